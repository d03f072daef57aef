#!lua
-- reap_room.lua: remove what a dead instance left in a batch of rooms, in bounded steps.
--
-- Per room i (i = 1..n, n = #KEYS / s, s = ARGV[4]), s keys, the first its pin:
-- KEYS[s*(i-1)+1] P:room:{R}:owner  (the room's pin). The room's other keys are derived from it
-- (same prefix and hash tag; the prefix holds no '{'): P:room:{R}:meta, :peers, :guests,
-- :guest-state and the peer records P:room:{R}:peer:<p> (docs/DESIGN.md, "One slot per
-- script": a derived key with the same base counts as passed). On one server s = 1: one key
-- per room saves the parsing of four arguments per room, which a reap pays at every room. On
-- Redis Cluster s = 5 (owner, meta, peers, guests, guest-state, not read from KEYS): the
-- server checks the declared keys of a slot being migrated, and answers TRYAGAIN while they
-- are split between the two masters, so a room is never judged on part of its keys (its
-- metadata still on the source while its pin and records are on the target).
-- ARGV[1] dead instance id (wire form)
-- ARGV[2] t0: server time, microseconds, at which the reap of this instance began
--         (reap_begin.lua)
-- ARGV[3] peers read at a time (SRANDMEMBER count, SSCAN COUNT), also the call's work bound:
--         once the rooms done in this call have seen that many peers, no further room is started
-- ARGV[4] s, the keys given per room: 1 or 5
-- ARGV[4+i] room i's SSCAN cursor over its peers; a missing one is '0' (a room's first call:
--         the caller sends no cursors when every room starts from '0')
--
-- Several rooms per call only where every key lives on one server (standalone, a Sentinel
-- master); on Redis Cluster the caller sends one room per call (its keys share a slot).
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
local dead, t0, count, stride = ARGV[1], tonumber(ARGV[2]), ARGV[3], tonumber(ARGV[4])
local n = #KEYS / stride
local budget = tonumber(count)
-- Server microseconds of a write: the _us field, else the end of the _ms one (older data).
local function micros(us, ms)
  return tonumber(us) or ((tonumber(ms) or 0) * 1000 + 999)
end
-- Keys of rooms deleted whole by the fast path, dels[1..nd]: sent in one DEL per call. The
-- table is reused after a DEL (entries past nd are stale); counts are kept in locals, as the
-- length operator searches the table each time.
local dels, nd = {}, 0
local function flush()
  if nd > 0 then
    redis.call('DEL', unpack(dels, 1, nd))
    nd = 0
  end
end

-- One room: its pin's value (false: none), its pin's key (the base of the others) and its peer
-- cursor. Returns its four reply elements (status, cursor, deleted, late) and the number of
-- peers its scan saw. The pins are read once, before the first room: a room listed twice in
-- one call would see its pin as it was then (the caller never lists a room twice).
local function reap(owner, owner_key, cursor)
  local base = string.sub(owner_key, 1, -6)
  local meta_key = base .. 'meta'
  -- The owner CAS: the pin, or when it has expired the metadata, names the dead instance (or
  -- nobody). A pin naming the dead instance needs only the pin time from the metadata (one
  -- field, answered without a table); a pin naming another instance needs nothing more.
  local dead_owns, gone, pinned = false, false, nil
  if owner == dead then
    dead_owns = true
    pinned = redis.call('HGET', meta_key, 'pinned_us')
  elseif owner == false then
    local meta = redis.call('HMGET', meta_key, 'owner', 'pinned_us')
    dead_owns = meta[1] == dead or meta[1] == false
    gone = meta[1] == false
    pinned = meta[2]
  end
  local status
  if dead_owns then
    -- pinned_ms only for data written before pinned_us existed (one more read, then).
    pinned = tonumber(pinned) or micros(false, redis.call('HGET', meta_key, 'pinned_ms'))
    if pinned >= t0 then
      status = 'new_life'
    elseif gone then
      status = 'gone'
    else
      status = 'reaped'
    end
  else
    status = 'skipped'
  end
  local whole = status == 'reaped' or status == 'gone'
  local peers_key = base .. 'peers'
  -- Peers read by a fast-path attempt that found the room too big for it (work done, counted).
  local tried = 0
  if whole and cursor == '0' then
    -- Fast path (nearly every room): SRANDMEMBER with a positive count answers the whole set
    -- when it holds at most count members and exactly count members otherwise, so fewer than
    -- count is every peer (bounded work, and cheaper for Redis than SSCAN or SMEMBERS). Nothing
    -- can be added while the script runs, so the records and the room's keys go with the
    -- call's one DEL (no SREM, no SCARD).
    local peers = redis.call('SRANDMEMBER', peers_key, count)
    local np = #peers
    if np < budget then
      for j = 1, np do
        dels[nd + j] = base .. 'peer:' .. peers[j]
      end
      nd = nd + np
      if owner then
        nd = nd + 1
        dels[nd] = owner_key
      end
      dels[nd + 1], dels[nd + 2] = meta_key, peers_key
      dels[nd + 3], dels[nd + 4] = base .. 'guests', base .. 'guest-state'
      nd = nd + 4
      return status, '0', np, 0, np
    end
    tried = np
  end
  local guests_key, state_key = base .. 'guests', base .. 'guest-state'
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

local replies, nr, seen = {}, 0, 0
-- Every room's pin in one MGET (one call instead of a GET per room). MGET answers nil for a
-- key of another type, which is then judged as an expired pin: by the metadata.
local pins, owners = KEYS, {}
if stride ~= 1 then
  pins = {}
  for i = 1, n do
    pins[i] = KEYS[stride * (i - 1) + 1]
  end
end
if n > 0 then
  owners = redis.call('MGET', unpack(pins))
end
for i = 1, n do
  if i > 1 and seen >= budget then
    break
  end
  local ok, status, cursor, deleted, late, scanned = pcall(reap, owners[i], pins[i],
    ARGV[4 + i] or '0')
  if ok then
    if status == 'reaped' and cursor == '0' and late == 0 then
      nr = nr + 1
      replies[nr] = deleted
    else
      replies[nr + 1], replies[nr + 2], replies[nr + 3], replies[nr + 4] = status, cursor,
        deleted, late
      nr = nr + 4
    end
    seen = seen + scanned
  else
    -- A failed command (the error is a string, or a table with err on some versions): what
    -- ran before it in this room stays done; the room is left for the audit.
    replies[nr + 1] = 'error'
    replies[nr + 2] = type(status) == 'table' and (status.err or '?') or tostring(status)
    replies[nr + 3], replies[nr + 4] = 0, 0
    nr = nr + 4
  end
  if nd > 1000 then
    flush()
  end
end
flush()
return replies
