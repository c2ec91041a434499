-- KEYS: m s q i r, events channel. ARGV: epoch ('' = unfenced), node, client id
local epoch = redis.call('HGET', KEYS[1], 'epoch')
if epoch and ARGV[1] ~= '' and epoch ~= ARGV[1] then return -1 end
redis.call('DEL', KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5])
redis.call(@PUBLISH@, KEYS[6], session_ended(ARGV[2], ARGV[3]))
return 1
