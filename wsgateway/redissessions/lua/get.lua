local s = redis.call('HMGET', KEYS[1], 'tenant', 'lease')
if not s[1] then return false end
local t = redis.call('TIME')
return {s[1], t[1] * 1000 + math.floor(t[2] / 1000) + redis.call('PTTL', KEYS[1]), s[2] or ''}
