#!lua
-- index_add.lua: an instance adds rooms to its own live room index; if it is not registered
-- any more, it hands itself to the reaper.
--
-- KEYS[1] P:{ctl}:heartbeats
-- KEYS[2] P:{ctl}:hb:<I>
-- KEYS[3] P:{ctl}:instance:<I>:rooms
-- KEYS[4] P:{ctl}:instance:<I>:reaped  STRING, the reap tombstone: the started_ms of the life
--         a reap of I began on (reap_begin.lua, reap_force_begin.lua)
-- ARGV[1] I, the calling instance (wire form)
-- ARGV[2] '1': I may be marked (below); '0': only if KEYS[4] names ARGV[3] (I's registration
--         is not acknowledged by a replica yet: a failover may have lost it, and I lives on;
--         heartbeat.rs `registration_lost`)
-- ARGV[3] the started_ms of I's current life, as heartbeat.lua's ARGV[8] ('0' if not known)
-- ARGV[4..] the members (rooms, wire form)
--
-- The members are added first (SADD). Then, if I has no sorted-set entry and no heartbeat
-- key, I is not registered: a reap of it completed while it was paused (a zombie that has
-- not noticed yet), or it left. Its score is then set to 0 ("being reaped"): candidates.lua
-- lists it, reap_begin.lua re-checks the heartbeat key and the score before it reaps, and
-- heartbeat.lua answers 'reaped' to its next tick, after which it registers again. Without
-- the mark, a zombie that indexed a room (and pinned it, wrote records there) and then
-- crashed before its next tick left an index, a pin, metadata and records that no leader
-- reaps: nothing in the sorted set named it, and with per-boot ids no process reuses it
-- (model check, finding 1).
-- An existing entry (a live score, or 0: a reap under way) is never touched, and neither is
-- an instance whose heartbeat key exists: a live instance is never marked. Nor is one whose
-- registration no replica acknowledged (ARGV[2] '0'): missing here, it may be a live
-- instance whose registration a failover lost, not a reaped one; marked, a leader would
-- reap it once it is silent for the two-phase delay (model check, finding 9). Unless the
-- tombstone KEYS[4] names I's current life: then a reap of that very life began on this
-- dataset (the tombstone replicates with the reap), the registration was reaped, not lost,
-- and I is a zombie like any other: marked. Without that, an unacknowledged zombie whose
-- reap completed, that pinned and crashed before its next tick, left rooms no leader
-- reaches (model check, finding 11). Otherwise its next tick registers it again
-- (heartbeat.lua 'missing', handled as a lost registration) or tells it it was reaped
-- ('zombie').
--
-- Reply: {added, marked}: how many members were new (SADD), and 1 if I was marked (score 0),
-- else 0.
--
-- Protects: invariant 2 (nothing of a dead instance is left out of a reaper's reach) and
-- invariant 1 (a registered instance's score is never changed).
local added = redis.call('SADD', KEYS[3], unpack(ARGV, 4))
local marked = 0
local may_mark = ARGV[2] == '1'
if not may_mark and ARGV[3] ~= '0' and redis.call('TYPE', KEYS[4]).ok == 'string' then
  may_mark = redis.call('GET', KEYS[4]) == ARGV[3]
end
if may_mark and not redis.call('ZSCORE', KEYS[1], ARGV[1])
    and redis.call('EXISTS', KEYS[2]) == 0 then
  redis.call('ZADD', KEYS[1], 0, ARGV[1])
  marked = 1
end
return {added, marked}
