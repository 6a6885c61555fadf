-- KEYS: bans (hash id -> ban), expiry (zset id by expires_ms), history
-- (hash key -> "strikes:until_ms:forget_ms"), history expiry (zset key by
-- forget_ms), revision, escalated (zset of the escalations' ban ids by
-- expires_ms), history rank (zset key by strikes, then forget_ms: the
-- entry a full history forgets first).
-- ARGV: op ("add", "esc" or "del"), now_ms, id, ban JSON, max bans,
-- channel, then for esc: history key, base_ms, max_ms, forget_ms, max
-- history, max bans of the escalations.
-- Returns {code, ban JSON[, evicted id]}: 1 saved (or deleted), 0 one in
-- force already (add, esc) or none (del), -1 full; an escalation's ban
-- that replaced another's names it.
local now = tonumber(ARGV[2])
local id = ARGV[3]
-- Expired bans and forgotten history leave as changes are made.
local gone = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now, 'LIMIT', 0, 1000)
for _, g in ipairs(gone) do
  redis.call('HDEL', KEYS[1], g)
  redis.call('ZREM', KEYS[2], g)
  redis.call('ZREM', KEYS[6], g)
end
local forgot = redis.call('ZRANGEBYSCORE', KEYS[4], '-inf', now, 'LIMIT', 0, 1000)
for _, g in ipairs(forgot) do
  redis.call('HDEL', KEYS[3], g)
  redis.call('ZREM', KEYS[4], g)
  redis.call('ZREM', KEYS[7], g)
end
local function changed()
  local rev = redis.call('INCR', KEYS[5])
  redis.call('PUBLISH', ARGV[6], rev)
end
local op = ARGV[1]
local cur = redis.call('HGET', KEYS[1], id)
if op == 'del' then
  if not cur then return {0, ''} end
  redis.call('HDEL', KEYS[1], id)
  redis.call('ZREM', KEYS[2], id)
  redis.call('ZREM', KEYS[6], id)
  changed()
  return {1, cur}
end
if cur then return {0, cur} end
local evicted = ''
if op == 'esc' and redis.call('ZCARD', KEYS[6]) >= tonumber(ARGV[12]) then
  -- The escalations hold their part: the new ban replaces the one of
  -- theirs that would end soonest.
  local soonest = redis.call('ZPOPMIN', KEYS[6])
  if soonest[1] then
    evicted = soonest[1]
    redis.call('HDEL', KEYS[1], evicted)
    redis.call('ZREM', KEYS[2], evicted)
  end
end
if redis.call('HLEN', KEYS[1]) >= tonumber(ARGV[5]) then return {-1, ''} end
local ban = cjson.decode(ARGV[4])
if op == 'esc' then
  local hkey = ARGV[7]
  local base, most, forget = tonumber(ARGV[8]), tonumber(ARGV[9]), tonumber(ARGV[10])
  local strikes = 0
  local h = redis.call('HGET', KEYS[3], hkey)
  if h then
    local s, _, f = string.match(h, '^(%d+):(%d+):(%d+)$')
    if s and tonumber(f) >= now then strikes = tonumber(s) end
  end
  local d = base
  for _ = 1, strikes do
    if d >= most / 2 then d = most break end
    d = d * 2
  end
  if d > most then d = most end
  ban.strike = strikes + 1
  ban.created_ms = now
  ban.expires_ms = now + d
  if not h and redis.call('HLEN', KEYS[3]) >= tonumber(ARGV[11]) then
    -- A full history forgets the fewest strikes first, so that a flood
    -- of identifiers banned once does not wipe a repeat offender's.
    local least = redis.call('ZPOPMIN', KEYS[7])
    if least[1] then
      redis.call('HDEL', KEYS[3], least[1])
      redis.call('ZREM', KEYS[4], least[1])
    end
  end
  local until_ms = ban.expires_ms
  redis.call('HSET', KEYS[3], hkey, string.format('%d:%d:%d', ban.strike, until_ms, until_ms + forget))
  redis.call('ZADD', KEYS[4], until_ms + forget, hkey)
  -- Ranked by strikes, then by when forgotten (both in one score: a
  -- strike counts for more than any time, 2^43 ms being past year 2248;
  -- at most 1,000 strikes counted, within a double's exact integers).
  redis.call('ZADD', KEYS[7], math.min(ban.strike, 1000) * 8796093022208 + until_ms + forget, hkey)
end
local out = cjson.encode(ban)
redis.call('HSET', KEYS[1], id, out)
redis.call('ZADD', KEYS[2], ban.expires_ms, id)
if op == 'esc' then redis.call('ZADD', KEYS[6], ban.expires_ms, id) end
changed()
return {1, out, evicted}
