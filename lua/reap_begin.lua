#!lua
-- reap_begin.lua: phase two of the two-phase reap: re-check one candidate and, if it is
-- really dead, mark it as being reaped.
--
-- KEYS[1] P:{ctl}:heartbeats
-- KEYS[2] P:{ctl}:hb:<D>
-- KEYS[3] P:{ctl}:leader
-- KEYS[4] P:{ctl}:instance:<D>:rooms           the live room index ...
-- KEYS[5] P:{ctl}:instance:<D>:reaping-rooms   ... and where the reap moves it
-- KEYS[6] P:{ctl}:instance:<D>:reaping         STRING: the token of the reap that owns it
-- KEYS[7] P:{ctl}:instance:<D>:info            HASH: D's own stale_threshold_ms, if any, and
--         the started_ms of the life that registered it
-- KEYS[8] P:{ctl}:instance:<D>:reaped          STRING, PX a day: the started_ms of the life a
--         reap of D began on
-- ARGV[1] candidate instance id (wire form)
-- ARGV[2] the leader's stale_threshold, ms: used when D has no readable record
-- ARGV[3] the calling leader's instance id (wire form)
--
-- Dead means: no heartbeat key and a sorted-set score older than D's own stale threshold
-- (server time): its record's stale_threshold_ms when that is a positive whole number (at
-- most 7 days, the largest a configuration accepts), else the leader's. So an instance is
-- reaped after the silence its own configuration tolerates, never before, whatever the
-- leader's timings (a fleet with mixed timings), as candidates.lua lists it and `status`
-- judges it.
-- A dead instance's score is set to 0, which (a) keeps it a candidate should this leader die
-- mid-reap and (b) tells the instance, should it resume, that it was reaped (heartbeat.lua).
--
-- A dead instance's room index is moved aside (RENAME, O(1)), unless a reap under way or
-- interrupted moved it already (then it stays where it is and this reap takes over the moved
-- one: a moved index never grows, so whichever reap scans it to the end has seen every
-- member). The room index reaches every record naming D (upsert_peer.lua writes records only
-- into rooms their instance owns; key schema version 2). What a new life or a zombie of D
-- indexes from now on goes to the fresh live index, which the reap never touches: no
-- per-member removal, no new-life check per batch; reap_finish.lua UNLINKs the moved index,
-- and heartbeat.lua merges it back into the live one should D register again first. KEYS[6]
-- gets this reap's token (server_us), so that only the reap that scanned the moved index
-- deletes it.
--
-- The tombstone KEYS[8] gets the started_ms of the life being reaped (from KEYS[7]; nothing when D has no
-- readable record: index_add.lua's mark of an unregistered instance), kept a day (the
-- longest pause after which a zombie is still told apart, below). heartbeat.lua answers
-- 'zombie' to that life's next heartbeat, whatever master it reaches: a reap of this very
-- life, never a registration a failover lost (docs/src/deploy/failover.md; model check).
--
-- The moved index and the token are the reaps' own keys: one holding another type (written
-- by something else: bad data) would stop every reap of D for ever, so it is deleted (counted in
-- the reply's fourth element; the reaper logs it) and the live index is moved as usual.
--
-- Reply: {status, server_ms, server_us, replaced}; status is 'dead' (reap it; server_us is t0 for the
-- room script: microseconds, so a new life's write cannot tie with it; and the
-- reap's token), 'alive' (it heartbeated again: leave it), 'gone' (not registered) or
-- 'not_leader' (the lease does not hold the caller's id: fencing, e.g. after Redis lost the
-- lease while the caller still believed it led).
--
-- Protects: pitfall "removing the two-phase re-check reaps instances that only missed a
-- heartbeat", invariants 1 and 3.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local now_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
if redis.call('GET', KEYS[3]) ~= ARGV[3] then return {'not_leader', now, now_us, 0} end
if redis.call('EXISTS', KEYS[2]) == 1 then return {'alive', now, now_us, 0} end
local score = redis.call('ZSCORE', KEYS[1], ARGV[1])
if score == false then return {'gone', now, now_us, 0} end
local threshold = tonumber(ARGV[2])
local own = redis.pcall('HGET', KEYS[7], 'stale_threshold_ms')
if type(own) == 'string' then
  local n = tonumber(string.match(own, '^%s*(%d+)%s*$') or '')
  if n and n > 0 then threshold = math.min(n, 604800000) end
end
if tonumber(score) >= now - threshold then return {'alive', now, now_us, 0} end
redis.call('ZADD', KEYS[1], 'XX', 0, ARGV[1])
local replaced = 0
local moved = redis.call('TYPE', KEYS[5]).ok
if moved ~= 'none' and moved ~= 'set' then
  redis.call('UNLINK', KEYS[5])
  replaced = 1
  moved = 'none'
end
if moved == 'none' and redis.call('TYPE', KEYS[4]).ok == 'set' then
  redis.call('RENAME', KEYS[4], KEYS[5])
end
redis.call('SET', KEYS[6], now_us)
local started = redis.pcall('HGET', KEYS[7], 'started_ms')
if type(started) == 'string' then redis.call('SET', KEYS[8], started, 'PX', 86400000) end
return {'dead', now, now_us, replaced}
