#!lua name=admit_v10
-- Admit's decision engine inside Redis, a Functions library with one
-- function: every algorithm, all the charges of a decision — or of a batch
-- of decisions — in one call (FCALL admit_v10 numkeys keys… args…). A
-- library, not an EVAL script, so that its ~40 helper closures are built
-- once at FUNCTION LOAD rather than at every call: that halved the Redis
-- CPU a decision costs. It mirrors the Go algorithms of the module's engine
-- (internal/engine: bucket.go, window.go, log.go) and must decide exactly as they do; the
-- conformance suite (storetest) runs against both.
--
-- Numbers. Lua numbers are doubles: integers are exact below 2^53. The
-- script never holds an absolute time in nanoseconds (1.8e18 > 2^53).
-- "now" is (nu, nsub): whole microseconds since the Unix epoch (exact until
-- the year 2255) and 0..999 nanoseconds. Every time the algorithms compute
-- with is relative to now, in nanoseconds, below 2^53 because the Go side
-- refuses rules whose spans and windows pass 52 days (see maxSpan in
-- store.go). Products that can pass 2^53 go through span() and muldiv(),
-- which split their operands so that every partial result is exact.
--
-- Arguments (ARGV), but for op b (see batch below):
--   1 op: b decide a batch of decisions, r reserve, u undo (give back a
--     committed decision), c cancel a reservation, n renew a lease,
--     l release a lease, x reset (forget what the charges' keys hold)
--   2 now in microseconds, or '' for Redis TIME; 3 the nanoseconds beyond
--   4, 5 op-specific; 6 lease or reservation id; 7 number of charges N
--   8.. N charges of STRIDE arguments: algorithm, cost, shadow, lease TTL
--   (µs), how (undo: which half of a combination was charged), then ten
--   algorithm parameters (see store.go, ruleArgs).
-- KEYS: the N charge keys, then the lease or reservation record, if any.
--
-- Writes. A call reads each counter's state once and writes it once, when
-- it ends (put, flush), however many of its decisions charged it.
--
-- State encodings (struct.pack, little-endian doubles):
--   token bucket, gcra: U W F X N Q R B M, the theoretical arrival time
--     U µs + W ns + F/n ns, until when (µs) the key was set to live (see
--     flush), and the shape it was written under: its token's time Q +
--     R/N ns, its burst B and how long it is remembered full M ns (see
--     adopt; admit_v9 wrote U W F X, admit_v5 U W F, read as the rule's
--     own); combination: the burst bucket's U W F, then the floor's, then
--     the shapes of both (five numbers each, as a bucket's; admit_v9
--     wrote the six numbers only).
--   fixed window: a count, an integer, in a key of its own for each
--     window: the counter's key, '@' and the window's end in µs (see
--     countKey), expiring at that end. Redis adds to it natively
--     (INCRBY), and a new window needs no reset. admit_v7 kept E C (the
--     end in µs, the count) in the counter's key itself; see legacyCount.
--   quota: E C (period end in µs, count): a period keeps its end when
--     the rule's anchor changes, which a key named for the period could
--     not.
--   sliding window: A B C W (current window's end + one window, in µs;
--     the current and the previous window's counts; the window's length,
--     µs, which tells another length's state from this one's: admit_v9
--     wrote A B C).
--   sliding log: a hash used as a queue: h (oldest seq), t (next seq),
--     n (units held) and one field per seq holding (µs, units).
--   concurrency: a sorted set of "<lease>#<i>" scored by expiry in µs.

local STRIDE = 15
-- A withdrawal takes at most 1/SHARE of what a key has left (see withdraw).
local SHARE = 8
-- A bucket's withdrawal may book its refill this far ahead, in ns (see
-- book; redisstore/leased.go's bookAhead).
local BOOKAHEAD = 250000000
local MAXCOUNT = 4000000000 -- admit.MaxCount: a window counts debits up to it
local TWO53 = 9007199254740992
local SPLIT = 2097152 -- 2^21
-- TOPK is admit.ShareTopK: a window's or quota's pool record keeps its
-- period's TOPK largest takers, 4 numbers each, after the record's 14;
-- RECFMT packs such a record, RECLEN doubles.
local TOPK = 8
local RECLEN = 14 + 4 * TOPK
local RECFMT = '<dddddddddddddddddddddddddddddddddddddddddddddd'
-- Redis gives a library's functions an empty globals table whose
-- metatable reaches the real ones: every use of a global would cost two
-- table look-ups and a metatable's. So the library keeps the ones it uses
-- in locals, set at the first call (see run) — at load, math, struct and
-- redis.call are not reachable yet.
local function builtins()
  return math.fmod, math.floor, struct.pack, struct.unpack, math.max, math.min,
    math.ceil, string.format, string.match, string.find, string.gmatch, string.sub,
    table.concat, redis.call, redis.pcall, tonumber, tostring, unpack, pairs, pcall, type
end
local fmod, floor, pack, sunpack, mmax, mmin, mceil, sformat, smatch, sfind,
  sgmatch, ssub, tconcat, rcall, rpcall, tonumber, tostring, unpack, pairs, pcall, type

-- The state of the call being run. The library's functions are defined
-- once, when it is loaded; each call sets these first (see run below).
local KEYS, ARGV, nu, nsub, nceil, n
-- The decision being run: its N charges' RULES, COSTS, lease TTLS (µs),
-- which are DEBITS (charged whether they fit or not; see admit.Charge)
-- and, for undo, which of a combination's HALVES each charged; whether it
-- is a dry run, whether it is REFUSED already (by another group of a
-- Cluster decision: it reports as a refusal, charging nothing), its LEASE
-- id and its lease record key REC (or nil). KEYBASE is where its keys
-- start in KEYS, within a batch.
-- A quota's charge brings the end of its calendar period (µs) and of the
-- next (ENDS1, ENDS2), which only the Go side, which knows time zones, can
-- compute; QEND1 and QEND2 are those of the charge being evaluated.
local ENDS1, ENDS2, QEND1, QEND2
local RULES, COSTS, TTLS, DEBITS, HALVES, DRY, REFUSED, LEASE, REC, KEYBASE
-- Scratch tables, made once and reused: every table a call makes costs
-- Redis allocations, and garbage collection. NOKEYS is always empty; OUT
-- is a batch's reply, ended by a nil (Redis reads a reply up to the first
-- nil); OUTK is how much of the reply is written.
--
-- What the library keeps between calls is kept small: Redis runs a step
-- of Lua's collector every 50 calls, and a step walks the heap. A heap of
-- 20,000 strings cost 34,000 instructions a call, more than a decision.
local RES, NEXTS, DIRTY, NOKEYS, OUT, OUTK
-- windows' rules of the call, by number.
local RS
-- decideFast's: each charge's next state (its first three numbers), and
-- the size of each algorithm's state in bytes.
local NXA, NXB, NXC, SIZE, KIND
-- decideFast's counts: which charges are windows' or quotas' counts
-- (ISC), and of those counted, the count's key, whether the call made it
-- and what it added, to take back.
local ISC, CKEY, MADE, ADDED
-- Each key a call reads or writes has a slot, 1..nslot, in the order the
-- call first touches it. SLOT maps a key to its slot; it is kept from call
-- to call (emptied when it passes 256 keys: see above) because adding a
-- key to a Lua table costs more than the look-up, and a slot is the key's
-- only while SKEY says so. Per slot: ST the state, as a table (false: the
-- key is absent; nil: not read yet), SHAS what the value read said of the
-- key's expiry (a window's end, or until when a bucket's key lives; see
-- flush), SW the expiry to write, in ns (nil: nothing to write) and SK
-- the state's kind (see put).
local SLOT, nslotkeys, SKEY, ST, SHAS, SW, SK, nslot
-- NUMS maps the texts of 0..63 to their numbers: tonumber is a C call,
-- which costs more than a table look-up, and heads, rule numbers and
-- costs are mostly small.
local NUMS

