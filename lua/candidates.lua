#!lua flags=no-writes
-- candidates.lua: instances whose last heartbeat is older than their own stale threshold, on
-- server time (phase one of the two-phase reap; candidates are not yet dead).
--
-- KEYS[1] P:{ctl}:heartbeats      a member I's record P:{ctl}:instance:<I>:info is derived
--                                 from it (same prefix, same {ctl} tag)
-- ARGV[1] the caller's stale_threshold, ms: used for a member without a readable record
-- ARGV[2] at most this many candidates
-- ARGV[3] floor, ms: the shortest stale threshold the caller knows of in the fleet's records
--         (at most ARGV[1]); only members older than it (or older than the shortest one found
--         in this call's walk page) have their record read
-- ARGV[4] cursor of the record walk (ZSCAN of KEYS[1]; '0' starts a pass)
-- ARGV[5] members per walk page (ZSCAN COUNT)
-- ARGV[6] at most this many members older than the floor are examined
--
-- A member's own threshold is its record's stale_threshold_ms when that is a positive whole
-- number (at most 7 days, the largest a configuration accepts); else ARGV[1]. A member is a
-- candidate when its score is 0 (a reap began) or older than now minus its own threshold:
-- what `status` calls stale, judged with the same records.
--
-- Cost (bounded whatever the fleet's size): one walk page of records (ARGV[5]; the caller
-- keeps the shortest threshold of its last pass, so that a short-threshold instance is
-- listed in time even when it registered after the walk passed it), then the members older
-- than the floor, oldest first, at most ARGV[6]. In a fleet of one set of timings the floor
-- is the caller's threshold: only stale members are read, as before records were consulted.
--
-- Reply: {server_ms, {instance, ...}, next_cursor, page_min}: candidates in wire form, oldest
-- first; the walk's next cursor ('0': the pass ended); the shortest threshold found in the
-- walk page, ms (0 if none).
--
-- Protects: invariant 1 (never listed before the silence its own configuration tolerates; the
-- re-check, reap_begin.lua, decides), "server time only", bounded reads.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local fallback = tonumber(ARGV[1])
local max = tonumber(ARGV[2])
local budget = tonumber(ARGV[6])

-- 'P:{ctl}:' (KEYS[1] without 'heartbeats'): the base of the instance records.
local base = string.sub(KEYS[1], 1, -11) .. 'instance:'

-- The record's stale_threshold_ms, or nil (no record, another type, not a positive number).
local function own(member)
  local v = redis.pcall('HGET', base .. member .. ':info', 'stale_threshold_ms')
  if type(v) ~= 'string' then return nil end
  local n = tonumber(string.match(v, '^%s*(%d+)%s*$') or '')
  if not n or n <= 0 then return nil end
  return math.min(n, 604800000)
end

local walked = redis.call('ZSCAN', KEYS[1], ARGV[4], 'COUNT', tonumber(ARGV[5]))
local page_min = 0
local members = walked[2]
for i = 1, #members, 2 do
  local n = own(members[i])
  if n and (page_min == 0 or n < page_min) then page_min = n end
end

local floor = math.min(tonumber(ARGV[3]), fallback)
if page_min > 0 and page_min < floor then floor = page_min end

local out = {}
local offset = 0
local page = 256
while #out < max and offset < budget do
  local got = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', '(' .. (now - floor), 'WITHSCORES',
    'LIMIT', offset, math.min(page, budget - offset))
  for i = 1, #got, 2 do
    local score = tonumber(got[i + 1])
    if score == 0 or score < now - (own(got[i]) or fallback) then
      out[#out + 1] = got[i]
      if #out >= max then break end
    end
  end
  offset = offset + #got / 2
  if #got / 2 < page then break end
end
return {now, out, walked[1], page_min}
