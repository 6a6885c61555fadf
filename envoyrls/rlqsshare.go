package envoyrls

import (
	"cmp"
	"encoding/binary"
	"errors"
	"math"
	"slices"
	"time"

	"github.com/admitdev/admit"
	"github.com/admitdev/admit/internal/wide"
)

// How a limit is divided among the Envoys that enforce it (docs/envoy.md,
// "The quota service", states the bound these keep).
//
// Each Envoy bucket a limit applies to is a holder of a share: a token
// bucket of Rate units per Fill seconds holding at most Max tokens. The
// ledger of a limit keeps, for every holder on every server, what it was
// sent and what may still be in force, and a pool: tokens the limit may
// still put into Envoys' buckets. Two sums are kept:
//
//   - the rates that may be in force, at most the limit's rate less a
//     reserve: a rate lowered counts at its old value until the last
//     assignment sent with it has expired, since the Envoy keeps that one
//     until the new one reaches it, however late;
//   - the tokens Envoys' buckets may hold (the maximums that may be in
//     force) plus the pool, at most the limit's burst, or, for a limit
//     divided among more buckets than its burst has tokens, one for each
//     bucket and one more: an Envoy's bucket holds one token at least.
//
// Envoy starts a new bucket full and scales a replaced one's tokens to its
// new maximum, so a bucket's tokens appear out of nothing when it is
// created or its maximum raised: those tokens are taken from the pool,
// which fills at the rate no holder is counted for (the reserve at least).
// The tokens of all Envoys' buckets and the pool thus make one token bucket
// of the limit's rate and burst (so counted), which admits at most
// burst + rate × t in any t.

const (
	// minShareUnits is how finely a limit's rate is divided: the fill
	// interval of its assignments is long enough for its rate to be at
	// least this many tokens per fill (when that interval fits a uint32
	// of seconds), so that rounding each holder's share down to whole
	// tokens per fill loses little.
	minShareUnits = 1 << 16
	// reserveShift sets the reserve: 1/128 of a limit's rate is never
	// handed out, so that the pool refills even when every holder wants
	// more than its share.
	reserveShift = 7
	// poolShift sets the burst kept for the pool when maximums are
	// shared out: 1/8, so that new buckets start without waiting.
	poolShift = 3
	// unmeasuredShift sets what a holder whose demand is not measured
	// yet is taken to want: 1/32 of the limit.
	unmeasuredShift = 5
	// MaxHoldersPerLimit bounds the buckets of all Envoys one limit is
	// divided among (a limit's ledger, read and written at each of their
	// reports, holds about 40 bytes of each, and computes every share
	// among all of them); a bucket past it waits for
	// a holder to leave, keeping what it has.
	MaxHoldersPerLimit = 256
)

// shareLimit is a limit as its shares are computed in it: Units tokens
// every Fill seconds, Burst tokens at most.
type shareLimit struct {
	Fill  int64
	Units int64
	Burst int64
}

// shareLimitOf returns the shares' terms of a token bucket or GCRA rule,
// and false for the other algorithms.
func shareLimitOf(r *admit.Rule) (shareLimit, bool) {
	if r.Algorithm != admit.TokenBucket && r.Algorithm != admit.GCRA || r.Rate.N <= 0 || r.Rate.Per <= 0 {
		return shareLimit{}, false
	}
	n, per := uint64(r.Rate.N), uint64(r.Rate.Per)
	sec := uint64(time.Second)
	// The shortest whole seconds that hold at least minShareUnits tokens,
	// and at least one period.
	fill := max(wide.MulDivUp(minShareUnits, per, n*sec), wide.MulDivUp(1, per, sec), 1)
	fill = min(fill, math.MaxUint32)
	units := min(wide.MulDiv(n, uint64(fill)*sec, per), math.MaxUint32)
	return shareLimit{Fill: fill, Units: units, Burst: max(r.Burst, 1)}, units > 0
}

// tokens is how many tokens the Envoys' buckets and the pool may hold
// together, with buckets of them holding a share or waiting for one: the
// burst, or, since an Envoy's bucket holds one token at least, one for
// each and one for the next to come.
func (st *shareState) tokens(buckets int64) int64 { return max(st.Limit.Burst, buckets+1) }

// reserve is the part of the rate never handed out.
func (l shareLimit) reserve() int64 { return l.Units >> reserveShift }

// capacity is the rate handed out at most.
func (l shareLimit) capacity() int64 { return l.Units - l.reserve() }