-- I formats an integer argument: Redis would print large numbers with an
-- exponent, which integer arguments do not accept.
local function I(x) return sformat('%d', x) end

-- countKey returns the key of the count that key keeps for the window
-- ending at endu (µs). No other key of the store's can be named so: a
-- counter's key ends with a length-prefixed field. The suffix of the
-- last window asked for is kept: a batch's windows mostly end together.
local lastEnd, lastSuffix = 0, ''
local function countKey(key, endu)
  if endu ~= lastEnd then lastEnd, lastSuffix = endu, '@' .. sformat('%d', endu) end
  return key .. lastSuffix
end

-- SLACK (ms) is added to every key's expiry when the store was given a
-- clock of its own: Redis expires keys by its clock, and a given clock
-- that runs slower (a test's, stepped by a slow machine) would see keys
-- vanish while they still hold state. With Redis's TIME it is 0.
local SLACK = 0

-- expireIn returns in how many ms, rounded up, a count's key for the
-- period ending at endu expires: relative, as the clock may be one the
-- store was given rather than Redis's.
local function expireIn(endu)
  return sformat('%d', mceil(((endu - nu) * 1000 - nsub) / 1000000) + SLACK)
end

-- LEGACYU: windows this long (µs) or shorter do not look for an admit_v7
-- state when their count is missing (see legacyCount).
local LEGACYU = 60000000

-- legacyCount returns what the admit_v7 state in key counts for the
-- window of wu µs ending at endu, or 0: so that an upgrade does not
-- restart a window longer than a minute in the middle. A shorter window
-- restarts at most once, as it would after a failover.
local function legacyCount(key, wu, endu)
  if wu <= LEGACYU then return 0 end
  local v = rpcall('GET', key)
  if type(v) ~= 'string' or #v ~= 16 then return 0 end
  local e, c = sunpack('<dd', v)
  if e ~= endu then return 0 end
  return c
end

-- loadCount returns the state of key's count for the window of wu µs
-- ending at endu, {endu, count}, or nil.
local function loadCount(key, wu, endu)
  local v = rcall('GET', countKey(key, endu))
  if not v then
    local c = legacyCount(key, wu, endu)
    if c > 0 then return {endu, c} end
    return nil
  end
  local c = tonumber(v)
  if not c then error('admit: ' .. key .. ' holds no count') end
  return {endu, c}
end

-- countCharge adds c to key's count for the window of wu µs ending at
-- endu, by INCRBY, and returns the count's key, the count (or Redis's
-- error, as a table) and whether it made the key.
local function countCharge(key, wu, endu, c)
  local ck = countKey(key, endu)
  local cnt = rpcall('INCRBY', ck, c)
  local made = cnt == c
  if made then
    local old = legacyCount(key, wu, endu)
    if old > 0 then cnt, made = rcall('INCRBY', ck, old), false end
    rcall('PEXPIRE', ck, expireIn(endu))
  end
  return ck, cnt, made
