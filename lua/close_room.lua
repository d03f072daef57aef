#!lua
-- close_room.lua: delete a room the caller owns, with its peers, in bounded batches.
--
-- KEYS[1] P:room:{R}:owner
-- KEYS[2] P:room:{R}:meta
-- KEYS[3] P:room:{R}:peers
-- KEYS[4] P:room:{R}:guests
-- KEYS[5] P:room:{R}:guest-state
-- Peer records P:room:{R}:peer:<p> are derived from KEYS[1] (same prefix and hash tag).
-- ARGV[1] instance id (wire form)
-- ARGV[2] SSCAN cursor over the room's peers ('0' on the first call)
-- ARGV[3] SSCAN COUNT (batch size)
--
-- Reply: {status, cursor_or_owner}; status is
--   'more'       a batch of peers was deleted; call again with the returned cursor (which
--                may be '0' again when peers were added behind the scan);
--   'closed'     the last batch and every room key were deleted;
--   'not_owner'  the room is not ours: second element = current owner ('' if none).
-- Another instance's records left in the room (it lost the room to the caller) go too; that
-- instance's room index entry then points at nothing, which its next walk settles.
--
-- Protects: owner CAS; "never loop unboundedly in Lua" (SSCAN batches).
local owner = redis.call('GET', KEYS[1])
local meta_owner = redis.call('HGET', KEYS[2], 'owner')
if owner ~= ARGV[1] and not (owner == false and meta_owner == ARGV[1]) then
  return {'not_owner', owner or meta_owner or ''}
end
local base = string.sub(KEYS[1], 1, -6)
local scan = redis.call('SSCAN', KEYS[3], ARGV[2], 'COUNT', ARGV[3])
local records = {}
for _, p in ipairs(scan[2]) do
  records[#records + 1] = base .. 'peer:' .. p
end
-- One variadic DEL and SREM per batch.
if #records > 0 then
  redis.call('DEL', unpack(records))
  redis.call('SREM', KEYS[3], unpack(scan[2]))
end
if scan[1] ~= '0' then
  return {'more', scan[1]}
end
-- Peers added behind the scan: scan again from the start rather than drop their records.
if redis.call('SCARD', KEYS[3]) > 0 then
  return {'more', '0'}
end
redis.call('DEL', KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5])
return {'closed', '0'}
