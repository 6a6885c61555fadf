-- Shares ------------------------------------------------------------------

-- A fair charge (admit.Charge.Share) is decided with its class's share of
-- the key (internal/engine/share.go, DecideShare, which this mirrors): the key's
-- pool of classes, the class's record and its sub's, each a string of
-- 14 doubles, or 26 with a period's largest takers (see shareLoad), and for a concurrency key the sorted sets of
-- the slots the class and its sub hold. SHARES[i] is charge i's share, or
-- false: its weight w, whether it has a sub and was prepaid, its keys.
local SHARES
local NEWREC = {}
for k = 1, RECLEN do NEWREC[k] = 0 end

-- A record: 1 level, 2 and 3 when (µs, ns; 0: new), 4 the class's rate
-- then (units/ns), 5 epoch seen, 6 weight counted, 7 claim, 8 epoch
-- claimed, then its pool: 9 epoch, 10 weight seen in it, 11 of that new,
-- 12 weight seen in the one before, 13 claims, 14 claims before; a
-- window's or quota's pool then its period's largest takers
-- (admit.ShareTop), 15..: class, weight, taken and epoch seen of each,
-- largest first, kept only when there are any.
local function shareLoad(key)
  local s = slotOf(key)
  local st = ST[s]
  if st == nil then
    local v = rcall('GET', key)
    if not v then
      st = false
    elseif #v >= 8 * RECLEN then
      st = {sunpack(RECFMT, v)}
      st[RECLEN + 1] = nil
    else
      st = {sunpack('<dddddddddddddd', v)}
      for k = 15, RECLEN do st[k] = 0 end
    end
    ST[s], SK[s] = st, 7
  end
  if not st then return NEWREC end
  return st
end


local function recCopy(a)
  local b = {}
  for k = 1, RECLEN do b[k] = a[k] end
  return b
end

local function recSame(a, b)
  for k = 1, RECLEN do if a[k] ~= b[k] then return false end end
  return true
end

-- topAt returns where entry j (1..TOPK) of a pool's largest takers
-- starts: class, weight, taken, seen.
local function topAt(j) return 11 + 4 * j end

-- topKeep records in pool record p the class id's taking t (weight w,
-- epoch e), as admit.ShareTop.keep: in place of its last, or of the
-- smallest when it took more; largest first.
local function topKeep(p, id, w, t, e)
  local i = TOPK
  for j = 1, TOPK do
    if p[topAt(j)] == id then i = j break end
  end
  local o = topAt(i)
  if p[o] ~= id and p[o + 2] >= t then return end
  p[o], p[o + 1], p[o + 2], p[o + 3] = id, w, t, e
  while i > 1 and p[topAt(i) + 2] > p[topAt(i - 1) + 2] do
    local a, b = topAt(i), topAt(i - 1)
    for k = 0, 3 do p[a + k], p[b + k] = p[b + k], p[a + k] end
    i = i - 1
  end
end

-- waterFill mirrors admit.waterFill: what a class of weight w that took t
-- of a period's limit L may still take as its own, and what the other
-- active classes may (owed), the active classes weighing total and all
-- of them having taken taken, pool's largest takers (when of period) the
-- ones that may hold more than their level.
local cw, ct, ca, cf = {}, {}, {}, {} -- waterFill's candidates, reused
local function waterFill(L, total, w, t, taken, pool, id, e, period)
  cw[1], ct[1], ca[1], cf[1] = w, t, true, false
  local n = 1
  if pool[8] == period then
    for j = 1, TOPK do
      local o = topAt(j)
      if pool[o] ~= 0 and pool[o] ~= id then
        n = n + 1
        cw[n], ct[n], ca[n], cf[n] = pool[o + 1], pool[o + 2], pool[o + 3] >= e - 1, false
      end
    end
  end
  local fixedT, fixedW = 0, 0
  local function level()
    if total - fixedW <= 0 then return 0 end
    return mmax(L - fixedT, 0) / (total - fixedW)
  end
  while true do
    local lambda = level()
    local best, bestR = 0, 0
    for j = 1, n do
      if not cf[j] and not (ca[j] and ct[j] <= lambda * cw[j]) then
        local r = 1 / 0
        if ca[j] then r = ct[j] / cw[j] end
        if best == 0 or r > bestR then best, bestR = j, r end
      end
    end
    if best == 0 then break end
    cf[best], fixedT = true, fixedT + ct[best]
    if ca[best] then fixedW = fixedW + cw[best] end
  end
  local lambda = level()
  local restW, restT = total - fixedW, taken - fixedT
  if not cf[1] then restW, restT = restW - w, restT - t end
  return lambda * w - t, mmax(lambda * restW - restT, 0)
end

