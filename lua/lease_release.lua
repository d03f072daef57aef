#!lua
-- lease_release.lua: give up the lease on shutdown, only if it still holds our id (owner CAS
-- DEL), so another instance takes over without waiting for the TTL.
--
-- KEYS[1] P:{ctl}:leader
-- ARGV[1] instance id (wire form)
--
-- Reply: 1 released, 0 not ours (nothing touched).
--
-- Protects: invariant 3 / pitfall "release must only touch our own lease".
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  return 1
end
return 0
