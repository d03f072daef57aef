-- heartbeat.lua: record that an instance is alive, on Redis server time.
--
-- KEYS[1] P:{ctl}:heartbeats   ZSET instance -> last heartbeat (server ms); 0 = being reaped
-- KEYS[2] P:{ctl}:hb:<I>       STRING, PX heartbeat_ttl
-- KEYS[3] P:{ctl}:dataset      STRING, the dataset token
-- ARGV[1] instance id (wire form)
-- ARGV[2] heartbeat_ttl, ms
-- ARGV[3] 'register' (first heartbeat of a life) or 'tick'
-- ARGV[4] the dataset token this instance saw last ('' if none)
-- ARGV[5] a fresh random token, written if the dataset token is missing
--
-- Reply: {status, server_ms, token}; status is
--   'ok'        heartbeat written;
--   'restored'  this instance was missing and the dataset token is gone or changed: Redis lost
--               its data, so the instance registered again (the caller restores its pins/peers);
--   'reaped'    this instance was missing (or is being reaped, score 0) and the token is
--               unchanged: a leader reaped it. Nothing is written; the caller reports its rooms
--               lost and registers again as a fresh life.
--
-- Protects: invariant 1 (server time only, so clock skew cannot make a live instance look
-- stale) and the zombie rule (a reaped instance never silently writes itself back).
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local token = redis.call('GET', KEYS[3])
local status = 'ok'
if ARGV[3] ~= 'register' then
  local score = redis.call('ZSCORE', KEYS[1], ARGV[1])
  if score == false then
    if token and token == ARGV[4] then
      return {'reaped', now, token}
    end
    status = 'restored'
  elseif tonumber(score) == 0 then
    return {'reaped', now, token or ''}
  end
end
if not token then
  token = ARGV[5]
  redis.call('SET', KEYS[3], token)
end
redis.call('ZADD', KEYS[1], now, ARGV[1])
redis.call('SET', KEYS[2], now, 'PX', ARGV[2])
return {status, now, token}
