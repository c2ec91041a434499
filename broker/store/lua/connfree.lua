-- KEYS: a user's connections (keys.user_connections). ARGV: client id, this node's instance.
-- Gives the client's connection back, unless another node holds it now (a takeover). Idempotent.
if redis.call('HGET', KEYS[1], ARGV[1]) == ARGV[2] then
  redis.call('HDEL', KEYS[1], ARGV[1])
end
return 1