end

-- capCount takes a debit's count cnt of charge i in ck back to MAXCOUNT,
-- as admit.stepCount does, and records what the charge then added, for
-- takeBack. It returns the count.
local function capCount(i, ck, cnt, c)
  ADDED[i] = c - (cnt - MAXCOUNT)
  rcall('SET', ck, I(MAXCOUNT), 'KEEPTTL')
  return MAXCOUNT
end

-- takeBack takes back charge i's count (ck, cnt as countCharge returned
-- them, at cost c), then those of the charges before it recorded in
-- CKEY, MADE and ADDED (of those only says, if set), last first: a key counted twice
-- was made by the first.
local function takeBack(i, ck, cnt, c, made, only)
  if made then rcall('DEL', ck)
  elseif type(cnt) == 'number' then rcall('DECRBY', ck, c) end
  for j = i - 1, 1, -1 do
    if not only or only[j] then
      if MADE[j] then rcall('DEL', CKEY[j]) else rcall('DECRBY', CKEY[j], ADDED[j]) end
    end
  end
end

-- putCount writes a count's state.
local function putCount(key, st)
  rcall('SET', countKey(key, st[1]), I(st[2]), 'PX', expireIn(st[1]))
end

-- Exact arithmetic --------------------------------------------------------

-- divmod returns floor(p/d) and p mod d for integers 0 <= p < 2^53.
local function divmod(p, d)
  local r = fmod(p, d)
  return (p - r) / d, r
