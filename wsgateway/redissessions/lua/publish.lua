if redis.call('EXISTS', KEYS[1]) == 0 then return false end
local seq = redis.call('HINCRBY', KEYS[1], 'seq', 1)
local t = redis.call('TIME')
local exp = t[1] * 1000 + math.floor(t[2] / 1000) + tonumber(ARGV[2])
redis.call('PEXPIRE', KEYS[1], ARGV[2])
redis.call('PEXPIRE', KEYS[2], ARGV[2])
local msg = ARGV[1] .. ' ' .. seq .. ' ' .. exp .. ' ' .. ARGV[4]
for _, node in ipairs(redis.call('SMEMBERS', KEYS[2])) do
  redis.call('PUBLISH', ARGV[3] .. node, msg)
end
return seq
