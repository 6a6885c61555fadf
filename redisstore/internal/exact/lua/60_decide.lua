-- Deciding --------------------------------------------------------------

local function putBucket(key, b, st)
  put(key, st, bucketExpiry(b, st), 4)
end

local function store(key, R, alg, st)
  if alg == 1 or alg == 2 then return putBucket(key, bucketParams(R), st) end
  if alg == 6 then
    put(key, st, mmax(bucketExpiry(bucketParams(R), st), bucketExpiry(floorParams(R), {st[4], st[5], st[6]})), 6)
  elseif alg == 3 then
    putCount(key, st)
  elseif alg == 8 then
    put(key, st, (st[1] - nu) * 1000 - nsub, 2)
  else
    put(key, st, (st[1] - nu) * 1000 - nsub, 3)
  end
end

-- evaluate decides every charge at its cost (or at 0 when peek), chaining
-- the states of a key charged twice, as memstore does.
local function evaluate(results, nexts, dirty, peek, only, dup)
  -- Only a decision that charges a key twice needs to chain states and
  -- count what earlier charges of a key hold.
  local chain, pendingBy = NOKEYS, NOKEYS
  if dup then chain, pendingBy = {}, {} end
  for i = 1, n do
    local R, alg, cost = charge(i)
    local key = KEYS[KEYBASE + i]
    local c = cost
    if peek and not DEBITS[i] then c = 0 end
    local res = results[i]
    if not only or only[i] then
      res.retry = 0
      if alg == 5 or alg == 7 then
        local p = pendingBy[key] or 0
        if peek then p = 0 end
        if alg == 5 then
          logEval(key, R[5], R[6], c, p, res)
        else
          concEval(key, R[5], R[6], c, p, res)
        end
        res.share = nil
        if SHARES[i] then shareDecide(i, R, res, cost, peek) end
      else
        if alg == 8 then QEND1, QEND2 = ENDS1[i], ENDS2[i] end
        local st = chain[key]
        if st == nil and alg == 3 then
          st = loadCount(key, R[6], windowEnd(R[6])) or false
        elseif st == nil then
          st = load(key, alg) or false
        end
        local next, how = step(R, alg, st or nil, c, res, DEBITS[i])
        res.how, res.share = how, nil
        if SHARES[i] then
          shareDecide(i, R, res, cost, peek)
          if res.share == 3 then
            -- The rule admitted what the share refuses: keep what a look
            -- keeps.
            next = step(R, alg, st or nil, 0, {retry = 0}, false)
            res.how = 0
          end
        end
        nexts[i] = next
        dirty[i] = next ~= (st or nil)
        if dup then chain[key] = next or false end
      end
    elseif dup and nexts[i] ~= nil then
      chain[key] = nexts[i] or false
    end
    if dup then pendingBy[key] = (pendingBy[key] or 0) + cost end
  end
end

