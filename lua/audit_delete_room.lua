#!lua
-- audit_delete_room.lua: the audit's (fsck --repair) deletion of an orphaned room, in bounded
-- batches, with an owner CAS on every call.
--
-- KEYS[1] P:room:{R}:owner
-- KEYS[2] P:room:{R}:meta
-- KEYS[3] P:room:{R}:peers
-- KEYS[4] P:room:{R}:guests
-- KEYS[5] P:room:{R}:guest-state
-- Peer records P:room:{R}:peer:<p> are derived from KEYS[1] (same prefix and hash tag).
-- ARGV[1] the metadata owner the audit saw ('' = the room had no metadata)
-- ARGV[2] the metadata pinned_ms the audit saw ('' = none)
-- ARGV[3] SSCAN cursor over the room's peers ('0' on the first call), or '' to delete only the
--         records listed in ARGV[5..] (records the audit's SCAN found, in the set or not)
-- ARGV[4] SSCAN COUNT (batch size)
-- ARGV[5..] peer ids (wire form) whose records to delete when ARGV[3] is ''
--
-- The room is deleted only while it is still orphaned exactly as the audit saw it: no pin, and
-- the metadata's owner and pinned_ms unchanged (the audit checked, in two scans separated by
-- the settle delay, that this owner is not a registered instance: orphaned_room; or that this
-- owner is alive, heartbeated between the scans and still did not re-pin it, the scans being
-- further apart than its heartbeat interval plus command timeout: forgotten_room). Any pin (a live instance
-- took the room over) or any change of the metadata stops the deletion at once.
--
-- Reply: {status, cursor}; status is
--   'more'        a batch was deleted; call again with the returned cursor ('' after a
--                 listed-records call: go on with the next list, or with cursor '0');
--   'deleted'     the last batch and every room key were deleted;
--   'owned'       the room has a pin now: nothing written;
--   'changed'     the metadata changed: nothing written;
--   'wrong_type'  a room key or a peer record holds the wrong type: nothing written in this
--                 call (wrong-typed keys are reported, never repaired).
-- Nothing of the control plane is touched here (another slot). Instances whose records were
-- deleted may still list the room in their room indexes (key schema version 2: a room index
-- reaches every record naming its instance); such an entry now points at nothing, which that
-- instance's own walk, its reap or a later audit (dangling_room_index) settles.
--
-- Protects: invariant 2 (rooms nobody owns leave nothing behind), invariant 1 (owner CAS: a
-- room a live instance pinned is never touched), "never loop unboundedly in Lua".
local expect = {'string', 'hash', 'set', 'hash', 'hash'}
for i = 1, 5 do
  local t = redis.call('TYPE', KEYS[i])['ok']
  if t ~= 'none' and t ~= expect[i] then return {'wrong_type', ''} end
end
if redis.call('EXISTS', KEYS[1]) == 1 then return {'owned', ''} end
local meta = redis.call('HMGET', KEYS[2], 'owner', 'pinned_ms')
if (meta[1] or '') ~= ARGV[1] or (meta[2] or '') ~= ARGV[2] then
  return {'changed', ''}
end
local base = string.sub(KEYS[1], 1, -6)
local peers
local next_cursor = ''
if ARGV[3] == '' then
  peers = {}
  for i = 5, #ARGV do peers[#peers + 1] = ARGV[i] end
else
  local scan = redis.call('SSCAN', KEYS[3], ARGV[3], 'COUNT', ARGV[4])
  next_cursor, peers = scan[1], scan[2]
end
for _, p in ipairs(peers) do
  local t = redis.call('TYPE', base .. 'peer:' .. p)['ok']
  if t ~= 'none' and t ~= 'hash' then return {'wrong_type', ''} end
end
for _, p in ipairs(peers) do
  redis.call('DEL', base .. 'peer:' .. p)
  redis.call('SREM', KEYS[3], p)
end
if ARGV[3] == '' or next_cursor ~= '0' then
  return {'more', next_cursor}
end
redis.call('DEL', KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5])
return {'deleted', '0'}