-- recExpiry returns in how many ns record st no longer matters
-- (ShareState.Expiry): its epochs past and its bucket full again.
local function recExpiry(R, st)
  local last = mmax(st[5], st[9])
  if R.sf ~= 2 then last = mmax(last, st[8]) end
  local ttl = ((last + 2) * R.se - nu) * 1000 - nsub
  if R.sf == 2 then ttl = mmax(ttl, (st[8] - nu) * 1000 - nsub) end
  if st[2] > 0 and st[4] > 0 then
    local cap = st[4] / R.sr * R.sb
    if st[1] < cap then
      local full = (st[2] - nu) * 1000 + (st[3] - nsub) + mmin((cap - st[1]) / st[4], 86400000000000)
      ttl = mmax(ttl, full)
    end
  end
  return ttl
end

local function recLevel(st, rate, cap)
  if st[2] == 0 then return cap end
  local l = st[1]
  local dt = (nu - st[2]) * 1000 + (nsub - st[3])
  if dt > 0 then l = l + dt * rate end
  return mmin(l, cap)
end

local function recSet(st, level, rate)
  st[1], st[2], st[3], st[4] = level, nu, nsub, rate
end

-- poolRoll moves the pool kept at st[o+9..] to epoch e.
local function poolRoll(st, e)
  local pe = st[9]
  if pe == e then return end
  if pe == e - 1 then st[12], st[14] = st[10], st[13] else st[12], st[14] = 0, 0 end
  st[9], st[10], st[11], st[13] = e, 0, 0, 0
end

-- markActive counts record c of weight w in the pool of record p.
local function markActive(p, c, e, w)
  if c[5] == e then
    if c[6] ~= w then
      p[10] = p[10] + w - c[6]
      if p[11] > 0 then p[11] = mmax(p[11] + w - c[6], 0) end
    end
  elseif c[5] == e - 1 and p[12] >= c[6] then
    p[10] = p[10] + w
  else
    p[10], p[11] = p[10] + w, p[11] + w
  end
  c[5], c[6] = e, w
end

local function setClaim(p, c, e, amount)
  if c[8] == e then p[13] = p[13] - c[7]
  elseif c[8] == e - 1 then p[14] = mmax(p[14] - c[7], 0) end
  c[7], c[8] = 0, 0
  if amount > 0 then c[7], c[8], p[13] = amount, e, p[13] + amount end
  p[13] = mmax(p[13], 0)
end

-- zlive returns the slots held at now in the sorted set key.
local function zlive(key)
  if not key then return 0 end
  return rcall('ZCOUNT', key, '(' .. I(nu), '+inf')
end

