-- reap_finish.lua: end the reap of an instance once its indexes are empty.
--
-- KEYS[1] P:{ctl}:heartbeats
-- KEYS[2] P:{ctl}:hb:<D>
-- KEYS[3] P:{ctl}:instance:<D>:rooms
-- KEYS[4] P:{ctl}:instance:<D>:peers
-- ARGV[1] instance id (wire form)
--
-- Reply: {status, rooms_left, peers_left}; status is
--   'done'        indexes empty: the sorted-set entry (score 0) and heartbeat key are removed;
--   'incomplete'  index members remain (data that could not be reaped): the entry keeps score 0
--                 so the next round retries, and the audit reports what is left;
--   'alive'       the instance registered again meanwhile (new life): nothing touched.
--
-- Protects: invariant 2 (nothing of a dead instance remains, or it stays a candidate).
if redis.call('EXISTS', KEYS[2]) == 1 then return {'alive', 0, 0} end
local score = redis.call('ZSCORE', KEYS[1], ARGV[1])
if score and tonumber(score) ~= 0 then return {'alive', 0, 0} end
local rooms = redis.call('SCARD', KEYS[3])
local peers = redis.call('SCARD', KEYS[4])
if rooms + peers > 0 then return {'incomplete', rooms, peers} end
redis.call('ZREM', KEYS[1], ARGV[1])
return {'done', 0, 0}
