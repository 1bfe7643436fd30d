-- Announces a published article on the articles' channel, with its position in the journal of
-- publications, in one step: the journal (a sorted set, article id -> position 1, 2, 3…, the
-- newest ARGV[2] kept) is the order in which publications were announced, which a resumed
-- `articlePublished` replays from; ids commit out of order (an id below one a client has may still
-- be announced), so the position, not the id, is what a client holds. Its member `epoch`, scored
-- -epoch, names this run of positions: a journal Redis lost starts again under a new one, and a
-- live stream hearing it knows it missed what the old one held.
--
-- KEYS[1] journal
-- ARGV[1] channel (in the journal's slot)
-- ARGV[2] journal cap
-- ARGV[3] article id
-- ARGV[4] the article, as JSON
-- ARGV[5] the command that publishes on ARGV[1]: PUBLISH (one server) or SPUBLISH (a cluster)
-- Publishes "epoch:position:" followed by ARGV[4]. Returns the article's position; an article
-- already journaled is not announced again.

local epoch = redis.call('ZSCORE', KEYS[1], 'epoch')
if not epoch then
  -- Microseconds of the server's clock: a journal created again gets a later epoch.
  local now = redis.call('TIME')
  epoch = tonumber(now[1]) * 1000000 + tonumber(now[2])
  redis.call('ZADD', KEYS[1], string.format('%d', -epoch), 'epoch')
else
  epoch = -tonumber(epoch)
end
local known = redis.call('ZSCORE', KEYS[1], ARGV[3])
if known then
  return tonumber(known)
end
local top = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
local position = math.max(tonumber(top[2]), 0) + 1
redis.call('ZADD', KEYS[1], position, ARGV[3])
-- The epoch member is rank 0 (its score is negative); the newest ARGV[2] positions stay.
redis.call('ZREMRANGEBYRANK', KEYS[1], 1, -(tonumber(ARGV[2]) + 1))
redis.call(ARGV[5], ARGV[1], string.format('%d:%d:', epoch, position) .. ARGV[4])
return position
