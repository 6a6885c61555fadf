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
-- A chunk's unit j >= 1 unlocks at u + (j - 1)·T, T = tp/tn µs (tp = 0:
-- all at u), computed in integers as the home computes its timeline (the
-- arithmetic above), never early. T is the same as a float, for an
-- earlier version's script sharing this pool.
local function rational(text)
  local p, n = string.match(text or '', '^(%d+)/(%d+)$')
  if p then return tonumber(p), tonumber(n) end
  -- A float (an earlier version's), rounded up: no unit unlocks early.
  local x = tonumber(text) or 0
  if x > 0 then return math.ceil(x), 1 end
  return 0, 1
end
local paces = {}
-- paceOf returns chunk c's interval as the arithmetic's shape, nil when
-- its units are all unlocked at u.
local function paceOf(c)
  if not c.tp then c.tp, c.tn = rational(tostring(c.T)) end
  if c.tp == 0 then return nil end
  local p = paces[c]
  if not p then
    p = {n = c.tn, q = (c.tp - fmod(c.tp, c.tn)) / c.tn, r = fmod(c.tp, c.tn)}
    paces[c] = p
  end
  return p
end
-- unlocked returns how many of chunk c's units have unlocked by time t.
local function unlocked(c, t)
  if t < c.u then return 0 end
  return (muldiv(t - c.u, c.tn, c.tp)) + 1
end
-- at returns when unit j + 1 of chunk c unlocks, rounded up.
local function at(c, j)
  local p = paceOf(c)
  if not p then return c.u end
  return c.u + ceil(span(p, j))
end
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
  -- The rule's span, Tr = rp/rn µs a unit (0 for a count): booked units
  -- are due one per Tr, each no earlier than it unlocks (rounded so).
  local rp, rn = rational(ARGV[6])
  local rule
  if rp > 0 then rule = {n = rn, q = (rp - fmod(rp, rn)) / rn, r = fmod(rp, rn)} end
  local function booking(j)
    if not rule then return 0 end
    return (span(rule, j))
  end
  for _, c in ipairs(cs) do
    if got >= want then break end
    local p = paceOf(c)
    local lim = c.n
    if p then lim = math.min(c.n, unlocked(c, now + horizon)) end
    local take = math.min(want - got, lim - c.k)
    if take > 0 then
      local r = take
      if p then r = math.max(math.min(unlocked(c, now) - c.k, take), 0) end
      local m = take - r
      if m > 0 then
        local cand = math.max(at(c, c.k + r) - booking(booked), at(c, c.k + r + m - 1) - booking(booked + m - 1))
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
      local u = at(c, c.k)
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
  if got < tonumber(ARGV[8]) and z == 0 and (not rule or fair == 0 or fair > 0 and dem <= 1.5 * fair) then wait = 1 end
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
    local tp, tn = rational(ARGV[5])
    c = {u = tonumber(ARGV[3]), n = tonumber(ARGV[4]), k = 0, T = tp / tn, tp = tp, tn = tn, e = tonumber(ARGV[6]), g = tonumber(ARGV[2])}
    spent, fair, shape = tonumber(ARGV[8]), tonumber(ARGV[9]), ARGV[10]
  else
    c = {u = now, n = tonumber(ARGV[3]), k = 0, T = 0, tp = 0, tn = 1, e = tonumber(ARGV[4]), g = tonumber(ARGV[2])}
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