// shareable is the burst shared out among holders' maximums.
func (l shareLimit) shareable() int64 { return max(1, l.Burst-(l.Burst+(1<<poolShift)-1)>>poolShift) }

// A holder is one Envoy bucket's share of a limit. Times are Unix µs.
type holder struct {
	ID     string
	Class  string // the share class (tenant) its weight is of
	Weight int64  // the class's weight; 0 means 1
	Demand int64  // units per fill it asked for at its last report
	// Measured says Demand was measured over an interval between two
	// reports; until then the holder is taken to want any share.
	Measured bool
	Rate     int64 // units per fill last sent
	Max      int64 // tokens last sent
	// HeldRate and HeldMax may still be in force until Until: values sent
	// before a lowering, which the Envoy keeps until the lower ones reach
	// it or their assignment expires.
	HeldRate int64
	HeldMax  int64
	Until    int64
	Expires  int64 // when the last assignment sent expires
	Gone     bool  // abandoned or its stream ended: counted until Expires
	// Seen is when it last asked with a report, Every its interval
	// between reports: one silent for two intervals (its server gone)
	// wants nothing more, though what it was sent counts until Expires.
	Seen  int64
	Every int64
}

// rate is the holder's rate that may be in force at now.
func (h *holder) rate(now int64) int64 {
	if now < h.Until {
		return max(h.Rate, h.HeldRate)
	}
	return h.Rate
}

// max is the holder's maximum that may be in force at now.
func (h *holder) max(now int64) int64 {
	if now < h.Until {
		return max(h.Max, h.HeldMax)
	}
	return h.Max
}

// shareState is one limit's ledger.
type shareState struct {
	Limit   shareLimit
	Pool    int64 // µtokens
	PoolAt  int64 // when Pool was counted
	Holders []holder
}

// shareAsk is what a holder asks of a limit's ledger.
type shareAsk struct {
	ID     string
	Class  string
	Weight int64
	// Demand is the holder's reported demand, in tokens per second;
	// Reported says it is a new measure (else the last one is kept).
	Demand   float64
	Reported bool
	// Measured says Demand was measured between two reports: a bucket's
	// first report, at its first request, says nothing of its rate.
	Measured bool
	// CapRate and CapMax bound the share (the holder's other limits
	// offer no more); 0 means no bound.
	CapRate float64 // tokens per second
	CapMax  int64
	// TTL is how long the assignment sent is in force.
	TTL time.Duration
	// Every is the holder's interval between reports (default
	// DefaultReportInterval).
	Every time.Duration
	// Leave marks the holder gone: it keeps what may be in force until
	// its assignment expires and is dropped then.
	Leave bool
}

// shareGrant is a holder's share: Rate tokens every Limit.Fill seconds,
// Max tokens at most; Wait says there is none to give yet (the bucket
// keeps what it has). Same says the share is the one last sent.
type shareGrant struct {
	Limit shareLimit
	Rate  int64
	Max   int64
	Wait  bool
	Full  bool // waits because the limit has MaxHoldersPerLimit holders
	Deny  bool // a window with nothing left: denied until TTL

	Same bool
	// Holders counts the limit's holders.
	Holders int
}

// perSecond returns the grant's rate in tokens per second.
func (g shareGrant) perSecond() float64 { return float64(g.Rate) / float64(g.Limit.Fill) }

// setLimit takes the limit's current terms. The values held are converted
// up (what may be in force is never counted less), the pool kept in
// tokens.
func (st *shareState) setLimit(l shareLimit) {
	old := st.Limit
	if old == l {
		return
	}
	st.Limit = l
	if old.Fill == 0 {
		return
	}
	conv := func(u int64) int64 {
		return wide.MulDivUp(uint64(u), uint64(l.Fill), uint64(old.Fill))
	}
	for i := range st.Holders {
		h := &st.Holders[i]
		h.Demand = conv(h.Demand)
		// The rate sent stays the rate the Envoy runs, in the new units
		// rounded up; the next grant lowers it if it must.
		h.Rate, h.HeldRate = conv(h.Rate), conv(h.HeldRate)
	}
}

