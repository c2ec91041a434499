-- KEYS: m s q i r, events channel. ARGV: node, clean start, client id, packed will ('' = none), will delay,
-- expiry, zone, username, 1|0 (whether there is a username), an incarnation for a new session, the claim's
-- token. The will is kept with the session so that, if this node dies, another node publishes it, as the
-- zone's rules allow for that client (zone and username). A session gets an incarnation when it is created
-- (Message.receipt). The claim's token, kind, previous owner and the will of a session Clean Start ended
-- stay in the meta (ctok, ckind, cprev, cew/cez/ceu) until the next claim: the same claim sent again (its
-- reply was lost) gets the same answer, and a claimer that never heard back reads them (CLAIMED).
-- Returns {epoch, 0|1 (new | Clean Start discarded one), {}, previous owner, ended will, its zone, its
-- username, incarnation} or {epoch, 2, previous owner, meta, subscriptions, journal, awaiting rel}.
local function state(epoch, kind, previous)
  if kind ~= 2 then
    local e = redis.call('HMGET', KEYS[1], 'cew', 'cez', 'ceu', 'inc')
    return {epoch, kind, {}, previous, e[1] or '', e[2], e[3], e[4]}
  end
  return {epoch, 2, previous, redis.call('HGETALL', KEYS[1]), redis.call('HGETALL', KEYS[2]),
          redis.call('HGETALL', KEYS[4]), redis.call('HGETALL', KEYS[5])}
end
-- The same claim sent again (its reply was lost): the same answer, nothing done twice. What was queued
-- for the session since is moved into its journal as the first run moved what was queued before: the
-- receipts the answer carries (x:) count those too, so it must hold them.
local ran = redis.call('HMGET', KEYS[1], 'ctok', 'epoch', 'ckind', 'cprev')
if ran[1] == ARGV[11] then
  if ran[3] == '2' then move_queue(KEYS[1], KEYS[3], KEYS[4], 0) end
  return state(tonumber(ran[2]), tonumber(ran[3]), ran[4] or '')
end
local existed = redis.call('EXISTS', KEYS[1]) == 1
-- a session reaped as ended, kept only for its will: ended now whatever the Clean Start flag says
local clean = ARGV[2] == '1' or redis.call('HGET', KEYS[1], 'gone') == '1'
local prev = redis.call('HMGET', KEYS[1], 'node', 'online')
local previous = ''
if prev[2] == '1' and prev[1] then previous = prev[1] end
local epoch = redis.call('HINCRBY', KEYS[1], 'epoch', 1)
local ended = {false, false, false}
if existed and clean then
  -- Clean Start ends the stored session: a will it still had waiting goes out now [MQTT-3.1.3-9]
  if redis.call('HEXISTS', KEYS[1], 'will_at') == 1 then ended = redis.call('HMGET', KEYS[1], 'will', 'zone', 'user') end
  redis.call('DEL', KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5])
  redis.call('HSET', KEYS[1], 'epoch', epoch)
  redis.call(@PUBLISH@, KEYS[6], session_ended(ARGV[1], ARGV[3]))
end
local kind = (not existed) and 0 or (clean and 1 or 2)
redis.call('HSET', KEYS[1], 'node', ARGV[1], 'online', '1', 'expiry', ARGV[6], 'zone', ARGV[7],
           'ctok', ARGV[11], 'ckind', kind, 'cprev', previous)
redis.call('HDEL', KEYS[1], 'cew', 'cez', 'ceu', 'rtok', 'wtok')
if ended[1] then redis.call('HSET', KEYS[1], 'cew', ended[1], 'cez', ended[2] or '') end
if ended[1] and ended[3] then redis.call('HSET', KEYS[1], 'ceu', ended[3]) end
redis.call('HSETNX', KEYS[1], 'inc', ARGV[10])
if ARGV[9] == '1' then redis.call('HSET', KEYS[1], 'user', ARGV[8]) else redis.call('HDEL', KEYS[1], 'user') end
-- the reconnect cancels a will still waiting for its delay [MQTT-3.1.3-9]; the new connection brings its own
redis.call('HDEL', KEYS[1], 'will_at')
if ARGV[4] ~= '' then
  redis.call('HSET', KEYS[1], 'will', ARGV[4], 'will_delay', ARGV[5])
else
  redis.call('HDEL', KEYS[1], 'will', 'will_delay')
end
for k = 1, 5 do redis.call('PERSIST', KEYS[k]) end
if kind == 2 then move_queue(KEYS[1], KEYS[3], KEYS[4], 0) end
return state(epoch, kind, previous)
