-- Exact arithmetic --------------------------------------------------------

-- This file is also the regions' scripts' arithmetic (package leased
-- prepends it to them, after locals for fmod and floor): whatever it
-- uses it defines, or takes from those two.

local TWO53 = 9007199254740992
local SPLIT = 2097152 -- 2^21

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

-- Timelines: a bucket b = {n, q, r} whose token takes q + r/n units of
-- time (ns in the library, µs in the regions' scripts); times are (a, f),
-- a units plus f/n, 0 <= f < n.

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
