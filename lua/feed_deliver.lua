-- Delivers one article into one follower's timeline, if the follower is active: an inbox (or an
-- inbox being rebuilt) exists. Idempotent: an article already there changes nothing and is not
-- announced again. Trims to the cap on every write; trimming drops the "no more" sentinel, since
-- SQL then holds items the inbox does not. Announces the article on the follower's channel only
-- when it was added, stayed within the cap, and the follower is online.
--
-- KEYS[1] inbox         sorted set, anchor member 0 plus up to cap article ids (score = id)
-- KEYS[2] inbox being rebuilt (receives the article when the inbox does not exist yet)
-- KEYS[3] no-more sentinel
-- KEYS[4] online marker
-- ARGV[1] article id
-- ARGV[2] cap
-- ARGV[3] channel to announce on ("" for none)
-- Returns 0: follower inactive or article there already; 1: added; 2: added and announced.

local target = KEYS[1]
if redis.call('EXISTS', target) == 0 then
  target = KEYS[2]
  if redis.call('EXISTS', target) == 0 then
    return 0
  end
end
local id = ARGV[1]
if redis.call('ZADD', target, id, id) == 0 then
  return 0
end
local excess = redis.call('ZCARD', target) - 1 - tonumber(ARGV[2])
if excess > 0 then
  -- Rank 0 is the anchor; the lowest ids above it go.
  redis.call('ZREMRANGEBYRANK', target, 1, excess)
  redis.call('DEL', KEYS[3])
  if not redis.call('ZSCORE', target, id) then
    return 0
  end
end
if ARGV[3] ~= '' and redis.call('EXISTS', KEYS[4]) == 1 then
  redis.call('PUBLISH', ARGV[3], id)
  return 2
end
return 1
