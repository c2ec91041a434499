-- KEYS: m s, events channel. ARGV: epoch, filter, packed options ('' = remove), node, client id. The change is announced
-- to the fleet by the script that stores it.
if redis.call('HGET', KEYS[1], 'epoch') ~= ARGV[1] then return -1 end
if ARGV[3] == '' then
  redis.call(@PUBLISH@, KEYS[3], route_removed(ARGV[4], ARGV[5], ARGV[2]))
  return redis.call('HDEL', KEYS[2], ARGV[2])
end
redis.call(@PUBLISH@, KEYS[3], route_added(ARGV[4], ARGV[5], ARGV[2], ARGV[3]))
return redis.call('HSET', KEYS[2], ARGV[2], ARGV[3])
