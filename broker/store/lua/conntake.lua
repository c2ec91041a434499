-- KEYS: a user's connections (keys.user_connections: client id -> node instance).
-- ARGV: client id, this node's instance, the limit, 1 if this is the last round (0 if not), the count n of
-- live instances, those n instances, then instances known to be dead.
-- Takes a connection for the client unless the user already has `limit` others held by live instances.
-- The client's own entry (a reconnect, a takeover) does not count against it; entries of dead instances (a
-- node killed, or restarted under the same name) are dropped on the way. An instance neither live nor dead
-- to the caller (a node that joined since its last look): in the first round nothing is written and the
-- script answers those instances, for the caller to look up; in the last it counts them. Sent again after
-- a lost reply, it finds the client's own entry and answers the same: {1} taken, {0} refused, or
-- {-1, instance...} to look up.
local n_live = tonumber(ARGV[5])
local live, dead = {}, {}
for i = 6, 5 + n_live do live[ARGV[i]] = true end
for i = 6 + n_live, #ARGV do dead[ARGV[i]] = true end
live[ARGV[2]] = true
local held, unknown, gone = 0, {}, {}
local entries = redis.call('HGETALL', KEYS[1])
for i = 1, #entries, 2 do
  local cid, instance = entries[i], entries[i + 1]
  if cid ~= ARGV[1] then
    if live[instance] then
      held = held + 1
    elseif dead[instance] then
      gone[#gone + 1] = cid
    elseif ARGV[4] == '1' then
      held = held + 1
    elseif not unknown[instance] then
      unknown[instance] = true
      unknown[#unknown + 1] = instance
    end
  end
end
if #unknown > 0 then
  local out = {-1}
  for _, instance in ipairs(unknown) do out[#out + 1] = instance end
  return out
end
if #gone > 0 then redis.call('HDEL', KEYS[1], unpack(gone)) end
if held >= tonumber(ARGV[3]) then return {0} end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
return {1}
