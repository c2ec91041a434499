-- KEYS: m. ARGV: will_at, the taker's token. Hands a will whose delay ran out to exactly one publisher (its
-- node's timer, or the node releasing a dead node's sessions); nothing if the client came back meanwhile.
-- The same taker asking again (its reply was lost) gets it again. Returns {will, zone, username} or nil.
local w = redis.call('HMGET', KEYS[1], 'will_at', 'wtok')
if w[2] ~= ARGV[2] then
  if w[1] ~= ARGV[1] then return false end
  redis.call('HSET', KEYS[1], 'wtok', ARGV[2])
  redis.call('HDEL', KEYS[1], 'will_at')
end
return redis.call('HMGET', KEYS[1], 'will', 'zone', 'user')