// refill counts the pool up to now: it fills at the rate no holder may be
// running, within the burst no holder's bucket may hold. Both change only
// when a holder's held values or assignment expire, so the time since the
// pool was last counted is taken in the pieces between those moments.
func (st *shareState) refill(now int64) {
	l := st.Limit
	if st.PoolAt == 0 {
		st.Pool, st.PoolAt = l.Burst*1e6, now
		return
	}
	if now <= st.PoolAt {
		return
	}
	ends := []int64{now}
	for i := range st.Holders {
		for _, t := range []int64{st.Holders[i].Until, st.Holders[i].Expires} {
			if t > st.PoolAt && t < now {
				ends = append(ends, t)
			}
		}
	}
	slices.Sort(ends)
	from := st.PoolAt
	for _, to := range ends {
		if to <= from {
			continue
		}
		var rates, maxes, buckets int64
		for i := range st.Holders {
			if h := &st.Holders[i]; h.Expires > from {
				rates += h.rate(from)
				maxes += h.max(from)
				buckets++ // holding a share, or waiting for its first
			}
		}
		if feed := l.Units - rates; feed > 0 {
			st.Pool += wide.MulDiv(uint64(feed), uint64(to-from), uint64(l.Fill))
		}
		st.Pool = min(st.Pool, max(0, st.tokens(buckets)-maxes)*1e6)
		from = to
	}
	st.PoolAt = now
}

// share records ask at now and returns the holder's grant. A caller that
// only asks what it would be given discards st afterwards.
func (st *shareState) share(now int64, ask shareAsk) shareGrant {
	l := st.Limit
	st.refill(now)
	// Holders whose assignment has expired hold nothing; ask's own is
	// then new: the Envoy starts its next bucket full.
	st.Holders = slices.DeleteFunc(st.Holders, func(h holder) bool { return h.Expires <= now && h.ID != ask.ID })
	i := slices.IndexFunc(st.Holders, func(h holder) bool { return h.ID == ask.ID })
	wait := shareGrant{Limit: l, Wait: true}
	if i < 0 {
		if ask.Leave || len(st.Holders) >= MaxHoldersPerLimit {
			wait.Holders, wait.Full = len(st.Holders), !ask.Leave
			return wait
		}
		st.Holders = append(st.Holders, holder{ID: ask.ID})
		i = len(st.Holders) - 1
	}
	h := st.Holders[i]
	// A holder not sent a bucket, or whose bucket has expired, is new:
	// the Envoy's next bucket starts full.
	fresh := h.Expires <= now || h.Max == 0
	if fresh {
		h = holder{ID: ask.ID, Demand: h.Demand}
	}
	wait.Holders = len(st.Holders)
	if ask.Leave {
		st.Holders[i].Gone = true
		return wait
	}
	h.Class, h.Weight, h.Gone = ask.Class, ask.Weight, false
	if ask.Reported || fresh {
		h.Demand, h.Measured = unitsOf(ask.Demand, l.Fill), ask.Measured
		h.Seen, h.Every = now, cmp.Or(ask.Every, DefaultReportInterval).Microseconds()
	}
	// A holder waiting for its share stays in the ledger, so that the
	// others' shares make room for it.
	sentUntil := h.Expires
	h.Expires = max(h.Expires, now+ask.TTL.Microseconds())
	st.Holders[i] = h

	target := st.targets(now, i)
	rate := target
	desiredMax := max(1, wide.MulDiv(uint64(l.shareable()), uint64(target), uint64(max(1, l.capacity()))))
	if ask.CapRate > 0 {
		rate = min(rate, int64(ask.CapRate*float64(l.Fill)))
	}
	if ask.CapMax > 0 {
		desiredMax = min(desiredMax, ask.CapMax)
	}
	var others int64
	for j := range st.Holders {
		if j != i {
			others += st.Holders[j].rate(now)
		}
	}
	free := l.capacity() - others
	switch {
	case fresh && free < rate/2:
		// A new holder waits for half its share at least: its Envoy may
		// run an assignment of another server it reconnected from, which
		// a small one would replace.
		rate = 0
	case fresh:
		rate = min(rate, free)
	case rate > h.Rate:
		// Raised as far as the rate no other holder may be running
		// allows (none, when a lowered limit is still over-committed).
		rate = max(h.Rate, min(rate, free))
	}
	if !fresh && l.steady(rate, h.Rate, h.Every) && h.Rate <= free && !(rate < h.Rate && st.waiting(now, i)) {
		// Within the hysteresis, and no other holder waits for what
		// lowering it would free: sent again as it was.
		rate = h.Rate
	}
	// The tokens a new bucket starts with, or a raised maximum adds, come
	// from the pool.
	pool := st.Pool / 1e6
	maxTokens := h.Max
	switch {
	case fresh:
		maxTokens = min(desiredMax, pool)
	case desiredMax > h.Max && !near(desiredMax, h.Max, 10):
		maxTokens = h.Max + min(desiredMax-h.Max, pool)
	case desiredMax < h.Max && (!near(desiredMax, h.Max, 10) || st.waiting(now, i)):
		// Lowered (when a bucket waits, however little: its first
		// token may be the one this frees).
		maxTokens = desiredMax
	}
	created := maxTokens
	if !fresh {
		created = max(0, maxTokens-h.Max)
	}
	if fresh && (rate < 1 || maxTokens < 1) {
		st.Holders[i].Rate, st.Holders[i].Max = 0, 0
		return wait
	}
	rate, maxTokens = max(rate, 1), max(maxTokens, 1)
	g := shareGrant{Limit: l, Rate: rate, Max: maxTokens, Same: !fresh && rate == h.Rate && maxTokens == h.Max, Holders: len(st.Holders)}
	if !fresh && (rate < h.Rate || maxTokens < h.Max) {
		// Lowered: what was sent stays counted until the last assignment
		// sent with it expires (with what was held before, if that is
		// still in force).
		h.HeldRate, h.HeldMax, h.Until = h.rate(now), h.max(now), sentUntil
	}
	h.Rate, h.Max = rate, maxTokens
	h.Expires = now + ask.TTL.Microseconds()
	st.Pool -= created * 1e6
	st.Holders[i] = h
	return g
}

