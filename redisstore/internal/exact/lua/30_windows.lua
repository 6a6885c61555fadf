-- Windows -----------------------------------------------------------------

-- countEval counts up to limit in a period that ends at endu (µs), or at
-- the end st holds while it runs (admit.stepCount). A quota's reply says
-- the end in µs where the others say the reset and retry in ns (a year in
-- ns does not fit a double exactly); the Go side converts.
local function countEval(limit, endu, st, c, res, debit, quota)
  local count = 0
  if st and st[1] > nu then count, endu = st[2], st[1] end
  res.reset = (endu - nu) * 1000 - nsub
  if quota then res.reset = endu end
  if count + c <= limit then
    res.allowed, res.remaining = 1, limit - count - c
    if c > 0 then return {endu, count + c} end
    return st
  end
  res.allowed, res.remaining = 0, mmax(limit - count, 0)
  res.retry = res.reset
  if debit then return {endu, mmin(count + c, MAXCOUNT)} end
  return st
end

local function fixedEval(limit, wu, st, c, res, debit)
  return countEval(limit, nu - fmod(nu, wu) + wu, st, c, res, debit, false)
end

-- endAt reads a period's end as the Go side sends it (µs): a first-hit
-- window, run as a quota, sends its length negated, for a window that
-- starts now if none is running.
local function endAt(e)
  if e < 0 then return nu - e end
  return e
end

-- quotaEval is fixedEval over the calendar periods the charge brings
-- (stepQuota): the first of the two ends after now.
local function quotaEval(limit, st, c, res, debit)
  local endu = QEND1
  if endu <= nu then endu = QEND2 end
  return countEval(limit, endu, st, c, res, debit, true)
end

-- windowEnd returns the end (µs) of the window of wu µs now is in.
local function windowEnd(wu)
  return nu - fmod(nu, wu) + wu
end

-- slidingCounts returns a sliding window's counts at now from its state
-- st: the current and the previous window's, the current window's end
-- (µs), and the previous window's weight, prev*left/w rounded up.
local function slidingCounts(wu, st)
  local startu = nu - fmod(nu, wu)
  local endu = startu + wu
  local cur, prev, other = 0, 0, false
  if st and st[1] > nu then
    local stateEnd = st[1] - wu
    if st[4] and st[4] ~= wu then cur, other = mmin(st[2] + st[3], MAXCOUNT), true
    elseif stateEnd == endu then cur, prev = st[2], st[3]
    elseif stateEnd == startu then prev = st[2]
    else cur, other = mmin(st[2] + st[3], MAXCOUNT), true end
  end
  local left = mmax((endu - nu) * 1000 - nsub, 0)
  local weight, exact = muldiv(prev, left, wu * 1000)
  if not exact then weight = weight + 1 end
  return cur, prev, endu, weight, other
end

local function slidingEval(limit, wu, st, c, res, debit)
  local cur, prev, endu, weight, other = slidingCounts(wu, st)
  -- Another window's state is kept as this window's, refused or not, or
  -- every look would read it so again until it expired.
  if other then st = {endu + wu, cur, prev, wu} end
  local w = wu * 1000
  local room = limit - cur - c
  local admitted = room >= 0 and weight <= room
  local after = cur
  if admitted then after = cur + c end
  res.remaining = mmax(limit - weight - after, 0)
  if after > 0 then res.reset = (endu + wu - nu) * 1000 - nsub
  elseif prev > 0 then res.reset = (endu - nu) * 1000 - nsub
  else res.reset = 0 end
  if admitted then
    res.allowed = 1
    if c > 0 then return {endu + wu, after, prev, wu} end
    return st
  end
  res.allowed = 0
  if debit then return {endu + wu, mmin(cur + c, MAXCOUNT), prev, wu} end
  local untilEnd = (endu - nu) * 1000 - nsub
  if room >= 0 then
    local k = muldiv(room, w, prev)
    res.retry = mmax(untilEnd - k, 0)
  else
    local k = muldiv(limit - c, w, cur)
    res.retry = mmax(untilEnd + w - k, 0)
  end
  return st
end

-- Sliding log -------------------------------------------------------------

local function logEntry(key, seq)
  local v = rcall('HGET', key, I(seq))
  if not v then return nil end
  local us, units = sunpack('<dd', v)
  return us, units
end

