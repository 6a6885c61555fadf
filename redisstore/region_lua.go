package redisstore

import "github.com/redis/rueidis"

// homeScript is the home's side of a bucket held across regions: one
// call grants a region a stretch of the bucket's timeline and applies the
// give-backs it carries.
//
// KEYS[1] is the limit's hash: tat (µs, Redis time; the end of the
// timeline handed out), gen (when this incarnation of the key was made),
// and per region r: d:r (its demand, units a second), t:r (when it said
// so) and s:r (the last give-back applied). KEYS[2] is the epoch of the
// keys of its hash tag: when they were first made after the home lost
// them (a restart without persistence), shared by the tag so that it
// is lost with them.
//
// ARGV: region, N, per (µs), burst, initial, lookahead (µs), want,
// demand, then give-backs as triples gen, units, seq.
//
// A key made new starts at max(now + (burst - initial)·T, epoch + τ + Λ):
// a key lost to a restart may have handed out positions up to τ + Λ after
// the restart, and every new position must come after them.
//
// The reply: granted, first unlock (µs from now), last unlock (µs from
// now), gen, the region's share (parts per million), and T as text.
var homeScript = rueidis.NewLuaScript(`
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local region = ARGV[1]
local n, per = tonumber(ARGV[2]), tonumber(ARGV[3])
local burst, initial, look = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
local want, demand = tonumber(ARGV[7]), tonumber(ARGV[8])
local T = per / n
local tau = burst * T
local ep = tonumber(redis.call('GET', KEYS[2]))
if not ep then
  ep = now
  redis.call('SET', KEYS[2], string.format('%d', ep))
end
local h = redis.call('HMGET', KEYS[1], 'tat', 'gen')
local tat, gen = tonumber(h[1]), tonumber(h[2])
if not tat then
  gen = now
  tat = math.max(now + (burst - initial) * T, ep + tau + look)
  tat = math.ceil(tat)
  redis.call('HSET', KEYS[1], 'gen', string.format('%d', gen))
end
local i = 9
while i + 2 <= #ARGV do
  local g, m, seq = tonumber(ARGV[i]), tonumber(ARGV[i + 1]), tonumber(ARGV[i + 2])
  local last = tonumber(redis.call('HGET', KEYS[1], 's:' .. region)) or 0
  if g == gen and seq > last and m > 0 then
    tat = math.max(now, tat - math.floor(m * T))
    redis.call('HSET', KEYS[1], 's:' .. region, string.format('%d', seq))
  end
  i = i + 3
end
redis.call('HSET', KEYS[1], 'd:' .. region, tostring(demand), 't:' .. region, string.format('%d', now))
-- Max-min fair shares of the rate among the regions that asked within
-- the last second, by their demand.
local all = redis.call('HGETALL', KEYS[1])
local ds, mine = {}, 0
for j = 1, #all, 2 do
  local f = all[j]
  if string.sub(f, 1, 2) == 'd:' then
    local r = string.sub(f, 3)
    local at = tonumber(redis.call('HGET', KEYS[1], 't:' .. r)) or 0
    local d = tonumber(all[j + 1]) or 0
    if now - at <= 1000000 and d > 0 then
      ds[#ds + 1] = {r, d}
    end
  end
end
table.sort(ds, function(a, b) return a[2] < b[2] end)
local left, total = n * 1000000 / per, 0
for j = 1, #ds do
  local fair = left / (#ds - j + 1)
  local a = math.min(ds[j][2], fair)
  left = left - a
  total = total + a
  if ds[j][1] == region then mine = a end
end
local w = 1
if total > 0 then w = mine / total end
if now > tat then tat = now end
local avail = math.floor((now + tau + look - tat) / T)
local g = math.min(want, math.floor(w * avail))
if g < 1 and want >= 1 and avail >= 1 then g = 1 end
if g < 0 then g = 0 end
local first = tat + T - tau
local last = tat + g * T - tau
tat = math.ceil(tat + g * T)
redis.call('HSET', KEYS[1], 'tat', string.format('%d', tat))
local ttl = math.ceil((tat - now + look) / 1000) + 60000
redis.call('PEXPIRE', KEYS[1], ttl)
local ettl = redis.call('PTTL', KEYS[2])
if ettl < ttl then redis.call('PEXPIRE', KEYS[2], ttl) end
return {g, math.ceil(first - now), math.ceil(last - now), gen, math.floor(w * 1000000), tostring(T)}
`)