end

-- mulparts returns a*b as base-2^24 digits, least significant first, for
-- integers 0 <= a, b < 2^53.
local function mulparts(a, b)
  local B = 16777216
  local a0 = fmod(a, B); local a1 = fmod((a - a0) / B, B); local a2 = floor(a / B / B)
  local b0 = fmod(b, B); local b1 = fmod((b - b0) / B, B); local b2 = floor(b / B / B)
  local cols = {a0 * b0, a0 * b1 + a1 * b0, a0 * b2 + a1 * b1 + a2 * b0, a1 * b2 + a2 * b1, a2 * b2, 0}
  local carry = 0
  for i = 1, 6 do
    local v = cols[i] + carry
    local lo = fmod(v, B)
    cols[i] = lo
    carry = (v - lo) / B
  end
  return cols
end

-- cmpprod compares a*b with c*d exactly: -1, 0 or 1.
local function cmpprod(a, b, c, d)
  local x, y = a * b, c * d
  if x < TWO53 and y < TWO53 then
    if x < y then return -1 elseif x > y then return 1 end
    return 0
  end
  local p, q = mulparts(a, b), mulparts(c, d)
  for i = 6, 1, -1 do
    if p[i] < q[i] then return -1 elseif p[i] > q[i] then return 1 end
  end
  return 0
end

-- muldiv returns floor(a*b/d) for integers 0 <= a, b, d < 2^53, d > 0,
-- saturated at 2^53 (callers only need exact quotients below that), and
-- whether a*b is a multiple of d.
local function muldiv(a, b, d)
  local p = a * b
  if p < TWO53 then
    local q, r = divmod(p, d)
    return q, r == 0
  end
  local q = floor(p / d)
  if q >= TWO53 / 4 then return TWO53, false end
  -- The estimate is off by a few units at most; walk to the exact one.
  while q > 0 and cmpprod(q, d, a, b) > 0 do q = q - 1 end
  while cmpprod(q + 1, d, a, b) <= 0 do q = q + 1 end
  return q, cmpprod(q, d, a, b) == 0
end

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

-- span returns c tokens' time, c*per/n, for 0 <= c < 2^32.
local function span(b, c)
  local a = c * b.q
  local r, n = b.r, b.n
  if r == 0 then return a, 0 end
  local p = c * r
  if p < TWO53 then
    local q, f = divmod(p, n)
    return a + q, f
  end
  -- c*r can pass 2^53: split c so that every product stays below it.
  local cl = fmod(c, SPLIT)
  local ch = (c - cl) / SPLIT
  local q0, f0 = divmod(cl * r, n)
  local q1, f1 = divmod(ch * r, n)
  local q2, f2 = divmod(f1 * SPLIT, n)
  local q, f = q1 * SPLIT + q2 + q0, f0 + f2
  if f >= n then q, f = q + 1, f - n end
  return a + q, f
end

local function add(b, a1, f1, a2, f2)
  local a, f = a1 + a2, f1 + f2
  if f >= b.n then a, f = a + 1, f - b.n end
  return a, f
end

local function sub(b, a1, f1, a2, f2)
  local a, f = a1 - a2, f1 - f2
  if f < 0 then a, f = a - 1, f + b.n end
  return a, f
end

local function less(a1, f1, a2, f2)
  return a1 < a2 or (a1 == a2 and f1 < f2)
end

local function ceil(a, f)
  if f > 0 then return a + 1 end
  return a
end

