if redis.call('EXISTS', KEYS[1]) == 1 then return false end
local t = redis.call('TIME')
redis.call('HSET', KEYS[1], 'tenant', ARGV[1], 'seq', 0, 'lease', ARGV[3])
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return t[1] * 1000 + math.floor(t[2] / 1000) + tonumber(ARGV[2])
