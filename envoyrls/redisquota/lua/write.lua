-- KEYS[1]: a limit's ledger. ARGV: the version read, the new state, its
-- time to live in ms. Writes the state as the next version if the version
-- is still the one read, and returns 1; else returns what read.lua would,
-- for the caller to try again.
local v = redis.call('HGET', KEYS[1], 'v') or '0'
if v == ARGV[1] then
  redis.call('HSET', KEYS[1], 'v', tostring(tonumber(v) + 1), 's', ARGV[2])
  redis.call('PEXPIRE', KEYS[1], ARGV[3])
  return 1
end
local t = redis.call('TIME')
return {t[1], t[2], v, redis.call('HGET', KEYS[1], 's') or ''}
