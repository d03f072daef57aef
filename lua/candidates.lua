#!lua flags=no-writes
-- candidates.lua: instances whose last heartbeat is older than the stale threshold, on server
-- time (phase one of the two-phase reap; candidates are not yet dead).
--
-- KEYS[1] P:{ctl}:heartbeats
-- ARGV[1] stale_threshold, ms
-- ARGV[2] at most this many candidates
--
-- Reply: {server_ms, {instance, ...}} (wire form), oldest first; includes instances whose reap
-- began but did not finish (score 0).
--
-- Protects: "server time only" (a host's clock plays no part), bounded reads.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local cutoff = now - tonumber(ARGV[1])
return {now, redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', '(' .. cutoff, 'LIMIT', 0, tonumber(ARGV[2]))}
