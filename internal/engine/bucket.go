package engine

import (
	"time"

	"github.com/admitdev/admit"
	"github.com/admitdev/admit/internal/bounds"
	"github.com/admitdev/admit/internal/wide"
)

// A bucket is a token bucket kept as a theoretical arrival time (TAT), the
// virtual-scheduling form of GCRA: the bucket is full when TAT <= now and
// holds (now + burst·T − TAT)/T tokens otherwise, where T = per/n is the
// time one token takes to refill. T is rarely a whole number of
// nanoseconds (3/s is 333333333⅓ ns), so times are kept as a nanosecond
// count plus a remainder in units of 1/n ns, and every product goes
// through 128 bits: no float, no drift, no overflow within the bounds that
// Rule.Validate enforces.
type bucket struct {
	n, per         uint64 // T = per/n nanoseconds
	whole          int64  // T when it is a whole number of nanoseconds, else 0
	burst, initial int64
	debt           int64 // the most a debit leaves owed; see Rule.MaxDebt
	remember       int64 // nanoseconds a full bucket is kept; see RememberFull
	// stamp names the bucket's shape in the states it writes (see
	// shape.go); 0 once a process has named too many shapes.
	stamp uint32
}

func newBucket(rate admit.Rate, burst, initial int64) bucket {
	b := bucket{n: uint64(rate.N), per: uint64(rate.Per), burst: burst, initial: initial, debt: burst}
	if q := b.per / b.n; q*b.n == b.per { // the common case, such as 100/s
		b.whole = int64(q)
	}
	if initial < burst {
		b.remember = int64(bounds.RememberFull)
	}
	return b
}

func mainBucket(r *admit.Rule) bucket {
	b := newBucket(r.Rate, r.Burst, initialOf(r))
	if r.MaxDebt > 0 && r.Algorithm != admit.Combination {
		b.debt = r.MaxDebt
	}
	b.named()
	return b
}

func floorBucket(r *admit.Rule) bucket {
	b := newBucket(r.Floor, r.Floor.N, r.Floor.N)
	b.named()
	return b
}

// named gives b the id of its shape, which its states carry (see shape.go).
func (b *bucket) named() {
	b.stamp = shapeID(shape{n: b.n, per: b.per, burst: b.burst, remember: b.remember})
}

// fine is the instant ns + frac/n nanoseconds, 0 <= frac < n.
type fine struct{ ns, frac int64 }

func (b *bucket) after(t fine, d fine) fine {
	t.ns += d.ns
	t.frac += d.frac
	if t.frac >= int64(b.n) {
		t.ns++
		t.frac -= int64(b.n)
	}
	return t
}

func (b *bucket) before(t fine, d fine) fine {
	t.ns -= d.ns
	t.frac -= d.frac
	if t.frac < 0 {
		t.ns--
		t.frac += int64(b.n)
	}
	return t
}

func (t fine) less(u fine) bool { return t.ns < u.ns || (t.ns == u.ns && t.frac < u.frac) }

// ceil returns t rounded up to a whole nanosecond.
func (t fine) ceil() int64 {
	if t.frac > 0 {
		return t.ns + 1
	}
	return t.ns
}

// span returns the time c tokens take to refill, c·per/n.
func (b *bucket) span(c int64) fine {
	if b.whole > 0 {
		return fine{ns: c * b.whole}
	}
	q, r := wide.Mul(uint64(c), b.per).Div(b.n)
	return fine{ns: q, frac: int64(r)}
}

// tokens returns the whole tokens that refill in d >= 0: floor(d·n/per).
func (b *bucket) tokens(d fine) int64 {
	if d.ns < 0 {
		return 0
	}
	if b.whole > 0 {
		return d.ns / b.whole
	}
	q, _ := wide.Mul(uint64(d.ns), b.n).Add(wide.U128{Lo: uint64(d.frac)}).Div(b.per)
	return q
}