-- shareDecide decides the share of charge i (rule R, cost c, its rule's
-- result res), as DecideShare does; a peek leaves the decision's outcome
-- (sh.tou, sh.chg: the records to keep when refused, when admitted).
local function shareDecide(i, R, res, c, peek)
  local sh = SHARES[i]
  local debit = DEBITS[i]
  if peek and not debit then c = 0 end
  res.pool, res.whole = res.remaining, nil
  local eu = R.se
  local e = floor(nu / eu) + 1
  local pool, cls = recCopy(shareLoad(sh.kp)), recCopy(shareLoad(sh.kc))
  local sub = NEWREC
  if sh.ks then sub = recCopy(shareLoad(sh.ks)) end
  local hasSub = sh.ks ~= nil
  local w = sh.w
  poolRoll(pool, e)
  markActive(pool, cls, e, w)
  local n = 1
  if hasSub then
    poolRoll(cls, e)
    markActive(cls, sub, e, 1)
    n = mmax(cls[12] + cls[11], 1)
  end
  local act = pool[12] + pool[11]
  local s = mmin(w / mmax(act, w), 1)
  local path = 0
  local chg
  local toEpoch = (e * eu - nu) * 1000 - nsub
  if R.sf == 4 then
    -- slots
    local entitled = mmax(1, floor(s * R.sb))
    local ceiling = R.sc
    if s < 1 then ceiling = mmax(ceiling, entitled) end
    local subCap = ceiling
    if hasSub then subCap = mmax(1, floor((ceiling + n - 1) / n)) end
    local own = 0
    if cls[8] == e or cls[8] == e - 1 then own = cls[7] end
    local others = mmax(mmax(pool[13] + pool[14], 0) - own, 0)
    local h, hs = zlive(sh.kh), zlive(sh.kg)
    local claim = -1
    if c == 0 then
    elseif res.allowed == 0 then
      if h + c <= entitled then claim = mmin(entitled - h, mmax(c, own)) end
    elseif h + c > ceiling or (hasSub and hs + c > subCap) then
      path = 3
    elseif h + c <= entitled then
      path, claim = 1, mmax(own - c, 0)
    elseif res.remaining >= others then
      path = 2
    else
      path = 3
    end
    if claim >= 0 and claim ~= own then setClaim(pool, cls, e, claim) end
    local hA = h
    if path == 1 or path == 2 then hA = h + c end
    local vis = mmin(res.remaining, ceiling - hA, mmax(entitled - hA, res.remaining - others))
    if hasSub then
      local hsA = hs
      if hA > h then hsA = hs + c end
      vis = mmin(vis, subCap - hsA)
    end
    if path ~= 0 or c == 0 then res.remaining = mmax(vis, 0) end
    if path == 3 then
      res.allowed = 0
      res.pool = res.pool + c
      res.retry = mmax(res.retry or 0, toEpoch)
    end
    chg = {pool, cls, sub}
  else
    local fc = c
    local alone = s >= 1
    local top = s
    if alone then top = R.st end
    local unpaced = alone and top >= 1
    local rate, capC = s * R.sr, top * R.sb
    local subRate, capS = rate / n, capC / n
    -- A fixed window's or a quota's part is counted in its period (µs
    -- end): st[7] taken of it in the period ending at st[8].
    local windowed = R.sf == 2
    local period, resetNs = 0, 0
    if windowed then
      resetNs = res.reset
      if R.alg == 8 then resetNs = (res.reset - nu) * 1000 - nsub end
      period = nu + floor((resetNs + nsub) / 1000)
    end
    local function taken(st)
      if st[8] == period then return st[7] end
      return 0
    end
    local function lvl(st, r, cap)
      if windowed then return cap - taken(st) end
      return recLevel(st, r, cap)
    end
    -- what a class may still take of a period as its own, and the
    -- others may, by water-filling (admit.decideRate)
    local lc = lvl(cls, rate, capC)
    local owed, id = 0, 0
    if windowed and not alone then
      id = tonumber(ssub(redis.sha1hex(sh.kc), 1, 8), 16) + 1
      lc, owed = waterFill(R.sb, w / s, w, taken(cls), taken(pool), pool, id, e, period)
    end
    local ls = 0
    if hasSub then ls = lvl(sub, subRate, capS) end
    local reserve = (1 - top) * R.sp
    local paced = R.sf ~= 1
    local pace = 0
    if paced then pace = recLevel(pool, R.sr, R.sp) end
    local function room(rem, x)
      if paced then return mmin(rem, pace - x) end
      return rem
    end
    local function subLend(l) return l - (1 - 1 / n) * capC end
    local keep, keepTime = 0, 0
    if windowed and not alone then
      keepTime = (1 - s) * R.sr * resetNs
      keep = mmax(mmin(owed, keepTime), 0)
    end
    local function borrowable(rem, x) return mmin(room(rem, x) - reserve, rem - keep) end
    -- a period's part holds the cost itself (admit.decideRate's need)
    local function need(x, cap)
      if windowed and cap >= 1 then return x end
      return mmin(x, cap)
    end
    local takeC, takeS = 0, 0
    if c == 0 then
    elseif sh.pre then
      if res.allowed == 1 then path = 1 end
    elseif debit then
      path, takeC, takeS = 1, fc, fc
    elseif res.allowed == 0 then
    else
      local assured = fc <= R.so and lc >= need(fc, capC)
      local subOwn = true
      if hasSub and assured then
        subOwn = ls >= need(fc, capS)
        assured = subOwn or subLend(lc) - fc >= 0
      end
      if assured then
        path, takeC = 1, fc
        if hasSub and subOwn then takeS = fc end
      elseif unpaced or borrowable(res.remaining, fc) >= 0 then
        path = 2
      else
        path = 3
      end
    end
    local cp, cc, cs = recCopy(pool), recCopy(cls), recCopy(sub)
    if paced and c > 0 and (path == 1 or path == 2) then recSet(cp, mmax(pace - fc, -R.sp), R.sr) end
    if takeC > 0 and windowed then
      if cp[8] ~= period then
        for k = 15, RECLEN do cp[k] = 0 end
      end
      cp[7], cp[8] = floor(mmin(taken(cp) + takeC, 2 * R.sb)), period
      cc[7], cc[8] = floor(mmin(taken(cc) + takeC, capC + R.sb)), period
      if id == 0 then id = tonumber(ssub(redis.sha1hex(sh.kc), 1, 8), 16) + 1 end
      topKeep(cp, id, w, cc[7], e)
      if takeS > 0 then cs[7], cs[8] = floor(mmin(taken(cs) + takeS, capS + R.sb)), period end
    elseif takeC > 0 then
      recSet(cc, mmax(lc - takeC, -R.sb), rate)
      if takeS > 0 then recSet(cs, mmax(ls - takeS, -R.sb), subRate) end
    end
    chg = {cp, cc, cs}
    local ac, as = cls, sub
    if path == 1 or path == 2 then ac, as = cc, cs end
    local lcA = lvl(ac, rate, capC)
    if windowed and not alone then lcA = lc - takeC end
    local ownA = lcA
    if hasSub then ownA = mmin(lcA, mmax(lvl(as, subRate, capS), subLend(lcA))) end
    local rem = res.remaining
    if paced and (path == 1 or path == 2) then pace = pace - fc end
    local vis = mmin(rem, mmax(floor(mmax(ownA, 0)), floor(borrowable(rem, 0))))
    if unpaced then vis = rem end
    if path ~= 0 or c == 0 then res.remaining = mmax(vis, 0) end
    if path == 3 then
      res.allowed = 0
      res.pool = res.pool + c
      local whole = not (fc <= R.so and lc >= need(fc, capC))
      if whole and hasSub then res.whole = 1 end
      local wait = toEpoch
      if windowed and fc <= R.so then
        wait = mmin(wait, resetNs)
      elseif rate > 0 and fc <= R.so then
        local need = (mmin(fc, capC) - lc) / rate
        if hasSub and not whole then
          local o = (mmin(fc, capS) - ls) / subRate
          local lend = ((1 - 1 / n) * capC + fc - lc) / rate
          need = mmax(need, mmin(o, lend))
        end
        wait = mmin(wait, mmax(need, 0))
      end
      if R.sr > 0 then
        local back = (reserve - room(rem, fc)) / R.sr
        if rem < keep then back = mmax(back, (keepTime - rem) / ((1 - s) * R.sr)) end
        wait = mmin(wait, back)
      end
      res.retry = mceil(mmax(wait, 1))
    end
  end
  res.share = path
  if path ~= 3 then res.whole = nil end
  if not peek or not sh.tou then
    sh.tou, sh.chg = {pool, cls, sub}, chg
    if c == 0 then sh.tou, sh.chg = nil, nil end
  end
