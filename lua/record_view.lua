-- Counts one view of an article, at most once per viewer per window, and answers the new total.
--
-- KEYS[1]  seen marker for (article, viewer)     string, expires with the window
-- KEYS[2]  shard's base counts                   hash article -> view_count as SQL had it
-- KEYS[3]  shard's pending deltas                hash article -> views not yet in SQL
-- KEYS[4]  shard's all-time ranking              zset article -> views
-- KEYS[5]  shard's ranking for the current day   zset, expires ARGV[4] s after its last write
-- KEYS[6]  shard's ranking for the current week  zset, expires ARGV[5] s after its last write
-- ARGV[1]  article id
-- ARGV[2]  dedup window in seconds
-- ARGV[3]  '1' to count, '0' to only read (a crawler's view)
-- ARGV[4]  day bucket time-to-live in seconds
-- ARGV[5]  week bucket time-to-live in seconds
-- ARGV[6]  the article's SQL view_count, to seed KEYS[2] when it lacks the article; '' when unknown
-- ARGV[7]  channel to tell that the article's counters moved, when the view counts (in the shard's
--          slot)
-- ARGV[8]  the command that publishes on ARGV[7]: PUBLISH (one server) or SPUBLISH (a cluster)
--
-- Returns { counted (1|0), total views (base + pending) }, or { -1, 0 } when the base is unknown
-- and ARGV[6] is '': the caller reads SQL (which also tells whether the article exists) and retries.
-- The in-flight batch of a flush is still inside pending until it is committed, so the total never
-- dips while a flush runs.

local article = ARGV[1]
local base = redis.call('HGET', KEYS[2], article)
if not base then
  if ARGV[6] == '' then
    return { -1, 0 }
  end
  redis.call('HSETNX', KEYS[2], article, ARGV[6])
  base = redis.call('HGET', KEYS[2], article)
  local pending = tonumber(redis.call('HGET', KEYS[3], article) or '0')
  redis.call('ZADD', KEYS[4], 'NX', tonumber(base) + pending, article)
end

local counted = 0
if ARGV[3] == '1' and redis.call('SET', KEYS[1], '1', 'NX', 'EX', ARGV[2]) then
  counted = 1
  redis.call('HINCRBY', KEYS[3], article, 1)
  redis.call('ZINCRBY', KEYS[4], 1, article)
  redis.call('ZINCRBY', KEYS[5], 1, article)
  redis.call('EXPIRE', KEYS[5], ARGV[4])
  redis.call('ZINCRBY', KEYS[6], 1, article)
  redis.call('EXPIRE', KEYS[6], ARGV[5])
  redis.call(ARGV[8], ARGV[7], '')
end

local pending = tonumber(redis.call('HGET', KEYS[3], article) or '0')
return { counted, tonumber(base) + pending }
