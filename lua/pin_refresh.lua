#!lua
-- pin_refresh.lua: extend or re-pin one of the caller's pins, with the owner CAS. The tick
-- refreshes pins with plain PEXPIRE GT + GET (src/rooms.rs); this script runs, pipelined, for
-- the pins that GET found gone, and for every pin while restoring after Redis (or, on a
-- cluster, the pin's master) lost its data. A restore writes the room's entry in the caller's
-- room index first (on a cluster in a round trip of its own, before this script is sent:
-- index first, docs/DESIGN.md "Cross-slot order").
--
-- KEYS[1] P:room:{R}:owner
-- KEYS[2] P:room:{R}:meta
-- ARGV[1] instance id (wire form)
-- ARGV[2] pin_ttl, ms
-- ARGV[3] '1' to pin again a room whose metadata is gone too (only after Redis lost its data;
--         otherwise a room closed concurrently would be brought back), else '0'
--
-- Reply: {status, owner}; status is
--   'ok'        the pin is ours and was extended;
--   'repinned'  the pin had lapsed and nobody took the room over (metadata names us, or is gone
--               and ARGV[3] is '1'): pinned again;
--   'gone'      pin and metadata are gone (closed or reaped) and ARGV[3] is '0': nothing written;
--   'lost'      another instance owns the room now: owner = that instance. Nothing written.
--
-- Protects: owner CAS (never overwrites another instance's pin), docs/DESIGN.md "Behaviour details".
local owner = redis.call('GET', KEYS[1])
if owner == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return {'ok', ''}
end
if owner then
  return {'lost', owner}
end
local meta_owner = redis.call('HGET', KEYS[2], 'owner')
if meta_owner and meta_owner ~= ARGV[1] then
  return {'lost', meta_owner}
end
if not meta_owner and ARGV[3] ~= '1' then
  return {'gone', ''}
end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
redis.call('HSET', KEYS[2], 'owner', ARGV[1])
if not meta_owner then
  -- Metadata gone (Redis lost data): pinned now.
  local t = redis.call('TIME')
  redis.call('HSET', KEYS[2], 'pinned_ms', tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000),
    'pinned_us', t[1] .. string.format('%06d', tonumber(t[2])))
end
return {'repinned', ''}
