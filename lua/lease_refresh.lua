#!lua
-- lease_refresh.lua: extend the lease only if it still holds our id (owner CAS PEXPIRE).
--
-- KEYS[1] P:{ctl}:leader
-- ARGV[1] instance id (wire form)
-- ARGV[2] lease_ttl, ms
--
-- Reply: 1 extended, 0 not ours (expired or taken): the caller demotes at once. Never
-- recreates an expired lease.
--
-- Protects: invariant 3 / pitfall "refresh must only touch our own lease".
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
return 0
