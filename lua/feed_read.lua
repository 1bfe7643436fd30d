-- Reads one page of a timeline from its inbox, and keeps the inbox alive: reading is what makes
-- a user active.
--
-- An inbox holds every article of the reader's fanned-out followees from its floor up; below the
-- floor, SQL answers. The floor is kept in the anchor member `0`, scored -(floor + 1) (floor 0:
-- the whole history), so it lives, expires and is renamed with the inbox. Ids below the floor (a
-- late delivery) are not returned. An anchor scored 0 (an inbox written before floors were kept)
-- has its lowest member as its floor, and covers nothing when it has none.
--
-- KEYS[1] inbox
-- ARGV[1] highest score wanted: "+inf", or "(<id>" for ids below a cursor's
-- ARGV[2] most ids to return
-- ARGV[3] time to live in milliseconds
-- Returns {0} when the inbox does not exist; else {1, floor (2^52 when it covers nothing), ids
-- at or above the floor, newest first...}.

if redis.call('EXISTS', KEYS[1]) == 0 then
  return {0}
end
redis.call('PEXPIRE', KEYS[1], ARGV[3])
local head = redis.call('ZRANGE', KEYS[1], 0, 1, 'WITHSCORES')
local anchor = tonumber(head[2])
local floor
if anchor < 0 then
  floor = -anchor - 1
else
  floor = tonumber(head[3] or '4503599627370496')
end
local min = '(0'
if floor > 0 then
  min = string.format('%d', floor)
end
local reply = {1, floor}
local ids = redis.call('ZREVRANGEBYSCORE', KEYS[1], ARGV[1], min, 'LIMIT', 0, tonumber(ARGV[2]))
for _, id in ipairs(ids) do
  reply[#reply + 1] = tonumber(id)
end
return reply
