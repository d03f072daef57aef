#!lua
-- reap_putback.lua: a reap's last writes to the live index of the instance it reaps: the
-- members it could not reap (bad data, left for the audit) or kept (written after t0 by a new
-- life that has not registered yet), put back from the moved index (reap_begin.lua) before
-- reap_finish.lua deletes that.
--
-- KEYS[1] P:{ctl}:heartbeats
-- KEYS[2] P:{ctl}:hb:<D>
-- KEYS[3] P:{ctl}:instance:<D>:rooms
-- KEYS[4] P:{ctl}:instance:<D>:reaping   the token of the reap that owns the moved index
-- ARGV[1] D, the instance being reaped (wire form)
-- ARGV[2] this reap's token (reap_begin.lua's server_us)
-- ARGV[3..] the members
--
-- Skipped once D registered again (its heartbeat key exists, or its score is neither 0 nor
-- absent): its registration merged the moved index into the live one and its clean-up of
-- its earlier life decides about these members; putting them back after that clean-up would
-- leave entries naming rooms the live instance does not hold.
-- Skipped too when KEYS[4] does not hold this reap's token: a registration deleted it (and
-- merged the moved index back: the members are in the live index already, and the life that
-- registered may since have left, its index gone with it), or a later reap took the moved
-- index over (the members are still in it: the moved index is never emptied member by
-- member, and that reap decides). Without this, a reap whose instance registered again and
-- then left (`Node::leave`: no heartbeat key, no score) put its members back into the index
-- of an instance no longer registered, naming rooms its leave had closed (model check,
-- finding 2).
--
-- Reply: the number of members added, or -1 when skipped.
--
-- Protects: invariant 4 (no member dropped that no reap looked at; no entry added to a live
-- instance's index behind its clean-up).
if redis.call('EXISTS', KEYS[2]) == 1 then return -1 end
local score = redis.call('ZSCORE', KEYS[1], ARGV[1])
if score and tonumber(score) ~= 0 then return -1 end
local token = redis.pcall('GET', KEYS[4])
if type(token) == 'table' or token ~= ARGV[2] then return -1 end
return redis.call('SADD', KEYS[3], unpack(ARGV, 3))
