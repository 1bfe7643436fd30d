-- Casts one voter's ballots in one poll. Each ballot is all or nothing: every rate-limit counter
-- that applies to it is checked first, and only if none is at its limit are the counters
-- incremented, every board moved (REAL by 1, DISPLAY by the option's bonus, the next period's
-- buckets by the carry-over fraction of that), the voter added to the poll's and the option's
-- HyperLogLogs, the poll's sequence advanced and the vote appended to the archive stream. A
-- rejected ballot changes nothing. Ballots are applied in order, so two ballots of one call count
-- against each other's limits. Every key shares the poll's hash tag.
--
-- KEYS[1]          the poll's closed flag (set: every ballot is refused)
-- KEYS[2]          the poll's vote sequence (grows by one per vote, never below the time in µs)
-- KEYS[3]          the poll's participants HyperLogLog
-- KEYS[4]          the shard's archive stream
-- KEYS[5..4+B]     the B boards the call moves (period bucket × REAL/DISPLAY × current/next)
-- then per ballot: the option's participants HyperLogLog, then its C rate-limit counters
-- ARGV[1]   now, ms since the epoch
-- ARGV[2]   voter (user id)
-- ARGV[3]   event id prefix (the ballot's index is appended)
-- ARGV[4]   channel ('' none)
-- ARGV[5]   device ('' none)
-- ARGV[6]   poll id
-- ARGV[7]   the poll's periods, comma-separated (recorded with the vote)
-- ARGV[8]   the poll's zone (recorded with the vote)
-- ARGV[9]   the poll's carry-over fraction (recorded with the vote)
-- ARGV[10]  pub/sub channel told that the poll's boards moved
-- ARGV[11]  B, boards
-- ARGV[12]  N, ballots
-- ARGV[13]  the command that publishes on ARGV[10]: PUBLISH (one server) or SPUBLISH (a cluster;
--           the channel carries the poll's hash tag)
-- then B values: each board's expiry, ms since the epoch ('0': never)
-- then per ballot: option id, bonus, C, then B increments (decimal strings, '0': untouched), then
--   per counter: limit, time-to-live in ms ('0': none), retry after in s ('-1': never), rule index
--
-- Returns { -1 } when the poll is closed; else 3 values per ballot: accepted (1|0), the index of
-- the rule that refused it (-1), the seconds after which it may pass (-1: never or accepted).

if redis.call('EXISTS', KEYS[1]) == 1 then
  return { -1 }
end

local now, voter, prefix = ARGV[1], ARGV[2], ARGV[3]
local boards = tonumber(ARGV[11])
local ballots = tonumber(ARGV[12])
local arg = 14
local expire_at = {}
for j = 1, boards do
  expire_at[j] = ARGV[arg]
  arg = arg + 1
end
local key = 5 + boards
local out = {}
local accepted_any = false

for i = 1, ballots do
  local option, bonus, counters = ARGV[arg], ARGV[arg + 1], tonumber(ARGV[arg + 2])
  local increments = arg + 3
  local limits = increments + boards
  local option_hll = KEYS[key]
  local first_counter = key + 1
  local refused = nil
  for c = 0, counters - 1 do
    local used = tonumber(redis.call('GET', KEYS[first_counter + c]) or '0')
    if used + 1 > tonumber(ARGV[limits + c * 4]) then
      refused = c
      break
    end
  end
  if refused then
    out[#out + 1] = 0
    out[#out + 1] = tonumber(ARGV[limits + refused * 4 + 3])
    out[#out + 1] = tonumber(ARGV[limits + refused * 4 + 2])
  else
    for c = 0, counters - 1 do
      local counter = KEYS[first_counter + c]
      local ttl = ARGV[limits + c * 4 + 1]
      if redis.call('INCR', counter) == 1 and ttl ~= '0' then
        redis.call('PEXPIRE', counter, ttl)
      end
    end
    for j = 1, boards do
      local increment = ARGV[increments + j - 1]
      if increment ~= '0' then
        redis.call('ZINCRBY', KEYS[4 + j], increment, option)
        if expire_at[j] ~= '0' then
          redis.call('PEXPIREAT', KEYS[4 + j], expire_at[j])
        end
      end
    end
    redis.call('PFADD', KEYS[3], voter)
    redis.call('PFADD', option_hll, voter)
    -- One more than the last, and never below the vote's time in microseconds: after a restart
    -- from an older snapshot the sequence still grows past what the vote log has seen.
    local seq = math.max(tonumber(redis.call('GET', KEYS[2]) or '0') + 1, tonumber(now) * 1000)
    redis.call('SET', KEYS[2], string.format('%d', seq))
    redis.call('XADD', KEYS[4], '*',
      'event', prefix .. ':' .. i, 'poll', ARGV[6], 'option', option, 'voter', voter,
      'seq', string.format('%d', seq), 'at', now, 'bonus', bonus, 'carry', ARGV[9], 'periods', ARGV[7], 'tz', ARGV[8],
      'channel', ARGV[4], 'device', ARGV[5])
    accepted_any = true
    out[#out + 1] = 1
    out[#out + 1] = -1
    out[#out + 1] = -1
  end
  key = first_counter + counters
  arg = limits + counters * 4
end

if accepted_any then
  redis.call(ARGV[13], ARGV[10], redis.call('GET', KEYS[2]))
end
return out
