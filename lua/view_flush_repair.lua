-- Repairs a shard whose Redis came back older than SQL (an old snapshot or AOF, a promoted
-- replica), so that no view SQL already holds is flushed again.
--
-- KEYS[1]  shard's pending deltas   hash article -> views not yet in SQL
-- KEYS[2]  shard's in-flight batch  hash: 'batch', 'lease', 'seq', article -> views
-- KEYS[3]  shard's flush sequence   string: the sequence of the shard's last taken batch
-- KEYS[4]  shard's base counts      hash article -> view_count as SQL has it
-- ARGV[1]  the shard's sequence as the caller found it in Redis
-- ARGV[2]  the sequence of the shard's last batch committed to SQL, read before the articles of
--          ARGV[4..]: Redis takes it on
-- ARGV[3]  the id of the caller's own in-flight batch, which SQL refused as stale ('' when the
--          caller found no batch in flight)
-- ARGV[4..] pairs: article, its pending count as the caller read it, for each pending article that
--           SQL says a batch newer than this Redis flushed. A take moves an article's whole pending
--           count, so all of its pending views as of the snapshot are in SQL: exactly the count read
--           is subtracted, and views counted since the read stay pending.
--
-- Pending articles not listed keep their views: SQL has not seen them. The base counts are all
-- dropped (an article flushed after the snapshot may have no pending field but a stale base); the
-- next view or read refills them from SQL. The caller rebuilds the shard's ranking afterwards.
--
-- Returns the number of pending views dropped, or -1 when the shard changed since the caller looked
-- (another process repaired it, or took a batch): then nothing is done.

-- With ARGV[3] the caller's batch must still be the one in flight: if it is gone, the shard has
-- moved on (another flusher cleared or repaired it) and the caller's view of it is stale.
local batch = redis.call('HGET', KEYS[2], 'batch')
if ARGV[3] == '' then
  if batch then
    return -1
  end
elseif batch ~= ARGV[3] then
  return -1
end
if tonumber(redis.call('GET', KEYS[3]) or '0') ~= tonumber(ARGV[1]) then
  return -1
end

local dropped = 0
for i = 4, #ARGV, 2 do
  local stale = tonumber(ARGV[i + 1])
  dropped = dropped + stale
  if redis.call('HINCRBY', KEYS[1], ARGV[i], -stale) <= 0 then
    redis.call('HDEL', KEYS[1], ARGV[i])
  end
end
redis.call('DEL', KEYS[4])
redis.call('DEL', KEYS[2])
redis.call('SET', KEYS[3], ARGV[2])
return dropped
