-- Fixed-window rate limit: counts one attempt and says whether it is within the limit.
--
-- KEYS[1]  the window's counter key
-- ARGV[1]  the limit (attempts per window)
-- ARGV[2]  the window length in milliseconds
--
-- Returns { allowed (1|0), milliseconds until the window resets }.
-- Refused attempts are not counted, so a client hammering past the limit does not extend its own ban.

local limit = tonumber(ARGV[1])
local window_ms = tonumber(ARGV[2])

local used = tonumber(redis.call('GET', KEYS[1]) or '0')
if used >= limit then
  return { 0, redis.call('PTTL', KEYS[1]) }
end

redis.call('INCR', KEYS[1])
-- Checked rather than "first INCR" so a counter that somehow lost its TTL cannot ban forever.
if redis.call('PTTL', KEYS[1]) < 0 then
  redis.call('PEXPIRE', KEYS[1], window_ms)
end
return { 1, redis.call('PTTL', KEYS[1]) }
