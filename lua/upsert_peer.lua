#!lua
-- upsert_peer.lua: write a peer record and its room indexes, removing stale entries first.
--
-- KEYS[1] P:room:{R}:peer:<p>   HASH, the peer record
-- KEYS[2] P:room:{R}:peers      SET
-- KEYS[3] P:room:{R}:guests     HASH guest -> peer
-- KEYS[4] P:room:{R}:guest-state
-- KEYS[5] P:room:{R}:owner
-- KEYS[6] P:room:{R}:meta       (peer_seq: the room's generation counter)
-- Other peer records are derived from KEYS[2] (same prefix and hash tag).
-- ARGV[1] instance id (wire form)
-- ARGV[2] peer id (wire form)
-- ARGV[3] guest id (wire form) or ''
-- ARGV[4] '' for a new generation, or the generation to write back (restoring a record after
--         Redis lost its data; the room's counter is raised to at least it)
-- ARGV[5..] host fields: name, value, name, value, ...
--
-- Steps, atomically: (1) if the record named another guest whose pointer still names this
-- peer, drop that pointer (and that guest's state); (2) if the new guest's pointer names another
-- peer (a quick reconnect with a new peer id), delete that superseded peer's record and room
-- entry; (3) write the record with a new generation from the room's counter (unique within
-- the room across all its lives, so a delayed remove of an older connection never matches).
--
-- Reply: the generation (an integer) when no peer was superseded, {generation,
-- superseded_peer} when one was, or {'not_owner', owner} when the caller does not own the room
-- (nothing written). A bare integer in the common case: Redis 7.0 checks a table reply for seven
-- special fields before it sends it, about 3,000 instructions (docs/src/performance.md).
--
-- Index. Only the owner of a room writes records into it, and a room goes into its owner's
-- room index (P:{ctl}:instance:<I>:rooms) before its pin: every record naming an instance is
-- in a room of that instance's room index (key schema version 2; docs/DESIGN.md "Schema
-- version"), so this one call in one slot is the whole join, on every topology, and no crash
-- or lost reply can leave a record that no index reaches.
--
-- Protects: invariant 4 / pitfall "upsert without removing old index entries leaves stale
-- mappings forever".
local me, peer, guest = ARGV[1], ARGV[2], ARGV[3]
local rec = redis.call('HMGET', KEYS[1], 'instance', 'guest')
local old_guest = rec[2]
local owner = redis.call('GET', KEYS[5])
if owner ~= me then
  local meta_owner = redis.call('HGET', KEYS[6], 'owner')
  if owner or meta_owner ~= me then
    return {'not_owner', owner or meta_owner or ''}
  end
end
local t = redis.call('TIME')
-- The write's times as strings built from TIME's own digits: a Lua number passed to
-- redis.call is formatted with snprintf('%.17g') on Redis 7.0, which cost about 3,000
-- instructions per number, 5 % of a join and leave (callgrind, docs/src/performance.md).
local us6 = string.rep('0', 6 - #t[2]) .. t[2]
local now_us = t[1] .. us6
local now_ms = t[1] .. string.sub(us6, 1, 3)
if old_guest and old_guest ~= '' and old_guest ~= guest
    and redis.call('HGET', KEYS[3], old_guest) == peer then
  redis.call('HDEL', KEYS[3], old_guest)
  redis.call('HDEL', KEYS[4], old_guest)
end
local sup = ''
-- HSETNX: a guest with no pointer yet (nearly every join) is one call; a pointer that exists is
-- read, and if it names another peer, that peer is superseded and the pointer moves here.
if guest ~= '' and redis.call('HSETNX', KEYS[3], guest, peer) == 0 then
  local cur = redis.call('HGET', KEYS[3], guest)
  if cur and cur ~= peer then
    local sup_rec = string.sub(KEYS[2], 1, -6) .. 'peer:' .. cur
    sup = cur
    redis.call('DEL', sup_rec)
    redis.call('SREM', KEYS[2], cur)
    redis.call('HSET', KEYS[3], guest, peer)
  end
end
local gen
if ARGV[4] == '' then
  -- The room's counter starts at the server time in microseconds, so generations keep
  -- growing across lives of the room (closed or reaped, then pinned again): a late remove of
  -- a connection from an earlier life can never match a new record.
  gen = redis.call('HINCRBY', KEYS[6], 'peer_seq', '1')
  if gen == 1 then
    gen = redis.call('HINCRBY', KEYS[6], 'peer_seq', now_us)
  end
else
  gen = tonumber(ARGV[4])
  if (tonumber(redis.call('HGET', KEYS[6], 'peer_seq')) or 0) < gen then
    redis.call('HSET', KEYS[6], 'peer_seq', gen)
  end
end
if rec[1] or rec[2] then
  -- The earlier record's host fields go with it.
  redis.call('DEL', KEYS[1])
end
redis.call('HSET', KEYS[1], 'instance', me, 'guest', guest, 'generation', string.format('%d', gen),
  'updated_ms', now_ms, 'updated_us', now_us, unpack(ARGV, 5))
redis.call('SADD', KEYS[2], peer)
if sup == '' then
  return gen
end
return {gen, sup}
