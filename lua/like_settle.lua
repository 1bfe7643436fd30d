-- Settles a batch of like events that the archiver has committed to SQL: acknowledges each entry
-- and, only for those this call acknowledged, subtracts its change from the pending counts, so a
-- batch settled twice (a crash between the two, a second consumer) subtracts once; takes SQL's new
-- counts as the bases unless a newer one is cached already; drops the archived relations from the
-- unarchived hash and caches SQL's state of each, unless a newer change has come since.
--
-- KEYS[1]   shard's unarchived relations       hash relation field -> 2 × seq + liked
-- KEYS[2]   shard's base counts                hash subject field -> like_count in SQL
-- KEYS[3]   shard's base versions              hash subject field -> like_version
-- KEYS[4]   shard's pending changes            hash subject field -> likes - unlikes not archived
-- KEYS[5]   shard's archive stream
-- KEYS[6]   shard's all-time article ranking   zset article -> likes
-- KEYS[7…]  relation caches, one per relation below, in order
-- ARGV[1]   the archive job's consumer group
-- ARGV[2]   relation cache time-to-live, seconds
-- ARGV[3]   E, entries; then E × (stream id, subject field, change +1|-1)
-- then      S, subjects; then S × (subject field, SQL like_count, SQL like_version, article id or '')
-- then      R × (relation field, value its event wrote, value of SQL's state) for KEYS[7…]
--
-- Returns the number of entries this call acknowledged.

local at = 3
local entries = tonumber(ARGV[at])
local acknowledged = 0
for _ = 1, entries do
  local id, field, change = ARGV[at + 1], ARGV[at + 2], tonumber(ARGV[at + 3])
  at = at + 3
  if redis.call('XACK', KEYS[5], ARGV[1], id) == 1 then
    acknowledged = acknowledged + 1
    if redis.call('HINCRBY', KEYS[4], field, -change) == 0 then
      redis.call('HDEL', KEYS[4], field)
    end
  end
end

at = at + 1
local subjects = tonumber(ARGV[at])
for _ = 1, subjects do
  local field, count, version, article = ARGV[at + 1], ARGV[at + 2], tonumber(ARGV[at + 3]), ARGV[at + 4]
  at = at + 4
  -- A missing base stays missing: the next reader loads SQL's count, which has this batch.
  if redis.call('HEXISTS', KEYS[2], field) == 1 then
    local cached = tonumber(redis.call('HGET', KEYS[3], field) or '-1')
    if version >= cached then
      redis.call('HSET', KEYS[2], field, count)
      redis.call('HSET', KEYS[3], field, version)
    end
    if article ~= '' then
      local pending = tonumber(redis.call('HGET', KEYS[4], field) or '0')
      local base = tonumber(redis.call('HGET', KEYS[2], field))
      redis.call('ZADD', KEYS[6], base + pending, article)
    end
  end
end

for index = 7, #KEYS do
  local field, written, archived = ARGV[at + 1], ARGV[at + 2], ARGV[at + 3]
  at = at + 3
  if redis.call('HGET', KEYS[1], field) == written then
    redis.call('HDEL', KEYS[1], field)
    local cached = redis.call('GET', KEYS[index])
    if (not cached) or cached == written then
      redis.call('SET', KEYS[index], archived, 'EX', ARGV[2])
    end
  end
end
return acknowledged
