#!lua
-- reap_force_begin.lua: an operator's reap of one instance (`sfu-redis reap`, src/reap.rs):
-- check that the instance may be reaped now and, with 'begin', mark it as being reaped (score
-- 0), as reap_begin.lua does for a leader, but without a lease and without the two-phase wait.
-- The rest of the reap is the leader's: the same owner-CAS script (reap_room.lua) and
-- reap_finish.lua, so a leader reaping the same instance
-- at the same moment and this reap interleave safely (each step is idempotent).
--
-- KEYS[1] P:{ctl}:heartbeats
-- KEYS[2] P:{ctl}:hb:<D>
-- KEYS[3] P:{ctl}:instance:<D>:rooms           moved aside with 'begin', as reap_begin.lua
-- KEYS[4] P:{ctl}:instance:<D>:reaping-rooms   does (see there)
-- KEYS[5] P:{ctl}:instance:<D>:reaping
-- KEYS[6] P:{ctl}:instance:<D>:info            started_ms of the life being reaped ...
-- KEYS[7] P:{ctl}:instance:<D>:reaped          ... written here with 'begin', as reap_begin.lua
--                                               does (see there)
-- ARGV[1] D, the instance to reap (wire form)
-- ARGV[2] D's stale threshold, ms (its own record's, else the caller's configuration)
-- ARGV[3] '1': forced (a heartbeat key holding 'released' and a last heartbeat within the
--         stale threshold no longer refuse the reap), '0': not forced
-- ARGV[4] 'begin' (mark it) or 'check' (a dry run: nothing written)
--
-- Reply: {status, server_ms, score, server_us, replaced}; replaced: how many of the reaps' own
-- keys (the moved index) held another type and were deleted, as reap_begin.lua does; score is D's sorted-set score (server ms,
-- 0 = being reaped already, -1 = not registered); status is
--   'dead'     it may be reaped; with 'begin' its score is now 0 and a heartbeat key holding
--              'released' was deleted (so the reap's scripts, which treat any heartbeat key as
--              a registration, see it gone), and its room index is moved aside as by
--              reap_begin.lua; server_us is t0 for the room script and the reap's
--              token;
--   'live'     its heartbeat key holds a live process's boot token (any value but
--              'released', or a key of another type): never reaped, forced or not;
--   'released' its heartbeat key holds 'released' (a clean stop whose key has not expired
--              yet) and the call is not forced;
--   'fresh'    its last heartbeat is within the stale threshold and the call is not forced;
--   'gone'     it is not in the sorted set (not registered, or reaped meanwhile).
--
-- Protects: invariant 1 (a live instance is never reaped: its heartbeat key holds its boot
-- token while it runs, heartbeat.lua) and the zombie rule (score 0 tells a paused instance
-- that resumes that it was reaped).
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local now_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
local forced = ARGV[3] == '1'
local replaced = 0
local score = redis.call('ZSCORE', KEYS[1], ARGV[1])
local s = -1
if score ~= false then s = math.floor(tonumber(score) or 0) end
local holder = redis.pcall('GET', KEYS[2])
if type(holder) == 'table' then return {'live', now, s, now_us, 0} end
if holder and holder ~= 'released' then return {'live', now, s, now_us, 0} end
if score == false then return {'gone', now, s, now_us, 0} end
if holder and not forced then return {'released', now, s, now_us, 0} end
if not forced and s ~= 0 and s >= now - tonumber(ARGV[2]) then
  return {'fresh', now, s, now_us, 0}
end
if ARGV[4] == 'begin' then
  if holder then redis.call('DEL', KEYS[2]) end
  redis.call('ZADD', KEYS[1], 'XX', 0, ARGV[1])
  local moved = redis.call('TYPE', KEYS[4]).ok
  if moved ~= 'none' and moved ~= 'set' then
    redis.call('UNLINK', KEYS[4])
    replaced = 1
    moved = 'none'
  end
  if moved == 'none' and redis.call('TYPE', KEYS[3]).ok == 'set' then
    redis.call('RENAME', KEYS[3], KEYS[4])
  end
  redis.call('SET', KEYS[5], now_us)
  local started = redis.pcall('HGET', KEYS[6], 'started_ms')
  if type(started) == 'string' then redis.call('SET', KEYS[7], started, 'PX', 86400000) end
end
return {'dead', now, s, now_us, replaced}
