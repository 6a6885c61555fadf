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
local i, gen, avail, capacity, least
local b, tat, c, pend, look, maxDebt, ta, tf
-- shapeMemory is how long (µs) a bucket's earlier shapes are remembered
-- for the give-backs of what they granted: far beyond a pool's hold.
local shapeMemory = 600000000
-- A bucket's timeline is in integers, as one Redis's is (the arithmetic
-- above): a token takes T = per/n µs = q + r/n, tat is a whole µs, and
-- each time computed from it is rounded toward admitting less (tat and
-- unlocks up, what is given back down), so that the regions together
-- never admit more than the bucket would.
local function shape(n, per)
  return {n = n, q = (per - fmod(per, n)) / n, r = fmod(per, n)}
end
-- paceOf returns the shape a text "per/n" names (nil for another text).
local function paceOf(text)
  local per, n = string.match(text or '', '^(%d+)/(%d+)$')
  if not per then return nil end
  return shape(tonumber(n), tonumber(per))
end
-- cheaper reports whether shape x's token takes less time than y's.
local function cheaper(x, y)
  return cmpprod(x.q * x.n + x.r, y.n, y.q * y.n + y.r, x.n) < 0
end
-- adopt returns tat, a bucket's timeline written under the shape old
-- (n/per/burst), as a timeline of this rule's shape (b, burst), as one
-- Redis's bucket adopts a state of another shape: the tokens it holds
-- now are kept, capped at the new burst, with the part of the next token
-- already refilled scaled to the new interval and rounded down; a debt
-- (or what was granted ahead) is kept as the time it takes to repay; a
-- full bucket stays full.
local function adopt(old, tat, now, burst)
  local on, oper, oburst = string.match(old, '^(%d+)/(%d+)/(%d+)$')
  if not on then return tat end
  on, oper = tonumber(on), tonumber(oper)
  local o = shape(on, oper)
  local e = tat - now
  if e <= 0 then return now end
  local oa, of = span(o, tonumber(oburst))
  if less(oa, of, e, 0) then return now + ceil(ta, tf) + e - oa end
  local ha, hf = sub(o, oa, of, e, 0)
  local m = tokens(o, ha, hf)
  if m >= burst then return now end
  -- The part of the next token refilled, x/oper of a token (x < oper),
  -- is floor(x·per/(oper·n)) µs of the new shape.
  local pa, pf = sub(o, ha, hf, span(o, m))
  local per = b.q * b.n + b.r
  local part = floor(muldiv(pa * on + pf, per, oper) / b.n)
  local xa, xf = sub(b, ta, tf, span(b, m))
  return now + ceil(xa - part, xf)
