package redisstore

import "github.com/redis/rueidis"

// homeScript is the home's side of a limit held across regions: one call
// grants a region part of the limit and applies the give-backs it
// carries.
//
// KEYS[1] is the limit's hash. A bucket keeps tat (µs, Redis time; the
// end of the timeline handed out), gen (when this incarnation of the key
// was made) and sh, the shape it was written under (N/per/burst): a
// timeline of another shape is adopted as one Redis's bucket adopts a
// state (tokens kept, capped at the new burst; a debt kept as time), and
// mT, the least interval of its earlier shapes, is kept until mTu for
// the give-backs of what they granted. A count (a fixed window or a
// quota) keeps e:end, the units granted in the period ending at end (µs;
// the end is also the period's gen), one per period in progress: so a
// period whose length changes counts anew, and finds its count again
// when changed back. Both keep, per region r, d:r (its demand, units a
// second), t:r (when it said so) and s:r (the last give-back applied).
//
// ARGV: region, kind (b or c), want, demand, then for a bucket N, per
// (µs), burst, initial, lookahead (µs) and the most it may owe, for a
// count its limit, its
// window (µs; 0 for a quota) and a quota's period in progress and the
// next (start, end, next end, µs), then give-backs as triples gen,
// units, seq (negative units: a debt).
//
// A home that may evict keys (maxmemory with a policy other than
// noeviction) is refused, with an error saying so: an evicted key would
// grant again what it granted.
//
// A home that lost its keys (a restart without persistence) cannot tell
// a bucket it lost from a new one, and the regions may still spend what
// the lost one granted. So a bucket made new while the server has been
// up for less than τ + lookahead starts at the later of the time its
// initial balance says and the server's start + τ + lookahead: every
// position the lost key handed out came before. A count has no such
// bound: what it granted in its period is simply forgotten, so counts
// need a home that keeps its data (docs/architecture.md).
//
// The reply: granted, first unlock (µs from now), last unlock (a count:
// its period's end; µs from now), gen, the region's share (parts per
// million), T as text (0 for a count), the grant's name as text, how long
// the home has nothing more to grant (µs; 0 when it has), and the region's
// fair level (units a second, as text): the most max-min fairness would
// give it, whatever its demand; negative when the regions together ask for
// more than the limit.
var homeScript = rueidis.NewLuaScript(`
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
`)