end

-- shareKeep writes the records of fair charge i that changed: those an
-- admitted decision keeps when charged is set, else those any decision
-- keeps.
local function shareKeep(i, R, charged)
  local sh = SHARES[i]
  local recs = sh.tou
  if charged then recs = sh.chg end
  if not recs then return end
  local keys = {sh.kp, sh.kc, sh.ks}
  for k = 1, 3 do
    local key = keys[k]
    if key then
      local st = recs[k]
      if not recSame(st, shareLoad(key)) then put(key, st, recExpiry(R, st), 7) end
    end
  end
end

-- shareYields reports whether the class whose holdings of a shared
-- concurrency key hkey a lease record's value v names (its TTL, its
-- slots, the rule's max and epoch) must yield them rather than renew: it
-- holds more than its entitled part while another class claims slots.
local function shareYields(hkey, v)
  local _, _, max, eu = sunpack('<dddd', v)
  local base, cp = smatch(hkey, '^(.*)~h(%d+:.*)$')
  if not base then return false end
  local held = zlive(hkey)
  if held <= 0 then return false end
  local pool, cls = recCopy(shareLoad(base .. '~p')), shareLoad(base .. '~c' .. cp)
  local e = floor(nu / eu) + 1
  poolRoll(pool, e)
  local w = mmax(cls[6], 1)
  local act = pool[12] + pool[11]
  if cls[5] < e - 1 or (cls[5] == e - 1 and pool[12] < w) then act = act + w end
  local s = mmin(w / mmax(act, w), 1)
  local entitled = mmax(1, floor(s * max))
  local own = 0
  if cls[8] == e or cls[8] == e - 1 then own = cls[7] end
  return held > entitled and mmax(pool[13] + pool[14], 0) - own > 0
end

-- shareHold adds the slots of concurrency charge i, of lease id, to its
-- class's and sub's holdings, and names them in the lease record: the
-- class's with the rule's max and epoch, for shareYields.
local function shareHold(i, id, e, ttl, cost)
  local sh = SHARES[i]
  local R = RULES[i]
  for _, key in pairs({sh.kh, sh.kg}) do
    rcall('ZREMRANGEBYSCORE', key, '-inf', I(nu))
    leaseSlots(id, 1, cost, function(m)
      local args = {}
      for j = 1, #m do args[2 * j - 1], args[2 * j] = I(e), m[j] end
      rcall('ZADD', key, unpack(args))
    end)
    local last = rcall('ZRANGE', key, -1, -1, 'WITHSCORES')
    rcall('PEXPIRE', key, I(mceil((tonumber(last[2]) - nu) / 1000) + SLACK))
    if key == sh.kh then
      rcall('HSET', REC, key, pack('<dddd', ttl, cost, R.sb, R.se))
    else
      rcall('HSET', REC, key, pack('<dd', ttl, cost))
    end
  end
end

