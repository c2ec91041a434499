-- KEYS: m, s, q, i, r. A session as the management API lists it, in one reply instead of five: false if
-- it ended (or is kept only for its will), else {node it is connected to or '', zone, username or false,
-- expiry, subscriptions, deliveries kept (journal and queue), awaiting PUBREL}.
local m = redis.call('HMGET', KEYS[1], 'node', 'online', 'zone', 'user', 'expiry', 'gone')
if not m[3] or m[6] then return false end
local node = ''
if m[2] == '1' and m[1] then node = m[1] end
return {node, m[3], m[4], m[5] or '0', redis.call('HLEN', KEYS[2]),
        redis.call('HLEN', KEYS[4]) + redis.call('LLEN', KEYS[3]), redis.call('HLEN', KEYS[5])}