-- tokens returns the whole tokens that refill in (a, f) >= 0.
local function tokens(b, a, f)
  if a < 0 then return 0 end
  if b.r == 0 then return (divmod(a, b.q)) end
  local k = floor(a / (b.q + b.r / b.n))
  if k < 0 then k = 0 end
  while true do
    local sa, sf = span(b, k + 1)
    if less(a, f, sa, sf) then break end
    k = k + 1
  end
  while k > 0 do
    local sa, sf = span(b, k)
    if not less(a, f, sa, sf) then break end
    k = k - 1
  end
  return k
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
  if debit then return encode(mmin(na, (burst + b.debt) * q), 0, b), 0, 0, 0, 0 end
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

-- Decisions ---------------------------------------------------------------

-- charge returns charge i of the decision being run: its rule, algorithm,
-- cost and whether the rule is in shadow mode.
local function charge(i)
  local R = RULES[i]
  return R, R.alg, COSTS[i], R.shadow
end

-- slotOf returns key's slot in this call.
local function slotOf(key)
  local s = SLOT[key]
  if s and s <= nslot and SKEY[s] == key then return s end
  if not s then
    if nslotkeys >= 256 then SLOT, nslotkeys = {}, 0 end
    nslotkeys = nslotkeys + 1
  end
  nslot = nslot + 1
  s = nslot
  SLOT[key], SKEY[s], ST[s], SHAS[s], SW[s], SK[s] = s, key, nil, nil, nil, nil
  return s
end

-- decodeState returns the state value v holds for a rule of algorithm
-- alg, as a table, and records in slot s the expiry the key has in Redis
-- (see flush). It fails, as struct.unpack does, on a value of another
-- size.
local function decodeState(s, alg, v)
  local st
  if alg == 1 or alg == 2 then
    -- struct.unpack returns the position after the values last: it must
    -- not read as a shape's first number.
    if #v == 24 then st = {sunpack('<ddd', v)} st[4] = 0 -- admit_v5's, expiry unknown
    elseif #v == 32 then st = {sunpack('<dddd', v)} st[5] = nil -- admit_v9's, no shape named
    else st = {sunpack('<dddd', v)} st[5] = ssub(v, 33) end
    SHAS[s] = st[4]
  elseif alg == 6 then
    -- admit_v9's six numbers, or since admit_v10 with the burst
    -- bucket's shape and the floor's after them.
    st = {sunpack('<dddddd', v)}
    st[7], st[8] = nil, nil
    if #v == 128 then st[7], st[8] = ssub(v, 49, 88), ssub(v, 89) end
  elseif alg == 8 then st = {sunpack('<dd', v)} SHAS[s] = st[1]
  elseif #v == 32 then st = {sunpack('<dddd', v)} st[5] = nil SHAS[s] = st[1]
  else st = {sunpack('<ddd', v)} st[4] = nil SHAS[s] = st[1] end -- admit_v9's, no length
  SK[s] = KIND[alg]
  return st
end

-- load returns the stored state of a counter key as a table, or nil.
local function load(key, alg)
  local s = slotOf(key)
  local st = ST[s]
  if st ~= nil then return st or nil end
  local v = rcall('GET', key)
  if not v then ST[s] = false return nil end
  st = decodeState(s, alg, v)
  ST[s] = st
  return st
end

-- stepOne evaluates a charge of a one-state algorithm (step).
local function stepOne(R, alg, st, c, res, debit)
  if alg == 1 or alg == 2 then
    return bucketEval(bucketParams(R), st, c, res, debit)
  elseif alg == 3 then
    return fixedEval(R[5], R[6], st, c, res, debit)
  elseif alg == 8 then
    return quotaEval(R[5], st, c, res, debit)
  end
  return slidingEval(R[5], R[6], st, c, res, debit)
end

