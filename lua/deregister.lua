#!lua
-- deregister.lua: an instance's registration ends (`Node::leave`, once its rooms are closed
-- and its records removed).
--
-- KEYS[1] P:{ctl}:heartbeats
-- KEYS[2] P:{ctl}:hb:<I>
-- KEYS[3] P:{ctl}:instance:<I>:info
-- KEYS[4] P:{ctl}:instance:<I>:rooms           its live room index
-- KEYS[5] P:{ctl}:instance:<I>:reaping-rooms   its room index as a reap moved it aside
-- KEYS[6] P:{ctl}:instance:<I>:reaping         the token of a reap of I under way
-- ARGV[1] I, the leaving instance (wire form)
--
-- The heartbeat key and the info hash are deleted. If either room index or a reap's token
-- still exists, I is handed to the reaper: its score is set to 0 ("being reaped"), so a leader lists it and
-- reaps what the indexes reach. Otherwise its sorted-set entry is removed.
-- Two cases keep an index: a reap of I is under way (I was reaped while paused, then left
-- before its tick noticed: the leave walked only the live index, and the reap needs its
-- score-0 mark to be listed again after it puts kept rooms back), or the leave left entries
-- (a room held again, bad data). Removing the entry then left those rooms where no leader
-- ever looks (model check, finding 3). A token alone (a reap under way of an instance with
-- no rooms) keeps the mark too: the reap's end deletes the token and the entry; without the
-- mark a reap whose leader died left the token where nothing lists it.
--
-- Reply: 'handed' (score 0, the indexes left to the reaper) or 'gone' (entry removed).
--
-- Protects: invariant 2 (nothing an index still reaches is hidden from every reaper).
redis.call('DEL', KEYS[2])
redis.call('DEL', KEYS[3])
if redis.call('EXISTS', KEYS[4], KEYS[5], KEYS[6]) > 0 then
  redis.call('ZADD', KEYS[1], 0, ARGV[1])
  return 'handed'
end
redis.call('ZREM', KEYS[1], ARGV[1])
return 'gone'
