-- Reads one page of a timeline from its inbox, and keeps the inbox alive: reading is what makes
-- a user active.
--
-- KEYS[1] inbox
-- KEYS[2] no-more sentinel
-- ARGV[1] highest score wanted: "+inf", or "(<id>" for ids below a cursor's
-- ARGV[2] most ids to return
-- ARGV[3] time to live in milliseconds
-- Returns {0} when the inbox does not exist; else {1, no_more (0|1), lowest cached id (0 when
-- none), ids newest first...}.

if redis.call('EXISTS', KEYS[1]) == 0 then
  return {0}
end
redis.call('PEXPIRE', KEYS[1], ARGV[3])
local no_more = redis.call('PEXPIRE', KEYS[2], ARGV[3])
local lowest = redis.call('ZRANGE', KEYS[1], 1, 1)
local reply = {1, no_more, tonumber(lowest[1] or '0')}
local ids = redis.call('ZREVRANGEBYSCORE', KEYS[1], ARGV[1], '(0', 'LIMIT', 0, tonumber(ARGV[2]))
for _, id in ipairs(ids) do
  reply[#reply + 1] = tonumber(id)
end
return reply
