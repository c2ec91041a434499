-- KEYS: m q i. ARGV: epoch, n, journaled (1/0), first order reserved by the owner. Hands up to n queued
-- deliveries to the node the client is connected to; for a journaled session they move into its journal
-- in the same step.
if redis.call('HGET', KEYS[1], 'epoch') ~= ARGV[1] then return -1 end
local n = tonumber(ARGV[2])
if ARGV[3] == '1' then
  local start, items = move_queue(KEYS[1], KEYS[2], KEYS[3], n, tonumber(ARGV[4]))
  return {start, items}
end
local items = redis.call('LRANGE', KEYS[2], 0, n - 1)
if #items > 0 then
  redis.call('LTRIM', KEYS[2], #items, -1)
  drained(KEYS[1], KEYS[2], items)
end
return {-1, items}