// waiting reports whether a holder other than i waits for its first share.
func (st *shareState) waiting(now int64, i int) bool {
	for k := range st.Holders {
		if h := &st.Holders[k]; k != i && h.Max == 0 && !h.Gone && h.Expires > now {
			return true
		}
	}
	return false
}

// steady reports whether a rate of a units is near enough to b, sent to a
// bucket reporting every µs, to send b again: within 4 % of it, or less
// than a token between two reports. Every change makes Envoy rebuild the
// bucket, and a rebuilt bucket keeps its tokens' fill ratio rounded down
// to whole tokens: one a report, lost to a bucket whose share moved each
// time.
func (l shareLimit) steady(a, b, every int64) bool {
	token := wide.MulDivUp(uint64(l.Fill), 1e6, uint64(cmp.Or(every, DefaultReportInterval.Microseconds())))
	d := a - b
	if d < 0 {
		d = -d
	}
	return d <= max(b/25, token)
}

// near reports whether a is within b/div of b (and at least 1).
func near(a, b, div int64) bool {
	d := a - b
	if d < 0 {
		d = -d
	}
	return d <= max(1, b/div)
}

// unitsOf converts a demand in tokens per second to whole units per fill
// of fill seconds, rounded up.
func unitsOf(perSecond float64, fill int64) int64 {
	if !(perSecond > 0) {
		return 0
	}
	return int64(min(math.Ceil(perSecond*float64(fill)), math.MaxUint32))
}

