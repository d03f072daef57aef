#!lua
-- heartbeat_release.lua: on a graceful stop, mark this process's heartbeat key as released,
-- so a restart with the same instance id starts at once instead of waiting for the key to
-- expire (its boot token would otherwise look like another live process's).
--
-- KEYS[1] P:{ctl}:hb:<I>   STRING, PX heartbeat_ttl: the boot token of the live process
-- ARGV[1] this process's boot token
--
-- The key keeps its TTL and stays present, so the instance still counts as alive until it
-- expires (its rooms are reaped only after the stale threshold, as for any stopped instance);
-- heartbeat.lua's 'register' accepts a key holding 'released' as free.
--
-- Reply: 1 if released, 0 if the key is gone or holds another boot token (owner CAS: another
-- process's registration is never touched).
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('SET', KEYS[1], 'released', 'KEEPTTL')
  return 1
end
return 0