-- logScan returns the log's head, tail, the units held by live entries and
-- the first live seq.
local function logScan(key, wu)
  local m = rcall('HMGET', key, 'h', 't', 'n')
  if not m[1] then return 0, 0, 0, 0 end
  local h, t, n = tonumber(m[1]), tonumber(m[2]), tonumber(m[3])
  local first, gone = h, 0
  while first < t do
    local us, units = logEntry(key, first)
    if us + wu > nu then break end
    gone = gone + units
    first = first + 1
  end
  return h, t, n - gone, first
end

local function logEval(key, limit, wu, c, pending, res)
  local h, t, live0, first = logScan(key, wu)
  local live = live0 + pending
  local w = wu * 1000
  local newest = 0
  if t > first then newest = (logEntry(key, t - 1) + wu - nu) * 1000 - nsub end
  if live + c <= limit then
    res.allowed, res.remaining = 1, limit - live - c
    if c > 0 or pending > 0 then res.reset = w
    elseif live > 0 then res.reset = mmax(newest, 0)
    else res.reset = 0 end
    return
  end
  res.allowed, res.remaining = 0, mmax(limit - live, 0)
  if pending > 0 then res.reset = w else res.reset = mmax(newest, 0) end
  local k = live + c - limit
  if k <= live0 then
    local seq, seen = first, 0
    while true do
      local us, units = logEntry(key, seq)
      seen = seen + units
      if seen >= k then
        res.retry = mmax((us + wu - nu) * 1000 - nsub, 0)
        break
      end
      seq = seq + 1
    end
  else
    res.retry = w
  end
end

local function logCommit(key, wu, c)
  local h, t, live, first = logScan(key, wu)
  for seq = h, first - 1 do rcall('HDEL', key, I(seq)) end
  local units = c
  if t > first then
    local us, u = logEntry(key, t - 1)
    if us == nceil then units, t = u + c, t - 1 end
  end
  rcall('HSET', key, I(t), pack('<dd', nceil, units), 'h', I(first), 't', I(t + 1), 'n', I(live + c))
  rcall('PEXPIRE', key, I(mceil((nceil + wu - nu) / 1000) + SLACK))
  return nceil
end

-- leaseSlots calls f with the members of lease id's slots first..last of
-- a concurrency key ("<id>#<j>"), at most 250 at a time: a command takes
-- its arguments from a Lua table with unpack, which refuses more than 8000
-- values. A lease takes at most 1000 slots (admit.MaxLeaseCost), but
-- several charges of one key add up; refusing in the middle of a commit
-- would leave its earlier writes behind.
local function leaseSlots(id, first, last, f)
  local j = first
  while j <= last do
    local m = {}
    for k = j, mmin(last, j + 249) do m[#m + 1] = id .. '#' .. k end
    f(m)
    j = j + 250
  end
end

-- logUndo removes c units recorded at us, newest first.
local function logUndo(key, us, c)
  local m = rcall('HMGET', key, 'h', 't', 'n')
  if not m[1] then return end
  local h, t, n = tonumber(m[1]), tonumber(m[2]), tonumber(m[3])
  local seq = t - 1
  while c > 0 and seq >= h do
    local eu, units = logEntry(key, seq)
    if eu < us then break end
    if eu == us then
      local take = mmin(units, c)
      c, n = c - take, n - take
      if take == units then
        rcall('HDEL', key, I(seq))
        if seq == t - 1 then t = t - 1 end
      else
        rcall('HSET', key, I(seq), pack('<dd', eu, units - take))
      end
    end
    seq = seq - 1
  end
  if n <= 0 then rcall('DEL', key) else rcall('HSET', key, 't', t, 'n', n) end
end

-- Concurrency -------------------------------------------------------------

local function concEval(key, max, ttl, c, pending, res)
  local nuS = I(nu)
  local live = rcall('ZCOUNT', key, '(' .. nuS, '+inf') + pending
  local last = rcall('ZRANGE', key, -1, -1, 'WITHSCORES')
  res.reset = 0
  if last[2] then res.reset = mmax((tonumber(last[2]) - nu) * 1000 - nsub, 0) end
  if live + c <= max then
    res.allowed, res.remaining = 1, max - live - c
    if c > 0 then res.reset = mmax(res.reset, ttl * 1000) end
    return
  end
  res.allowed, res.remaining = 0, mmax(max - live, 0)
  local k = live + c - max
  local at = rcall('ZRANGEBYSCORE', key, '(' .. nuS, '+inf', 'WITHSCORES', 'LIMIT', k - 1, 1)
  if at[2] then res.retry = (tonumber(at[2]) - nu) * 1000 - nsub else res.retry = ttl * 1000 end
end

