#!lua
-- reap_begin.lua: phase two of the two-phase reap: re-check one candidate and, if it is
-- really dead, mark it as being reaped.
--
-- KEYS[1] P:{ctl}:heartbeats
-- KEYS[2] P:{ctl}:hb:<D>
-- KEYS[3] P:{ctl}:leader
-- ARGV[1] candidate instance id (wire form)
-- ARGV[2] stale_threshold, ms
-- ARGV[3] the calling leader's instance id (wire form)
--
-- Dead means: no heartbeat key and a sorted-set score older than the threshold (server time).
-- A dead instance's score is set to 0, which (a) keeps it a candidate should this leader die
-- mid-reap and (b) tells the instance, should it resume, that it was reaped (heartbeat.lua).
--
-- Reply: {status, server_ms, server_us}; status is 'dead' (reap it; server_us is t0 for the
-- room and peer scripts: microseconds, so a new life's write cannot tie with it), 'alive' (it heartbeated again: leave it), 'gone' (not registered) or
-- 'not_leader' (the lease does not hold the caller's id: fencing, e.g. after Redis lost the
-- lease while the caller still believed it led).
--
-- Protects: pitfall "removing the two-phase re-check reaps instances that only missed a
-- heartbeat", invariants 1 and 3.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local now_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
if redis.call('GET', KEYS[3]) ~= ARGV[3] then return {'not_leader', now, now_us} end
if redis.call('EXISTS', KEYS[2]) == 1 then return {'alive', now, now_us} end
local score = redis.call('ZSCORE', KEYS[1], ARGV[1])
if score == false then return {'gone', now, now_us} end
if tonumber(score) >= now - tonumber(ARGV[2]) then return {'alive', now, now_us} end
redis.call('ZADD', KEYS[1], 'XX', 0, ARGV[1])
return {'dead', now, now_us}