-- step evaluates counter charge i at cost c from state st and returns the
-- state to keep, and for a combination which half paid (1 floor, 2 burst).
-- A debit that does not fit reports what a request of cost 1 meets after
-- it (admit.stepOne).
local function step(R, alg, st, c, res, debit)
  if alg <= 4 or alg == 8 then
    local next = stepOne(R, alg, st, c, res, debit)
    if debit and res.allowed == 0 then
      local after = {retry = 0}
      stepOne(R, alg, next, 1, after, false)
      res.remaining, res.reset, res.retry = after.remaining, after.reset, after.retry
      -- A count's debit says how far past the limit it went, as a
      -- negative remaining (nothing remains then): admit.Result.Over.
      if (alg == 3 or alg == 8) and next[2] > R[5] then res.remaining = R[5] - next[2] end
    end
    return next, 0
  end
  -- combination: the floor first, then the burst bucket
  local fb, bb = floorParams(R), bucketParams(R)
  local sb, sf
  if st then sb, sf = {st[1], st[2], st[3], 0, st[7]}, {st[4], st[5], st[6], 0, st[8]} end
  if sb and sb[1] == 0 then sb = nil end
  if sf and sf[1] == 0 then sf = nil end
  local f, bres = {retry = 0}, {retry = 0}
  local floorFits = c <= fb.burst
  local nf, nb
  if floorFits then nf = bucketEval(fb, sf, c, f, false) else nf = bucketEval(fb, sf, 0, f, false) f.allowed = 0 end
  if f.allowed == 1 then nb = bucketEval(bb, sb, 0, bres, false) else nb = bucketEval(bb, sb, c, bres, false) end
  res.allowed = mmax(f.allowed, bres.allowed)
  res.remaining = f.remaining + bres.remaining
  res.reset = mmax(f.reset, bres.reset)
  res.retry = 0
  if res.allowed == 0 then
    res.retry = bres.retry
    if floorFits then res.retry = mmin(res.retry, f.retry) end
  end
  local how = 0
  if c > 0 and f.allowed == 1 then how = 1 elseif c > 0 and bres.allowed == 1 then how = 2 end
  if nb == sb and nf == sf then return st, how end
  local a, z = nb or {0, 0, 0}, nf or {0, 0, 0}
  -- Both halves are the rule's shapes now, adopted or their own.
  return {a[1], a[2], a[3], z[1], z[2], z[3], bb.sh, fb.sh}, how
end

-- put keeps a key's state st, of kind k (2: a quota's numbers, 3: a
-- sliding window's, 4: a
-- bucket's, 6: a combination's), which matters for ttl ns more (deleted
-- when it no longer does); flush writes it when the call ends, packed
-- once however many decisions of a batch changed it.
local function put(key, st, ttl, k)
  local s = slotOf(key)
  SW[s], SK[s], ST[s] = ttl, k, st
end

local function packState(st, k)
  if k == 7 then
    if st[15] and st[15] ~= 0 then return pack(RECFMT, unpack(st, 1, RECLEN)) end
    return pack('<dddddddddddddd', st[1], st[2], st[3], st[4], st[5], st[6], st[7], st[8], st[9], st[10], st[11], st[12], st[13], st[14])
  elseif k == 4 then
    local v = pack('<dddd', st[1], st[2], st[3], st[4])
    if st[5] then return v .. st[5] end
    return v
  elseif k == 2 then return pack('<dd', st[1], st[2])
  elseif k == 3 then
    if st[4] then return pack('<dddd', st[1], st[2], st[3], st[4]) end
    return pack('<ddd', st[1], st[2], st[3])
  end
  local v = pack('<dddddd', st[1], st[2], st[3], st[4], st[5], st[6])
  if st[7] and st[8] then return v .. st[7] .. st[8] end
  return v
end

-- px returns a relative expiry in ms, ttl ns rounded up: a number, which
-- redis.call prints as an integer (below 2^53, with no exponent).
local function px(ttl)
  return mceil(ttl / 1000000) + SLACK
end

