-- Reads a journal after a position, for a resumed event stream: a reader's feed journal (see
-- `feed_read.lua`) or the journal of publications (see `article_announce.lua`). Both are sorted
-- sets of article id -> position (1, 2, 3…, the newest kept) with the member `epoch` scored -epoch.
--
-- KEYS[1] journal
-- ARGV[1] epoch of the position
-- ARGV[2] position: the client has every article journaled up to it
-- ARGV[3] most articles to return
-- Returns {0} when the journal is not of that epoch (or is gone); {2} when it no longer holds every
-- position after ARGV[2], or more than ARGV[3] follow it; else {1, newest position, then id and
-- position of each article after ARGV[2], oldest first}.

local epoch = redis.call('ZSCORE', KEYS[1], 'epoch')
if not epoch or -tonumber(epoch) ~= tonumber(ARGV[1]) then
  return {0}
end
local after = tonumber(ARGV[2])
local top = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
local head = math.max(tonumber(top[2]), 0)
if after > head or head - after > tonumber(ARGV[3]) then
  return {2}
end
if head > after then
  -- Rank 0 is the epoch member; rank 1 the oldest position kept.
  local oldest = redis.call('ZRANGE', KEYS[1], 1, 1, 'WITHSCORES')
  if tonumber(oldest[2]) > after + 1 then
    return {2}
  end
end
local reply = {1, head}
local entries = redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. ARGV[2], '+inf', 'WITHSCORES')
for i = 1, #entries, 2 do
  reply[#reply + 1] = tonumber(entries[i])
  reply[#reply + 1] = tonumber(entries[i + 1])
end
return reply
