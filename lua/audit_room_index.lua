#!lua
-- audit_room_index.lua: the audit's (fsck --repair) fix of one room-slot index entry, re-checked
-- atomically right before it is changed.
--
-- KEYS[1] P:room:{R}:peer:<p>   HASH, the peer record the entry is about
-- KEYS[2] P:room:{R}:peers      SET
-- KEYS[3] P:room:{R}:guests     HASH guest -> peer
-- KEYS[4] P:room:{R}:guest-state
-- ARGV[1] mode:
--   'drop_peer'   remove peer p from the room's peers set if its record does not exist;
--   'add_peer'    add peer p to the room's peers set if its record exists and has an instance;
--   'drop_guest'  remove guest g's pointer (and its state, which goes with the pointer) if it
--                 still names p and p's record is missing or names another guest;
--   'add_guest'   point guest g at p if g has no pointer and p's record names guest g.
-- ARGV[2] peer id p (wire form)
-- ARGV[3] guest id g (wire form; '' for the peer modes)
--
-- Reply: status
--   'fixed'       the entry was removed or added;
--   'gone'        nothing to do any more: the problem went away meanwhile;
--   'changed'     the data changed in a way the fix does not cover (e.g. the guest now points
--                 at another peer): nothing written;
--   'malformed'   the record exists but has no instance field: nothing written;
--   'wrong_type'  one of the keys holds the wrong type: nothing written (never repaired).
--
-- Protects: invariant 4 (each room index holds exactly what the peer records say), without
-- ever destroying live data: removals only happen while the record is still missing (record
-- and room indexes share this slot, so the check and the write are one atomic step), additions
-- only point at a record that exists.
local expect = {'hash', 'set', 'hash', 'hash'}
for i = 1, 4 do
  local t = redis.call('TYPE', KEYS[i])['ok']
  if t ~= 'none' and t ~= expect[i] then return 'wrong_type' end
end
local mode, peer, guest = ARGV[1], ARGV[2], ARGV[3]
if mode == 'drop_peer' then
  if redis.call('EXISTS', KEYS[1]) == 1 then return 'gone' end
  if redis.call('SREM', KEYS[2], peer) == 1 then return 'fixed' end
  return 'gone'
elseif mode == 'add_peer' then
  if redis.call('EXISTS', KEYS[1]) == 0 then return 'gone' end
  if redis.call('HGET', KEYS[1], 'instance') == false then return 'malformed' end
  if redis.call('SADD', KEYS[2], peer) == 1 then return 'fixed' end
  return 'gone'
elseif mode == 'drop_guest' then
  if redis.call('HGET', KEYS[3], guest) ~= peer then return 'gone' end
  if redis.call('HGET', KEYS[1], 'guest') == guest then return 'gone' end
  redis.call('HDEL', KEYS[3], guest)
  redis.call('HDEL', KEYS[4], guest)
  return 'fixed'
elseif mode == 'add_guest' then
  if redis.call('HGET', KEYS[1], 'guest') ~= guest then return 'gone' end
  local cur = redis.call('HGET', KEYS[3], guest)
  if cur == peer then return 'gone' end
  if cur then return 'changed' end
  redis.call('HSET', KEYS[3], guest, peer)
  return 'fixed'
end
return redis.error_reply('audit_room_index.lua: unknown mode ' .. tostring(mode))
