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

