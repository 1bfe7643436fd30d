-- Puts a job shard's dead letters back onto its stream, oldest first, each as a new entry with
-- its original fields. One script, so an entry is never both re-added and still dead (or re-added
-- twice by two concurrent retries).
--
-- KEYS[1]  the shard's dead-letter stream (entries: origin, error, deliveries, fields as JSON)
-- KEYS[2]  the shard's stream (same hash tag)
-- ARGV[1]  most dead letters to move in this call
--
-- Returns the number of dead letters moved.

local dead = redis.call('XRANGE', KEYS[1], '-', '+', 'COUNT', ARGV[1])
for _, entry in ipairs(dead) do
  local fields = entry[2]
  local original
  for i = 1, #fields, 2 do
    if fields[i] == 'fields' then
      original = fields[i + 1]
    end
  end
  local args = {}
  for name, value in pairs(cjson.decode(original)) do
    args[#args + 1] = name
    args[#args + 1] = value
  end
  redis.call('XADD', KEYS[2], '*', unpack(args))
  redis.call('XDEL', KEYS[1], entry[1])
end
return #dead
