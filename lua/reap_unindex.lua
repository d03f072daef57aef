#!lua
-- reap_unindex.lua: the reaper's deferred clean-up of a dead instance's OWN index, after the
-- scripts that deleted the records (index after record).
--
-- KEYS[1] P:{ctl}:heartbeats
-- KEYS[2] P:{ctl}:hb:<D>
-- KEYS[3] P:{ctl}:instance:<D>:rooms or P:{ctl}:instance:<D>:peers
-- ARGV[1] D, the instance being reaped (wire form)
-- ARGV[2..] the members to remove
--
-- The members go unless D registered again since its reap began: its heartbeat key exists, or
-- its sorted-set score is no longer 0 (reap_begin.lua set it to 0; a registration sets it to the
-- server time). A new life of D cleans its own indexes when it registers, before it pins or
-- upserts anything (heartbeat.rs, `register`), so what is skipped here is its to remove;
-- removing it here could strip the entry of a room the new life pinned again (or a peer it
-- wrote again) between the reap's script and this clean-up, and that room would be owned but
-- unindexed: an orphan once the new life dies.
--
-- Reply: the number of members removed, or -1 when skipped.
--
-- Protects: invariant 4 and "no orphans" across two lives of one instance id (issue 11).
if redis.call('EXISTS', KEYS[2]) == 1 then return -1 end
local score = redis.call('ZSCORE', KEYS[1], ARGV[1])
if score and tonumber(score) ~= 0 then return -1 end
return redis.call('SREM', KEYS[3], unpack(ARGV, 2))
