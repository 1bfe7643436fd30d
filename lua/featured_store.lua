-- Replaces an article's featured comments with a freshly computed list and keeps its lease for
-- the refresh interval, in one step: readers see the old list or the new one, never a mix, and the
-- next recompute waits for the lease to lapse.
--
-- KEYS[1]  featured list     string: comment ids, comma-separated ('' for none)
-- KEYS[2]  recompute lease   string
-- ARGV[1]  the new list
-- ARGV[2]  the lease's token (only the holder stores)
-- ARGV[3]  refresh interval, ms (the lease's new life)
-- ARGV[4]  the list's time-to-live, ms (it outlives the lease, so readers keep a list to show)
--
-- Returns 1 when stored, 0 when the lease was no longer ours.

if redis.call('GET', KEYS[2]) ~= ARGV[2] then
  return 0
end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[4])
redis.call('SET', KEYS[2], ARGV[2], 'PX', ARGV[3])
return 1
