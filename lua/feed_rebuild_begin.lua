-- Starts rebuilding a missing inbox, unless another reader (in any process) is at it: takes the
-- rebuild lock and creates the building key (with the anchor, floor 0: deliveries alone hold
-- nothing old, and the install raises the floor to the pull's), which deliveries write into from
-- now on, so an article fanned out during the rebuild is not lost.
--
-- KEYS[1] inbox
-- KEYS[2] inbox being rebuilt
-- KEYS[3] rebuild lock
-- ARGV[1] lock token
-- ARGV[2] lock time to live in milliseconds
-- Returns 1: this caller rebuilds; 0: another rebuild holds the lock; 2: the inbox exists now.

if redis.call('EXISTS', KEYS[1]) == 1 then
  return 2
end
if not redis.call('SET', KEYS[3], ARGV[1], 'NX', 'PX', ARGV[2]) then
  return 0
end
redis.call('DEL', KEYS[2])
redis.call('ZADD', KEYS[2], -1, 0)
redis.call('PEXPIRE', KEYS[2], ARGV[2])
return 1
