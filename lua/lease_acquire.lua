#!lua
-- lease_acquire.lua: try to become the reaper leader (SET NX PX) and start a new term.
--
-- KEYS[1] P:{ctl}:leader   STRING, PX lease_ttl: the holder's instance id
-- KEYS[2] P:{ctl}:epoch    counter: the fencing token, INCR on every successful acquire
-- KEYS[3] P:{ctl}:dataset  read only: the dataset token
-- ARGV[1] instance id (wire form)
-- ARGV[2] lease_ttl, ms
-- ARGV[3] the highest epoch this instance has seen (0 if none): after Redis lost its data the
--         counter restarts from at least it, so epochs never go backwards
--
-- Reply: {0, '<dataset new>', ''} while the dataset token is missing or younger than a lease
--   TTL (it is written as '<random>:<server ms>' by the first heartbeat after Redis started
--   empty or lost its data): a leader of the lost dataset may still act until its own
--   deadline, at most a lease TTL after the loss, so no new term starts before that.
-- {1, epoch, repaired} on success, {0, holder, ''} when the lease is held, even by the
--   caller itself: a node that demoted (a refresh failed or came late) waits for its old lease
--   to expire instead of extending it, so a node that can send but not receive (a one-way
--   partition) cannot keep the lease alive forever without ever acting as leader.
--   A lease key without a TTL, or of the wrong type without a TTL, was not written by this
--   protocol and would block every election forever: it is replaced, and repaired names what
--   was there ('string' or the type). A wrong-typed key with a TTL is waited out (holder is
--   '<type>'). An epoch key of the wrong type or holding a non-number is replaced too
--   (repaired names it), so garbage there cannot block every election forever.
--
-- Protects: invariant 3 (at most one leader): the lease is only ever created when absent.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local dataset = redis.pcall('GET', KEYS[3])
if type(dataset) ~= 'string' then return {0, '<dataset new>', ''} end
local created = tonumber(string.match(dataset, ':(%d+)$'))
if created and now - created < tonumber(ARGV[2]) then return {0, '<dataset new>', ''} end
local key_type = redis.call('TYPE', KEYS[1])['ok']
local repaired = ''
if key_type ~= 'none' then
  local pttl = redis.call('PTTL', KEYS[1])
  if key_type == 'string' then
    local cur = redis.call('GET', KEYS[1])
    if pttl >= 0 then return {0, cur, ''} end
  elseif pttl >= 0 then
    return {0, '<' .. key_type .. '>', ''}
  end
  repaired = key_type
  redis.call('DEL', KEYS[1])
end
-- The fencing counter: never below what this instance has seen, replaced if it is garbage.
local function note(what)
  if repaired == '' then repaired = what else repaired = repaired .. ',' .. what end
end
local seen = tonumber(ARGV[3]) or 0
local epoch_type = redis.call('TYPE', KEYS[2])['ok']
local current
if epoch_type == 'string' then
  current = tonumber(redis.call('GET', KEYS[2]))
  if current and current ~= math.floor(current) then current = nil end
  if current == nil then note('epoch') end
elseif epoch_type ~= 'none' then
  note('epoch ' .. epoch_type)
end
if current == nil or current < seen then
  redis.call('DEL', KEYS[2])
  redis.call('SET', KEYS[2], string.format('%d', math.max(current or 0, seen)))
end
local epoch = redis.call('INCR', KEYS[2])
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return {1, epoch, repaired}
