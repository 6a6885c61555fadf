if redis.call('EXISTS', KEYS[1]) == 0 then return false end
for _, node in ipairs(redis.call('SMEMBERS', KEYS[2])) do
  redis.call('PUBLISH', ARGV[2] .. node, ARGV[1] .. ' closed')
end
redis.call('DEL', KEYS[1], KEYS[2])
return 1
