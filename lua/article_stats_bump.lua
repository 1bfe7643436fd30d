-- Moves an article's stats version (the like and comment part of `articleStatsChanged`'s version)
-- past its last value and the time, then tells the article's stats subscribers that its counters
-- moved: what a committed comment or comment deletion does, in one step, so that a watcher that
-- hears the announcement reads a version that covers the change.
--
-- KEYS[1]  the article's like shard's article stats versions   hash article -> version
-- ARGV[1]  article id
-- ARGV[2]  now, microseconds since the epoch
-- ARGV[3]  the article's stats channel in the like shard (in KEYS[1]'s slot)
-- ARGV[4]  the command that publishes on ARGV[3]: PUBLISH (one server) or SPUBLISH (a cluster)
--
-- Returns the new version.

local version = tonumber(redis.call('HGET', KEYS[1], ARGV[1]) or '0') + 1
if version < tonumber(ARGV[2]) then
  version = tonumber(ARGV[2])
end
-- Formatted by hand: Lua would write numbers this large with 14 significant digits.
version = string.format('%.0f', version)
redis.call('HSET', KEYS[1], ARGV[1], version)
redis.call(ARGV[4], ARGV[3], '')
return tonumber(version)
