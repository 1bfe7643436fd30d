-- Delivers articles into the timelines of several followers of one author at once, each only if
-- that follower is active: their inbox (or an inbox being rebuilt) exists. One call serves a whole
-- fan-out chunk, so the call's own cost is paid once per chunk, not once per inbox; every follower
-- of a call is in one feed shard, so its keys share one hash tag with the author's audience there.
--
-- A follower found inactive leaves the author's audience in the same step that found them so:
-- a follower who becomes active again creates their building key before rejoining, so this never
-- drops someone whose inbox is being built. Their journal goes too: what is published from then on
-- never reaches them, so no position in it could be resumed from without a silent gap.
--
-- Idempotent: an article already in an inbox changes nothing and is not announced again. Trims to
-- the cap on every write; a trim raises the inbox's floor (see `feed_read.lua`) to its lowest
-- member kept, since SQL then holds items the inbox does not.
--
-- Every article a write added is appended to the follower's journal, when it exists (see
-- `feed_read.lua`), with the next position of that journal: deliveries of different
-- authors run concurrently and ids commit out of order, so the journal, not the id, is the order
-- in which items joined this feed. The journal keeps the newest ARGV[2] positions. An article
-- added is announced on the follower's channel, as "epoch:position:id" ("0:0:id" without a
-- journal), when the follower is online; within one channel, announcements keep their journal's
-- order.
--
-- KEYS[1]        the author's audience in this shard (sorted set of follower ids)
-- KEYS[4i-2..4i+1] follower i's inbox (sorted set: the anchor member 0, scored -(floor + 1), plus
--                up to cap article ids, score = id), inbox being rebuilt (receives the articles
--                when the inbox does not exist yet), online marker, journal
-- ARGV[1] cap
-- ARGV[2] journal cap
-- ARGV[3] the command that announces: PUBLISH (one server) or SPUBLISH (a cluster, whose followers'
--         channels are in their shard's slot)
-- ARGV[4] n, the number of articles
-- ARGV[5..4+n] article ids
-- ARGV[4+n+2i-1], ARGV[4+n+2i] follower i's id, and the channel to announce on ("" for none)
-- Returns {articles added (and kept within the cap), counted per inbox; announced; followers
-- dropped from the audience}.

local cap = tonumber(ARGV[1])
local journal_cap = tonumber(ARGV[2])
local publish = ARGV[3]
local n = tonumber(ARGV[4])
local added, announced, dropped = 0, 0, 0

for f = 1, (#KEYS - 1) / 4 do
  local base = 4 * (f - 1) + 1
  local target = KEYS[base + 1]
  local journal = KEYS[base + 4]
  if redis.call('EXISTS', target) == 0 then
    target = KEYS[base + 2]
    if redis.call('EXISTS', target) == 0 then
      target = nil
    end
  end
  if target then
    local new = {}
    for a = 5, 4 + n do
      if redis.call('ZADD', target, ARGV[a], ARGV[a]) == 1 then
        new[#new + 1] = ARGV[a]
      end
    end
    local kept = #new
    -- All but the anchor (rank 0) and the newest cap go: usually nothing.
    local trimmed = #new > 0 and redis.call('ZREMRANGEBYRANK', target, 1, -(cap + 1)) or 0
    if trimmed > 0 then
      local head = redis.call('ZRANGE', target, 0, 1, 'WITHSCORES')
      local anchor, lowest = tonumber(head[2]), tonumber(head[3])
      if anchor < 0 and lowest and lowest > -anchor - 1 then
        redis.call('ZADD', target, string.format('%d', -lowest - 1), 0)
      end
      kept = 0
      for _, id in ipairs(new) do
        if redis.call('ZSCORE', target, id) then
          kept = kept + 1
        end
      end
    end
    added = added + kept
    -- Announced with their positions, trimmed or not: an article trimmed at once is below the
    -- floor, which SQL serves, but it is still new to this feed.
    local messages = {}
    local epoch = redis.call('ZSCORE', journal, 'epoch')
    if epoch then
      epoch = string.format('%d', -tonumber(epoch))
      local top = redis.call('ZRANGE', journal, -1, -1, 'WITHSCORES')
      local position = math.max(tonumber(top[2]), 0)
      for _, id in ipairs(new) do
        -- Added to the inbox again after a trim, by a redelivered chunk: it has its position.
        if not redis.call('ZSCORE', journal, id) then
          position = position + 1
          redis.call('ZADD', journal, position, id)
          messages[#messages + 1] = epoch .. ':' .. string.format('%d', position) .. ':' .. id
        end
      end
      -- The epoch member is rank 0 (its score is negative); the newest journal_cap stay.
      redis.call('ZREMRANGEBYRANK', journal, 1, -(journal_cap + 1))
    else
      for _, id in ipairs(new) do
        messages[#messages + 1] = '0:0:' .. id
      end
    end
    local channel = ARGV[4 + n + 2 * f]
    if #messages > 0 and channel ~= '' and redis.call('EXISTS', KEYS[base + 3]) == 1 then
      for _, message in ipairs(messages) do
        redis.call(publish, channel, message)
      end
      announced = announced + #messages
    end
  else
    redis.call('DEL', journal)
    dropped = dropped + redis.call('ZREM', KEYS[1], ARGV[4 + n + 2 * f - 1])
  end
end
return {added, announced, dropped}
