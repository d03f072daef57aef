#!lua
-- pin_room.lua: make the calling instance the owner of a room.
--
-- KEYS[1] P:room:{R}:owner   STRING, PX pin_ttl: the pin
-- KEYS[2] P:room:{R}:meta    HASH: owner (second, non-expiring copy), pinned_ms, pinned_us,
--                            peer_seq
-- ARGV[1] instance id (wire form)
-- ARGV[2] pin_ttl, ms
-- ARGV[3] the owner the caller found dead (its heartbeat key is gone), or ''
--
-- Reply: {status, other}; status is
--   'pinned'     the room was free;
--   'ours'       already pinned by the caller (pin refreshed);
--   'took_over'  the pin had expired, or its owner is ARGV[3] (dead): other = previous owner;
--   'held'       another instance holds the pin: other = that owner. Nothing written.
--
-- Every successful pin writes pinned_ms and pinned_us (server time, ms and microseconds); the
-- reaper only deletes a room whose pinned_us is strictly before the start of its reap (t0, in
-- microseconds: a new life's pin cannot tie with it; a tie would count as the new life's), so a room pinned again by a resumed instance is
-- never deleted as the leftover of its previous life.
-- Protects: owner CAS (a live owner's pin is never taken), invariant 1.
local owner = redis.call('GET', KEYS[1])
local status, prev = 'pinned', ''
if owner == ARGV[1] then
  status = 'ours'
elseif owner == false then
  local meta_owner = redis.call('HGET', KEYS[2], 'owner')
  if meta_owner == ARGV[1] then
    status = 'ours'
  elseif meta_owner then
    status, prev = 'took_over', meta_owner
  end
elseif ARGV[3] ~= '' and owner == ARGV[3] then
  status, prev = 'took_over', owner
else
  return {'held', owner}
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
redis.call('HSET', KEYS[2], 'owner', ARGV[1], 'pinned_ms', now,
  'pinned_us', t[1] .. string.format('%06d', tonumber(t[2])))
return {status, prev}
