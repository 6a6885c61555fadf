local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local info = redis.call('INFO', 'server', 'memory')
local started = now - (tonumber(string.match(info, 'uptime_in_seconds:(%d+)')) or 0) * 1000000
local policy = string.match(info, 'maxmemory_policy:(%S+)') or 'noeviction'
if (tonumber(string.match(info, 'maxmemory:(%d+)')) or 0) > 0 and policy ~= 'noeviction' then
  return redis.error_reply('ADMIT_EVICTS the home Redis may evict keys (maxmemory-policy ' .. policy ..
    '), which would hand out again what they granted: set maxmemory-policy noeviction, or maxmemory 0')
end
local region, kind = ARGV[1], ARGV[2]
local want, demand = tonumber(ARGV[3]), tonumber(ARGV[4])
local i, gen, avail, capacity, leastT
local T, tat, c, pend, tau, look, maxDebt = 0
-- shapeMemory is how long (µs) a bucket's earlier shapes are remembered
-- for the give-backs of what they granted: far beyond a pool's hold.
local shapeMemory = 600000000
-- adopt returns tat, a bucket's timeline written under the shape old
-- (n/per/burst), as a timeline of this rule's shape (T, tau, burst), as
-- one Redis's bucket adopts a state of another shape: the tokens it holds
-- now are kept, capped at the new burst, with the part of the next token
-- already refilled scaled to the new interval and rounded down; a debt
-- (or what was granted ahead) is kept as the time it takes to repay; a
-- full bucket stays full.
local function adopt(old, tat, now, T, tau, burst)
  local on, oper, oburst = string.match(old, '^(%d+)/(%d+)/(%d+)$')
  if not on then return tat end
  local oT = tonumber(oper) / tonumber(on)
  local otau = tonumber(oburst) * oT
  local e = tat - now
  if e <= 0 then return now end
  if e > otau then return math.ceil(now + tau + e - otau) end
  local held = (otau - e) / oT
  local m = math.floor(held)
  if m >= burst then return now end
  return math.ceil(now + tau - m * T - math.floor((held - m) * T))
end
if kind == 'b' then
  local n, per = tonumber(ARGV[5]), tonumber(ARGV[6])
  local burst, initial = tonumber(ARGV[7]), tonumber(ARGV[8])
  look, maxDebt = tonumber(ARGV[9]), tonumber(ARGV[10])
  i = 11
  T = per / n
  tau = burst * T
  capacity = n * 1000000 / per
  local sh = ARGV[5] .. '/' .. ARGV[6] .. '/' .. ARGV[7]
  local h = redis.call('HMGET', KEYS[1], 'tat', 'gen', 'sh', 'mT', 'mTu')
  tat, gen = tonumber(h[1]), tonumber(h[2])
  if tonumber(h[5]) and tonumber(h[5]) > now then leastT = math.min(T, tonumber(h[4])) end
  if not tat then
    gen = now
    tat = math.ceil(math.max(now + (burst - initial) * T, started + tau + look))
    redis.call('HSET', KEYS[1], 'gen', string.format('%d', gen), 'sh', sh)
  elseif h[3] and h[3] ~= sh then
    tat = adopt(h[3], tat, now, T, tau, burst)
    -- Give-backs of units granted under the old shape may still come
    -- (within a pool's hold, or later from a pool that could not reach
    -- home): for a while they repay a debt at the least interval of the
    -- shapes it had, so that units granted cheap never repay dear time.
    local on, oper = string.match(h[3], '^(%d+)/(%d+)/')
    leastT = math.min(leastT or T, tonumber(oper) / tonumber(on))
    redis.call('HSET', KEYS[1], 'sh', sh, 'mT', tostring(leastT), 'mTu', string.format('%d', now + shapeMemory))
  elseif not h[3] then
    redis.call('HSET', KEYS[1], 'sh', sh)
  end
else
  local limit, wu = tonumber(ARGV[5]), tonumber(ARGV[6])
  local s1, e1, e2 = tonumber(ARGV[7]), tonumber(ARGV[8]), tonumber(ARGV[9])
  i = 10
  local pstart
  local q = redis.call('HMGET', KEYS[1], 'qs', 'qe')
  if wu > 0 then
    pend = now - math.fmod(now, wu) + wu
    pstart = pend - wu
  elseif tonumber(q[2]) and tonumber(q[2]) > now then
    -- A quota's period in progress keeps its end whatever changes: a
    -- new period (or anchor) starts at the next one.
    pstart, pend = tonumber(q[1]), tonumber(q[2])
  elseif now < e1 then
    pstart, pend = s1, e1
  else
    pstart, pend = e1, e2
  end
  if wu == 0 and tonumber(q[2]) ~= pend then
    redis.call('HSET', KEYS[1], 'qs', string.format('%d', pstart), 'qe', string.format('%d', pend))
  end
  -- Shares are of a rate: the limit over the period's length.
  capacity = limit * 1000000 / (pend - pstart)
  -- A count per period end, as one Redis keeps a window's: a period
  -- whose length changed counts anew, and finds its count again when
  -- changed back while it lasts.
  local h = redis.call('HMGET', KEYS[1], 'e:' .. string.format('%d', pend), 'p', 'c')
  c = tonumber(h[1])
  if not c then
    c = 0
    -- Written by an earlier version: one count, of the period ending at p.
    if tonumber(h[2]) == pend then c = tonumber(h[3]) or 0 end
  end
  if h[2] then redis.call('HDEL', KEYS[1], 'p', 'c') end
  gen = pend