// targets returns holder i's share of the limit's capacity, max-min fair
// among the holders' demands (each with a tenth of headroom, and one unit
// at least; a holder not measured yet a 32nd of the capacity, and every
// holder its equal part at most while one is not), weighted by class, each class's weight divided among its
// holders. The shares are rounded down to whole units, the units left
// given one each to the holders that want more, the largest part first.
// Holders that left, or have not reported for two of their intervals,
// want nothing.
func (st *shareState) targets(now int64, i int) int64 {
	hs := st.Holders
	n := len(hs)
	capacity := st.Limit.capacity()
	if n == 0 || capacity <= 0 {
		return 0
	}
	perClass := map[string]int{}
	for k := range hs {
		perClass[hs[k].Class]++
	}
	want := make([]float64, n)
	weight := make([]float64, n)
	for k := range hs {
		h := &hs[k]
		switch {
		case h.Gone, k != i && now-h.Seen > 2*cmp.Or(h.Every, DefaultReportInterval.Microseconds()):
		case !h.Measured:
			// Its demand is not known yet (a bucket's first report, at
			// its first request, says nothing of its rate): a 32nd
			// of the limit, so that what others measured first is not
			// taken back from them, nor given it and taken back from it
			// once its rate is known (a lowered share counts until the
			// Envoy surely has it; a raised one is given at once).
			want[k] = float64(capacity>>unmeasuredShift + 1)
		default:
			want[k] = float64(h.Demand + h.Demand/10 + 1)
		}
		weight[k] = float64(max(1, h.Weight)) / float64(perClass[h.Class])
	}
	// While a holder's demand is unknown, none is raised past its equal
	// part: what it took it might have to give back.
	var wsum0 float64
	unknown := false
	for k := range hs {
		wsum0 += weight[k]
		unknown = unknown || want[k] > 0 && !hs[k].Measured
	}
	if unknown {
		for k := range want {
			// (It keeps what it has: lowered, that would count until
			// the Envoy surely had the lower share.)
			want[k] = min(want[k], max(float64(capacity)*weight[k]/wsum0, float64(hs[k].Rate)))
		}
	}
	// Water-fill: raise a common level of share per weight until the
	// capacity is used or every holder has what it wants.
	order := make([]int, n)
	for k := range order {
		order[k] = k
	}
	slices.SortFunc(order, func(a, b int) int { return cmp.Compare(want[a]/weight[a], want[b]/weight[b]) })
	left, wsum := float64(capacity), 0.0
	for _, k := range order {
		wsum += weight[k]
	}
	share := make([]float64, n)
	for _, k := range order {
		level := left / wsum
		if want[k] <= level*weight[k] {
			share[k] = want[k]
		} else {
			share[k] = level * weight[k]
		}
		left -= share[k]
		wsum -= weight[k]
	}
	units := make([]int64, n)
	var given int64
	for k := range share {
		units[k] = int64(share[k])
		given += units[k]
	}
	spare := capacity - given
	if spare > 0 {
		byPart := slices.Clone(order)
		slices.SortStableFunc(byPart, func(a, b int) int {
			return cmp.Compare(share[b]-float64(units[b]), share[a]-float64(units[a]))
		})
		for _, k := range byPart {
			if spare == 0 {
				break
			}
			if float64(units[k]) < want[k] {
				units[k]++
				spare--
			}
		}
	}
	return units[i]
}

// stateVersion is the first byte of an encoded shareState; a state of
// another version does not decode, and its limit gives no share.
const stateVersion = 1

// appendState encodes st compactly: a limit's ledger is read and written
// at every report of every bucket it has.
func appendState(b []byte, st *shareState) []byte {
	b = append(b, stateVersion)
	for _, v := range []int64{st.Limit.Fill, st.Limit.Units, st.Limit.Burst, st.Pool, st.PoolAt, int64(len(st.Holders))} {
		b = binary.AppendVarint(b, v)
	}
	for i := range st.Holders {
		h := &st.Holders[i]
		b = binary.AppendUvarint(b, uint64(len(h.ID)))
		b = append(b, h.ID...)
		b = binary.AppendUvarint(b, uint64(len(h.Class)))
		b = append(b, h.Class...)
		var flags int64
		if h.Measured {
			flags |= 1
		}
		if h.Gone {
			flags |= 2
		}
		for _, v := range []int64{flags, h.Weight, h.Demand, h.Rate, h.Max, h.HeldRate, h.HeldMax, h.Until, h.Expires, h.Seen, h.Every} {
			b = binary.AppendVarint(b, v)
		}
	}
	return b
}

// errState is a state that does not decode.
var errState = errors.New("envoyrls: a quota ledger's state does not decode")

// decodeState decodes what appendState wrote into st.
func decodeState(b []byte, st *shareState) error {
	if len(b) == 0 || b[0] != stateVersion {
		return errState
	}
	b = b[1:]
	next := func() int64 {
		v, n := binary.Varint(b)
		if n <= 0 {
			b = nil
			return 0
		}
		b = b[n:]
		return v
	}
	text := func() string {
		l, n := binary.Uvarint(b)
		if n <= 0 || uint64(len(b)-n) < l {
			b = nil
			return ""
		}
		s := string(b[n : n+int(l)])
		b = b[n+int(l):]
		return s
	}
	st.Limit.Fill, st.Limit.Units, st.Limit.Burst, st.Pool, st.PoolAt = next(), next(), next(), next(), next()
	n := next()
	if b == nil || n < 0 || n > MaxHoldersPerLimit {
		return errState
	}
	st.Holders = make([]holder, n)
	for i := range st.Holders {
		h := &st.Holders[i]
		h.ID, h.Class = text(), text()
		flags := next()
		h.Measured, h.Gone = flags&1 != 0, flags&2 != 0
		h.Weight, h.Demand, h.Rate, h.Max, h.HeldRate, h.HeldMax = next(), next(), next(), next(), next(), next()
		h.Until, h.Expires, h.Seen, h.Every = next(), next(), next(), next()
		if b == nil {
			return errState
		}
	}
	if len(b) != 0 {
		return errState
	}
	return nil
}
