-- Reads one page of a timeline from its inbox, and keeps the inbox alive: reading is what makes
-- a user active.
--
-- An inbox holds every article of the reader's fanned-out followees from its floor up; below the
-- floor, SQL answers. The floor is kept in the anchor member `0`, scored -(floor + 1) (floor 0:
-- the whole history), so it lives, expires and is renamed with the inbox. Ids below the floor (a
-- late delivery) are not returned. An inbox whose anchor is scored 0 was written before floors
-- were kept: it counts as missing, and the read rebuilds it (`feed_rebuild_begin.lua`).
--
-- The reader's journal, a sorted set, gives every article delivered into the inbox a position, 1,
-- 2, 3…, in the order of delivery (`feed_deliver.lua`), so a `feedItemAdded` client resumes from
-- a position rather than an id: ids commit out of order and fan-out of different authors runs
-- concurrently, so an id below one the client has may still arrive. Its member `epoch`, scored
-- -epoch, names this run of positions: a journal created again (dropped with its reader's audience,
-- expired, or lost by Redis) has a new epoch, so a position of the old one is answered with a
-- resync, never read against a journal that lacks what was delivered in between. The journal is
-- opened here, beside the inbox, and lives as long; its epoch and newest position are returned:
-- read in the same step as the page, they say which deliveries the page holds, so a subscription
-- resumed from the page's cursor replays exactly those made after it.
--
-- KEYS[1] inbox
-- KEYS[2] journal
-- ARGV[1] highest score wanted: "+inf", or "(<id>" for ids below a cursor's
-- ARGV[2] most ids to return
-- ARGV[3] time to live in milliseconds
-- Returns {0} when the inbox does not exist; else {1, floor, journal epoch, journal's newest
-- position, ids at or above the floor, newest first...}.

local anchor = tonumber(redis.call('ZSCORE', KEYS[1], 0) or '0')
if anchor >= 0 then
  return {0}
end
redis.call('PEXPIRE', KEYS[1], ARGV[3])
local epoch = redis.call('ZSCORE', KEYS[2], 'epoch')
if not epoch then
  -- Microseconds of the server's clock: a journal created again gets a later epoch.
  local now = redis.call('TIME')
  epoch = tonumber(now[1]) * 1000000 + tonumber(now[2])
  redis.call('ZADD', KEYS[2], string.format('%d', -epoch), 'epoch')
else
  epoch = -tonumber(epoch)
end
redis.call('PEXPIRE', KEYS[2], ARGV[3])
local top = redis.call('ZRANGE', KEYS[2], -1, -1, 'WITHSCORES')
local floor = -anchor - 1
local min = '(0'
if floor > 0 then
  min = string.format('%d', floor)
end
local reply = {1, floor, epoch, math.max(tonumber(top[2]), 0)}
local ids = redis.call('ZREVRANGEBYSCORE', KEYS[1], ARGV[1], min, 'LIMIT', 0, tonumber(ARGV[2]))
for _, id in ipairs(ids) do
  reply[#reply + 1] = tonumber(id)
end
return reply