// decode returns the theoretical arrival time s holds at now, and whether
// s was written under another shape and adopted (see adopt): a state to
// write back even when nothing is charged, or every look would adopt it
// again and the bucket would never refill at its new rate.
func (b *bucket) decode(s State, now int64) (fine, bool) {
	if s.Expiry <= now {
		return b.after(fine{ns: now}, b.span(b.burst-b.initial)), false
	}
	if b.stamp != 0 && s.Prev != b.stamp && s.Prev != 0 {
		if old, ok := shapeOf(s.Prev); ok {
			return b.adopt(old, s, now), true
		}
		if !isShapeID(s.Prev) {
			// A sliding window's counts, after the rule's algorithm
			// changed: nothing a bucket can read.
			return b.after(fine{ns: now}, b.span(b.burst-b.initial)), true
		}
	}
	return b.own(s), false
}

// own returns the theoretical arrival time of a live state of b's shape.
func (b *bucket) own(s State) fine {
	t := fine{ns: s.Expiry - b.remember, frac: int64(s.Count)}
	if t.frac > 0 {
		t.ns--
	}
	return t
}

func (b *bucket) encode(t fine) State {
	return State{Expiry: t.ceil() + b.remember, Count: uint32(t.frac), Prev: b.stamp}
}

// eval decides cost c at now into res and returns the state to keep. A
// request is admitted iff the TAT after it stays within burst·T of now,
// which is to say iff c tokens are there. A debit that does not fit is
// charged all the same: the bucket goes into debt, by at most b.debt
// tokens (one burst unless the rule says otherwise: its TAT at most
// (burst+debt)·T after now), repaid at its rate.
func (b *bucket) eval(res *admit.Result, s State, now, c int64, debit bool) State {
	if debit {
		// More than burst+debt lands on the cap whatever the TAT; no
		// more is ever multiplied, so a large debit cannot overflow.
		c = min(c, b.burst+b.debt)
	}
	tat, adopted := b.decode(s, now)
	base := tat
	if base.less(fine{ns: now}) {
		base = fine{ns: now}
	}
	horizon := b.after(fine{ns: now}, b.span(b.burst))
	next := b.after(base, b.span(c))
	keep := s
	if adopted || s.Expiry <= now && b.initial < b.burst {
		// A new bucket that starts below its burst must be recorded even
		// when nothing is charged, or it would start empty again at every
		// look and never refill; so must a state adopted from another
		// shape.
		keep = b.encode(tat)
	}
	if !horizon.less(next) {
		res.Allowed = true
		res.Remaining = b.tokens(b.before(horizon, next))
		res.ResetAfter = time.Duration(next.ceil() - now)
		if c > 0 {
			keep = b.encode(next)
		}
		return keep
	}
	res.Allowed = false
	res.Remaining = 0
	if base.less(horizon) {
		res.Remaining = b.tokens(b.before(horizon, base))
	}
	res.RetryAfter = time.Duration(b.before(next, horizon).ceil())
	res.ResetAfter = time.Duration(base.ceil() - now)
	if debit {
		// Into debt by at most b.debt, and never back: a TAT already past
		// the cap (a reservation's or a withdrawal's booking ahead) stays,
		// or the debit would give back what the booking holds.
		most := b.after(fine{ns: now}, b.span(b.burst+b.debt))
		if most.less(base) {
			most = base
		}
		if most.less(next) {
			next = most
		}
		return b.encode(next)
	}
	return keep
}

// reserve books c tokens whatever the wait and returns the new state and
// the wait until the booking conforms.
func (b *bucket) reserve(s State, now, c int64) (State, int64) {
	tat, _ := b.decode(s, now)
	if tat.less(fine{ns: now}) {
		tat = fine{ns: now}
	}
	horizon := b.after(fine{ns: now}, b.span(b.burst))
	next := b.after(tat, b.span(c))
	wait := int64(0)
	if horizon.less(next) {
		wait = b.before(next, horizon).ceil()
	}
	return b.encode(next), wait
}

