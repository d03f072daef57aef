#!lua
-- reap_room.lua: remove what a dead instance left in one room, in bounded batches.
--
-- KEYS[1] P:room:{R}:owner
-- KEYS[2] P:room:{R}:meta
-- KEYS[3] P:room:{R}:peers
-- KEYS[4] P:room:{R}:guests
-- KEYS[5] P:room:{R}:guest-state
-- Peer records P:room:{R}:peer:<p> are derived from KEYS[1] (same prefix and hash tag).
-- ARGV[1] dead instance id (wire form)
-- ARGV[2] t0: server time, microseconds, at which the reap of this instance began
--         (reap_begin.lua)
-- ARGV[3] SSCAN cursor over the room's peers ('0' on the first call)
-- ARGV[4] SSCAN COUNT (batch size)
--
-- The room is the dead instance's leftover when its pin names the dead instance, or the pin
-- has expired and the metadata still names it (or names nobody), and it was pinned strictly
-- before t0 (pinned_us; data written before pinned_us existed counts as pinned at the end of its
-- pinned_ms: a tie is the new life's, kept, and reaped by a later round if no new life registers).
-- Such a room is deleted whole: peer records batch by batch, then every room key.
-- Otherwise (taken over by a live instance, or pinned again by the same instance after its reap
-- began) only the dead instance's own peer records written before t0 are removed.
--
-- Reply: {status, cursor, removed}; cursor ~= '0' means "call again with this cursor"
-- ('again': start over from '0', peers were added behind the scan);
-- status is
--   'reaped'    the room was the dead instance's and is (being) deleted;
--   'gone'      nothing of the room was left;
--   'skipped'   another instance owns the room: only the dead instance's peers were removed;
--   'new_life'  the same instance pinned the room again after t0 (it came back): kept, keep
--               the index entry.
-- removed = {peer1, instance1, ...}: peer records deleted in this call. For a room deleted
-- whole whose metadata field solo names the dead instance (pin_room.lua: its peers set was
-- empty when it was pinned, and upsert_peer.lua writes only records naming the owner),
-- instance is the dead instance without reading each record; otherwise it is read from the
-- record, so that other instances' index entries for records left in the room are removed too.
--
-- Protects: owner CAS (pitfall "without the owner check the reaper deletes rooms another
-- instance took over"), invariant 2 (an expired pin is still the dead instance's leftover),
-- "never loop unboundedly in Lua" (SSCAN batches).
local dead, t0 = ARGV[1], tonumber(ARGV[2])
local owner = redis.call('GET', KEYS[1])
local meta = redis.call('HMGET', KEYS[2], 'owner', 'pinned_ms', 'solo', 'pinned_us')
local meta_owner = meta[1]
-- Server microseconds of a write: the _us field, else the end of the _ms one (older data).
local function micros(us, ms)
  return tonumber(us) or ((tonumber(ms) or 0) * 1000 + 999)
end
local pinned = micros(meta[4], meta[2])
local base = string.sub(KEYS[1], 1, -6)
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
local solo = whole and meta[3] == dead
local scan = redis.call('SSCAN', KEYS[3], ARGV[3], 'COUNT', ARGV[4])
local removed, records, members = {}, {}, {}
for _, p in ipairs(scan[2]) do
  local rec = base .. 'peer:' .. p
  local inst
  if solo then inst = dead else inst = redis.call('HGET', rec, 'instance') end
  local drop = whole
  if not drop and inst == dead then
    local upd = redis.call('HMGET', rec, 'updated_us', 'updated_ms')
    drop = micros(upd[1], upd[2]) < t0
    if drop then
      local g = redis.call('HGET', rec, 'guest')
      if g and g ~= '' and redis.call('HGET', KEYS[4], g) == p then
        redis.call('HDEL', KEYS[4], g)
        redis.call('HDEL', KEYS[5], g)
      end
    end
  end
  if drop then
    removed[#removed + 1] = p
    removed[#removed + 1] = inst or ''
    records[#records + 1] = rec
    members[#members + 1] = p
  end
end
if whole and ARGV[3] == '0' and scan[1] == '0' then
  -- Fast path (nearly every room): one SSCAN from cursor 0 back to 0 inside this script saw
  -- every peer, and nothing can be added while it runs, so the records and the room's keys go
  -- in one DEL (no SREM, no SCARD).
  records[#records + 1] = KEYS[1]
  records[#records + 1] = KEYS[2]
  records[#records + 1] = KEYS[3]
  records[#records + 1] = KEYS[4]
  records[#records + 1] = KEYS[5]
  redis.call('DEL', unpack(records))
  return {status, '0', removed}
end
-- One variadic DEL and SREM per batch (a batch is at most ARGV[4]-ish members).
if #records > 0 then
  redis.call('DEL', unpack(records))
  redis.call('SREM', KEYS[3], unpack(members))
end
if scan[1] ~= '0' then
  return {status, scan[1], removed}
end
if whole then
  -- Peers added behind the scan: scan again rather than drop their records with the set.
  if redis.call('SCARD', KEYS[3]) > 0 then
    return {status, 'again', removed}
  end
  redis.call('DEL', KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5])
end
return {status, '0', removed}
