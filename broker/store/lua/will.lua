-- KEYS: m. ARGV: epoch, packed will ('' = none), will delay, expiry. A new connection of a session that
-- stays on this node (a takeover here) brings its own will and expiry.
if redis.call('HGET', KEYS[1], 'epoch') ~= ARGV[1] then return -1 end
redis.call('HSET', KEYS[1], 'expiry', ARGV[4])
if ARGV[2] ~= '' then
  redis.call('HSET', KEYS[1], 'will', ARGV[2], 'will_delay', ARGV[3])
else
  redis.call('HDEL', KEYS[1], 'will', 'will_delay')
end
return 1
