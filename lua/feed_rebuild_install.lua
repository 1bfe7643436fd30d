-- Finishes a rebuild: adds the pulled ids to the building key (which may hold deliveries made
-- meanwhile), sets the floor (see `feed_read.lua`) to the pull's (0 when it was the whole history),
-- drops what lies below it, trims to the cap (raising the floor to the lowest member kept) and
-- renames the building key onto the inbox in one step, so no reader ever sees a half-built
-- timeline. Does nothing unless the caller still holds the lock and the building key still exists:
-- a follow or unfollow meanwhile deletes it (`feed_merge.lua`), since the pull may have read the
-- follow graph before that change; the caller then starts over.
--
-- KEYS[1] inbox
-- KEYS[2] inbox being rebuilt
-- KEYS[3] rebuild lock
-- ARGV[1] lock token
-- ARGV[2] inbox time to live in milliseconds
-- ARGV[3] cap
-- ARGV[4] floor of the pulled ids: 0 when they are the followees' whole history
-- ARGV[5..] article ids
-- Returns 1 when installed, 0 when the lock was lost, 2 when the building key was deleted (the
-- lock is released: start over).

if redis.call('GET', KEYS[3]) ~= ARGV[1] then
  return 0
end
if redis.call('EXISTS', KEYS[2]) == 0 then
  redis.call('DEL', KEYS[3])
  return 2
end
local head = redis.call('ZRANGE', KEYS[2], 0, 0, 'WITHSCORES')
local floor = math.max(-tonumber(head[2]) - 1, tonumber(ARGV[4]))
for i = 5, #ARGV, 500 do
  local args = {}
  for j = i, math.min(i + 499, #ARGV) do
    args[#args + 1] = ARGV[j]
    args[#args + 1] = ARGV[j]
  end
  redis.call('ZADD', KEYS[2], unpack(args))
end
if floor > 0 then
  redis.call('ZREMRANGEBYSCORE', KEYS[2], '(0', string.format('(%d', floor))
end
local excess = redis.call('ZCARD', KEYS[2]) - 1 - tonumber(ARGV[3])
if excess > 0 then
  redis.call('ZREMRANGEBYRANK', KEYS[2], 1, excess)
  floor = math.max(floor, tonumber(redis.call('ZRANGE', KEYS[2], 1, 1)[1]))
end
redis.call('ZADD', KEYS[2], string.format('%d', -floor - 1), 0)
redis.call('RENAME', KEYS[2], KEYS[1])
redis.call('PEXPIRE', KEYS[1], ARGV[2])
redis.call('DEL', KEYS[3])
return 1