// unreserve gives back c tokens booked earlier.
func (b *bucket) unreserve(s State, now, c int64) State {
	if s.Expiry <= now {
		return s
	}
	if b.stamp != 0 && s.Prev != b.stamp {
		if old, ok := shapeOf(s.Prev); ok {
			return b.giveInto(old.bucket(s.Prev), s, now, c)
		}
	}
	tat, _ := b.decode(s, now)
	next := b.encode(b.before(tat, b.span(c)))
	if next.Expiry <= now {
		return State{}
	}
	return next
}

func stepCombination(bs *buckets, st [2]State, now, cost int64, res *admit.Result) [2]State {
	fb, bb := &bs.floor, &bs.main
	var f, b admit.Result
	var next [2]State
	floorFits := cost <= fb.burst
	if floorFits {
		next[0] = fb.eval(&f, st[0], now, cost, false)
	} else {
		next[0] = fb.eval(&f, st[0], now, 0, false) // for its remaining tokens only
		f.Allowed = false
	}
	if f.Allowed {
		next[1] = bb.eval(&b, st[1], now, 0, false)
	} else {
		next[1] = bb.eval(&b, st[1], now, cost, false)
	}
	res.Allowed = f.Allowed || b.Allowed
	res.Remaining = f.Remaining + b.Remaining
	res.ResetAfter = max(f.ResetAfter, b.ResetAfter)
	if !res.Allowed {
		res.RetryAfter = b.RetryAfter
		if floorFits {
			res.RetryAfter = min(res.RetryAfter, f.RetryAfter)
		}
	}
	return next
}

// StepReserve books cost in a token_bucket or gcra state at now whatever
// the wait, and returns the state to keep and the wait in nanoseconds until
// the booking conforms. The caller keeps the old state when the wait is too
// long.
func StepReserve(r *admit.Rule, s State, now, cost int64) (State, int64) {
	b := mainBucket(r)
	return b.reserve(s, now, cost)
}

// StepCancel gives back cost booked by StepReserve.
func StepCancel(r *admit.Rule, s State, now, cost int64) State {
	b := mainBucket(r)
	return b.unreserve(s, now, cost)
}

// giveInto gives back c of b's tokens booked earlier into s, a live state
// of another shape o, and returns it still o's: the rule that last decided
// the key keeps it. The units repay first the debt s holds, as time, as
// adopt keeps a debt (c tokens' time of b), and what is left of them comes
// back as whole tokens of o, as adopt keeps tokens: so a give-back that
// lands after a change undoes what its booking did, and no more.
func (b *bucket) giveInto(o bucket, s State, now, c int64) State {
	tat := o.own(s)
	give := b.span(c).ns
	debt := int64(0)
	if drained := o.after(fine{ns: now}, o.span(o.burst)); drained.less(tat) {
		debt = o.before(tat, drained).ns
	}
	back := fine{ns: give}
	if give > debt {
		back = o.after(fine{ns: debt}, o.span(b.tokens(fine{ns: give - debt})))
	}
	next := o.encode(o.before(tat, back))
	if next.Expiry <= now {
		return State{}
	}
	return next
}

// SpanOf returns how long n >= 0 tokens of rate r take to refill, rounded
// up (saturated at math.MaxInt64): a bucket's span, for what paces a
// bucket's tokens outside the bucket (a leased allowance's booked refill,
// a region's hold).
func SpanOf(r admit.Rate, n int64) time.Duration {
	return time.Duration(wide.MulDivUp(uint64(n), uint64(r.Per), uint64(r.N)))
}

// TokensIn returns how many whole tokens of rate r refill in d >= 0,
// rounded down (saturated at math.MaxInt64): SpanOf's inverse.
func TokensIn(r admit.Rate, d time.Duration) int64 {
	return wide.MulDiv(uint64(d), uint64(r.N), uint64(r.Per))
}
