-- KEYS: m s q i r. ARGV: epoch, ttl ms, n meta, (k, v)... The client left: the session (journaled all
-- along) waits for it until the TTL ends it. Meta may carry a will waiting for its delay (will, will_at).
if redis.call('HGET', KEYS[1], 'epoch') ~= ARGV[1] then return -1 end
redis.call('HDEL', KEYS[1], 'will', 'will_delay', 'will_at', 'wtok', 'rtok')
-- a will waiting for its delay is kept with its due time: if this node dies first, another publishes it
hset_pairs(KEYS[1], ARGV, 4, tonumber(ARGV[3]))
local ttl = tonumber(ARGV[2])
for k = 1, 5 do
  if ttl > 0 then redis.call('PEXPIRE', KEYS[k], ttl) else redis.call('PERSIST', KEYS[k]) end
end
return 1
