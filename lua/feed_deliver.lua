-- Delivers articles into the timelines of several followers of one author at once, each only if
-- that follower is active: their inbox (or an inbox being rebuilt) exists. One call serves a whole
-- fan-out chunk, so the call's own cost is paid once per chunk, not once per inbox; every follower
-- of a call is in one feed shard, so its keys share one hash tag with the author's audience there.
--
-- A follower found inactive leaves the author's audience in the same step that found them so:
-- a follower who becomes active again creates their building key before rejoining, so this never
-- drops someone whose inbox is being built.
--
-- Idempotent: an article already in an inbox changes nothing and is not announced again. Trims to
-- the cap on every write; a trim raises the inbox's floor (see `feed_read.lua`) to its lowest
-- member kept, since SQL then holds items the inbox does not. Announces an article on the
-- follower's channel only when it was added, stayed within the cap, and the follower is online.
--
-- KEYS[1]        the author's audience in this shard (sorted set of follower ids)
-- KEYS[3i-1..3i+1] follower i's inbox (sorted set: the anchor member 0, scored -(floor + 1), plus
--                up to cap article ids, score = id), inbox being rebuilt (receives the articles
--                when the inbox does not exist yet), online marker
-- ARGV[1] cap
-- ARGV[2] n, the number of articles
-- ARGV[3..2+n] article ids
-- ARGV[2+n+2i-1], ARGV[2+n+2i] follower i's id, and the channel to announce on ("" for none)
-- Returns {articles added (and kept within the cap), counted per inbox; of those, announced;
-- followers dropped from the audience}.

local cap = tonumber(ARGV[1])
local n = tonumber(ARGV[2])
local added, announced, dropped = 0, 0, 0

for f = 1, (#KEYS - 1) / 3 do
  local base = 3 * (f - 1) + 1
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
    -- All but the anchor (rank 0) and the newest cap go: usually nothing.
    local trimmed = #new > 0 and redis.call('ZREMRANGEBYRANK', target, 1, -(cap + 1)) or 0
    if trimmed > 0 then
      local head = redis.call('ZRANGE', target, 0, 1, 'WITHSCORES')
      local anchor, lowest = tonumber(head[2]), tonumber(head[3])
      if anchor < 0 and lowest and lowest > -anchor - 1 then
        redis.call('ZADD', target, string.format('%d', -lowest - 1), 0)
      end
      local kept = {}
      for _, id in ipairs(new) do
        if redis.call('ZSCORE', target, id) then
          kept[#kept + 1] = id
        end
      end
      new = kept
    end
    added = added + #new
    local channel = ARGV[2 + n + 2 * f]
    if #new > 0 and channel ~= '' and redis.call('EXISTS', KEYS[base + 3]) == 1 then
      for _, id in ipairs(new) do
        redis.call('PUBLISH', channel, id)
      end
      announced = announced + #new
    end
  else
    dropped = dropped + redis.call('ZREM', KEYS[1], ARGV[2 + n + 2 * f - 1])
  end
end
return {added, announced, dropped}
