-- Likes or unlikes a subject for a user. Only a change of state counts: it moves the counter and
-- appends one event to the archive stream, in this one atomic step, so the count, the relation and
-- the queued event never disagree. Liking twice, or unliking what was never liked, changes nothing.
--
-- A relation is stored as 2 × seq + liked (seq: the sequence of its last change; 0 for a state read
-- from SQL). A shard's sequence grows by one per change and never falls behind the time in
-- microseconds, so that it keeps growing past what SQL has seen even after Redis restarted from an
-- older snapshot: SQL orders a relation's changes by it. Where it stands, in order of trust: the relation cache (KEYS[1]); the
-- unarchived relations (KEYS[2]), which hold every change not yet in SQL; SQL itself (ARGV[6]),
-- which the caller reads when both miss. A count is the base (SQL's count, KEYS[3]) plus the pending
-- changes not yet archived (KEYS[5]); the caller reads SQL's count when the base is missing.
--
-- KEYS[1]   relation cache (subject, user)    string, expires ARGV[9] s after its last write
-- KEYS[2]   shard's unarchived relations       hash relation field -> 2 × seq + liked
-- KEYS[3]   shard's base counts                hash subject field -> like_count in SQL
-- KEYS[4]   shard's base versions              hash subject field -> like_version of that count
-- KEYS[5]   shard's pending changes            hash subject field -> likes - unlikes not archived
-- KEYS[6]   shard's event sequence             string
-- KEYS[7]   shard's archive stream
-- KEYS[8]   shard's all-time article ranking   zset article -> likes      (articles only)
-- KEYS[9]   shard's ranking of the day         zset article -> net likes  (articles only)
-- KEYS[10]  shard's ranking of the week        zset article -> net likes  (articles only)
-- KEYS[11]  shard's article stats versions     hash article -> version    (articles only): moved
--           past both its last value and this change's sequence, so `articleStatsChanged`'s
--           versions grow with every change, whichever process reads them
-- ARGV[1]   '1' to like, '0' to unlike
-- ARGV[2]   subject field ('a42', 'c7')
-- ARGV[3]   relation field ('a42:9')
-- ARGV[4]   user id
-- ARGV[5]   event id (unique; the archive's idempotency key)
-- ARGV[6]   the relation in SQL: '1' liked, '0' not, '' not read
-- ARGV[7]   the subject's like_count in SQL, '' not read
-- ARGV[8]   the subject's like_version in SQL (with ARGV[7])
-- ARGV[9]   relation cache time-to-live, seconds
-- ARGV[10]  now, ms since the epoch
-- ARGV[11]  day bucket time-to-live, seconds
-- ARGV[12]  week bucket time-to-live, seconds
-- ARGV[13]  subject kind code ('1' article, '2' comment)
-- ARGV[14]  subject id
-- ARGV[15]  channel to tell that the subject's article counters moved ('' none; in the shard's slot)
-- ARGV[16]  the command that publishes on ARGV[15]: PUBLISH (one server) or SPUBLISH (a cluster)
--
-- Returns { 1 changed | 0 unchanged, liked (1|0), count }, or { -1, need relation (1|0), need
-- count (1|0) } when SQL must be read first (the caller reads it and calls again).

local want = ARGV[1] == '1'
local cached = redis.call('GET', KEYS[1])
local state = cached or redis.call('HGET', KEYS[2], ARGV[3])
local base = redis.call('HGET', KEYS[3], ARGV[2])
local need_relation = (not state) and ARGV[6] == ''
local need_count = (not base) and ARGV[7] == ''
if need_relation or need_count then
  return { -1, need_relation and 1 or 0, need_count and 1 or 0 }
end
if not base then
  base = ARGV[7]
  redis.call('HSET', KEYS[3], ARGV[2], base)
  redis.call('HSET', KEYS[4], ARGV[2], ARGV[8])
end
state = state or ARGV[6]
local liked = tonumber(state) % 2 == 1
local pending = tonumber(redis.call('HGET', KEYS[5], ARGV[2]) or '0')

if liked == want then
  if not cached then
    redis.call('SET', KEYS[1], state, 'EX', ARGV[9])
  end
  return { 0, liked and 1 or 0, tonumber(base) + pending }
end

local seq = tonumber(redis.call('GET', KEYS[6]) or '0') + 1
local floor = tonumber(ARGV[10]) * 1000
if seq < floor then
  seq = floor
end
-- Formatted by hand: Lua would write numbers this large with 14 significant digits.
seq = string.format('%.0f', seq)
redis.call('SET', KEYS[6], seq)
local value = string.format('%.0f', 2 * tonumber(seq) + (want and 1 or 0))
local delta = want and 1 or -1
redis.call('SET', KEYS[1], value, 'EX', ARGV[9])
redis.call('HSET', KEYS[2], ARGV[3], value)
pending = redis.call('HINCRBY', KEYS[5], ARGV[2], delta)
if pending == 0 then
  redis.call('HDEL', KEYS[5], ARGV[2])
end
local count = tonumber(base) + pending
redis.call('XADD', KEYS[7], '*',
  'event', ARGV[5], 'user', ARGV[4], 'kind', ARGV[13], 'subject', ARGV[14],
  'liked', want and '1' or '0', 'seq', seq, 'at', ARGV[10])
if #KEYS >= 10 then
  redis.call('ZADD', KEYS[8], count, ARGV[14])
  redis.call('ZINCRBY', KEYS[9], delta, ARGV[14])
  redis.call('EXPIRE', KEYS[9], ARGV[11])
  redis.call('ZINCRBY', KEYS[10], delta, ARGV[14])
  redis.call('EXPIRE', KEYS[10], ARGV[12])
  local version = tonumber(redis.call('HGET', KEYS[11], ARGV[14]) or '0') + 1
  if version < tonumber(seq) then
    version = tonumber(seq)
  end
  redis.call('HSET', KEYS[11], ARGV[14], string.format('%.0f', version))
end
if ARGV[15] ~= '' then
  redis.call(ARGV[16], ARGV[15], '')
end
return { 1, want and 1 or 0, count }
