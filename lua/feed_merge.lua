-- Brings one followee's articles into a reader's inbox, or takes them out: a follow's backfill, an
-- unfollow, a celebrity who fell below the threshold (their articles were merged at read time and
-- never fanned out), `pulse rebuild feed`'s repair.
--
-- The inbox holds every article of the reader's followees from its floor up (see
-- `feed_read.lua`: the anchor member `0` scored -(floor + 1), or 0 for "the lowest member").
-- Added ids are exact from their own floor up, so the inbox's floor rises to the higher of the
-- two, and what lies below it leaves: a backfill that could not take all of a followee's articles
-- above the old floor leaves reads below the new one to SQL, never a hole. Trimming to the cap
-- raises the floor to the lowest member kept.
--
-- Without an inbox, a rebuild may be under way, whose pull may have read the follow graph before
-- this change: its building key is deleted, so the rebuild starts over (see
-- `feed_rebuild_install.lua`).
--
-- KEYS[1] inbox
-- KEYS[2] inbox being rebuilt
-- ARGV[1] "add" or "remove"
-- ARGV[2] cap
-- ARGV[3] floor of the ids (add: 0 when they are the followee's whole history)
-- ARGV[4..] article ids
-- Returns 1 when the inbox was changed, 2 when a rebuild was sent back to start, 0 when the
-- reader has neither (inactive: nothing to do).

if redis.call('EXISTS', KEYS[1]) == 0 then
  if redis.call('DEL', KEYS[2]) == 1 then
    return 2
  end
  return 0
end

if ARGV[1] == 'remove' then
  for i = 4, #ARGV, 500 do
    redis.call('ZREM', KEYS[1], unpack(ARGV, i, math.min(i + 499, #ARGV)))
  end
  return 1
end

local head = redis.call('ZRANGE', KEYS[1], 0, 1, 'WITHSCORES')
local anchor = tonumber(head[2])
local floor
if anchor < 0 then
  floor = -anchor - 1
else
  floor = tonumber(head[3] or '4503599627370496')
end
floor = math.max(floor, tonumber(ARGV[3]))

for i = 4, #ARGV, 500 do
  local args = {}
  for j = i, math.min(i + 499, #ARGV) do
    if tonumber(ARGV[j]) >= floor then
      args[#args + 1] = ARGV[j]
      args[#args + 1] = ARGV[j]
    end
  end
  if #args > 0 then
    redis.call('ZADD', KEYS[1], unpack(args))
  end
end
if floor > 0 then
  redis.call('ZREMRANGEBYSCORE', KEYS[1], '(0', string.format('(%d', floor))
end
local excess = redis.call('ZCARD', KEYS[1]) - 1 - tonumber(ARGV[2])
if excess > 0 then
  redis.call('ZREMRANGEBYRANK', KEYS[1], 1, excess)
  floor = math.max(floor, tonumber(redis.call('ZRANGE', KEYS[1], 1, 1)[1]))
end
redis.call('ZADD', KEYS[1], string.format('%d', -floor - 1), 0)
return 1
