#!lua
-- heartbeat.lua: record that an instance is alive, on Redis server time.
--
-- KEYS[1] P:{ctl}:heartbeats   ZSET instance -> last heartbeat (server ms); 0 = being reaped
-- KEYS[2] P:{ctl}:hb:<I>       STRING, PX heartbeat_ttl: the boot token of the live process
-- KEYS[3] P:{ctl}:dataset      STRING, the dataset token
-- KEYS[4] P:{ctl}:epoch        the last fencing token handed out
-- KEYS[5] P:{ctl}:instance:<I>:info  HASH, how the instance describes itself (src/info.rs)
-- KEYS[6] P:{ctl}:instance:<I>:rooms           its room index ...
-- KEYS[7] P:{ctl}:instance:<I>:reaping-rooms   ... as a reap of an earlier life moved it
-- KEYS[8] P:{ctl}:instance:<I>:reaping         aside (reap_begin.lua), and that reap's token
-- KEYS[9] P:{ctl}:schema      STRING, the key schema version the prefix is laid out in
-- KEYS[10] P:{ctl}:instance:<I>:reaped         STRING: the started_ms of the life a reap of I
--          began on (reap_begin.lua, reap_force_begin.lua)
-- ARGV[1] instance id (wire form)
-- ARGV[2] heartbeat_ttl, ms
-- ARGV[3] 'register' (first heartbeat of a life) or 'tick'
-- ARGV[4] the dataset token this instance saw last ('' if none)
-- ARGV[5] a fresh random value; if the dataset token is missing it is written as
--         '<value>:<server ms>' (lease_acquire.lua waits a lease TTL after that time)
-- ARGV[6] this process's boot token (random per Node::start); a key holding 'released' was
--         left by a graceful stop (heartbeat_release.lua) and is free to register over
-- ARGV[7] the highest epoch this instance has seen: written back if the counter is lower (it
--         was lost with Redis's data), so the next term's epoch is higher than every term any
--         live instance knows of (a new lease is only granted a lease TTL after the dataset
--         was re-created, by when every live instance has heartbeated)
-- ARGV[8] server ms this life started at ('0' if not known yet): the info's started_ms. At
--         'register' the caller passes its clean-up boundary t0 (heartbeat.rs `register`:
--         rooms and records written from then on are this life's), at or just before now
-- ARGV[9] the key schema version this release speaks (keys.rs SCHEMA_VERSION)
-- ARGV[10] how many peers this instance holds now ('' on 'register'): written to the info's
--          `peers` field on every heartbeat (`sfu-redis status` shows it; key schema version 2
--          keeps no per-instance peer index to count)
-- ARGV[11..] the info's other fields, name and value pairs
--
-- The info hash is written (whole, replacing what was there) at 'register', after Redis lost
-- its data ('restored'), and whenever a heartbeat finds it missing, of another type, or
-- naming another life (its started_ms is not ARGV[8], when ARGV[8] is not '0': a master that
-- never saw this life's registration kept an earlier life's record); its started_ms is
-- ARGV[8], or this call's server time when ARGV[8] is '0'. reap_begin.lua copies it into the
-- tombstone KEYS[10], so it must name the life the sorted-set entry is. 'register' and 'restored'
-- delete KEYS[10] (a new registration, nothing reaped).
-- It goes with the registration: reap_finish.lua and Node::leave delete it.
--
-- At 'register', a room index a reap of an earlier life moved aside (a reap under way, or one
-- a leader left unfinished) is merged back into the live index and the reap's token deleted:
-- the new life's clean-up of its earlier life (heartbeat.rs, `register`) then sees every
-- member, and a reap still running ends as 'alive' without deleting anything of this life.
-- Before that, KEYS[6] or KEYS[7] holding another type than a set (bad data: the library only
-- ever writes sets there) is deleted and counted in `replaced`, as reap_begin.lua does with
-- the moved indexes: otherwise the clean-up and every pin of the new life would fail on it
-- (WRONGTYPE). Rooms such a key may have listed are left for the audit (unindexed rooms).
--
-- Schema version. KEYS[9] missing is written as ARGV[9] (a new prefix, a Redis that lost its
-- data), on 'register' and 'tick' alike; a value of another type is bad data, replaced the
-- same way (schema_replaced 1). A missing KEYS[9] beside an existing dataset token (KEYS[3])
-- is a prefix written by a release from before versions existed: its layout is version 1, so
-- a registration reads it as '1'; a running node's 'tick' writes the stamp back (an operator
-- deleted it). A KEYS[9] naming another version refuses a registration, and a tick that would
-- re-register ('restored': Redis lost its data) alike: nothing is written. On a plain 'tick'
-- a mismatch (the prefix was migrated under a running node) does not stop the heartbeat,
-- which keeps this node's rooms alive; the caller reports it.
--
-- Reply: {status, server_ms, token, epoch, server_us, replaced, schema, schema_replaced};
-- replaced is the number of index keys of another type deleted at 'register' (0 otherwise);
-- schema is what KEYS[9] holds after this call (its first 80 bytes: whatever was left there,
-- the reply stays small); status is
--   'ok'        heartbeat written;
--   'restored'  this instance was missing, or at score 0, and the dataset token is gone or
--               changed: Redis lost its data, so the instance registered again (the caller
--               restores its pins/peers). Score 0 under a token this instance never saw,
--               with no reap of it under way (KEYS[8] absent), is the mark index_add.lua set
--               when the instance wrote its index between the loss and this tick (or fsck's
--               hand-over of its leftovers), not a reap of its registration. Once a reap
--               began (KEYS[8] holds its token), the instance was silent through a
--               two-phase wait after the loss: 'reaped', as for any zombie (the reap's t0
--               would otherwise delete rooms of a life that goes on: model check);
--   'reaped'    this instance is being reaped (score 0) and the token is unchanged: a leader
--               found it stale, or index_add.lua / deregister.lua handed it over. Nothing is
--               written; the caller reports its rooms lost and registers again as a fresh life
--               (unless, as for 'missing' below, its registration was never acknowledged and
--               this is another master);
--   'zombie'    as 'reaped' or 'missing', and KEYS[10] names this very life (ARGV[8], not
--               '0'): a reap of it began, on this master or on one this master replicated.
--               The caller handles it as 'reaped' even when its registration was never
--               acknowledged and this is another master: a failover did not lose it, a reap
--               took it (without KEYS[10] the two look alike: the price the lost-registration
--               rule used to pay, docs/src/deploy/failover.md; model check);
--   'missing'   this instance is missing and the token is unchanged. Nothing is written. A
--               leader reaped it (handled as 'reaped'), unless no replica has acknowledged
--               its registration yet: then a failover promoted a replica that never got the
--               registration, and the caller registers again and restores what it holds;
--   'duplicate' on 'register': another live process (another boot token) holds this
--               instance id's heartbeat key. Nothing written; the caller must not start.
--               On 'tick' a foreign boot token is overwritten and reported the same way;
--   'schema'    KEYS[9] names another version than ARGV[9], on 'register' or on a 'tick'
--               that would re-register. Nothing written; the caller must not start (or, on a
--               tick, stops writing until a registration succeeds again).
--
-- Protects: invariant 1 (server time only, so clock skew cannot make a live instance look
-- stale) and the zombie rule (a reaped instance never silently writes itself back).
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local now_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
-- Reads that tolerate a key of the wrong type (bad data must not stop the heartbeat: the
-- writes below replace such a key).
local function get(key)
  local v = redis.pcall('GET', key)
  if type(v) == 'table' then return false end
  return v
end
local token = get(KEYS[3])
local epoch = get(KEYS[4])
if not epoch or tonumber(epoch) == nil then epoch = '0' end
local holder = get(KEYS[2])
local schema = get(KEYS[9])
local schema_replaced = 0
if not schema and redis.call('TYPE', KEYS[9]).ok ~= 'none' then schema_replaced = 1 end
-- No stamp but a dataset token: the prefix holds data of a release from before versions,
-- laid out in version 1.
local implied = false
if not schema and schema_replaced == 0 and token then schema, implied = '1', true end
local shown = schema and string.sub(schema, 1, 80) or ''
local foreign = schema and schema ~= ARGV[9]
if ARGV[3] == 'register' and foreign then
  return {'schema', now, token or '', epoch, now_us, 0, shown, 0}
end
if ARGV[3] == 'register' and holder and holder ~= ARGV[6] and holder ~= 'released' then
  return {'duplicate', now, token or '', epoch, now_us, 0, shown, 0}
end
local status = 'ok'
if ARGV[3] ~= 'register' then
  local score = redis.call('ZSCORE', KEYS[1], ARGV[1])
  -- KEYS[10] naming this life: a reap of it began ('zombie').
  local function taken()
    return ARGV[8] ~= '0' and get(KEYS[10]) == ARGV[8]
  end
  if score == false then
    if token and token == ARGV[4] then
      if taken() then return {'zombie', now, token, epoch, now_us, 0, shown, 0} end
      return {'missing', now, token, epoch, now_us, 0, shown, 0}
    end
    if foreign then
      return {'schema', now, token or '', epoch, now_us, 0, shown, 0}
    end
    status = 'restored'
  elseif tonumber(score) == 0 then
    if (token and token == ARGV[4]) or redis.call('EXISTS', KEYS[8]) == 1 then
      if taken() then return {'zombie', now, token or '', epoch, now_us, 0, shown, 0} end
      return {'reaped', now, token or '', epoch, now_us, 0, shown, 0}
    end
    if foreign then
      return {'schema', now, token or '', epoch, now_us, 0, shown, 0}
    end
    status = 'restored'
  end
end
if not schema or implied then
  redis.call('DEL', KEYS[9])
  redis.call('SET', KEYS[9], ARGV[9])
  shown = ARGV[9]
end
if not token then
  token = ARGV[5] .. ':' .. string.format('%d', now)
  redis.call('DEL', KEYS[3])
  redis.call('SET', KEYS[3], token)
end
-- On 'tick' only: at 'register' the one holder left here is 'released' (checked above), which
-- is free to register over (reporting it as a duplicate made a restart wait an interval).
if status == 'ok' and ARGV[3] ~= 'register' and holder and holder ~= ARGV[6] then
  status = 'duplicate'
end
if tonumber(ARGV[7]) > tonumber(epoch) then
  redis.call('DEL', KEYS[4])
  redis.call('SET', KEYS[4], ARGV[7])
  epoch = ARGV[7]
end
redis.call('ZADD', KEYS[1], now, ARGV[1])
redis.call('SET', KEYS[2], ARGV[6], 'PX', ARGV[2])
local replaced = 0
if ARGV[3] == 'register' then
  for i = 6, 7 do
    local kind = redis.call('TYPE', KEYS[i]).ok
    if kind ~= 'set' and kind ~= 'none' then
      redis.call('UNLINK', KEYS[i])
      replaced = replaced + 1
    end
  end
  local live = redis.call('TYPE', KEYS[6]).ok
  if redis.call('TYPE', KEYS[7]).ok == 'set' and (live == 'set' or live == 'none') then
    redis.call('SUNIONSTORE', KEYS[6], KEYS[6], KEYS[7])
    redis.call('UNLINK', KEYS[7])
  end
  redis.call('DEL', KEYS[8])
end
if ARGV[3] == 'register' or status == 'restored' then redis.call('DEL', KEYS[10]) end
local stale_info = ARGV[8] ~= '0' and redis.pcall('HGET', KEYS[5], 'started_ms') ~= ARGV[8]
if ARGV[3] == 'register' or status == 'restored' or stale_info
    or redis.call('TYPE', KEYS[5]).ok ~= 'hash' then
  local started = ARGV[8]
  if started == '0' then started = string.format('%d', now) end
  redis.call('DEL', KEYS[5])
  redis.call('HSET', KEYS[5], 'started_ms', started, unpack(ARGV, 11))
end
if ARGV[10] ~= '' then redis.call('HSET', KEYS[5], 'peers', ARGV[10]) end
return {status, now, token, epoch, now_us, replaced, shown, schema_replaced}
