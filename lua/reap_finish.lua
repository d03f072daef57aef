#!lua
-- reap_finish.lua: end the reap of an instance once its indexes are empty.
--
-- KEYS[1] P:{ctl}:heartbeats
-- KEYS[2] P:{ctl}:hb:<D>
-- KEYS[3] P:{ctl}:instance:<D>:rooms
-- KEYS[4] P:{ctl}:instance:<D>:peers
-- KEYS[5] P:{ctl}:instance:<D>:info (deleted with the sorted-set entry)
-- ARGV[1] instance id (wire form)
-- ARGV[2] how many index members the reap kept because they were written after t0 by the
--         same instance id (a new life that has not registered yet)
--
-- Reply: {status, rooms_left, peers_left}; status is
--   'done'        indexes empty: the sorted-set entry (score 0) is removed;
--   'incomplete'  index members remain that could not be reaped (bad data, reported by the
--                 reaper): the entry is removed all the same, so a broken record does not make
--                 every later round re-reap the instance; the audit (fsck) reports what is left;
--   'alive'       the instance registered again meanwhile (new life): nothing touched;
--   'retry'       members written after t0 were kept (ARGV[2] > 0) but the instance did not
--                 register again: the entry keeps score 0 so the next round reaps them.
--
-- Protects: invariant 2 (the instance itself is gone; leftovers are reported, not hidden).
if redis.call('EXISTS', KEYS[2]) == 1 then return {'alive', 0, 0} end
local score = redis.call('ZSCORE', KEYS[1], ARGV[1])
if score and tonumber(score) ~= 0 then return {'alive', 0, 0} end
if tonumber(ARGV[2]) > 0 then return {'retry', 0, 0} end
local rooms = redis.call('SCARD', KEYS[3])
local peers = redis.call('SCARD', KEYS[4])
redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('DEL', KEYS[5])
if rooms + peers > 0 then return {'incomplete', rooms, peers} end
return {'done', 0, 0}
