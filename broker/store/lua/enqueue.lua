-- KEYS: m q, wakes channel prefix, then the meta keys of the guards' publisher sessions (none on a Redis
-- Cluster). ARGV: client id, n guards, the guards' epochs, then (delivery, qos, guard number or 0, receipt
-- incarnation or '', receipt number or 0) for every delivery of one batch for one session. Returns
-- {dropped, zone, skipped, refused} or -1 (no such session): dropped from the full queue, QoS0 skipped for
-- an offline session that does not keep it, and refused because the publisher's session is at another
-- epoch now (Message.sender_epoch); a message the session already got (Message.receipt) is left out. A
-- session connected somewhere is woken there by the same script: no stale owner cache.
if redis.call('EXISTS', KEYS[1]) == 0 then return -1 end
local meta = redis.call('HMGET', KEYS[1], 'qos0', 'online', 'gone')
if meta[3] then return -1 end  -- ended, kept only for its will (REAP)
local skip_qos0 = meta[1] == '0' and meta[2] ~= '1'
local ng = tonumber(ARGV[2])
local ok = guards_ok(4, 3, ng)
local items, skipped, refused = {}, 0, 0
for j = 3 + ng, #ARGV, 5 do
  local g = tonumber(ARGV[j + 2])
  if g > 0 and not ok[g] then
    refused = refused + 1
  elseif skip_qos0 and ARGV[j + 1] == '0' then
    skipped = skipped + 1
  elseif first_time(KEYS[1], ARGV[j + 3], ARGV[j + 4]) then
    items[#items + 1] = ARGV[j]
  end
end
local dropped, zone = queue_push(KEYS[1], KEYS[2], KEYS[3], ARGV[1], items)
return {dropped, zone, skipped, refused, refused > 0 and failed(ok) or {}}