// poolScript is a region's pool of one bucket: the stretches of the
// timeline the region holds, in its own Redis, which its servers take
// their allowances from.
//
// KEYS[1] is the pool's hash: c, the chunks (cmsgpack: a list of {u, n,
// k, T, e, g}: token j of n unlocks at u + j·T, k are taken, the rest
// expire at e, all µs of this Redis's clock; g is the home key's gen),
// b, the units to give back home (cmsgpack: {gen = units}), q the last
// give-back's sequence number, a and at the arrivals counted since at,
// and dem, the region's demand (units a second, a moving average).
//
// ARGV[1] is the operation:
//
//	t want arrivals horizon period: take up to want units that unlock
//	  within horizon (µs). Replies taken, first due (µs from now; the
//	  taken units are due one per T after it), hold (µs from now), units
//	  held after, next unlock (µs from now; -1 when none is held),
//	  whether the pool wants a refill, gen, and the demand.
//	a period: prepare a refill: fold the arrivals into the demand, give
//	  back what exceeds twice the target (demand × period, latest
//	  first) and what expired. Replies held, target, demand, then gen,
//	  units, seq triples to send home.
//	d gen first n T hold: add a grant of n units, the first unlocking
//	  first µs from now, one per T after it, held for hold µs.
//	r gen n hold: add n units given back by a server, all unlocked.
var poolScript = rueidis.NewLuaScript(`
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local op = ARGV[1]
local h = redis.call('HMGET', KEYS[1], 'c', 'b', 'q', 'a', 'at', 'dem')
local cs = {}
if h[1] then cs = cmsgpack.unpack(h[1]) end
local back = {}
if h[2] then back = cmsgpack.unpack(h[2]) end
local seq = tonumber(h[3]) or 0
local arr, arrAt, dem = tonumber(h[4]) or 0, tonumber(h[5]) or now, tonumber(h[6]) or 0
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
  local got, first, hold, Tr, gen = 0, nil, nil, nil, 0
  for _, c in ipairs(cs) do
    if got >= want then break end
    local lim = c.n
    if c.T > 0 then lim = math.min(c.n, math.floor((now + horizon - c.u) / c.T) + 1) end
    local take = math.min(want - got, lim - c.k)
    if take > 0 then
      if not Tr then Tr = c.T end
      local u0 = c.u + c.k * c.T
      local cand = math.max(u0 - got * Tr, u0 + (take - 1) * c.T - (got + take - 1) * Tr)
      if not first or cand > first then first = cand end
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
  local target = math.max(dem * period / 1000000, arr)
  local need = 0
  if hd < target / 2 or (got < want and hd == 0) then need = 1 end
  if not first then first = now end
  if not hold then hold = now end
  reply = {got, math.max(math.ceil(first - now), 0), math.floor(hold - now), hd, math.ceil(nxt), need, gen, tostring(dem)}
elseif op == 'a' then
  local period = tonumber(ARGV[2])
  local dt = now - arrAt
  if dt >= 20000 then
    local rate = arr * 1000000 / dt
    local alpha = 1 - math.exp(-dt / 500000)
    dem = dem + alpha * (rate - dem)
    arr, arrAt = 0, now
  end
  local target = math.max(dem * period / 1000000, arr)
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
  reply = {held(), math.ceil(target), tostring(dem)}
  for g, m in pairs(back) do
    if m > 0 then
      seq = seq + 1
      reply[#reply + 1] = tonumber(g)
      reply[#reply + 1] = m
      reply[#reply + 1] = seq
    end
  end
  back = {}
elseif op == 'd' or op == 'r' then
  local c
  if op == 'd' then
    c = {u = now + tonumber(ARGV[3]), n = tonumber(ARGV[4]), k = 0, T = tonumber(ARGV[5]), e = now + tonumber(ARGV[6]), g = tonumber(ARGV[2])}
  else
    c = {u = now, n = tonumber(ARGV[3]), k = 0, T = 0, e = now + tonumber(ARGV[4]), g = tonumber(ARGV[2])}
  end
  if c.n > 0 and c.e > now then
    local at = #cs + 1
    for j, x in ipairs(cs) do
      if c.u < x.u then at = j; break end
    end
    table.insert(cs, at, c)
  end
  reply = {held()}
end
local emax = now
for _, c in ipairs(cs) do if c.e > emax then emax = c.e end end
redis.call('HSET', KEYS[1], 'c', cmsgpack.pack(cs), 'b', cmsgpack.pack(back), 'q', string.format('%d', seq),
  'a', tostring(arr), 'at', string.format('%d', arrAt), 'dem', tostring(dem))
redis.call('PEXPIRE', KEYS[1], math.ceil((emax - now) / 1000) + 10000)
return reply
`)
