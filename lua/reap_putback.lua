#!lua
-- reap_putback.lua: a reap's last writes to the live index of the instance it reaps: the
-- members it could not reap (bad data, left for the audit) or kept (written after t0 by a new
-- life that has not registered yet), put back from the moved index (reap_begin.lua) before
-- reap_finish.lua deletes that.
--
-- KEYS[1] P:{ctl}:heartbeats
-- KEYS[2] P:{ctl}:hb:<D>
-- KEYS[3] P:{ctl}:instance:<D>:rooms
-- ARGV[1] D, the instance being reaped (wire form)
-- ARGV[2..] the members
--
-- Skipped once D registered again (its heartbeat key exists, or its score is neither 0 nor
-- absent): its registration merged the moved index into the live one and its clean-up of
-- its earlier life decides about these members; putting them back after that clean-up would
-- leave entries naming rooms the live instance does not hold.
--
-- Reply: the number of members added, or -1 when skipped.
--
-- Protects: invariant 4 (no member dropped that no reap looked at; no entry added to a live
-- instance's index behind its clean-up).
if redis.call('EXISTS', KEYS[2]) == 1 then return -1 end
local score = redis.call('ZSCORE', KEYS[1], ARGV[1])
if score and tonumber(score) ~= 0 then return -1 end
return redis.call('SADD', KEYS[3], unpack(ARGV, 2))
