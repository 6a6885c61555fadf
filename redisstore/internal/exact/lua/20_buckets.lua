-- Buckets -----------------------------------------------------------------

-- A bucket's token takes T = per/n ns = q + r/n. Times are (a, f): a ns
-- relative to now plus f/n ns, 0 <= f < n.

-- A rule is a table: alg, shadow, ttl (its lease TTL in µs) and its ten
-- parameters at [5]..[14], numbers, as in a charge's stride (see ARGV
-- above); b and f cache its bucket's and its floor's parameters.
local function ruleOf(src, base)
  local R = {alg = tonumber(src[base]), shadow = src[base + 2] == '1', ttl = tonumber(src[base + 3])}
  for k = 5, 14 do R[k] = tonumber(src[base + k]) end
  -- A rule's share parameters (admit.shareParams), when a batch sends
  -- them: its family (1 refills, 2 windows, 3 sliding, 4 slots), rate
  -- (units/ns), burst, epoch (µs), ceiling, top (the part of the rule a
  -- class alone takes at once), pace (a window's pace's burst) and once
  -- (the most of the rule one class takes in one charge).
  if src[base + 15] then
    R.sf, R.sr, R.sb = tonumber(src[base + 15]), tonumber(src[base + 16]), tonumber(src[base + 17])
    R.se, R.sc, R.st = tonumber(src[base + 18]), tonumber(src[base + 19]), tonumber(src[base + 20])
    R.sp, R.so = tonumber(src[base + 21]), tonumber(src[base + 22])
  end
  return R
end

-- rules caches the rules of batches by their text (a stride joined with
-- commas), so that a rule is parsed once, not at every call. It is
-- dropped when it grows large: rules change with every reload.
local rules, nrules = {}, 0

