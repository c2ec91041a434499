-- KEYS: m s q i r, events channel. ARGV: a claim's token, node, client id. Undo what a claim whose client was
-- refused left behind (its claimer never heard back, so the CONNACK said the server was unavailable):
-- a session it resumed waits for its client again (its expiry as TTL), one it created ends; nothing if a
-- later claim, or another node, took the session since. Returns 1 (undone, or nothing to undo).
local c = redis.call('HMGET', KEYS[1], 'ctok', 'ckind', 'node', 'online', 'expiry')
if c[1] ~= ARGV[1] or c[3] ~= ARGV[2] or c[4] ~= '1' then return 1 end
local ttl = math.floor(tonumber(c[5] or '0') * 1000)
if c[2] ~= '2' or ttl <= 0 then
  redis.call('DEL', KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5])
  redis.call(@PUBLISH@, KEYS[6], session_ended(ARGV[2], ARGV[3]))
  return 1
end
redis.call('HSET', KEYS[1], 'online', '0', 'node', '')
redis.call('HDEL', KEYS[1], 'will', 'will_delay', 'ctok')
for k = 1, 5 do redis.call('PEXPIRE', KEYS[k], ttl) end
return 1
