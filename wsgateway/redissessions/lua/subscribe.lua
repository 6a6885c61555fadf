local ttl = redis.call('PTTL', KEYS[1])
if ttl < 0 then return false end
redis.call('SADD', KEYS[2], ARGV[1])
redis.call('PEXPIRE', KEYS[2], ttl)
return 1
