#!lua
-- audit_enqueue.lua: the audit's (fsck --repair) hand-over of an unregistered instance that
-- left a room index behind to the reaper.
--
-- KEYS[1] P:{ctl}:heartbeats
-- KEYS[2] P:{ctl}:hb:<I>
-- KEYS[3] P:{ctl}:instance:<I>:rooms
-- KEYS[4] P:{ctl}:instance:<I>:info
-- KEYS[5] P:{ctl}:instance:<I>:reaping-rooms  (the room index an interrupted reap moved aside)
-- KEYS[6] P:{ctl}:instance:<I>:reaping
-- ARGV[1] instance id (wire form)
--
-- Re-checked atomically: the instance still has no sorted-set entry, no heartbeat key, and a
-- non-empty room index (live or moved aside). Then it gets score 0 ("being reaped", ZADD NX):
-- the leader lists it as a candidate, re-checks it (reap_begin.lua) and reaps it with the
-- owner-CAS room script, which walks that room index: it reaches every peer record naming the
-- instance (key schema version 2). An instance without a sorted-set entry is already treated
-- as reaped by heartbeat.lua, so score 0 changes nothing for the instance itself should it
-- resume.
--
-- Reply: status
--   'queued'      score 0 written: handed to the reaper;
--   'registered'  it has a sorted-set entry now: nothing written;
--   'alive'       its heartbeat key exists: nothing written;
--   'empty'       its room index is empty now (live and moved aside): nothing left to reap; its
--                 info hash and the token of an interrupted reap, if any, are deleted (they
--                 describe a registration that no longer exists);
--   'wrong_type'  one of the keys holds the wrong type: nothing written.
--
-- Protects: invariant 2 (a dead instance leaves nothing behind, even when its sorted-set entry
-- went first), invariant 1 (an instance with a heartbeat key is never handed over).
local expect = {'zset', 'string', 'set', nil, 'set'}
for i = 1, 5 do
  if expect[i] then
    local t = redis.call('TYPE', KEYS[i])['ok']
    if t ~= 'none' and t ~= expect[i] then return 'wrong_type' end
  end
end
if redis.call('ZSCORE', KEYS[1], ARGV[1]) then return 'registered' end
if redis.call('EXISTS', KEYS[2]) == 1 then return 'alive' end
if redis.call('SCARD', KEYS[3]) + redis.call('SCARD', KEYS[5]) == 0 then
  redis.call('DEL', KEYS[4], KEYS[6])
  return 'empty'
end
redis.call('ZADD', KEYS[1], 'NX', 0, ARGV[1])
return 'queued'