end
-- A give-back of m > 0 unspent units lowers what was handed out; one of
-- m < 0 is a debt (debits a region could not pay), charged as one Redis
-- charges a debit: the bucket's timeline moves on, the count goes up.
local function giveBack(m)
  if kind == 'b' then
    if m > 0 and leastT and leastT < T then
      -- Units that may have been granted under a cheaper shape repay a
      -- debt at its interval, then come back as whole tokens.
      local debt = math.max(tat - now - tau, 0)
      local give = m * leastT
      if give <= debt then
        tat = tat - math.floor(give)
      else
        tat = math.max(now, tat - debt - math.floor((give - debt) / leastT) * T)
      end
    elseif m > 0 then
      tat = math.max(now, tat - math.floor(m * T))
    else
      -- As one Redis charges a debit: into debt by at most maxDebt.
      tat = math.ceil(math.min(math.max(now, tat) - m * T, math.max(tat, now + tau + maxDebt * T)))
    end
  else
    c = math.max(0, c - m)
  end
end
-- giveBackTo gives back m units to another period in progress, ending at
-- g, if it is counted: the period of another length they came from.
local function giveBackTo(g, m)
  if g <= now then return end
  local f = 'e:' .. string.format('%d', g)
  local x = tonumber(redis.call('HGET', KEYS[1], f))
  if x then redis.call('HSET', KEYS[1], f, string.format('%d', math.max(0, x - m))) end
end
local last = tonumber(redis.call('HGET', KEYS[1], 's:' .. region)) or 0
while i + 2 <= #ARGV do
  local g, m, seq = tonumber(ARGV[i]), tonumber(ARGV[i + 1]), tonumber(ARGV[i + 2])
  -- Units go back only to the incarnation (or period) they came from; a
  -- bucket's debt counts in any, since it only admits less.
  if seq > last and m ~= 0 and (g == gen or m < 0 and kind == 'b') then
    giveBack(m)
  elseif seq > last and m ~= 0 and kind == 'c' then
    giveBackTo(g, m)
  end
  if seq > last then last = seq end
  i = i + 3
end
redis.call('HSET', KEYS[1], 's:' .. region, string.format('%d', last), 'd:' .. region, tostring(demand), 't:' .. region, string.format('%d', now))
-- Max-min fair shares among the regions that asked within the last
-- second, by their demands.
local all = redis.call('HGETALL', KEYS[1])
local ds, at, mine, total = {}, {}, 0, 0
-- Counts of periods that ended go; lastEnd is the latest end counted.
local lastEnd = 0
for j = 1, #all, 2 do
  local f = all[j]
  local k = string.sub(f, 1, 2)
  if k == 't:' then
    at[string.sub(f, 3)] = tonumber(all[j + 1])
  elseif k == 'e:' then
    local e = tonumber(string.sub(f, 3))
    if e <= now then redis.call('HDEL', KEYS[1], f) elseif e > lastEnd then lastEnd = e end
  end
end
for j = 1, #all, 2 do
  local f = all[j]
  if string.sub(f, 1, 2) == 'd:' then
    local r, d = string.sub(f, 3), tonumber(all[j + 1]) or 0
    if now - (at[r] or 0) <= 1000000 and d > 0 then ds[#ds + 1] = {r, d} end
  end
end
table.sort(ds, function(a, b) return a[2] < b[2] end)
-- level is the region's fair level: the most it would get were its
-- demand unbounded; a region asking for more than that is over its share.
local left, level, asked = capacity, capacity, 0
for j = 1, #ds do
  local l = left / (#ds - j + 1)
  local a = math.min(ds[j][2], l)
  left = left - a
  total = total + a
  asked = asked + ds[j][2]
  if ds[j][1] == region then mine, level = a, l end
end
-- Regions together asking for more than the limit (by a quarter: the
-- demands are moving averages of bursts) make the level negative, and
-- then none of them waits for the home (see poolScript).
if #ds > 1 and asked > 1.25 * capacity then level = -level end
local w = 1
if total > 0 then w = mine / total end
local g, first, lastu, name, ttl, spentFor
if kind == 'b' then
  if now > tat then tat = now end
  avail = math.floor((now + tau + look - tat) / T)
else
  T = 0
  avail = tonumber(ARGV[5]) - c
end
g = math.max(math.min(want, math.floor(w * avail)), 0)
if g < 1 and want >= 1 and avail >= 1 then g = 1 end
if kind == 'b' then
  name = tat
  first = math.ceil(tat + T - tau - now)
  lastu = math.ceil(tat + g * T - tau - now)
  tat = math.ceil(tat + g * T)
  -- Nothing more to grant until the next unit comes within the lookahead.
  spentFor = 0
  if avail - g < 1 then spentFor = math.max(math.ceil(tat + T - tau - look - now), 0) end
  redis.call('HSET', KEYS[1], 'tat', string.format('%d', tat))
  ttl = math.ceil((tat - now + look) / 1000) + 60000
else
  name = c
  c = c + g
  first, lastu = 0, pend - now
  spentFor = 0
  if avail - g < 1 then spentFor = pend - now end
  redis.call('HSET', KEYS[1], 'e:' .. string.format('%d', pend), string.format('%d', c))
  ttl = math.ceil((math.max(pend, lastEnd) - now) / 1000) + 60000
end
redis.call('PEXPIRE', KEYS[1], ttl)
return {g, first, lastu, gen, math.floor(w * 1000000), tostring(T), string.format('%d', name), spentFor, tostring(level)}
