local cur = redis.call('GET', KEYS[1])
local rev = 0
if cur then rev = cjson.decode(cur).revision or 0 end
if rev ~= tonumber(ARGV[2]) then return 0 end
redis.call('SET', KEYS[1], ARGV[1])
redis.call('SET', KEYS[2], ARGV[4])
redis.call('PUBLISH', ARGV[3], ARGV[4])
return 1
