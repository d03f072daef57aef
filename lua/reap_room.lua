#!lua
-- reap_room.lua: remove what a dead instance left in a batch of rooms, in bounded steps.
--
-- Per room i (i = 1..n, n = #KEYS / 5), five keys:
-- KEYS[5i-4] P:room:{R}:owner
-- KEYS[5i-3] P:room:{R}:meta
-- KEYS[5i-2] P:room:{R}:peers
-- KEYS[5i-1] P:room:{R}:guests
-- KEYS[5i]   P:room:{R}:guest-state
-- Peer records P:room:{R}:peer:<p> are derived from the room's owner key (same prefix and hash
-- tag; the prefix holds no '{').
-- ARGV[1] dead instance id (wire form)
-- ARGV[2] t0: server time, microseconds, at which the reap of this instance began
--         (reap_begin.lua)
-- ARGV[3] peers read at a time (SRANDMEMBER count, SSCAN COUNT), also the call's work bound:
--         once the rooms done in this call have seen that many peers, no further room is started
-- ARGV[4] n, the number of rooms
-- ARGV[4+i] room i's SSCAN cursor over its peers ('0' on its first call)
--
-- Several rooms per call only where every key lives on one server (standalone, a Sentinel
-- master); on Redis Cluster the caller sends one room per call (its five keys share a slot).
--
-- The rooms come from the dead instance's room index, which reaches every record naming it
-- (key schema version 2: upsert_peer.lua writes records only into rooms their instance owns,
-- and an instance removes a room it lost from its index only after deleting its records
-- there). The same script removes a live instance's own records from a room it lost
-- (src/rooms.rs, sweep_own: ARGV[1] the caller, ARGV[2] the largest t0).
--
-- The room is the dead instance's leftover when its pin names the dead instance, or the pin
-- has expired (or is not a string: the pins are read with one MGET, which answers nil for a key
-- of another type; such a key is left alone, for the audit to report) and the metadata still
-- names it (or names nobody), and it was pinned strictly
-- before t0 (pinned_us; data written before pinned_us existed counts as pinned at the end of its
-- pinned_ms: a tie is the new life's, kept, and reaped by a later round if no new life registers).
-- Such a room is deleted whole: peer records batch by batch, then every room key.
-- Otherwise (taken over by a live instance, or pinned again by the same instance after its reap
-- began) only the dead instance's own peer records written before t0 are removed.
--
-- Reply: one flat array, in order, for the rooms this call reached (flat: Redis turns one table
-- into a reply faster than one per room; a shorter reply: the rooms after the last one were not
-- started; send them again with their cursors). A room is one integer, the records deleted, when
-- it was reaped whole in this call with nothing kept (status 'reaped', cursor '0', late 0: nearly
-- every room; an integer is the cheapest element for Redis to send), else four elements:
-- (status, cursor, deleted, late). cursor ~= '0' means "call again with this cursor" ('again':
-- start over from '0', peers were added behind the scan); status is
--   'reaped'    the room was the dead instance's and is (being) deleted;
--   'gone'      nothing of the room was left;
--   'skipped'   another instance owns the room: only the dead instance's peers were removed;
--   'new_life'  the same instance pinned the room again after t0 (it came back): kept, keep
--               the index entry;
--   'error'     a command failed on this room: cursor is the error text (the caller skips the
--               room for WRONGTYPE, bad data, and treats any other error as transient); what
--               ran before it in this room stays done, the other rooms go on.
-- deleted = the number of peer records deleted in this call; late = the dead instance's records
-- written at or after t0 that this call kept in a room not deleted whole (a zombie's or a new
-- life's writes): the caller keeps such a room in the instance's index (put back), so that a
-- later reap finds them, whoever owns the room by then (key schema version 2: the room index
-- must reach every record naming the instance). A room deleted whole is deleted
-- with every record in it (another instance's records left in a room it lost go too: that
-- instance's room index entry then points at nothing, which its next walk settles); its
-- records are not read. In a room kept, each record's instance and update time are read.
--
-- Protects: owner CAS (pitfall "without the owner check the reaper deletes rooms another
-- instance took over"), invariant 2 (an expired pin is still the dead instance's leftover),
-- "never loop unboundedly in Lua" (SRANDMEMBER of at most the batch size, SSCAN batches, a work
-- bound per call).
local dead, t0, count, n = ARGV[1], tonumber(ARGV[2]), ARGV[3], tonumber(ARGV[4])
local budget = tonumber(count)
-- Server microseconds of a write: the _us field, else the end of the _ms one (older data).
local function micros(us, ms)
  return tonumber(us) or ((tonumber(ms) or 0) * 1000 + 999)
end
-- Keys of rooms deleted whole by the fast path: sent in one DEL per call.
local dels = {}
local function flush()
  if #dels > 0 then
    redis.call('DEL', unpack(dels))
    dels = {}
  end
end

-- One room: its pin's value (false: none), its keys (owner, meta, peers, guests, guest-state)
-- and its peer cursor. Returns its four reply elements (status, cursor, deleted, late) and the
-- number of peers its scan saw. The pins are read once, before the first room: a room listed
-- twice in one call would see its pin as it was then (the caller never lists a room twice).
local function reap(owner, owner_key, meta_key, peers_key, guests_key, state_key, cursor)
  local meta = redis.call('HMGET', meta_key, 'owner', 'pinned_us')
  local meta_owner = meta[1]
  -- pinned_ms only for data written before pinned_us existed (one more read, then).
  local pinned = tonumber(meta[2]) or micros(false, redis.call('HGET', meta_key, 'pinned_ms'))
  local base = string.sub(owner_key, 1, -6)
  local dead_owns = owner == dead or (owner == false and (meta_owner == dead or meta_owner == false))
  local status
  if dead_owns and pinned < t0 then
    if owner == false and meta_owner == false then status = 'gone' else status = 'reaped' end
  elseif dead_owns then
    status = 'new_life'
  else
    status = 'skipped'
  end
  local whole = status == 'reaped' or status == 'gone'
  -- Peers read by a fast-path attempt that found the room too big for it (work done, counted).
  local tried = 0
  if whole and cursor == '0' then
    -- Fast path (nearly every room): SRANDMEMBER with a positive count answers the whole set
    -- when it holds at most count members and exactly count members otherwise, so fewer than
    -- count is every peer (bounded work, and cheaper for Redis than SSCAN or SMEMBERS). Nothing
    -- can be added while the script runs, so the records and the room's keys go with the
    -- call's one DEL (no SREM, no SCARD).
    local peers = redis.call('SRANDMEMBER', peers_key, count)
    if #peers < budget then
      for _, p in ipairs(peers) do
        dels[#dels + 1] = base .. 'peer:' .. p
      end
      if owner then
        dels[#dels + 1] = owner_key
      end
      dels[#dels + 1] = meta_key
      dels[#dels + 1] = peers_key
      dels[#dels + 1] = guests_key
      dels[#dels + 1] = state_key
      return status, '0', #peers, 0, #peers
    end
    tried = #peers
  end
  local scan = redis.call('SSCAN', peers_key, cursor, 'COUNT', count)
  local peers = scan[2]
  local records, members, late = {}, {}, 0
  for _, p in ipairs(peers) do
    local rec = base .. 'peer:' .. p
    local drop = whole
    if not drop and redis.call('HGET', rec, 'instance') == dead then
      local upd = redis.call('HMGET', rec, 'updated_us', 'updated_ms')
      drop = micros(upd[1], upd[2]) < t0
      if not drop then late = late + 1 end
      if drop then
        local g = redis.call('HGET', rec, 'guest')
        if g and g ~= '' and redis.call('HGET', guests_key, g) == p then
          redis.call('HDEL', guests_key, g)
          redis.call('HDEL', state_key, g)
        end
      end
    end
    if drop then
      records[#records + 1] = rec
      members[#members + 1] = p
    end
  end
  -- One variadic DEL and SREM per batch (a batch is at most ARGV[3]-ish members).
  if #records > 0 then
    redis.call('DEL', unpack(records))
    redis.call('SREM', peers_key, unpack(members))
  end
  if scan[1] ~= '0' then
    return status, scan[1], #records, late, tried + #peers
  end
  if whole then
    -- Peers added behind the scan: scan again rather than drop their records with the set.
    if redis.call('SCARD', peers_key) > 0 then
      return status, 'again', #records, late, tried + #peers
    end
    if owner then
      redis.call('DEL', owner_key)
    end
    redis.call('DEL', meta_key, peers_key, guests_key, state_key)
  end
  return status, '0', #records, late, tried + #peers
end

local replies, seen = {}, 0
-- Every room's pin in one MGET (one call instead of a GET per room). MGET answers nil for a
-- key of another type, which is then judged as an expired pin: by the metadata.
local owners = {}
if n > 0 then
  local pins = {}
  for i = 1, n do
    pins[i] = KEYS[5 * i - 4]
  end
  owners = redis.call('MGET', unpack(pins))
end
for i = 1, n do
  if i > 1 and seen >= budget then
    break
  end
  local k = 5 * (i - 1)
  local ok, status, cursor, deleted, late, scanned = pcall(reap, owners[i], KEYS[k + 1],
    KEYS[k + 2], KEYS[k + 3], KEYS[k + 4], KEYS[k + 5], ARGV[4 + i])
  local r = #replies
  if ok then
    if status == 'reaped' and cursor == '0' and late == 0 then
      replies[r + 1] = deleted
    else
      replies[r + 1], replies[r + 2], replies[r + 3], replies[r + 4] = status, cursor, deleted, late
    end
    seen = seen + scanned
  else
    -- A failed command (the error is a string, or a table with err on some versions): what
    -- ran before it in this room stays done; the room is left for the audit.
    replies[r + 1] = 'error'
    replies[r + 2] = type(status) == 'table' and (status.err or '?') or tostring(status)
    replies[r + 3], replies[r + 4] = 0, 0
  end
  if #dels > 1000 then
    flush()
  end
end
flush()
return replies
