-- KEYS: m. The node a session's client is connected to, if any.
local m = redis.call('HMGET', KEYS[1], 'node', 'online')
if m[2] == '1' then return m[1] end
return false