end
if kind == 'b' then
  local n, per = tonumber(ARGV[5]), tonumber(ARGV[6])
  local burst, initial = tonumber(ARGV[7]), tonumber(ARGV[8])
  look, maxDebt = tonumber(ARGV[9]), tonumber(ARGV[10])
  i = 11
  b = shape(n, per)
  b.burst = burst
  ta, tf = span(b, burst)
  capacity = n * 1000000 / per
  local sh = ARGV[5] .. '/' .. ARGV[6] .. '/' .. ARGV[7]
  local h = redis.call('HMGET', KEYS[1], 'tat', 'gen', 'sh', 'mT', 'mTu', 'mTr')
  tat, gen = tonumber(h[1]), tonumber(h[2])
  if tonumber(h[5]) and tonumber(h[5]) > now then
    least = paceOf(h[6])
    -- Written by an earlier version, as a float: rounded down to whole
    -- µs, it repays a debt with no more than it did.
    if not least and tonumber(h[4]) then least = shape(1, math.floor(tonumber(h[4]))) end
    if least and not cheaper(least, b) then least = nil end
  end
  if not tat then
    gen = now
    local ia, if_ = span(b, burst - initial)
    tat = math.max(now + ceil(ia, if_), started + ceil(ta, tf) + look)
    redis.call('HSET', KEYS[1], 'gen', string.format('%d', gen), 'sh', sh)
  elseif h[3] and h[3] ~= sh then
    tat = adopt(h[3], tat, now, burst)
    -- Give-backs of units granted under the old shape may still come
    -- (within a pool's hold, or later from a pool that could not reach
    -- home): for a while they repay a debt at the least interval of the
    -- shapes it had, so that units granted cheap never repay dear time.
    local on, oper = string.match(h[3], '^(%d+)/(%d+)/')
    local keep = least or b
    local o = shape(tonumber(on), tonumber(oper))
    if cheaper(o, keep) then keep = o end
    least = nil
    if cheaper(keep, b) then least = keep end
    -- mT is the same interval as a float, for an earlier version's
    -- script sharing this home.
    local lp = keep.q * keep.n + keep.r
    redis.call('HSET', KEYS[1], 'sh', sh, 'mT', tostring(lp / keep.n), 'mTr', string.format('%d/%d', lp, keep.n),
      'mTu', string.format('%d', now + shapeMemory))
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
  if kind ~= 'b' then
    c = math.max(0, c - m)
    return
  end
  if m < 0 then
    -- As one Redis charges a debit: into debt by at most maxDebt (more
    -- owed than that changes nothing), and never back. The debt counts
    -- from the lookahead's end, to which the timeline is handed out
    -- ahead: units granted that unlock later are not a debt, and counted
    -- from now the cap swallowed every debit of a bucket whose burst
    -- the lookahead passes (red team: 120 debited units of 1000/7s,
    -- burst 20, none charged).
    local most = b.burst + maxDebt
    local da, df = span(b, math.min(-m, most))
    local ma, mf = span(b, most)
    tat = math.min(math.max(now, tat) + ceil(da, df), math.max(tat, now + look + ceil(ma, mf)))
    return
  end
  -- Units given back beyond what the timeline holds ahead of now change
  -- nothing more: cap m so that its span stays within the arithmetic's.
  local ahead = math.max(tat - now, 0)
  local enough = tokens(b, ahead, 0) + 1
  if not least then
    tat = math.max(now, tat - span(b, math.min(m, enough)))
    return
  end
  -- Units that may have been granted under a cheaper shape repay a debt
  -- (the timeline beyond τ) at its interval, then come back as whole
  -- tokens. u, the units the debt takes, is rounded up, and what a
  -- repayment takes off rounded down.
  local da, df = sub(b, ahead, 0, ta, tf)
  local u, dfloor = 0, 0
  if less(0, 0, da, df) then
    local lp = least.q * least.n + least.r
    u, dfloor = math.huge, da
    if lp > 0 then
      local q, whole = muldiv(ceil(da, df), least.n, lp)
      u = q
      if not whole then u = u + 1 end
    end
  end
  if m <= u then
    tat = tat - math.min(span(least, m), dfloor)
    return
  end
  local k = math.min(m - u, enough)
  -- From the lesser of tat and now + τ, less k tokens.
  local xa, xf = ahead, 0
  if less(ta, tf, xa, xf) then xa, xf = ta, tf end
  xa, xf = sub(b, xa, xf, span(b, k))
  tat = math.max(now, now + ceil(xa, xf))
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
local T = '0'
if kind == 'b' then
  if now > tat then tat = now end
  -- Whole tokens from tat to now + τ + lookahead.
  avail = tokens(b, add(b, now + look - tat, 0, ta, tf))
else
  avail = tonumber(ARGV[5]) - c
end
-- w <= 1 (mine is one of total's terms), so g <= avail, floats or not.
g = math.max(math.min(want, math.floor(w * avail)), 0)
if g < 1 and want >= 1 and avail >= 1 then g = 1 end
if kind == 'b' then
  T = string.format('%d/%d', b.q * b.n + b.r, b.n)
  name = tat
  -- Unit j of the grant unlocks at tat + j·T - τ, rounded up.
  local function unlock(from, j)
    local xa, xf = add(b, from, 0, span(b, j))
    return ceil(sub(b, xa, xf, ta, tf))
  end
  first, lastu = unlock(tat - now, 1), unlock(tat - now, g)
  tat = tat + ceil(span(b, g))
  -- Nothing more to grant until the next unit comes within the lookahead.
  spentFor = 0
  if avail - g < 1 then spentFor = math.max(unlock(tat - now - look, 1), 0) end
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
return {g, first, lastu, gen, math.floor(w * 1000000), T, string.format('%d', name), spentFor, tostring(level)}
