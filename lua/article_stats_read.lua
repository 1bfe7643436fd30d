-- Reads an article's live like count and the version of its like and comment counts in one step,
-- so that a like change is in both or in neither: `articleStatsChanged` then sends nothing for a
-- version that moved without its counts. An article no change has moved since Redis had it gets
-- the time as its version.
--
-- KEYS[1]  the article's like shard's base counts             hash subject field -> like_count in SQL
-- KEYS[2]  the article's like shard's pending changes         hash subject field -> likes - unlikes
-- KEYS[3]  the article's like shard's article stats versions  hash article -> version
-- ARGV[1]  the article's subject field ('a42')
-- ARGV[2]  article id
-- ARGV[3]  now, microseconds since the epoch
--
-- Returns { base count or -1 when Redis has none (the caller takes SQL's), pending, version }.

redis.call('HSETNX', KEYS[3], ARGV[2], ARGV[3])
local base = redis.call('HGET', KEYS[1], ARGV[1])
local pending = redis.call('HGET', KEYS[2], ARGV[1])
local version = redis.call('HGET', KEYS[3], ARGV[2])
return { tonumber(base or '-1'), tonumber(pending or '0'), tonumber(version) }