local function ruleText(text)
  local R = rules[text]
  if R then return R end
  local f = {}
  for v in sgmatch(text, '[^,]+') do f[#f + 1] = v end
  R = ruleOf(f, 1)
  if nrules >= 256 then rules, nrules = {}, 0 end
  rules[text], nrules = R, nrules + 1
  return R
end

-- bucketParams returns a rule's bucket parameters.
local function bucketParams(R)
  local p = R.b
  if not p then
    p = {n = R[5], q = R[6], r = R[7], burst = R[8], initial = R[9], remember = R[10], debt = R[8]}
    -- its shape, as its states name it (see encode)
    p.sh = pack('<ddddd', p.n, p.q, p.r, p.burst, p.remember)
    -- a token bucket's or GCRA's debt bound (admit.Rule.MaxDebt), where a
    -- combination keeps its floor
    if (R.alg == 1 or R.alg == 2) and R[14] > 0 then p.debt = R[14] end
    R.b = p
  end
  return p
end

-- floorParams returns a combination rule's floor, a bucket always full at
-- first.
local function floorParams(R)
  local p = R.f
  if not p then
    p = {n = R[11], q = R[12], r = R[13], burst = R[14], initial = R[14], remember = 0, debt = R[14]}
    p.sh = pack('<ddddd', p.n, p.q, p.r, p.burst, p.remember)
    R.f = p
  end
  return p
end

-- decode returns a bucket's arrival time relative to now, and whether the
-- bucket is new (absent or expired).
local function decode(b, U, W, F)
  if U then
    local a = (U - nu) * 1000 + W - nsub
    if ceil(a, F) + b.remember > 0 then return a, F, false end
  end
  local a, f = span(b, b.burst - b.initial)
  return a, f, true
end

local function encode(a, f, b)
  local t = a + nsub
  local w = t - floor(t / 1000) * 1000
  return {nu + (t - w) / 1000, w, f, 0, b and b.sh} -- the fourth is flush's
end

-- sameShape reports whether bucket state st was written under b's shape,
-- or under no shape named (admit_v9's states, a combination's halves). A
-- state keeps its shape as the string it was packed in, st[5], which Lua
-- interns: the comparison is one of pointers.
local function sameShape(b, st)
  return not st[5] or st[5] == b.sh
end

-- shapeOf returns a bucket of the shape bucket state st names: enough of
-- one to read and write its states (engine's shape.bucket), full at first
-- when it is new.
local function shapeOf(st)
  local o = {sh = st[5]}
  o.n, o.q, o.r, o.burst, o.remember = sunpack('<ddddd', st[5])
  o.initial, o.debt = o.burst, o.burst
  return o
end

-- adopt returns bucket state st, written under another shape than b's,
-- as b's (internal/engine/shape.go, bucket.adopt, which it mirrors
-- number for number): the tokens it holds now under its own shape, whole
-- plus the part of the next one refilled, capped at b's burst, refilling
-- at b's rate from now on; a debt, as the old rate's time for it (within
-- what b repays in 2^52 ns). It returns nil
-- for a state its own shape no longer remembers (a new key).
local function adopt(b, st)
  local o = shapeOf(st)
  local ea, ef = (st[1] - nu) * 1000 + st[2] - nsub, st[3]
  if ceil(ea, ef) + o.remember <= 0 then return nil end
  if not less(0, 0, ea, ef) then return encode(0, 0, b) end
  local da, df = span(o, o.burst)
  if less(da, df, ea, ef) then
    -- A debt: kept as the old rate's time for it, within keptDebt.
    local owed = ceil(sub(o, ea, ef, da, df))
    local most = MAXCOUNT
    if b.q >= 1048576 then most = mmin(tokens(b, 4503599627370496, 0) - b.burst, MAXCOUNT) end
    local ca = span(b, mmax(most, b.debt))
    if ca < owed then owed = ca end
    local ha, hf = span(b, b.burst)
    return encode(ha + owed, hf, b)
  end
  local m = tokens(o, ea, ef)
  local sa, sf = span(o, m)
  if less(sa, sf, ea, ef) then
    m = m + 1
    sa, sf = span(o, m)
  end
  local pa, pf = sub(o, sa, sf, ea, ef)
  local part = pa + pf / o.n
  local held = o.burst - m
  if held >= b.burst then return encode(0, 0, b) end
  local p = 0
  if part > 0 and b.q >= 2 then
    local ratio = (b.q + b.r / b.n) / (o.q + o.r / o.n)
    p = mmax(mmin(floor(part * ratio), b.q - 1), 0)
  end
  local ta, tf = span(b, b.burst - held)
  ta, tf = sub(b, ta, tf, p, 0)
  return encode(ta, tf, b)
end

-- fit returns bucket state st as b's, adopting it when another shape
-- wrote it, and whether it did: a state to write back even when nothing
-- is charged, or every look would adopt it again.
local function fit(b, st)
  if not st or sameShape(b, st) then return st, false end
  return adopt(b, st), true
end

-- bucketWhole is bucketEval for the usual bucket, whose token takes a
-- whole number of nanoseconds (r == 0): every time is then an integer
-- (f == 0), and the arithmetic needs none of the helpers above. It
-- decides exactly as bucketEval does, which the conformance suite checks
-- for both stores. It returns the state to keep, then allowed, remaining,
-- reset and retry: values, not a result table, for decideFast. A
-- debit that does not fit is charged all the same, into a debt of at most
-- b.debt (bucket.eval); what it then reports is step's to say.
local function bucketWhole(b, st, c, debit)
  local q, burst = b.q, b.burst
  if debit then c = mmin(c, burst + b.debt) end
  local ta, fresh = 0, true
  if st then
    ta = (st[1] - nu) * 1000 + st[2] - nsub
    fresh = ta + b.remember <= 0
  end
  if fresh then ta = (burst - b.initial) * q end
  local ba = ta
  if ba < 0 then ba = 0 end
  local ha = burst * q
  local na = ba + c * q
  local keep = st
  if fresh and b.initial < burst then keep = encode(ta, 0, b) end
  if na <= ha then
    local left = ha - na
    if c > 0 then keep = encode(na, 0, b) end
    return keep, 1, (left - fmod(left, q)) / q, na, 0
  end
  -- A debit goes into debt by at most b.debt, and never back (a TAT
  -- booked past the cap stays; bucket.eval).
  if debit then return encode(mmin(na, mmax(ba, (burst + b.debt) * q)), 0, b), 0, 0, 0, 0 end
  local remaining = 0
  if ba < ha then
    local left = ha - ba
    remaining = (left - fmod(left, q)) / q
  end
  return keep, 0, remaining, ba, na - ha
end

-- bucketEval mirrors bucket.eval. st is {U, W, F} or nil; it returns the
-- state to keep (st itself when unchanged).
local function bucketEval(b, st, c, res, debit)
  local adopted
  st, adopted = fit(b, st)
  if b.r == 0 and (not st or st[3] == 0) then
    local keep
    keep, res.allowed, res.remaining, res.reset, res.retry = bucketWhole(b, st, c, debit)
    return keep
  end
  if debit then c = mmin(c, b.burst + b.debt) end
  local ta, tf, fresh
  if st then ta, tf, fresh = decode(b, st[1], st[2], st[3]) else ta, tf, fresh = decode(b) end
  local ba, bf = ta, tf
  if less(ba, bf, 0, 0) then ba, bf = 0, 0 end
  local ha, hf = span(b, b.burst)
  local sa, sf = span(b, c)
  local na, nf = add(b, ba, bf, sa, sf)
  local keep = st
  if adopted or fresh and b.initial < b.burst then keep = encode(ta, tf, b) end
  if not less(ha, hf, na, nf) then
    res.allowed = 1
    res.remaining = tokens(b, sub(b, ha, hf, na, nf))
    res.reset = ceil(na, nf)
    if c > 0 then keep = encode(na, nf, b) end
    return keep
  end
  res.allowed = 0
  res.remaining = 0
  if debit then
    local ma, mf = span(b, b.burst + b.debt)
    if less(ma, mf, ba, bf) then ma, mf = ba, bf end
    if less(ma, mf, na, nf) then na, nf = ma, mf end
    return encode(na, nf, b)
  end
  if less(ba, bf, ha, hf) then res.remaining = tokens(b, sub(b, ha, hf, ba, bf)) end
  res.retry = ceil(sub(b, na, nf, ha, hf))
  res.reset = ceil(ba, bf)
  return keep
end

-- bucketExpiry returns how long, in ns from now, a bucket state matters.
local function bucketExpiry(b, st)
  if not st or st[1] == 0 then return 0 end
  return ceil((st[1] - nu) * 1000 + st[2] - nsub, st[3]) + b.remember
end

