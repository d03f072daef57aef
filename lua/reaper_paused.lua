#!lua
-- reaper_paused.lua: the leader notes in its own record why it skipped a reap round, and
-- clears the note when a round runs again (or when it no longer leads), so `status` and the
-- fleet page can say why stale instances are not reaped (docs/src/reference/key-schema.md,
-- src/info.rs).
--
-- KEYS[1] P:{ctl}:instance:<I>:info  HASH, the leader's own record (src/info.rs)
-- ARGV[1] 'skip' (a round was skipped) or 'run' (clear the note)
-- ARGV[2] skip: the reason, 'slow_ticks', 'redis_errors' or 'slow_ticks,redis_errors'
-- ARGV[3] skip: the last slow heartbeat tick, ms ('' when no tick was slow)
-- ARGV[4] skip: ticks longer than this are slow (half the heartbeat interval), ms
--
-- 'skip' writes only into an existing hash: a record is written whole by the registration
-- (heartbeat.lua), and a note must never make a partial one (after a reap or a leave removed
-- it). Fields: reaper_paused (the reason), reaper_paused_ms (server ms of this skipped round),
-- reaper_paused_since_ms (server ms of the first skipped round in a row),
-- reaper_paused_rounds (skipped rounds in a row), and with slow ticks reaper_paused_tick_ms
-- and reaper_paused_slow_ms. 'run' deletes them all. A key of another type is left alone.
--
-- Reply: 1 when the record was changed, 0 otherwise.
local info = KEYS[1]
if redis.call('TYPE', info)['ok'] ~= 'hash' then
  return 0
end
if ARGV[1] == 'run' then
  local n = redis.call('HDEL', info, 'reaper_paused', 'reaper_paused_ms', 'reaper_paused_since_ms',
    'reaper_paused_rounds', 'reaper_paused_tick_ms', 'reaper_paused_slow_ms')
  if n > 0 then return 1 end
  return 0
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local rounds = tonumber(redis.call('HGET', info, 'reaper_paused_rounds')) or 0
if redis.call('HEXISTS', info, 'reaper_paused_since_ms') == 0 or rounds == 0 then
  redis.call('HSET', info, 'reaper_paused_since_ms', now)
end
redis.call('HSET', info, 'reaper_paused', ARGV[2], 'reaper_paused_ms', now,
  'reaper_paused_rounds', rounds + 1)
if ARGV[3] ~= '' then
  redis.call('HSET', info, 'reaper_paused_tick_ms', ARGV[3], 'reaper_paused_slow_ms', ARGV[4])
else
  redis.call('HDEL', info, 'reaper_paused_tick_ms', 'reaper_paused_slow_ms')
end
return 1
