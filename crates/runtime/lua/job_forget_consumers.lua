-- Forgets the consumers of a job's group that hold no entry and have been idle longer than a
-- threshold: the names of stopped processes, which would otherwise pile up with every restart.
-- One script, so that a consumer handed an entry in the meantime is never dropped with it (a live
-- consumer dropped while empty loses nothing: Redis adds it back at its next delivery).
--
-- KEYS[1]  the job's shard stream
-- ARGV[1]  the consumer group (the job's name)
-- ARGV[2]  idle threshold in milliseconds
--
-- Returns the number of consumers forgotten.

local forgotten = 0
for _, consumer in ipairs(redis.call('XINFO', 'CONSUMERS', KEYS[1], ARGV[1])) do
  local fields = {}
  for i = 1, #consumer, 2 do
    fields[consumer[i]] = consumer[i + 1]
  end
  if fields['pending'] == 0 and fields['idle'] > tonumber(ARGV[2]) then
    redis.call('XGROUP', 'DELCONSUMER', KEYS[1], ARGV[1], fields['name'])
    forgotten = forgotten + 1
  end
end
return forgotten