// poolScript is a region's pool of one bucket: the stretches of the
// timeline the region holds, in its own Redis, which its servers take
// their allowances from.
//
// KEYS[1] is the pool's hash: c, the chunks (cmsgpack: a list of {u, n,
// k, T, e, g}: token j of n unlocks at u + j·T, k are taken, the rest
// expire at e, all µs of this Redis's clock; g is the home key's gen),
// b, the units to give back home (cmsgpack: {gen = units}), q the last
// give-back's sequence number (never less than the time it was made, so
// that a pool made anew after a restart does not repeat old ones), a and
// at the arrivals counted since at, dem, the region's demand (units a
// second, a moving average), ids, the names of the last grants added, z,
// until when the home said it has nothing to grant, fr, the region's fair
// level as of its last grant, and p, the triples sent home and not yet
// acknowledged.
//
// ARGV[1] is the operation; times are µs of this Redis's clock:
//
//	t want arrivals horizon period span least need shape: take up to want
//	  units that unlock within horizon, the arrivals (units asked of the
//	  server since its last take) counted into the demand; span is the
//	  rule's (µs a unit), least the fewest units the pool should hold,
//	  need what the taker's callers lack. Replies
//	  taken, first due (µs from now: the taken units not ready are due
//	  one per span after it), hold (µs from now), units held after, next
//	  unlock (µs from now; -1 when none is held), whether the pool wants
//	  a refill, gen, how many of the units taken are ready, how long the
//	  home said it has nothing (µs), whether the taker should wait for a
//	  refill (it got less than it needs, the home may have more, and the
//	  region asks for no more than its fair rate), the demand, and now.
//	a period least: prepare a refill: fold the arrivals into the demand,
//	  give back what exceeds twice the target (demand × period, at least
//	  least; latest first) and what expired. Replies held, target,
//	  demand, now, then gen, units, seq triples to send home: every one
//	  not acknowledged yet.
//	k seq: the home has applied the triples numbered up to seq.
//	d gen unlock n T expiry pos until fair shape: add a grant of n units, the
//	  first unlocking at unlock, one per T after it, held until expiry,
//	  unless the grant (gen and pos name it) was added already; and set
//	  what z sets.
//	r gen n expiry m: add n units given back by a server, all unlocked,
//	  held until expiry (given back home if that has passed); and give
//	  back home m more (its booked units), or, negative, what it owes
//	  (debits it could not pay), which the home charges the limit.
//	z until fair shape: the home has nothing to grant until then (0: it has),
//	  and the region's fair rate, units a second, as of its last grant,
//	  both said of the rule's shape: a take of another shape (the rule
//	  changed) ignores them.
//
// A grant's times are set by its agent, from the offsets the home gave
// and this Redis's clock as the agent's preparation read it: an unlock
// late and an expiry early by the round trip of that reading, however
// late the deposit itself runs.
var poolScript = rueidis.NewLuaScript(`
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local op = ARGV[1]
local h = redis.call('HMGET', KEYS[1], 'c', 'b', 'q', 'a', 'at', 'dem', 'ids', 'z', 'fr', 'p', 'zs')
local cs = {}
if h[1] then cs = cmsgpack.unpack(h[1]) end
local back = {}
if h[2] then back = cmsgpack.unpack(h[2]) end
local seq = tonumber(h[3]) or 0
local arr, arrAt, dem = tonumber(h[4]) or 0, tonumber(h[5]) or now, tonumber(h[6]) or 0
local spent = tonumber(h[8]) or 0
local fair = tonumber(h[9]) or 0
-- What the home said (spent, fair) holds for the rule's shape it was
-- said of, zs: a take under another shape (the rule changed) asks anew.
local shape = h[11]
if op == 't' and ARGV[9] ~= shape then spent, fair = 0, 0 end
local pending = {}
if h[10] then pending = cmsgpack.unpack(h[10]) end
-- Chunks expired or spent leave; what an expired one still held goes back home.
local keep = {}
for _, c in ipairs(cs) do
  if c.e <= now then
    if c.n > c.k then back[string.format('%d', c.g)] = (back[string.format('%d', c.g)] or 0) + c.n - c.k end
  elseif c.k < c.n then
    keep[#keep + 1] = c
  end
end
cs = keep
local function held()
  local s = 0
  for _, c in ipairs(cs) do s = s + c.n - c.k end
  return s
end
local reply
if op == 't' then
  local want, horizon, period = tonumber(ARGV[2]), tonumber(ARGV[4]), tonumber(ARGV[5])
  arr = arr + tonumber(ARGV[3])
  -- Units taken that have unlocked are ready; the others are booked,
  -- due one per Tr (the rule's span) from first, which is late enough
  -- for every one of them.
  local got, ready, booked, first, hold, gen = 0, 0, 0, nil, nil, 0
  local Tr = tonumber(ARGV[6])
  for _, c in ipairs(cs) do
    if got >= want then break end
    local lim = c.n
    if c.T > 0 then lim = math.min(c.n, math.floor((now + horizon - c.u) / c.T) + 1) end
    local take = math.min(want - got, lim - c.k)
    if take > 0 then
      local r = take
      if c.T > 0 then r = math.max(math.min(math.floor((now - c.u) / c.T) + 1 - c.k, take), 0) end
      local m = take - r
      if m > 0 then
        local u0 = c.u + (c.k + r) * c.T
        local cand = math.max(u0 - booked * Tr, u0 + (m - 1) * c.T - (booked + m - 1) * Tr)
        if not first or cand > first then first = cand end
        booked = booked + m
      end
      ready = ready + r
      if not hold or c.e < hold then hold = c.e end
      c.k = c.k + take
      got = got + take
      gen = c.g
    end
  end
  local nxt = -1
  for _, c in ipairs(cs) do
    if c.k < c.n then
      local u = c.u + c.k * c.T
      if nxt < 0 or u - now < nxt then nxt = math.max(u - now, 0) end
    end
  end
  local hd = held()
  local target = math.max(dem * period / 1000000, arr, tonumber(ARGV[7]))
  local need = 0
  if hd < target / 2 or (got < want and hd == 0) then need = 1 end
  -- The home said it has nothing until spent: no refill before.
  local z = 0
  if spent > now then
    z = spent - now
    if hd > 0 then need = 0 end
  end
  -- A taker short of units waits for the home unless its region asks
  -- a bucket for more than its fair level (by half: the demand is a
  -- moving average of bursts), or the regions together ask for more than
  -- it (fair < 0: there is nothing to wait for): a hungry region's requests
  -- are refused at once instead, and its refill comes in the background.
  -- A count has no rate to be over: it waits until the home is spent.
  local wait = 0
  if got < tonumber(ARGV[8]) and z == 0 and (Tr == 0 or fair == 0 or fair > 0 and dem <= 1.5 * fair) then wait = 1 end
  if not first then first = now end
  if not hold then hold = now end
  reply = {got, math.max(math.ceil(first - now), 0), math.floor(hold - now), hd, math.ceil(nxt), need, gen, ready, math.ceil(z), wait, tostring(dem), string.format('%d', now)}
elseif op == 'z' then
  spent, fair, shape = tonumber(ARGV[2]), tonumber(ARGV[3]), ARGV[4]
  reply = {held()}
elseif op == 'a' then
  local period = tonumber(ARGV[2])
  local dt = now - arrAt
  if dt >= 20000 then
    local rate = arr * 1000000 / dt
    local alpha = 1 - math.exp(-dt / 500000)
    dem = dem + alpha * (rate - dem)
    arr, arrAt = 0, now
  end
  local target = math.max(dem * period / 1000000, arr, tonumber(ARGV[3]))
  local hd = held()
  if hd > 2 * target then
    local extra = hd - math.ceil(target)
    for j = #cs, 1, -1 do
      if extra <= 0 then break end
      local c = cs[j]
      local m = math.min(extra, c.n - c.k)
      c.n = c.n - m
      extra = extra - m
      back[string.format('%d', c.g)] = (back[string.format('%d', c.g)] or 0) + m
    end
    keep = {}
    for _, c in ipairs(cs) do if c.k < c.n then keep[#keep + 1] = c end end
    cs = keep
  end
  reply = {held(), math.ceil(target), tostring(dem), string.format('%d', now)}
  -- What is to go home is numbered and kept until the home has it (k):
  -- a refill whose call failed, or whose reply was lost, sends it again,
  -- and the home applies each number once.
  for g, m in pairs(back) do
    if m ~= 0 then
      seq = math.max(seq + 1, now)
      pending[#pending + 1] = {tonumber(g), m, seq}
    end
  end
  back = {}
  for _, x in ipairs(pending) do
    reply[#reply + 1] = x[1]
    reply[#reply + 1] = x[2]
    reply[#reply + 1] = x[3]
  end
elseif op == 'k' then
  local acked = tonumber(ARGV[2])
  local keep = {}
  for _, x in ipairs(pending) do
    if x[3] > acked then keep[#keep + 1] = x end
  end
  pending = keep
  reply = {#pending}
elseif op == 'd' or op == 'r' then
  local c
  if op == 'd' then
    -- A grant is added once: a deposit sent twice finds its name among
    -- the last ones added.
    local id = ARGV[2] .. '/' .. ARGV[7]
    local ids = {}
    if h[7] then ids = cmsgpack.unpack(h[7]) end
    for _, x in ipairs(ids) do
      if x == id then return {held(), 0} end
    end
    ids[#ids + 1] = id
    if #ids > 32 then table.remove(ids, 1) end
    redis.call('HSET', KEYS[1], 'ids', cmsgpack.pack(ids))
    c = {u = tonumber(ARGV[3]), n = tonumber(ARGV[4]), k = 0, T = tonumber(ARGV[5]), e = tonumber(ARGV[6]), g = tonumber(ARGV[2])}
    spent, fair, shape = tonumber(ARGV[8]), tonumber(ARGV[9]), ARGV[10]
  else
    c = {u = now, n = tonumber(ARGV[3]), k = 0, T = 0, e = tonumber(ARGV[4]), g = tonumber(ARGV[2])}
    -- Units a server gives back once expired, its booked ones, and its
    -- debts (negative) go home.
    local g = string.format('%d', c.g)
    local m = tonumber(ARGV[5])
    if c.n > 0 and c.e <= now then m = m + c.n end
    if m ~= 0 then back[g] = (back[g] or 0) + m end
  end
  if c.n > 0 and c.e > now then
    local at = #cs + 1
    for j, x in ipairs(cs) do
      if c.u < x.u then at = j; break end
    end
    table.insert(cs, at, c)
  end
  reply = {held(), 1}
end
local emax = now
for _, c in ipairs(cs) do if c.e > emax then emax = c.e end end
redis.call('HSET', KEYS[1], 'c', cmsgpack.pack(cs), 'b', cmsgpack.pack(back), 'p', cmsgpack.pack(pending), 'q', string.format('%d', seq),
  'a', tostring(arr), 'at', string.format('%d', arrAt), 'dem', tostring(dem),
  'z', string.format('%d', spent), 'fr', tostring(fair))
if shape then redis.call('HSET', KEYS[1], 'zs', shape) end
-- Kept while its chunks last, and a minute more; a day while it has
-- something to send home (a debt above all), which its next refill sends.
local ttl = math.ceil((emax - now) / 1000) + 60000
if next(back) ~= nil or #pending > 0 then ttl = math.max(ttl, 86400000) end
redis.call('PEXPIRE', KEYS[1], ttl)
return reply
`)
