-- Helpers every script of the Redis store starts with (after wire's, generated: wire.LUA_PRELUDE).
local function hset_pairs(key, list, first, n)
  local t = {}
  for j = 0, n - 1 do
    t[#t + 1] = list[first + 2 * j]; t[#t + 1] = list[first + 2 * j + 1]
    if #t >= CHUNK_N then redis.call('HSET', key, unpack(t)); t = {} end
  end
  if #t > 0 then redis.call('HSET', key, unpack(t)) end
end
local function hdel_list(key, list, first, n)
  local t = {}
  for j = 0, n - 1 do
    t[#t + 1] = list[first + j]
    if #t >= CHUNK_N then redis.call('HDEL', key, unpack(t)); t = {} end
  end
  if #t > 0 then redis.call('HDEL', key, unpack(t)) end
end
-- The stored bytes of packed deliveries (what a queue's byte limit counts, meta field 'qb').
local function sizes(items, from, to)
  local n = 0
  for k = from or 1, to or #items do n = n + #items[k] end
  return n
end
-- Items taken off the front of queue q: its byte count goes down (and starts over once it is empty, so a
-- count that drifted, or began after the queue did, heals).
local function drained(m, q, items)
  if redis.call('LLEN', q) == 0 then
    redis.call('HDEL', m, 'qb')
  else
    redis.call('HINCRBY', m, 'qb', -sizes(items))
  end
end
-- Move up to n (all if n <= 0) deliveries queued in q into the journal i, numbering them in order from
-- `first` (positions the owner reserved for them: its later deliveries come after, whatever it stored
-- since) or, without one, from the stored counter. The counter only grows. An owner that held
-- deliveries back behind a reservation left it in the meta (rsv: its first position not yet filled, rsvn:
-- how many queued deliveries it was for; JOURNAL): without `first` (a claim), those deliveries still go
-- into it, ahead of what was held back, and only what was queued after go after.
local function move_queue(m, q, i, n, first)
  local items = redis.call('LRANGE', q, 0, n > 0 and n - 1 or -1)
  local meta = redis.call('HMGET', m, 'order', 'rsv', 'rsvn')
  local stored = tonumber(meta[1] or '0')
  local left = tonumber(meta[3] or '0')
  local start = first or stored
  local reserved, at = 0, start
  if meta[2] and not first then  -- a claim: the reservation is used up here, or never will be
    reserved = math.min(left, #items)
    if reserved > 0 then at = tonumber(meta[2]) end
    redis.call('HDEL', m, 'rsv', 'rsvn')
  elseif meta[2] and #items > 0 then  -- the owner fills its reservation
    redis.call('HSET', m, 'rsv', string.format('%d', first + #items),
               'rsvn', string.format('%d', math.max(left - #items, 0)))
  end
  if #items == 0 then return start, items end
  redis.call('LTRIM', q, #items, -1)
  drained(m, q, items)
  local t, top = {}, stored
  for k = 1, #items do
    if k == reserved + 1 and reserved > 0 then at = stored end
    t[#t + 1] = string.sub(items[k], 1, @ID_LEN@)
    t[#t + 1] = string.format('%d', at) .. ':' .. items[k]
    if at >= top then top = at + 1 end
    at = at + 1
    if #t >= CHUNK_N then redis.call('HSET', i, unpack(t)); t = {} end
  end
  if #t > 0 then redis.call('HSET', i, unpack(t)) end
  redis.call('HSET', m, 'order', string.format('%d', top))
  return start, items
end
-- Whether each of n publisher sessions, whose meta keys are KEYS[first_key...], is still at the epoch in
-- ARGV[first_arg...]: what a node routed for a publisher fenced meanwhile is not queued (its client sends
-- it again to the new owner, which routes it itself).
local function guards_ok(first_key, first_arg, n)
  local ok = {}
  for g = 1, n do ok[g] = redis.call('HGET', KEYS[first_key + g - 1], 'epoch') == ARGV[first_arg + g - 1] end
  return ok
end
-- The numbers of the guards that failed: their publishers' nodes must not acknowledge what was refused.
local function failed(ok)
  local out = {}
  for g = 1, #ok do if not ok[g] then out[#out + 1] = g end end
  return out
end
-- Whether a message with the receipt (publisher incarnation `inc`, number `n`) is new to the session with
-- meta m, which remembers the highest number it accepted of each incarnation (field x:<inc>); always true
-- without a receipt (inc = '').
local function first_time(m, inc, n)
  if inc == '' then return true end
  local field = 'x:' .. inc
  if tonumber(n) <= tonumber(redis.call('HGET', m, field) or '0') then return false end
  redis.call('HSET', m, field, n)
  return true
end
-- Append packed deliveries to the queue q of the session with meta m, as any routing through the store
-- does: wake its owner (on the channel `wakes` .. node) if the queue was empty (the owner drains the whole
-- queue when woken, and wakes itself after a partial pull), keep the session's TTL, and trim an offline
-- session's queue to its limit (the oldest go, or the new ones with 'qnew'). Returns how many were dropped and the session's zone.
local function queue_push(m, q, wakes, cid, items)
  local meta = redis.call('HMGET', m, 'maxq', 'zone', 'online', 'node', 'qnew', 'maxb')
  local online = meta[3] == '1'
  local before = redis.call('LLEN', q)
  for j = 1, #items, CHUNK_N do
    redis.call('RPUSH', q, unpack(items, j, math.min(j + CHUNK_N - 1, #items)))
  end
  local len = before + #items
  if before == 0 and len > 0 and online and meta[4] then
    redis.call(@PUBLISH@, wakes .. meta[4], wake(cid))
  end
  local ttl = redis.call('PTTL', m)
  if ttl > 0 then redis.call('PEXPIRE', q, ttl) end
  local qb = redis.call('HINCRBY', m, 'qb', sizes(items))
  local dropped = 0
  local max = tonumber(meta[1] or '0')
  local drop_new = meta[5] == '1'
  if max > 0 and not online and len > max then
    dropped = len - max
    if drop_new then
      qb = redis.call('HINCRBY', m, 'qb', -sizes(items, math.max(#items - dropped + 1, 1)))
      redis.call('LTRIM', q, 0, max - 1)
    else
      qb = redis.call('HINCRBY', m, 'qb', -sizes(redis.call('LRANGE', q, 0, dropped - 1)))
      redis.call('LTRIM', q, dropped, -1)
    end
    len = max
  end
  local maxb = tonumber(meta[6] or '0')
  if maxb > 0 and not online then  -- then by bytes (meta 'qb'), as the overflow policy says
    local room = drop_new and math.min(#items - dropped, len) or len
    while qb > maxb and room > 0 do
      local gone = drop_new and redis.call('RPOP', q) or redis.call('LPOP', q)
      qb = redis.call('HINCRBY', m, 'qb', -#gone)
      dropped, room = dropped + 1, room - 1
    end
  end
  return dropped, meta[2] or 'default'
end
