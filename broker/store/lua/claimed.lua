-- KEYS: m. ARGV: a claim's token. Whether that claim ran (its claimer never heard back), read without
-- changing anything: {0} if not (or a later claim ran since), else {1, its kind, ended will, its zone, its
-- username}.
local c = redis.call('HMGET', KEYS[1], 'ctok', 'ckind', 'cew', 'cez', 'ceu')
if c[1] ~= ARGV[1] then return {0} end
return {1, tonumber(c[2]), c[3] or '', c[4], c[5]}
