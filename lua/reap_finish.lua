#!lua
-- reap_finish.lua: end the reap of an instance.
--
-- KEYS[1] P:{ctl}:heartbeats
-- KEYS[2] P:{ctl}:hb:<D>
-- KEYS[3] P:{ctl}:instance:<D>:rooms
-- KEYS[4] P:{ctl}:instance:<D>:reaping-rooms   the room index reap_begin.lua moved aside
-- KEYS[5] P:{ctl}:instance:<D>:reaping         the token of the reap that owns it
-- KEYS[6] P:{ctl}:instance:<D>:info (deleted with the sorted-set entry)
-- ARGV[1] instance id (wire form)
-- ARGV[2] how many index members (rooms) the reap kept because they were written after t0 by the
--         same instance id (a new life that has not registered yet)
-- ARGV[3] this reap's token (reap_begin.lua's server_us)
-- ARGV[4] how many distinct members this reap put back into the live index (KEYS[3]) just
--         before this call: those it could not reap (bad data) and those it kept
--
-- First, if KEYS[5] holds this reap's token, the moved index is deleted (UNLINK: freed off
-- the main thread): this reap scanned it to the end, and every member it did not reap is
-- back in the live index. Another reap's token (a reap that began later, or an operator's
-- `sfu-redis reap` beside a leader) leaves it to that reap.
--
-- Reply: {status, rooms_left}; status is
--   'done'        nothing left: the sorted-set entry (score 0) is removed;
--   'incomplete'  members remain that could not be reaped (bad data, reported by the
--                 reaper): the entry is removed all the same, so a broken record does not make
--                 every later round re-reap the instance; the audit (fsck) reports what is left;
--   'alive'       the instance registered again meanwhile (new life): nothing else touched
--                 (its registration merged whatever was still moved aside into its index);
--   'retry'       the entry keeps score 0 so the next round reaps what is left: members written
--                 after t0 were kept (ARGV[2] > 0), the live index holds more than this reap
--                 put back (written after the index was moved, by a zombie that has not
--                 noticed the reap yet), or another reap owns a moved index that still exists.
--
-- Protects: invariant 2 (the instance itself is gone; leftovers are reported, not hidden) and
-- invariant 4 (no index member is dropped that no reap has looked at).
local token = redis.pcall('GET', KEYS[5])
local mine = type(token) ~= 'table' and token == ARGV[3]
if mine then redis.call('UNLINK', KEYS[4], KEYS[5]) end
if redis.call('EXISTS', KEYS[2]) == 1 then return {'alive', 0} end
local score = redis.call('ZSCORE', KEYS[1], ARGV[1])
if score and tonumber(score) ~= 0 then return {'alive', 0} end
if tonumber(ARGV[2]) > 0 then return {'retry', 0} end
if not mine and redis.call('EXISTS', KEYS[4], KEYS[5]) > 0 then
  return {'retry', 0}
end
local rooms = redis.call('SCARD', KEYS[3])
if rooms > tonumber(ARGV[4]) then return {'retry', rooms} end
redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('DEL', KEYS[6])
if rooms > 0 then return {'incomplete', rooms} end
return {'done', 0}
