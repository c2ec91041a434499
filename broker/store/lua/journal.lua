-- KEYS: m i r q, wakes channel prefix, then the meta keys of the guards' publisher sessions (none on a Redis
-- Cluster: they are in other slots). ARGV: epoch, next pid, order, client id, receipts counter, n guards,
-- the guards' epochs, n puts, (msg id, value)..., n dels, msg id..., n rel puts, (pid, value)..., n rel
-- dels, pid..., n seen, (publisher incarnation, highest receipt)..., n fresh, (put number, guard number or
-- 0, receipt incarnation or '', receipt number or 0, 1 if the session checked the receipt or 0 if it took
-- the delivery unchecked while catching up)..., then the hold ('' unchanged, the first position
-- reserved for what a pull brings, or -1 once caught up: Journal.hold, move_queue): the fresh puts are deliveries routed into the
-- session on this node since its last commit; one whose publisher was fenced meanwhile is not stored
-- (Message.sender_epoch; the node takes it back from its copy). Returns 1, or {0, dropped, zone, refused,
-- queued} when fenced: another node owns the session now and this node's changes to it are refused, but
-- what it routed into its stale copy still belongs to the session and is queued for it, as a routing
-- through the store would have been (but for what it already has: Message.receipt; the oldest dropped if
-- the session is offline and its queue full).
local ng = tonumber(ARGV[6])
local puts = 7 + ng
local dels = puts + 1 + 2 * tonumber(ARGV[puts])
local rputs = dels + 1 + tonumber(ARGV[dels])
local rdels = rputs + 1 + 2 * tonumber(ARGV[rputs])
local seen = rdels + 1 + tonumber(ARGV[rdels])
local fresh = seen + 1 + 2 * tonumber(ARGV[seen])
local nf = tonumber(ARGV[fresh])
local last = fresh + 5 * (nf - 1) + 1  -- the first field of the last fresh entry
local ok = guards_ok(6, 7, ng)
local refused = {}  -- put number -> true: routed for a publisher fenced meanwhile
local nrefused = 0
for j = fresh + 1, last, 5 do
  local g = tonumber(ARGV[j + 1])
  if g > 0 and not ok[g] then refused[tonumber(ARGV[j])] = true; nrefused = nrefused + 1 end
end
if redis.call('HGET', KEYS[1], 'epoch') ~= ARGV[1] then
  if nf == nrefused or redis.call('EXISTS', KEYS[1]) == 0 or redis.call('HEXISTS', KEYS[1], 'gone') == 1 then
    return {0, 0, '', nrefused, 0, failed(ok)}
  end
  local items = {}
  for j = fresh + 1, last, 5 do
    local n = tonumber(ARGV[j])
    if not refused[n] and first_time(KEYS[1], ARGV[j + 2], ARGV[j + 3]) then
      items[#items + 1] = queued_delivery(ARGV[puts + 2 * n])
    end
  end
  local dropped, zone = queue_push(KEYS[1], KEYS[4], KEYS[5], ARGV[4], items)
  return {0, dropped, zone, nrefused, #items, failed(ok)}
end
local m = redis.call('HMGET', KEYS[1], 'order', 'rcv')
local order = math.max(tonumber(m[1] or '0'), tonumber(ARGV[3]))
local received = math.max(tonumber(m[2] or '0'), tonumber(ARGV[5]))
redis.call('HSET', KEYS[1], 'next_pid', ARGV[2], 'order', string.format('%d', order),
           'rcv', string.format('%d', received))
-- A delivery routed here whose receipt the session already accepted through the store: its publisher sent
-- it again through another node (this node's commit was late), so a copy waits in the queue or the journal.
-- One the session checked is its own: that is remembered (meta field d:<incarnation>:<number> = its message
-- id), so that whoever restores the session drops the other even once this one is delivered and gone. One
-- it took unchecked while catching up is the repeat, and is not kept: the session drops it once caught up,
-- but whoever restores the session before that would deliver it again.
local repeats = {}  -- put number -> true
local nrepeats = 0
for j = fresh + 1, last, 5 do
  local inc = ARGV[j + 2]
  if inc ~= '' and tonumber(ARGV[j + 3]) <= tonumber(redis.call('HGET', KEYS[1], 'x:' .. inc) or '0') then
    if ARGV[j + 4] == '1' then
      local field = ARGV[puts + 2 * tonumber(ARGV[j]) - 1]
      redis.call('HSETNX', KEYS[1], 'd:' .. inc .. ':' .. ARGV[j + 3], field)
    elseif not refused[tonumber(ARGV[j])] then
      repeats[tonumber(ARGV[j])] = true
      nrepeats = nrepeats + 1
    end
  end
end
for j = seen + 1, seen + 2 * tonumber(ARGV[seen]), 2 do first_time(KEYS[1], ARGV[j], ARGV[j + 1]) end
local hold = ARGV[fresh + 5 * nf + 1]
if hold == '-1' then
  redis.call('HDEL', KEYS[1], 'rsv', 'rsvn')
elseif hold ~= '' and redis.call('HEXISTS', KEYS[1], 'rsv') == 0 then
  -- what is queued now goes ahead of what this commit holds back, whoever moves it (move_queue)
  redis.call('HSET', KEYS[1], 'rsv', hold, 'rsvn', redis.call('LLEN', KEYS[4]))
end
if nrefused + nrepeats == 0 then
  hset_pairs(KEYS[2], ARGV, puts + 1, tonumber(ARGV[puts]))
else
  local t = {}
  for n = 1, tonumber(ARGV[puts]) do
    if not (refused[n] or repeats[n]) then t[#t + 1] = ARGV[puts + 2 * n - 1]; t[#t + 1] = ARGV[puts + 2 * n] end
  end
  hset_pairs(KEYS[2], t, 1, #t / 2)
end
hdel_list(KEYS[2], ARGV, dels + 1, tonumber(ARGV[dels]))
hset_pairs(KEYS[3], ARGV, rputs + 1, tonumber(ARGV[rputs]))
hdel_list(KEYS[3], ARGV, rdels + 1, tonumber(ARGV[rdels]))
if nrefused > 0 then return {1, failed(ok)} end
return 1
