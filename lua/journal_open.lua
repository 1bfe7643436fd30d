-- Opens a journal of positions (see `article_announce.lua`) for a subscriber: creates it, under a
-- new epoch, when it does not exist, so that the subscriber and the announcements after it agree
-- on one epoch.
--
-- KEYS[1] journal
-- ARGV[1] an article id to look up, or ""
-- Returns {epoch, newest position, position of ARGV[1]: 0 when it is not in the journal}.

local epoch = redis.call('ZSCORE', KEYS[1], 'epoch')
if not epoch then
  -- Microseconds of the server's clock: a journal created again gets a later epoch.
  local now = redis.call('TIME')
  epoch = tonumber(now[1]) * 1000000 + tonumber(now[2])
  redis.call('ZADD', KEYS[1], string.format('%d', -epoch), 'epoch')
else
  epoch = -tonumber(epoch)
end
local top = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
local position = 0
if ARGV[1] ~= '' then
  position = tonumber(redis.call('ZSCORE', KEYS[1], ARGV[1]) or '0')
end
return {epoch, math.max(tonumber(top[2]), 0), position}
