#!lua name=admit_v12
-- Admit's decision engine inside Redis, a Functions library with one
-- function: every algorithm, all the charges of a decision — or of a batch
-- of decisions — in one call (FCALL admit_v12 numkeys keys… args…). A
-- library, not an EVAL script, so that its helper closures are built once
-- at FUNCTION LOAD rather than at every call: that halved the Redis CPU a
-- decision costs. The library is this directory's files, joined in the
-- order of their names into one chunk: a local function of one file is
-- seen by the files after it. It mirrors the Go algorithms of the module's engine
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

