-- KEYS: m s q i r. ARGV: epoch, node, packed will ('' = none), will delay. A node back from losing Redis
-- holds on to a session its client is still connected to, if nobody took it meanwhile: still its own (1),
-- released by the fleet while it was away and taken back (2, with the will its connection has), or gone
-- (0: ended, or claimed since at a higher epoch).
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
local m = redis.call('HMGET', KEYS[1], 'epoch', 'node', 'online')
if m[1] ~= ARGV[1] then return 0 end
if m[3] == '1' then
  if m[2] == ARGV[2] then return 1 end
  return 0
end
redis.call('HSET', KEYS[1], 'node', ARGV[2], 'online', '1')
redis.call('HDEL', KEYS[1], 'will_at')
if ARGV[3] ~= '' then
  redis.call('HSET', KEYS[1], 'will', ARGV[3], 'will_delay', ARGV[4])
end
for k = 1, 5 do redis.call('PERSIST', KEYS[k]) end
return 2
