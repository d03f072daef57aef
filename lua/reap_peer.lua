#!lua
-- reap_peer.lua: remove one peer record a dead instance left behind.
--
-- KEYS[1] P:room:{R}:peer:<p>   HASH, the peer record
-- KEYS[2] P:room:{R}:peers
-- KEYS[3] P:room:{R}:guests
-- KEYS[4] P:room:{R}:guest-state
-- ARGV[1] dead instance id (wire form)
-- ARGV[2] t0: server time, microseconds, at which the reap began (a record is the dead
--         life's when updated_us, or the end of updated_ms for older data, is strictly before)
-- ARGV[3] peer id (wire form)
--
-- Reply: status
--   'reaped'     record and its room index entries deleted;
--   'gone'       no such record (the index entry was stale);
--   'moved'      the record belongs to another instance now: keep it;
--   'new_life'   written by the same instance after t0 (it came back): keep it;
--   'malformed'  the record exists but has no instance field: left alone, reported.
--
-- Protects: invariant 2 (nothing of a dead instance remains), invariant 1 (a peer re-homed on a
-- live instance is kept).
local inst = redis.call('HGET', KEYS[1], 'instance')
if inst == false then
  if redis.call('EXISTS', KEYS[1]) == 1 then return 'malformed' end
  return 'gone'
end
if inst ~= ARGV[1] then return 'moved' end
local upd = redis.call('HMGET', KEYS[1], 'updated_us', 'updated_ms')
if (tonumber(upd[1]) or ((tonumber(upd[2]) or 0) * 1000 + 999)) >= tonumber(ARGV[2]) then
  return 'new_life'
end
local g = redis.call('HGET', KEYS[1], 'guest')
redis.call('DEL', KEYS[1])
redis.call('SREM', KEYS[2], ARGV[3])
if g and g ~= '' and redis.call('HGET', KEYS[3], g) == ARGV[3] then
  redis.call('HDEL', KEYS[3], g)
  redis.call('HDEL', KEYS[4], g)
end
return 'reaped'
