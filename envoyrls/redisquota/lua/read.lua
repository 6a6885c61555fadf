-- KEYS[1]: a limit's ledger. Returns Redis's clock (seconds,
-- microseconds), the state's version (0 if none) and the state.
local t = redis.call('TIME')
local s = redis.call('HMGET', KEYS[1], 'v', 's')
return {t[1], t[2], s[1] or '0', s[2] or ''}
