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