-- reply writes a decision's reply into out from OUTK on: allowed, four
-- values per charge (allowed + 2 × how, remaining, reset, retry), then
-- extra (a lease's expiry). The call's reply starts with now (µs, ns),
-- once for all its decisions.
local function reply(out, results, allowed, extra)
  local k = OUTK
  out[k + 1] = allowed
  k = k + 1
  for i = 1, n do
    local r = results[i]
    local x = r.allowed + 2 * (r.how or 0)
    if r.share then x = x + 8 * r.share + 32 * (r.whole or 0) + 64 * mmax(r.pool, 0) end
    out[k + 1], out[k + 2], out[k + 3], out[k + 4] = x, r.remaining, r.reset, r.retry
    k = k + 4
  end
  out[k + 1] = extra or 0
  OUTK = k + 1
  return out
end

-- decide decides the decision batch sets up and writes its reply into
-- out.
local function decide(out)
  local dry, lease = DRY, LEASE
  -- The tables of the last decision are reused: a batch makes many.
  local results, nexts, dirty = RES, NEXTS, DIRTY
  local dup = false
  for i = 1, n do
    local r = results[i]
    if r then r.how = nil else results[i] = {} end
    local key = KEYS[KEYBASE + i]
    for j = 1, i - 1 do
      if KEYS[KEYBASE + j] == key then dup = true end
    end
  end
  evaluate(results, nexts, dirty, false, nil, dup)
  local allowed = 1
  for i = 1, n do
    if results[i].allowed == 0 and not RULES[i].shadow and not DEBITS[i] then allowed = 0 end
  end
  if REFUSED then allowed = 0 end
  local leaseExpiry = 0
  if dry then return reply(out, results, allowed) end
  if allowed == 1 then
    local counts = {}
    for i = 1, n do
      local R, alg, cost = charge(i)
      local key = KEYS[KEYBASE + i]
      if alg == 5 or alg == 7 then
        if results[i].allowed == 1 and cost > 0 then
          if alg == 5 then
            logCommit(key, R[6], cost)
          else
            local ttl = TTLS[i]
            local e = nceil + ttl
            rcall('ZREMRANGEBYSCORE', key, '-inf', I(nu))
            local have = counts[key] or 0
            leaseSlots(lease, have + 1, have + cost, function(m)
              local args = {}
              for j = 1, #m do args[2 * j - 1], args[2 * j] = I(e), m[j] end
              rcall('ZADD', key, unpack(args))
            end)
            counts[key] = have + cost
            local last = rcall('ZRANGE', key, -1, -1, 'WITHSCORES')
            rcall('PEXPIRE', key, I(mceil((tonumber(last[2]) - nu) / 1000) + SLACK))
            rcall('HSET', REC, key, pack('<dd', ttl, counts[key]))
            leaseExpiry = mmax(leaseExpiry, e)
            if SHARES[i] then shareHold(i, lease, e, ttl, cost) end
          end
        end
      elseif dirty[i] then
        store(key, R, alg, nexts[i])
      end
      if SHARES[i] then shareKeep(i, R, (results[i].allowed == 1 or DEBITS[i]) and cost > 0) end
    end
    if leaseExpiry > 0 then
      rcall('PEXPIRE', REC, I(mceil((leaseExpiry - nu) / 1000) + SLACK))
    end
    return reply(out, results, 1, leaseExpiry)
  end
  -- Refused: nothing is charged but the debits. A charge that would have
  -- admitted reports what it holds now; new keys that must be recorded
  -- are, and debited keys kept.
  local again, any = {}, false
  for i = 1, n do
    local _, _, cost = charge(i)
    results[i].would = (results[i].allowed == 1 or results[i].share == 3) and cost > 0
    if results[i].would or dup then again[i], any = true, true end
  end
  if any then
    local peeks = {}
    for i = 1, n do peeks[i] = {} end
    evaluate(peeks, nexts, dirty, true, again, dup)
    for i = 1, n do
      if again[i] and DEBITS[i] then
        local r, p = results[i], peeks[i]
        r.allowed, r.remaining, r.reset, r.retry = p.allowed, p.remaining, p.reset, p.retry
      elseif again[i] and results[i].would then
        results[i].remaining, results[i].reset, results[i].pool = peeks[i].remaining, peeks[i].reset, peeks[i].pool
      end
    end
  end
  for i = 1, n do
    local R, alg = charge(i)
    if dirty[i] and alg ~= 5 and alg ~= 7 then store(KEYS[KEYBASE + i], R, alg, nexts[i]) end
    -- The class asked and the shared limit refused it: it counts, and a
    -- claim it made stands. One that another of the decision's limits
    -- refused did not get to ask.
    if SHARES[i] and (DEBITS[i] or results[i].allowed == 0) then shareKeep(i, R, DEBITS[i]) end
  end
  return reply(out, results, 0)
end

-- decideFast is decide for the usual decision — token buckets, gcra,
-- fixed and sliding windows, quotas, each key once, no dry run, no lease,
-- no debit but of fixed windows — the one most batches are made of, with
-- less: no pcall (its setjmp and frame cost more than the decision's
-- arithmetic), no tables but the one a key's state is read into, changed
-- in place, the reply written as it goes. A fixed window's count is
-- never read: Redis adds the cost to it (INCRBY), and a count that went
-- over is taken back before the call ends, so no one ever sees it.
-- What decideFast cannot take it leaves to decide, having changed nothing
-- and written nothing but reply values past OUTK, which decide writes
-- over: a refusal (which reports what the other charges hold), a key
-- holding something else than the rule's state (decide fails it, in its
-- pcall), a repeated key, a look at cost 0, a bucket whose token takes a
-- fraction of a nanosecond. It returns whether it decided.
local function decideFast(out)
  local k = OUTK + 1
  local counts = false
  for i = 1, n do
    local key = KEYS[KEYBASE + i]
    for j = 1, i - 1 do
      if KEYS[KEYBASE + j] == key then return false end
    end
    local R = RULES[i]
    local alg, c = R.alg, COSTS[i]
    if alg == 3 then
      -- Counted below, once every other charge is known to fit.
      if c == 0 then return false end
      ISC[i], NXA[i], NXB[i], counts = true, false, windowEnd(R[6]), true
    else
      ISC[i] = false
      -- A bucket's state is four numbers (32 bytes), a sliding window's
      -- three, a quota's two.
      local s = slotOf(key)
      local st = ST[s]
      if st == nil then
        local v = rpcall('GET', key)
        if v == false then st = false
        elseif type(v) ~= 'string' or #v ~= SIZE[alg] then return false
        else st = decodeState(s, alg, v) end
        ST[s] = st
      elseif st and SK[s] ~= KIND[alg] then
        return false -- a rule of another algorithm had this key in this call
      end
      local al, rem, reset, retry, nx1, nx2, nx3
      if alg <= 2 then
        local b = R.b or bucketParams(R)
        local q, burst = b.q, b.burst
        if b.r ~= 0 or (st and (st[3] ~= 0 or not st[5] or not sameShape(b, st))) then return false end
        -- bucketWhole, without its tables: times are whole ns from now.
        local ta, fresh = 0, true
        if st then
          ta = (st[1] - nu) * 1000 + st[2] - nsub
          fresh = ta + b.remember <= 0
        end
        if fresh then ta = (burst - b.initial) * q end
        -- A new bucket that starts below its burst is recorded even
        -- when nothing is charged.
        nx1 = false
        if fresh and b.initial < burst then nx1 = ta end
        if ta < 0 then ta = 0 end
        local ha, na = burst * q, ta + c * q
        if na <= ha then
          local left = ha - na
          al, rem, reset, retry = 1, (left - fmod(left, q)) / q, na, 0
          if c > 0 then nx1 = na end
        elseif R.shadow then
          local left = mmax(ha - ta, 0)
          al, rem, reset, retry = 0, (left - fmod(left, q)) / q, ta, na - ha
        else
          return false
        end
      elseif alg == 4 then
        -- slidingEval, without its tables.
        local limit, wu = R[5], R[6]
        local cur, prev, endu, weight, other = slidingCounts(wu, st)
        -- Another length's state is decide's to convert and keep.
        if other then return false end
        local room = limit - cur - c
        -- A refusal, in shadow or not, is decide's to report.
        if room < 0 or weight > room then return false end
        al, rem, retry = 1, limit - weight - cur - c, 0
        if cur + c > 0 then reset = (endu + wu - nu) * 1000 - nsub
        elseif prev > 0 then reset = (endu - nu) * 1000 - nsub
        else reset = 0 end
        nx1 = false
        if c > 0 then nx1, nx2, nx3 = endu + wu, cur + c, prev end
      else
        -- countEval, without its tables: a quota's calendar period, whose
        -- reply says its end in µs.
        local limit, endu = R[5], ENDS1[i]
        if endu <= nu then endu = ENDS2[i] end
        local count = 0
        if st and st[1] > nu then count, endu = st[2], st[1] end
        if count + c > limit then return false end
        al, rem, reset, retry = 1, limit - count - c, endu, 0
        nx1 = false
        if c > 0 then nx1, nx2 = endu, count + c end
      end
      NXA[i], NXB[i], NXC[i] = nx1, nx2, nx3
      local o = k + 4 * i - 3
      out[o], out[o + 1], out[o + 2], out[o + 3] = al, rem, reset, retry
    end
  end
  -- Every other charge fits: count. A count that goes over (but a
  -- debit's, which counts anyway) takes back what the decision counted.
  if counts then
    for i = 1, n do
      if ISC[i] then
        local R, c, endu = RULES[i], COSTS[i], NXB[i]
        local limit = R[5]
        local ck, cnt, made = countCharge(KEYS[KEYBASE + i], R[6], endu, c)
        if type(cnt) ~= 'number' or (cnt > limit and not DEBITS[i]) then
          takeBack(i, ck, cnt, c, made, ISC)
          return false
        end
        CKEY[i], MADE[i], ADDED[i] = ck, made, c
        -- Whether it fitted is the count's before the cap: a debit past
        -- a limit of MAXCOUNT did not fit, though its count stops there.
        local fits = cnt <= limit
        if cnt > MAXCOUNT then cnt = capCount(i, ck, cnt, c) end
        local reset = (endu - nu) * 1000 - nsub
        local o = k + 4 * i - 3
        if fits then
          out[o], out[o + 1], out[o + 2], out[o + 3] = 1, limit - cnt, reset, 0
        else
          -- A debit over the limit reports what a cost of 1 meets after it.
          out[o], out[o + 1], out[o + 2], out[o + 3] = 0, 0, reset, reset
        end
      end
    end
  end
  -- Every charge fits (or refuses in shadow): commit, in place.
  for i = 1, n do
    local a = NXA[i]
    if a then
      local key, R = KEYS[KEYBASE + i], RULES[i]
      local alg = R.alg
      local st = ST[SLOT[key]]
      if alg <= 2 then
        local t = a + nsub
        local w = fmod(t, 1000)
        local b = R.b
        if not st then st = {0, 0, 0, 0, b.sh} end
        st[1], st[2], st[3] = nu + (t - w) / 1000, w, 0
        put(key, st, a + b.remember, 4)
      elseif alg == 4 then
        if not st then st = {0, 0, 0, 0} end
        st[1], st[2], st[3], st[4] = a, NXB[i], NXC[i], R[6]
        put(key, st, (a - nu) * 1000 - nsub, 3)
      else
        if not st then st = {0, 0} end
        st[1], st[2] = a, NXB[i]
        put(key, st, (a - nu) * 1000 - nsub, 2)
      end
    end
  end
  out[k] = 1
  OUTK = k + 4 * n + 1
  out[OUTK] = 0
  return true
end

