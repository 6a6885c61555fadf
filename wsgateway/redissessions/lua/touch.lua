local s = redis.call('HMGET', KEYS[1], 'tenant', 'lease')
if not s[1] then return false end
local t = redis.call('TIME')
redis.call('PEXPIRE', KEYS[1], ARGV[1])
redis.call('PEXPIRE', KEYS[2], ARGV[1])
return {s[1], t[1] * 1000 + math.floor(t[2] / 1000) + tonumber(ARGV[1]), s[2] or ''}