-- flush makes the writes put kept: each key's last state, or DEL. Setting
-- an expiry costs Redis as much as the rest of a SET (it is rewritten to
-- an absolute one for replication), so a key keeps the one it has when
-- that one is still right. A window's expiry is its end, st[1], which
-- changes only when a new window starts. A bucket's changes with every
-- charge, so it is set with room to spare — as far again as it needs,
-- between 1 s and 60 s, an idle key living that much longer — and the
-- bucket keeps, as its fourth number, until when (µs): a later write
-- needing no more keeps it.
local function flush()
  for s = 1, nslot do
    local ttl = SW[s]
    local key, k, st = SKEY[s], SK[s], ST[s]
    if not ttl then
      -- unchanged
    elseif ttl <= 0 then
      rcall('DEL', key)
    elseif k == 4 then
      local has = SHAS[s]
      if has and (has - nu) * 1000 - nsub >= ttl then
        st[4] = has
        rcall('SET', key, packState(st, 4), 'KEEPTTL')
      else
        local room = mmin(mmax(ttl, 1000000000), 60000000000)
        local x = nceil + mceil((ttl + room) / 1000)
        st[4] = x
        -- One ms more: Redis counts the expiry from its own clock, read
        -- a little before TIME was.
        rcall('SET', key, packState(st, 4), 'PX', px((x - nu) * 1000 + 1000000))
      end
    elseif k ~= 6 and SHAS[s] == st[1] then
      rcall('SET', key, packState(st, k), 'KEEPTTL')
    else
      rcall('SET', key, packState(st, k), 'PX', px(ttl))
    end
  end
end

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
        if st and st[1] > nu then store(key, R, alg, {st[1], mmax(st[2] - cost, 0)}) end
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
    if R.alg == 8 then ENDS1[i], ENDS2[i] = R[6], R[7] end
  end
  REC, KEYBASE = KEYS[n + 1], 0
end

-- batch decides many decisions in one call, one after the other, each all
-- or nothing on its own; they share the clock, the states read and the
-- writes. ARGV: 1 'b', 2 and 3 now, 4 the number of distinct rules R,
-- 5 the number of decisions M, 6 the reply's length; then R rules, each a
-- stride joined with commas (cost and how unused, the lease TTL the
-- rule's own); then M decisions, each: a head, N, its number of charges,
-- or "N:flags:lease" where flags holds d for a dry run, x for a decision
-- refused already, w for a withdrawal (N is 1; see withdraw), and r when a lease record key follows its charge keys; then per charge the rule's number
-- (1..R), the cost (d and the cost for a debit), for a quota the ends
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
    if not n then
      local c, f, l = smatch(h, '^(%d+):(%a*):(.*)$')
      n, LEASE = tonumber(c), l
      DRY, rec = sfind(f, 'd', 1, true) ~= nil, sfind(f, 'r', 1, true) ~= nil
      REFUSED, w = sfind(f, 'x', 1, true) ~= nil, sfind(f, 'w', 1, true) ~= nil
      shared = sfind(f, 's', 1, true) ~= nil
    end
    a = a + 1
    local fast = not rec and not DRY and not REFUSED and not w and not shared
    for i = 1, n do
      local R, c = rs[NUMS[ARGV[a]] or tonumber(ARGV[a])], ARGV[a + 1]
      local cost, debit = NUMS[c] or tonumber(c), false
      if not cost then
        -- A fixed window's debit is decideFast's too.
        cost, debit = tonumber(ssub(c, 2)), true
        if R.alg ~= 3 then fast = false end
      end
      RULES[i], COSTS[i], TTLS[i], DEBITS[i] = R, cost, R.ttl, debit
      a = a + 2
      if R.alg > 4 and R.alg ~= 8 then fast = false end
      if R.alg == 7 then
        local t = ARGV[a]
        if t ~= '' then TTLS[i] = tonumber(t) end
        a = a + 1
      elseif R.alg == 8 then
        ENDS1[i], ENDS2[i] = tonumber(ARGV[a]), tonumber(ARGV[a + 1])
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
    local nc = NUMS[h] or tonumber(h)
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
      if not c then c, debit = tonumber(ssub(cs, 2)), true end
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
      for j = 1, nc do
        local x = a0 + 2 * j - 2
        local R, cs = rs[NUMS[ARGV[x]] or tonumber(ARGV[x])], ARGV[x + 1]
        local c, debit = NUMS[cs] or tonumber(cs), false
        if not c then c, debit = tonumber(ssub(cs, 2)), true end
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

redis.register_function('admit_v10', run)
