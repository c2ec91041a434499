-- KEYS: m s q i r, events channel. ARGV: dead node, node, client id, the reaper's token, now (wall clock). A
-- session whose node died: it waits for its client like any other (TTL = its expiry), or ends now if it had
-- none. Its will is kept, due at will_at, for TAKEWILL to hand out once (a reaper whose reply is lost asks
-- again, with its token, and gets the same answer); an ended session keeps only that, marked gone, for a
-- minute. Returns {will, will_at or '0', expiry, kind, zone, username}: kind 0 = released, 1 = ended, 2 =
-- parked (earlier, or now) with a will waiting, 3 = ended with a will due now.
local m = redis.call('HMGET', KEYS[1], 'node', 'online', 'expiry', 'will', 'will_delay', 'will_at', 'zone', 'user',
                     'rtok', 'gone')
if m[9] == ARGV[4] then
  return {m[4] or '', m[6] or '0', m[3] or '0', m[10] == '1' and 3 or (m[6] and 2 or 0), m[7], m[8]}
end
if m[2] ~= '1' and m[6] then return {m[4], m[6], m[3] or '0', m[10] == '1' and 3 or 2, m[7], m[8]} end
if m[1] ~= ARGV[1] or m[2] ~= '1' then return false end
local expiry = tonumber(m[3] or '0')
local now = tonumber(ARGV[5])
if expiry <= 0 then
  redis.call(@PUBLISH@, KEYS[6], session_ended(ARGV[2], ARGV[3]))
  if not m[4] then
    redis.call('DEL', KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5])
    return {'', '0', '0', 1, m[7], m[8]}
  end
  redis.call('DEL', KEYS[2], KEYS[3], KEYS[4], KEYS[5])
  local due = string.format('%.3f', now)
  redis.call('HINCRBY', KEYS[1], 'epoch', 1)  -- (whatever its node still writes is fenced)
  redis.call('HSET', KEYS[1], 'online', '0', 'node', '', 'gone', '1', 'rtok', ARGV[4], 'will_at', due)
  redis.call('PEXPIRE', KEYS[1], 60000)
  return {m[4], due, '0', 3, m[7], m[8]}
end
redis.call('HSET', KEYS[1], 'online', '0', 'node', '', 'rtok', ARGV[4])
local due = '0'
if m[4] then
  due = string.format('%.3f', now + math.min(tonumber(m[5] or '0'), expiry))
  redis.call('HSET', KEYS[1], 'will_at', due)
end
for k = 1, 5 do redis.call('PEXPIRE', KEYS[k], math.floor(expiry * 1000)) end
return {m[4] or '', due, m[3], m[4] and 2 or 0, m[7], m[8]}
