-- Delivers articles into the timelines of several followers at once, each only if that follower is
-- active: their inbox (or an inbox being rebuilt) exists. One call serves a whole fan-out chunk, so
-- the call's own cost is paid once per chunk, not once per inbox; every follower of a call is in one
-- feed shard, so its keys share one hash tag.
--
-- Idempotent: an article already in an inbox changes nothing and is not announced again. Trims to
-- the cap on every write; trimming drops the "no more" sentinel, since SQL then holds items the
-- inbox does not. Announces an article on the follower's channel only when it was added, stayed
-- within the cap, and the follower is online.
--
-- KEYS[4i-3..4i] follower i's inbox (sorted set: anchor member 0 plus up to cap article ids, score =
--                id), inbox being rebuilt (receives the articles when the inbox does not exist yet),
--                no-more sentinel, online marker
-- ARGV[1] cap
-- ARGV[2] n, the number of articles
-- ARGV[3..2+n] article ids
-- ARGV[3+n..] follower i's channel to announce on ("" for none), one per follower
-- Returns {articles added (and kept within the cap), counted per inbox; of those, announced}.

local cap = tonumber(ARGV[1])
local n = tonumber(ARGV[2])
local added, announced = 0, 0

for f = 1, #KEYS / 4 do
  local base = 4 * (f - 1)
  local target = KEYS[base + 1]
  if redis.call('EXISTS', target) == 0 then
    target = KEYS[base + 2]
    if redis.call('EXISTS', target) == 0 then
      target = nil
    end
  end
  if target then
    local new = {}
    for a = 3, 2 + n do
      if redis.call('ZADD', target, ARGV[a], ARGV[a]) == 1 then
        new[#new + 1] = ARGV[a]
      end
    end
    local excess = #new > 0 and redis.call('ZCARD', target) - 1 - cap or 0
    if excess > 0 then
      -- Rank 0 is the anchor; the lowest ids above it go, perhaps some just added.
      redis.call('ZREMRANGEBYRANK', target, 1, excess)
      redis.call('DEL', KEYS[base + 3])
      local kept = {}
      for _, id in ipairs(new) do
        if redis.call('ZSCORE', target, id) then
          kept[#kept + 1] = id
        end
      end
      new = kept
    end
    added = added + #new
    local channel = ARGV[2 + n + f]
    if #new > 0 and channel ~= '' and redis.call('EXISTS', KEYS[base + 4]) == 1 then
      for _, id in ipairs(new) do
        redis.call('PUBLISH', channel, id)
      end
      announced = announced + #new
    end
  end
end
return {added, announced}
