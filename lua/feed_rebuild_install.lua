-- Finishes a rebuild: adds the pulled ids to the building key (which may hold deliveries made
-- meanwhile), trims it to the cap and renames it onto the inbox in one step, so no reader ever
-- sees a half-built timeline. Sets the "no more" sentinel when the pull was the whole history
-- and nothing was trimmed. Does nothing unless the caller still holds the lock.
--
-- KEYS[1] inbox
-- KEYS[2] inbox being rebuilt
-- KEYS[3] rebuild lock
-- KEYS[4] no-more sentinel
-- ARGV[1] lock token
-- ARGV[2] inbox time to live in milliseconds
-- ARGV[3] cap
-- ARGV[4] 1 when the pulled ids are the whole history, else 0
-- ARGV[5..] article ids
-- Returns 1 when installed, 0 when the lock was lost.

if redis.call('GET', KEYS[3]) ~= ARGV[1] or redis.call('EXISTS', KEYS[2]) == 0 then
  return 0
end
for i = 5, #ARGV, 500 do
  local args = {}
  for j = i, math.min(i + 499, #ARGV) do
    args[#args + 1] = ARGV[j]
    args[#args + 1] = ARGV[j]
  end
  redis.call('ZADD', KEYS[2], unpack(args))
end
local complete = ARGV[4] == '1'
local excess = redis.call('ZCARD', KEYS[2]) - 1 - tonumber(ARGV[3])
if excess > 0 then
  redis.call('ZREMRANGEBYRANK', KEYS[2], 1, excess)
  complete = false
end
redis.call('RENAME', KEYS[2], KEYS[1])
redis.call('PEXPIRE', KEYS[1], ARGV[2])
if complete then
  redis.call('SET', KEYS[4], '1', 'PX', ARGV[2])
else
  redis.call('DEL', KEYS[4])
end
redis.call('DEL', KEYS[3])
return 1
