package admit

import "time"

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
	burst, initial int64
	remember       int64 // nanoseconds a full bucket is kept; see RememberFull
}

func mainBucket(r *Rule) bucket {
	b := bucket{n: uint64(r.Rate.N), per: uint64(r.Rate.Per), burst: r.Burst, initial: r.initial()}
	if b.initial < b.burst {
		b.remember = int64(RememberFull)
	}
	return b
}

func floorBucket(r *Rule) bucket {
	return bucket{n: uint64(r.Floor.N), per: uint64(r.Floor.Per), burst: r.Floor.N, initial: r.Floor.N}
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
	if b.per%b.n == 0 { // the common case, such as 100/s: T is whole
		return fine{ns: c * int64(b.per/b.n)}
	}
	q, r := mul(uint64(c), b.per).div(b.n)
	return fine{ns: q, frac: int64(r)}
}

// tokens returns the whole tokens that refill in d >= 0: floor(d·n/per).
func (b *bucket) tokens(d fine) int64 {
	if d.ns < 0 {
		return 0
	}
	if d.frac == 0 && b.per%b.n == 0 {
		return d.ns / int64(b.per/b.n)
	}
	q, _ := mul(uint64(d.ns), b.n).add(u128{lo: uint64(d.frac)}).div(b.per)
	return q
}

func (b *bucket) decode(s State, now int64) fine {
	if s.A <= now {
		return b.after(fine{ns: now}, b.span(b.burst-b.initial))
	}
	t := fine{ns: s.A - b.remember, frac: int64(s.B)}
	if t.frac > 0 {
		t.ns--
	}
	return t
}

func (b *bucket) encode(t fine) State {
	return State{A: t.ceil() + b.remember, B: uint32(t.frac)}
}

// outcome is what bucket.eval found.
type outcome struct {
	allowed      bool
	remaining    int64
	reset, retry int64
	limit        int64
	next         State
}

func (o *outcome) fill(r *Result) {
	r.Allowed, r.Remaining = o.allowed, o.remaining
	r.ResetAfter, r.RetryAfter = time.Duration(o.reset), time.Duration(o.retry)
}

// eval decides cost c at now. A request is admitted iff the TAT after it
// stays within burst·T of now, which is to say iff c tokens are there.
func (b *bucket) eval(s State, now, c int64) outcome {
	tat := b.decode(s, now)
	base := tat
	if base.less(fine{ns: now}) {
		base = fine{ns: now}
	}
	horizon := b.after(fine{ns: now}, b.span(b.burst))
	next := b.after(base, b.span(c))
	o := outcome{limit: b.burst, next: s}
	if s.A <= now && b.initial < b.burst {
		// A new bucket that starts below its burst must be recorded even
		// when nothing is charged, or it would start empty again at every
		// look and never refill.
		o.next = b.encode(tat)
	}
	if !horizon.less(next) {
		o.allowed = true
		o.remaining = b.tokens(b.before(horizon, next))
		o.reset = next.ceil() - now
		if c > 0 {
			o.next = b.encode(next)
		}
		return o
	}
	if base.less(horizon) {
		o.remaining = b.tokens(b.before(horizon, base))
	}
	o.retry = b.before(next, horizon).ceil()
	o.reset = base.ceil() - now
	return o
}

// reserve books c tokens whatever the wait and returns the new state and
// the wait until the booking conforms.
func (b *bucket) reserve(s State, now, c int64) (State, int64) {
	tat := b.decode(s, now)
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
	if s.A <= now {
		return s
	}
	next := b.encode(b.before(b.decode(s, now), b.span(c)))
	if next.A <= now {
		return State{}
	}
	return next
}

func stepCombination(r *Rule, st [2]State, now, cost int64, res Result) ([2]State, Result) {
	fb, bb := floorBucket(r), mainBucket(r)
	next := st
	floorFits := cost <= fb.burst
	var f, b outcome
	if floorFits {
		f = fb.eval(st[0], now, cost)
	} else {
		f = fb.eval(st[0], now, 0) // for its remaining tokens only
		f.allowed = false
	}
	if f.allowed {
		b = bb.eval(st[1], now, 0)
	} else {
		b = bb.eval(st[1], now, cost)
	}
	next[0], next[1] = f.next, b.next
	res.Allowed = f.allowed || b.allowed
	res.Remaining = f.remaining + b.remaining
	res.ResetAfter = time.Duration(max(f.reset, b.reset))
	if !res.Allowed {
		retry := b.retry
		if floorFits {
			retry = min(retry, f.retry)
		}
		res.RetryAfter = time.Duration(retry)
	}
	return next, res
}

// Reservable reports whether a can book future capacity: token buckets and
// GCRA can.
func (a Algorithm) Reservable() bool { return a == TokenBucket || a == GCRA }

// StepReserve books cost in a token_bucket or gcra state at now whatever
// the wait, and returns the state to keep and the wait in nanoseconds until
// the booking conforms. The caller keeps the old state when the wait is too
// long.
func StepReserve(r *Rule, s State, now, cost int64) (State, int64) {
	b := mainBucket(r)
	return b.reserve(s, now, cost)
}

// StepCancel gives back cost booked by StepReserve.
func StepCancel(r *Rule, s State, now, cost int64) State {
	b := mainBucket(r)
	return b.unreserve(s, now, cost)
}
