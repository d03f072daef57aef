-- lease_acquire.lua: try to become the reaper leader (SET NX PX) and start a new term.
--
-- KEYS[1] P:{ctl}:leader   STRING, PX lease_ttl: the holder's instance id
-- KEYS[2] P:{ctl}:epoch    counter: the fencing token, INCR on every successful acquire
-- ARGV[1] instance id (wire form)
-- ARGV[2] lease_ttl, ms
--
-- Reply: {1, epoch, repaired} on success, {0, holder, ''} when the lease is held, even by the
--   caller itself: a node that demoted (a refresh failed or came late) waits for its old lease
--   to expire instead of extending it, so a node that can send but not receive (a one-way
--   partition) cannot keep the lease alive forever without ever acting as leader.
--   A lease key without a TTL, or of the wrong type without a TTL, was not written by this
--   protocol and would block every election forever: it is replaced, and repaired names what
--   was there ('string' or the type). A wrong-typed key with a TTL is waited out (holder is
--   '<type>').
--
-- Protects: invariant 3 (at most one leader): the lease is only ever created when absent.
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
local epoch = redis.call('INCR', KEYS[2])
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return {1, epoch, repaired}
