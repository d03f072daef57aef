#!lua
-- remove_peer.lua: delete a peer record and its room indexes, if it is still that generation.
--
-- KEYS[1] P:room:{R}:peer:<p>
-- KEYS[2] P:room:{R}:peers
-- KEYS[3] P:room:{R}:guests
-- KEYS[4] P:room:{R}:guest-state
-- ARGV[1] peer id (wire form)
-- ARGV[2] generation returned by upsert_peer.lua
-- ARGV[3] the calling instance (wire form)
--
-- Reply: 1 removed (one call, one slot, on every topology: the instance's room index, which
-- reaches the record, keeps the room while the instance owns it; key schema version 2); 0 when
-- the record is gone or has another generation (a delayed remove of an older connection is a
-- no-op); {0, owner} when the record belongs to another instance (nothing touched: only the
-- instance that hosts a peer removes it). Bare integers in the common cases: Redis 7.0 checks a
-- table reply for seven special fields before it sends it (docs/src/performance.md).
--
-- Protects: invariant 4.
local rec = redis.call('HMGET', KEYS[1], 'generation', 'instance', 'guest')
local gen = rec[1]
if gen == false or gen ~= ARGV[2] then
  return 0
end
local inst = rec[2] or ''
if inst ~= ARGV[3] then
  return {0, inst}
end
local g = rec[3]
redis.call('DEL', KEYS[1])
redis.call('SREM', KEYS[2], ARGV[1])
if g and g ~= '' and redis.call('HGET', KEYS[3], g) == ARGV[1] then
  redis.call('HDEL', KEYS[3], g)
  redis.call('HDEL', KEYS[4], g)
end
return 1
