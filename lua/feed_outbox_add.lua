-- Adds articles to an author's outbox and trims it to the cap. With `loaded` = 1 the ids are the
-- author's newest from SQL and the outbox is marked loaded (complete up to the cap); a publish
-- adds with `loaded` = 0, so a publish racing a load is kept either way.
--
-- KEYS[1] outbox           sorted set article id -> article id
-- KEYS[2] loaded marker
-- ARGV[1] cap
-- ARGV[2] loaded (0|1)
-- ARGV[3..] article ids
-- Returns the outbox's size.

for i = 3, #ARGV, 500 do
  local args = {}
  for j = i, math.min(i + 499, #ARGV) do
    args[#args + 1] = ARGV[j]
    args[#args + 1] = ARGV[j]
  end
  redis.call('ZADD', KEYS[1], unpack(args))
end
local size = redis.call('ZCARD', KEYS[1])
local cap = tonumber(ARGV[1])
if size > cap then
  redis.call('ZREMRANGEBYRANK', KEYS[1], 0, size - cap - 1)
  size = cap
end
if ARGV[2] == '1' then
  redis.call('SET', KEYS[2], '1')
end
return size
