-- Operations ------------------------------------------------------------

-- reserve books every charge (token buckets and gcra) if the longest wait
-- is within ARGV[4] ns; the record (KEYS[n+1]) keeps what cancel needs.
local function reserve()
  local maxWait = tonumber(ARGV[4])
  local chain, nexts, wait = {}, {}, 0
  for i = 1, n do
    local R, alg, cost, shadow = charge(i)
    local key = KEYS[i]
    local b = bucketParams(R)
    local st = chain[key]
    if st == nil then st = load(key, alg) or false end
    st = fit(b, st or nil)
    local ta, tf
    if st then ta, tf = decode(b, st[1], st[2], st[3]) else ta, tf = decode(b) end
    if less(ta, tf, 0, 0) then ta, tf = 0, 0 end
    local ha, hf = span(b, b.burst)
    local na, nf = add(b, ta, tf, span(b, cost))
    local w = 0
    if less(ha, hf, na, nf) then w = ceil(sub(b, na, nf, ha, hf)) end
    if not shadow then wait = mmax(wait, w) end
    nexts[i] = encode(na, nf, b)
    chain[key] = nexts[i]
  end
  if wait > maxWait then return {nu, nsub, 0, wait} end
  local rec = KEYS[n + 1]
  for i = 1, n do
    local R, alg = charge(i)
    store(KEYS[i], R, alg, nexts[i])
    local args, base = {}, 8 + (i - 1) * STRIDE
    for j = base, base + STRIDE - 1 do args[#args + 1] = ARGV[j] end
    rcall('HSET', rec, KEYS[i] .. '\n' .. i, tconcat(args, ','))
  end
  local at = encode(wait, 0)
  rcall('HSET', rec, 'at', pack('<dd', at[1], at[2]))
  rcall('PEXPIRE', rec, I(mceil(wait / 1000000) + 60000 + SLACK))
  return {nu, nsub, 1, wait}
end

-- bucketGive gives back c tokens of bucket key, as StepCancel does.
local function bucketGive(key, b, st, c)
  if not st then return end
  local ga, gf = span(b, c)
  if not sameShape(b, st) then
    -- Given back into the shape the key has now (engine's giveInto): the
    -- debt first, as time, c tokens' time of b; what is left of them as
    -- whole tokens of the key's shape.
    local give, o = ga, shapeOf(st)
    local ta, tf = decode(o, st[1], st[2], st[3])
    if ceil(ta, tf) + o.remember <= 0 then return end
    local da, df = span(o, o.burst)
    local debt = 0
    if less(da, df, ta, tf) then debt = sub(o, ta, tf, da, df) end
    ga, gf = give, 0
    if give > debt then ga, gf = add(o, debt, 0, span(o, tokens(b, give - debt, 0))) end
    b = o
  end
  local ta, tf = decode(b, st[1], st[2], st[3])
  if ceil(ta, tf) + b.remember <= 0 then return end
  local na, nf = sub(b, ta, tf, ga, gf)
  if ceil(na, nf) + b.remember <= 0 then put(key, false, 0, 0) return end
  return encode(na, nf, b)
end

-- cancel gives back a reservation whose time has not come. The keys it
-- touches are listed in KEYS, read from the record by the caller first;
-- the record is read again here, so a concurrent cancel gives back once.
local function cancel()
  local rec = KEYS[1]
  local at = rcall('HGET', rec, 'at')
  if not at then return {nu, nsub, 0} end
  local fields = rcall('HGETALL', rec)
  rcall('DEL', rec)
  local au, aw = sunpack('<dd', at)
  if (au - nu) * 1000 + aw - nsub <= 0 then return {nu, nsub, 1} end
  for j = 1, #fields, 2 do
    local f = fields[j]
    if f ~= 'at' then
      local key = smatch(f, '^(.*)\n%d+$')
      local a = {}
      for v in sgmatch(fields[j + 1], '[^,]+') do a[#a + 1] = v end
      local b = bucketParams(ruleText(tconcat(a, ',')))
      local st = load(key, 1)
      local next = bucketGive(key, b, st, tonumber(a[2]))
      if next then putBucket(key, b, next) end
    end
  end
  return {nu, nsub, 1}
end

-- undo gives back what a decision committed at (ARGV[4] µs, ARGV[5] ns),
-- then reports every charge as a look at cost 0. Used when a later part
-- of a decision that spans cluster slots refuses.
local function undo()
  local cu = tonumber(ARGV[4])
  local cceil = cu
  if tonumber(ARGV[5]) > 0 then cceil = cu + 1 end
  local lease = ARGV[6]
  for i = 1, n do
    local R, alg, cost = charge(i)
    local how = HALVES[i]
    local key = KEYS[i]
    if cost > 0 and how >= 0 then
      if alg == 1 or alg == 2 then
        local b = bucketParams(R)
        local next = bucketGive(key, b, load(key, alg), cost)
        if next then store(key, R, alg, next) end
      elseif alg == 6 then
        local st = load(key, alg)
        if st then
          local b, i0 = bucketParams(R), 1
          if how == 1 then b, i0 = floorParams(R), 4 end
          local next = bucketGive(key, b, {st[i0], st[i0 + 1], st[i0 + 2], 0, st[7 + (i0 - 1) / 3]}, cost)
          if next then
            local s = {st[1], st[2], st[3], st[4], st[5], st[6], st[7], st[8]}
            s[i0], s[i0 + 1], s[i0 + 2] = next[1], next[2], next[3]
            store(key, R, alg, s)
          end
        end
      elseif alg == 8 then
        local st = load(key, alg)
        -- A first-hit window (its length sent negated, endAt) gives back
        -- only to the window that ran at cu: one started later ends more
        -- than a window after cu.
        if st and st[1] > nu and (R[6] >= 0 or st[1] <= cu - R[6]) then store(key, R, alg, {st[1], mmax(st[2] - cost, 0)}) end
      elseif alg == 3 then
        -- To the window the decision was committed in, if it has not
        -- ended.
        local endu = cu - fmod(cu, R[6]) + R[6]
        local st = endu > nu and loadCount(key, R[6], endu)
        if st then putCount(key, {endu, mmax(st[2] - cost, 0)}) end
      elseif alg == 4 then
        local st = load(key, alg)
        local wu = R[6]
        local endu = cu - fmod(cu, wu) + wu
        if st and st[1] > nu then
          local s = {st[1], st[2], st[3], st[4]}
          if s[1] == endu + wu then s[2] = mmax(s[2] - cost, 0)
          elseif s[1] == endu + 2 * wu then s[3] = mmax(s[3] - cost, 0) end
          store(key, R, alg, s)
        end
      elseif alg == 5 then
        logUndo(key, cceil, cost)
      elseif alg == 7 and lease ~= '' then
        local v = rcall('HGET', REC, key)
        if v then
          local _, count = sunpack('<dd', v)
          leaseSlots(lease, 1, count, function(m) rcall('ZREM', key, unpack(m)) end)
          rcall('HDEL', REC, key)
        end
      end
    end
  end
  local results, nexts, dirty = {}, {}, {}
  for i = 1, n do results[i] = {} end
  local dup = false
  for i = 1, n do
    for j = 1, i - 1 do
      if KEYS[j] == KEYS[i] then dup = true end
    end
  end
  evaluate(results, nexts, dirty, true, nil, dup)
  local out = {}
  out[1], out[2], OUTK = nu, nsub, 2
  return reply(out, results, 0)
end

-- book is withdraw for a token bucket or gcra: it grants tokens the
-- bucket does not have yet, booking its refill up to BOOKAHEAD ns ahead
-- (the bucket goes into debt, as a reservation puts it), so that a key
-- under sustained demand is leased in batches rather than one token at a
-- time. Of the tokens that room holds it grants at most half, so that
-- other servers asking get a share, and nothing when it holds fewer than
-- 2 × SHARE: a small bucket is decided exactly. The reply is decide's for a look at
-- the key, with the grant where a lease's expiry goes and, in place of
-- the charge's retry, in how many ns (ceiled; <= 0: already) the first
-- token granted is due: the others follow one per token's span, and the
-- server spends none before it is due (redisstore/leased.go).
local function book(out, want, k0)
  local R, alg = charge(1)
  decide(out)
  local key = KEYS[KEYBASE + 1]
  local b = bucketParams(R)
  local st = fit(b, load(key, alg))
  local ta, tf
  if st then ta, tf = decode(b, st[1], st[2], st[3]) else ta, tf = decode(b) end
  if less(ta, tf, 0, 0) then ta, tf = 0, 0 end
  local ha, hf = span(b, b.burst)
  local ra, rf = sub(b, ha + BOOKAHEAD, hf, ta, tf)
  local room = tokens(b, ra, rf)
  local g = mmin(want, room - floor(room / 2))
  if room < 2 * SHARE then g = 0 end
  if g < 1 then
    out[OUTK] = 0
    return out
  end
  local na, nf = add(b, ta, tf, span(b, g))
  store(key, R, alg, encode(na, nf, b))
  local xa, xf = add(b, ta, tf, span(b, 1))
  out[k0 + 5] = ceil(sub(b, xa, xf, ha, hf))
  out[OUTK] = g
  return out
end

-- withdraw takes an allowance for a leased rule (redisstore/leased.go):
-- of the one charge's cost, as much as fits in 1/SHARE of what the key
-- has left, so that the last units of a limit go one by one to whichever
-- server asks, and the servers asking for more get less the less there
-- is. It replies as decide does, the charge as if its cost had been the
-- amount granted (0 when none was: what a peek sees), and that amount
-- where a lease's expiry goes. A bucket's is book's, but a shared one's.
local function withdraw(out)
  local want, k0 = COSTS[1], OUTK
  COSTS[1] = 0
  local alg = RULES[1].alg
  -- A bucket's withdrawal books its refill ahead, but not a shared
  -- bucket's: tokens booked ahead for one class would come before every
  -- other class's share. A class takes what is there, as a window's.
  if (alg == 1 or alg == 2) and not SHARES[1] then return book(out, want, k0) end
  decide(out)
  local g = mmin(want, floor(out[k0 + 3] / SHARE))
  if g >= 1 then
    OUTK, COSTS[1] = k0, g
    decide(out)
    if out[k0 + 1] ~= 1 then g = 0 end
  else
    g = 0
  end
  out[OUTK] = g
  return out
end

-- strided sets up the N charges of a call laid out in strides (ops r and
-- u; see ARGV above).
local function strided()
  n = tonumber(ARGV[7])
  for i = 1, n do
    local base = 8 + (i - 1) * STRIDE
    local R = ruleOf(ARGV, base)
    RULES[i], COSTS[i], TTLS[i], HALVES[i] = R, tonumber(ARGV[base + 1]), R.ttl, tonumber(ARGV[base + 4])
    DEBITS[i], SHARES[i] = false, false
    if R.alg == 8 then ENDS1[i], ENDS2[i] = endAt(R[6]), endAt(R[7]) end
  end
  REC, KEYBASE = KEYS[n + 1], 0
end

-- batch decides many decisions in one call, one after the other, each all
-- or nothing on its own; they share the clock, the states read and the
-- writes. ARGV: 1 'b', 2 and 3 now, 4 the number of distinct rules R,
-- 5 the number of decisions M, 6 the reply's length; then R rules, each a
-- stride joined with commas (cost and how unused, the lease TTL the
-- rule's own); then M decisions, each: a head, N, its number of charges,
-- or "N:flags:debits:lease" where flags holds d for a dry run, x for a
-- decision refused already, w for a withdrawal (N is 1; see withdraw), and
-- r when a lease record key follows its charge keys, and debits is the
-- mask of which charges are debits (bit k the k-th; empty for none); then
-- per charge the rule's number (1..R), the cost, for a quota the ends
-- of its period and the next in µs and, for a concurrency rule only, the lease TTL in µs
-- or '' for the rule's. KEYS: each decision's charge keys and record key,
-- in order. The reply: now (µs, ns), then each decision's (see reply).
local function batch()
  local nr, m = tonumber(ARGV[4]), tonumber(ARGV[5])
  local rs = {}
  for r = 1, nr do rs[r] = ruleText(ARGV[6 + r]) end
  local a = 7 + nr
  if OUT[1025] ~= nil then OUT = {} end -- not kept large
  local out = OUT
  out[1], out[2] = nu, nsub
  OUTK, KEYBASE = 2, 0
  for _ = 1, m do
    local h = ARGV[a]
    local rec = false
    local w = false
    local shared = false
    n, DRY, REFUSED, LEASE = NUMS[h] or tonumber(h), false, false, ''
    local dm = 0
    if not n then
      local c, f, d, l = smatch(h, '^(%d+):(%a*):(%d*):(.*)$')
      n, LEASE = tonumber(c), l
      if d ~= '' then dm = tonumber(d) end
      DRY, rec = sfind(f, 'd', 1, true) ~= nil, sfind(f, 'r', 1, true) ~= nil
      REFUSED, w = sfind(f, 'x', 1, true) ~= nil, sfind(f, 'w', 1, true) ~= nil
      shared = sfind(f, 's', 1, true) ~= nil
    end
    a = a + 1
    local fast = not rec and not DRY and not REFUSED and not w and not shared
    for i = 1, n do
      local R, c = rs[NUMS[ARGV[a]] or tonumber(ARGV[a])], ARGV[a + 1]
      local cost, debit = NUMS[c] or tonumber(c), false
      if dm > 0 then
        debit, dm = dm % 2 == 1, floor(dm / 2)
        -- A fixed window's debit is decideFast's too.
        if debit and R.alg ~= 3 then fast = false end
      end
      RULES[i], COSTS[i], TTLS[i], DEBITS[i] = R, cost, R.ttl, debit
      a = a + 2
      if R.alg > 4 and R.alg ~= 8 then fast = false end
      if R.alg == 7 then
        local t = ARGV[a]
        if t ~= '' then TTLS[i] = tonumber(t) end
        a = a + 1
      elseif R.alg == 8 then
        ENDS1[i], ENDS2[i] = endAt(tonumber(ARGV[a])), endAt(tonumber(ARGV[a + 1]))
        a = a + 2
      end
      SHARES[i] = false
      if shared then
        -- A fair charge's share: its weight, then s (it has a sub) and
        -- p (prepaid); its keys follow the decision's.
        local x = ARGV[a]
        a = a + 1
        if x ~= '' then
          local wt, f = smatch(x, '^(%d+)(%a*)$')
          SHARES[i] = {w = tonumber(wt), sub = sfind(f, 's', 1, true) ~= nil, pre = sfind(f, 'p', 1, true) ~= nil}
        end
      end
    end
    REC = nil
    if rec then REC = KEYS[KEYBASE + n + 1] end
    local kx = KEYBASE + n
    if rec then kx = kx + 1 end
    for i = 1, n do
      local sh = SHARES[i]
      if sh then
        sh.kp, sh.kc, kx = KEYS[kx + 1], KEYS[kx + 2], kx + 2
        if sh.sub then sh.ks, kx = KEYS[kx + 1], kx + 1 end
        if RULES[i].alg == 7 then
          sh.kh, kx = KEYS[kx + 1], kx + 1
          if sh.sub then sh.kg, kx = KEYS[kx + 1], kx + 1 end
        end
      end
    end
    -- A decision that fails (a key holding another type, after a rule
    -- changed its algorithm) must not fail the rest of the batch. Its
    -- commands all read until it commits, so it has written nothing: its
    -- reply says -1 where allowed goes, and Redis's log says why.
    local k0 = OUTK
    local ok, err = true, nil
    if w then ok, err = pcall(withdraw, out)
    elseif not (fast and decideFast(out)) then ok, err = pcall(decide, out) end
    if not ok then
      if type(err) == 'table' then err = err.err end
      redis.log(redis.LOG_WARNING, 'admit: a decision failed: ' .. tostring(err))
      for i = k0 + 1, k0 + 2 + 4 * n do out[i] = 0 end
      out[k0 + 1], OUTK = -1, k0 + 2 + 4 * n
    end
    KEYBASE = kx
  end
  out[OUTK + 1] = nil
  return out
end

-- windows is batch for a batch of decisions whose charges are all fixed
-- windows', with no flags: the usual request of envoyproxy/ratelimit's
-- configurations, at the least cost. ARGV is batch's. Each charge is
-- counted by INCRBY at once, in order; a decision that a count refuses
-- takes back what it counted, and is then decided by decide, to report
-- its refusal as batch would. The reply is shorter than batch's, as each
-- value of a reply costs Redis about as much as an INCRBY: now (µs, ns),
-- then for each decision either its charges' counts once it has counted
-- (each >= 1: the Go side works out the rest, as countEval would), or -2
-- and batch's reply for the decision, or -1 when it failed.
local function windows()
  local nr, m = tonumber(ARGV[4]), tonumber(ARGV[5])
  local rs = RS
  for r = 1, nr do rs[r] = ruleText(ARGV[6 + r]) end
  local a = 7 + nr
  if OUT[1025] ~= nil then OUT = {} end -- not kept large
  local out = OUT
  out[1], out[2] = nu, nsub
  local k, kb = 2, 0
  for _ = 1, m do
    local h = ARGV[a]
    local nc, dm0 = NUMS[h] or tonumber(h), 0
    if not nc then
      local c, d = smatch(h, '^(%d+):%a*:(%d*):')
      nc, dm0 = tonumber(c), tonumber(d) or 0
    end
    local dm = dm0
    local a0 = a + 1
    a = a0 + 2 * nc
    local k0 = k
    local refused = false
    local i = 0
    while i < nc do
      i = i + 1
      local x = a0 + 2 * i - 2
      local R, cs = rs[NUMS[ARGV[x]] or tonumber(ARGV[x])], ARGV[x + 1]
      local c, debit = NUMS[cs] or tonumber(cs), false
      if dm > 0 then debit, dm = dm % 2 == 1, floor(dm / 2) end
      local wu, limit = R[6], R[5]
      local endu = nu - fmod(nu, wu) + wu
      local ck, cnt, made = nil, false, false
      if c > 0 then ck, cnt, made = countCharge(KEYS[kb + i], wu, endu, c) end
      -- A look (cost 0) is decide's too.
      if type(cnt) ~= 'number' or (cnt > limit and not debit) then
        -- Taken back, this one and those before it; decide reports.
        takeBack(i, ck, cnt, c, made)
        refused = true
        break
      end
      CKEY[i], MADE[i], ADDED[i] = ck, made, c
      -- The reply is the count before the cap, which says whether the
      -- charge fitted: a debit past a limit of MAXCOUNT did not, though
      -- the count stops there (redisstore/batch.go, counted).
      k = k + 1
      out[k] = cnt
      if cnt > MAXCOUNT then capCount(i, ck, cnt, c) end
    end
    if refused then
      n, DRY, REFUSED, LEASE, REC, KEYBASE = nc, false, false, '', nil, kb
      dm = dm0
      for j = 1, nc do
        local x = a0 + 2 * j - 2
        local R, cs = rs[NUMS[ARGV[x]] or tonumber(ARGV[x])], ARGV[x + 1]
        local c, debit = NUMS[cs] or tonumber(cs), false
        if dm > 0 then debit, dm = dm % 2 == 1, floor(dm / 2) end
        RULES[j], COSTS[j], TTLS[j], DEBITS[j], SHARES[j] = R, c, R.ttl, debit, false
      end
      out[k0 + 1] = -2
      OUTK = k0 + 1
      local ok, err = pcall(decide, out)
      k = OUTK
      if not ok then
        if type(err) == 'table' then err = err.err end
        redis.log(redis.LOG_WARNING, 'admit: a decision failed: ' .. tostring(err))
        out[k0 + 1] = -1
        k = k0 + 1
      end
    end
    kb = kb + nc
  end
  out[k + 1] = nil
  return out
end

-- renew and release act on a lease record (KEYS[1]) and the concurrency
-- keys it lists (KEYS[2..], read from the record by the caller first).
local function leaseOp(renew)
  local rec = KEYS[1]
  local id = ARGV[6]
  local held, expiry = false, 0
  if renew then
    -- A class holding more than its part of a shared key while another
    -- claims slots yields (admit.ShareYields): nothing is renewed.
    for i = 2, #KEYS do
      local key = KEYS[i]
      local v = rcall('HGET', rec, key)
      if v and #v == 32 and shareYields(key, v) then return {nu, nsub, 2, 0} end
    end
  end
  for i = 2, #KEYS do
    local key = KEYS[i]
    local v = rcall('HGET', rec, key)
    if v then
      local ttl, count = sunpack('<dd', v)
      leaseSlots(id, 1, count, function(m)
        local scores = rcall('ZMSCORE', key, unpack(m))
        local live = {}
        for j = 1, #m do
          local e = scores[j]
          if e and tonumber(e) > nu then
            live[#live + 1], live[#live + 2] = I(nceil + ttl), m[j]
          end
        end
        if #live > 0 then
          held = true
          if renew then
            rcall('ZADD', key, 'XX', unpack(live))
            expiry = mmax(expiry, nceil + ttl)
          end
        end
        if not renew then rcall('ZREM', key, unpack(m)) end
      end)
      local last = rcall('ZRANGE', key, -1, -1, 'WITHSCORES')
      if last[2] and tonumber(last[2]) > nu then
        rcall('PEXPIRE', key, I(mceil((tonumber(last[2]) - nu) / 1000) + SLACK))
      else
        rcall('DEL', key)
      end
    end
  end
  if renew and held then
    rcall('PEXPIRE', rec, I(mceil((expiry - nu) / 1000) + SLACK))
  else
    rcall('DEL', rec)
  end
  if held then return {nu, nsub, 1, expiry} end
  return {nu, nsub, 0, 0}
end

-- reset forgets what each charge's key holds: the key, and a window's
-- count now (an earlier window's is never read again).
local function reset()
  for i = 1, n do
    local R, alg = charge(i)
    local key = KEYS[i]
    rcall('DEL', key)
    if alg == 3 then rcall('DEL', countKey(key, windowEnd(R[6]))) end
  end
  return {nu, nsub}
end

-- setup makes the library's locals at its first call.
local function setup()
  fmod, floor, pack, sunpack, mmax, mmin, mceil, sformat, smatch, sfind,
    sgmatch, ssub, tconcat, rcall, rpcall, tonumber, tostring, unpack, pairs, pcall, type = builtins()
  RES, NEXTS, DIRTY, NOKEYS, OUT, NUMS, RS = {}, {}, {}, {}, {}, {}, {}
  NXA, NXB, NXC = {}, {}, {}
  ISC, CKEY, MADE, ADDED = {}, {}, {}, {}
  SLOT, nslotkeys, SKEY, ST, SHAS, SW, SK = {}, 0, {}, {}, {}, {}, {}
  KIND = {4, 4, 0, 3, 0, 6, 0, 2}
  SIZE = {72, 72, 0, 32, 0, 0, 0, 16}
  for i = 0, 63 do NUMS[sformat('%d', i)] = i end
  RULES, COSTS, TTLS, DEBITS, HALVES, ENDS1, ENDS2 = {}, {}, {}, {}, {}, {}, {}
  SHARES = {}
end

-- run is the library's one function: FCALL admit numkeys keys… args….
local function run(keys, args)
  KEYS, ARGV = keys, args
  if not fmod then setup() end
  if ARGV[2] == '' then
    local t = rcall('TIME')
    nu, nsub = tonumber(t[1]) * 1000000 + tonumber(t[2]), 0
    SLACK = 0
  else
    nu, nsub = tonumber(ARGV[2]), tonumber(ARGV[3])
    SLACK = 600000
  end
  -- Log entries and lease expiries are whole microseconds, rounded up.
  nceil = nu
  if nsub > 0 then nceil = nu + 1 end
  n = 0
  nslot = 0
  OUTK = 0
  local op, out = ARGV[1], nil
  if op == 'w' then out = windows()
  elseif op == 'b' then out = batch()
  elseif op == 'r' then strided() out = reserve()
  elseif op == 'u' then strided() out = undo()
  elseif op == 'x' then strided() out = reset()
  elseif op == 'c' then out = cancel()
  elseif op == 'n' then out = leaseOp(true)
  elseif op == 'l' then out = leaseOp(false)
  else return redis.error_reply('admit: unknown op ' .. tostring(op)) end
  flush()
  return out
end

redis.register_function('admit_v12', run)
