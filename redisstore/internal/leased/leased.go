package leased

import (
	"context"
	"slices"
	"sync"
	"time"

	"github.com/admitdev/admit"
	"github.com/admitdev/admit/internal/bounds"
	"github.com/admitdev/admit/internal/engine"
	"github.com/admitdev/admit/redisstore/internal/exact"
	"github.com/admitdev/admit/redisstore/internal/link"
)

// Leased allowances. A rule with Distribution admit.Leased is decided from
// allowances: units a server has withdrawn from the key's state in Redis
// (a charge like any other, made by one atomic call) and spends locally,
// without a round trip, until they run out or expire. Since every unit is
// withdrawn before it admits anything, the servers together never admit
// more than the exact limit would; what they hold unused is admitted by
// none until it is returned or expires, which bounds the under-admission.
// docs/architecture.md ("Leased allowances") has the proof of both bounds.
//
// A decision is local only if every charge is leased and covered by the
// allowance in hand. Otherwise the server withdraws for the charges short
// of units (one withdrawal per key in flight; other callers wait for it)
// and tries again, and if that is not enough either — the key is near its
// limit, or cold — it decides the request exactly in Redis, all or
// nothing as always.
//
// How much a withdrawal asks for follows the key's local demand: what the
// server spent since its last withdrawal, scaled to leaseHorizon. Redis
// grants at most 1/8 of what the key has left (the library, withdraw), so
// batches shrink as the limit nears and the last 7 units are decided
// exactly, one request at a time, by whichever server asks. A new
// withdrawal is made when the allowance falls below half of the last
// grant, before it runs out, so callers rarely wait.
//
// A token bucket (or GCRA) near empty has nothing to share, and under
// sustained demand it stays there: a withdrawal then books the refill to
// come, up to bookAhead ahead, putting the bucket into debt in Redis as a
// reservation does, and the server spends each token it was granted no
// earlier than Redis said the token is due (counted from when the reply
// arrived, which is after Redis decided). Until a token is due, a request
// that the tokens booked would cover is refused locally, with the time
// it is due as its retry. So the servers of a hot key make a call per
// batch of its refill, not per request, and together admit no more than
// the bucket would.
//
// An allowance lives as long as what it was withdrawn from: a fixed
// window's or quota's units until the period ends, a sliding window's
// until the current window ends (after which they count in the previous
// window, weighted less, so spending them cannot pass the limit), a
// bucket's tokens for bucketHold. Times are the local clock's, started
// before the withdrawal was sent: an allowance ends locally no later than
// in Redis. Units unused when a key goes idle (leaseIdle) or the store is
// closed are given back; units a bucket held when they expire are given
// back too (a window's are worthless then). A server that dies loses what
// it held: never spent twice, only not spent.
const (
	// leaseHorizon is how long an allowance should last at the key's
	// current demand.
	leaseHorizon = 250 * time.Millisecond
	// minLease is the smallest withdrawal worth a call: a key whose
	// demand would ask for less is decided exactly.
	minLease = 4
	// maxLease bounds one withdrawal.
	maxLease = 1 << 20
	// bucketHold is how long a bucket's tokens may be spent after they
	// were withdrawn.
	bucketHold = time.Second
	// leaseIdle is how long a key goes unused before its allowance is
	// given back.
	leaseIdle = time.Second
	// refusalHold is how long a refusal Redis made is repeated locally
	// before Redis is asked again: the longest other servers hold units
	// before they give them back (bucketHold, leaseIdle), and a sweep.
	refusalHold = bucketHold + sweepEvery
	// leaseForget is how long an empty allowance is kept, with its
	// demand and refusal, after its last use.
	leaseForget = 10 * time.Second
	// sweepEvery is how often expired and idle allowances are swept.
	sweepEvery = 250 * time.Millisecond
	// bookAhead mirrors the library's BOOKAHEAD: how far ahead of its
	// refill a bucket's withdrawal may book.
	bookAhead = 250 * time.Millisecond
)

// shareOf mirrors the library's SHARE: a withdrawal takes at most 1/shareOf
// of what the key has left.
const shareOf = 8

// allowance is what one server holds of one leased key, for one class of
// callers when the key's limit is shared (admit.Charge.Share): a class's
// allowance is withdrawn with its share, and spent by it alone.
type allowance struct {
	rule     *admit.Rule
	key, tag string
	share    *admit.Share // nil: the key's limit is not shared

	mu     sync.Mutex
	avail  int64     // units in hand
	future int64     // a bucket's units booked, not yet due
	due    time.Time // when the first of them is due (local clock)
	until  time.Time // when they expire (local clock)
	gen    uint64    // bumped when avail is replaced, not added to
	period int64     // the end of the window or quota period avail is of (µs, Redis time)
	takenU int64     // Redis time of the last grant, µs and ns: a refund
	takenN int64     // gives back into its window
	grant  int64     // the last grant, for the low-water mark
	shared int64     // what the key had left in Redis at the last reply
	reset  time.Time // when the key resets, as of the last reply
	exact  bool      // too little left in Redis to withdraw: decide exactly
	fetch  *fetch    // the withdrawal in flight

	refusedUntil time.Time    // refuse locally a cost of at least refusedCost
	refusedCost  int64        // until then, as Redis last refused it
	refusal      admit.Result // that refusal
	refusalEnds  time.Time    // when Redis said it ends: its retry, told to callers
	used         int64        // units spent since
	since        time.Time    // the last withdrawal
	lastUse      time.Time

	// Across regions (see region.go): the units asked of this server
	// since its last take from the pool, refused ones too (the region's
	// demand), and the home key's incarnation its units came from.
	asked   int64
	hgen    int64
	delta   int64 // the pool's clock less this one's, at least, µs
	short   int64 // units the callers waiting for a take lack
	waiting int64 // what they cost
	debits  bool  // some are debits
	owing   bool  // a debt is in the pool, not home yet
	// spentUntil: the home had nothing for a debit's take; until then
	// debits owe without asking again.
	spentUntil time.Time
}

// fetch is a withdrawal in flight; done is closed when it has landed.
type fetch struct {
	done chan struct{}
	err  error
}

// allowances are a store's allowances by charge key and class.
type allowances struct {
	mu       sync.RWMutex
	m        map[allowanceKey]*allowance
	sweeping bool

	// Withdrawals in flight, which Close waits for before it gives every
	// allowance back: a grant landing after that would be lost.
	fetchMu sync.Mutex
	closing bool
	fetches sync.WaitGroup
}

// errClosing answers the callers of a withdrawal asked of a closing store.
var errClosing = admit.Errorf(admit.CodeUnavailable, "redisstore: the store is closing")

// allowanceKey names an allowance: a key, and the class it is for.
type allowanceKey struct{ key, class string }

func allowanceKeyOf(c *admit.Charge) allowanceKey {
	if c.Share != nil {
		return allowanceKey{c.Key, c.Share.Class}
	}
	return allowanceKey{key: c.Key}
}

// leasable reports whether charge c could be decided from an allowance:
// a leased rule, a positive cost, no debit, and no sub of a class (the
// anonymous callers' addresses), whose demand is each too small to lease.
func leasable(c *admit.Charge) bool {
	return c.Rule != nil && c.Rule.Distribution == admit.Leased && engine.Leasable(c.Rule.Algorithm) && c.Cost > 0 && !c.Debit &&
		(c.Share == nil || c.Share.Sub == "")
}

// Leasable reports whether a decision of charges goes through
// allowances: one charge at least is leasable and none is a dry run.
func Leasable(charges []admit.Charge) bool {
	if len(charges) == 0 || len(charges) > bounds.MaxCharges {
		return false
	}
	any := false
	for i := range charges {
		if charges[i].DryRun {
			return false
		}
		any = any || leasable(&charges[i])
	}
	return any
}

// sameShare reports whether an allowance withdrawn with share a serves a
// charge with share b: the same class, of the same weight.
func sameShare(a, b *admit.Share) bool {
	if a == nil || b == nil {
		return a == b
	}
	return a.Class == b.Class && a.Weight == b.Weight
}

// sameRule reports whether rules a and b are the same in every parameter:
// a reload or a catalog change compiles every rule anew, and an allowance
// serves the new copy of an unchanged rule as it served the old.
func sameRule(a, b *admit.Rule) bool {
	if a == b {
		return true
	}
	if (a.Initial == nil) != (b.Initial == nil) || a.Initial != nil && *a.Initial != *b.Initial {
		return false
	}
	return a.Name == b.Name && a.Algorithm == b.Algorithm && a.Rate == b.Rate && a.Burst == b.Burst && a.Floor == b.Floor &&
		a.Limit == b.Limit && a.Window == b.Window && a.Max == b.Max && a.LeaseTTL == b.LeaseTTL &&
		a.Period == b.Period && a.Location.String() == b.Location.String() && a.Anchor.Equal(b.Anchor) &&
		a.MaxCost == b.MaxCost && a.ShareCeiling == b.ShareCeiling && a.MaxDebt == b.MaxDebt &&
		a.Shadow == b.Shadow && a.OnError == b.OnError && a.Distribution == b.Distribution
}

// allowanceOf returns the allowance of c's key, made on first use or when
// the key's rule changed (the old one's units are given back); nil when a
// region's store keeps maxRegionKeys already.
func (s *Room) allowanceOf(c *admit.Charge, now time.Time) *allowance {
	a := &s.allowances
	k := allowanceKeyOf(c)
	a.mu.RLock()
	p := a.m[k]
	a.mu.RUnlock()
	if p != nil && sameRule(p.rule, c.Rule) && sameShare(p.share, c.Share) {
		return p
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if p = a.m[k]; p != nil && sameRule(p.rule, c.Rule) && sameShare(p.share, c.Share) {
		return p
	}
	if p == nil && s.region != nil && len(a.m) >= maxRegionKeys {
		return nil
	}
	var old *allowance
	if p != nil {
		old = p
		a.mu.Unlock()
		if s.region != nil && isBucket(old.rule) == isBucket(c.Rule) {
			// A region's units are stretches of the home's timeline (or
			// units of a count's period), spent as they were granted
			// whatever rule decides them: the new rule's allowance takes
			// them over, unlock times and all, once the old one's take
			// in flight has landed, and the home adopts the new rule at
			// the next refill. Given back instead, units not yet due
			// went home and came back later still, and rules changed
			// faster than they came due (reloads, catalog changes)
			// starved the key.
			old.awaitFetch()
		} else {
			// What the old rule's allowance holds goes back before the
			// new rule decides: the key's state adopts it under the rule
			// that decides it now (see the library, adopt), rather than
			// the units coming back, late, into what the new rule
			// already counted. A refund is one call; rules change
			// rarely.
			s.refund(old)
			old = nil
		}
		a.mu.Lock()
		if p = a.m[k]; p != nil && p != old && sameRule(p.rule, c.Rule) && sameShare(p.share, c.Share) {
			return p
		}
	}
	tag := link.Tag(c)
	p = &allowance{rule: c.Rule, key: c.Key, tag: tag, since: now, lastUse: now}
	if old != nil && a.m[k] == old {
		old.handOver(p)
	}
	if c.Share != nil {
		sh := *c.Share
		p.share = &sh
	}
	if a.m == nil {
		a.m = make(map[allowanceKey]*allowance)
	}
	a.m[k] = p
	if !a.sweeping {
		a.sweeping = true
		go s.sweepLoop()
	}
	return p
}

// awaitFetch waits for p's take in flight, if any, to land.
func (p *allowance) awaitFetch() {
	p.mu.Lock()
	f := p.fetch
	p.mu.Unlock()
	if f != nil {
		<-f.done
	}
}

// handOver moves the units p holds, and what it knows of its region's
// pool, to next, the allowance of p's key under a new rule; p is left
// holding nothing, and what is put back into it is lost (admitting less).
// A refusal p repeats is not handed over: the new rule asks anew.
func (p *allowance) handOver(next *allowance) {
	p.mu.Lock()
	defer p.mu.Unlock()
	next.avail, next.future, next.due, next.until, next.period = p.avail, p.future, p.due, p.until, p.period
	next.grant, next.shared, next.reset, next.hgen, next.delta = p.grant, p.shared, p.reset, p.hgen, p.delta
	next.asked, next.owing, next.since, next.lastUse = p.asked, p.owing, p.since, p.lastUse
	p.avail, p.future, p.asked = 0, 0, 0
	p.gen++
}

// Decide decides charges (Leasable): the leasable ones covered
// by their allowances are taken from them; the others, if any, are
// decided exactly in Redis, and if that refuses, what was taken is put
// back, so the decision stays all or nothing. A charge short of units
// first gets a withdrawal, which the callers of its key wait for.
func (s *Room) Decide(ctx context.Context, charges []admit.Charge, d *admit.Decision) error {
	if err := engine.CheckDebits(charges); err != nil {
		return err
	}
	for i := range charges {
		if err := exact.Check(i, &charges[i]); err != nil {
			return err
		}
	}
	now := s.link.Now()
	var pools [bounds.MaxCharges]*allowance
	ps := pools[:len(charges)]
	for i := range charges {
		if leasable(&charges[i]) {
			ps[i] = s.allowanceOf(&charges[i], now)
		}
	}
	all := uint64(1)<<len(charges) - 1
	var taken uint64
	var gens generations
	for try := 0; ; try++ {
		var refused bool
		taken, refused = s.takeLocal(charges, ps, &gens, now, d)
		if refused || taken == all {
			s.Decisions.Add(1)
			s.LocalDecisions.Add(1)
			d.At = now
			engine.Summarize(d)
			return nil
		}
		if try == 1 {
			break
		}
		// Withdraw for each charge short of units, and wait.
		var waits [bounds.MaxCharges]*fetch
		n := 0
		for i, p := range ps {
			if p == nil || taken&(1<<i) != 0 {
				continue
			}
			if f := p.fetchFor(s, charges[i].Cost, now); f != nil {
				waits[n] = f
				n++
			}
		}
		if n == 0 {
			break
		}
		s.putBack(charges, ps, &gens, taken)
		if err := waitFetches(ctx, waits[:n]); err != nil {
			return err
		}
		now = s.link.Now()
	}
	err := s.decideRest(ctx, charges, ps, taken, now, d)
	if err != nil || !d.Allowed {
		s.putBack(charges, ps, &gens, taken)
	}
	return err
}

// waitFetches waits for the withdrawals fs to land, or ctx to end.
func waitFetches(ctx context.Context, fs []*fetch) error {
	for _, f := range fs {
		select {
		case <-f.done:
		case <-ctx.Done():
			return admit.Errorf(admit.CodeUnavailable, "redisstore: %w", ctx.Err())
		}
		if f.err != nil {
			return f.err
		}
	}
	return nil
}

// decideRest decides exactly in Redis the charges not in taken, and
// fills d with their results and the taken ones'.
func (s *Room) decideRest(ctx context.Context, charges []admit.Charge, ps []*allowance, taken uint64, now time.Time, d *admit.Decision) error {
	var rest [bounds.MaxCharges]admit.Charge
	var at [bounds.MaxCharges]int
	n := 0
	for i := range charges {
		if taken&(1<<i) == 0 {
			rest[n], at[n] = charges[i], i
			n++
		}
	}
	sub := decisions.Get().(*admit.Decision)
	defer decisions.Put(sub)
	if err := s.exact.Decide(ctx, rest[:n], sub); err != nil {
		return err
	}
	d.At = sub.At
	// A charge of a key charged twice was refused for both costs: no
	// refusal of one cost may be learned from it.
	dup := false
	for i := range ps {
		dup = dup || ps[i] != nil && slices.Contains(ps[:i], ps[i])
	}
	for k, i := range at[:n] {
		d.Results[i] = sub.Results[k]
		if p := ps[i]; p != nil {
			p.learn(&charges[i], &sub.Results[k], now, !dup)
		}
	}
	d.Lease = sub.Lease
	engine.Summarize(d)
	return nil
}

// decisions recycles the Decisions of decideRest.
var decisions = sync.Pool{New: func() any { return new(admit.Decision) }}

// generations holds, per charge taken from an allowance, the allowance's
// generation then, so that a unit is put back only where it came from.
type generations [bounds.MaxCharges]uint64

// takeLocal takes from their allowances ps the leasable charges they
// cover, and returns which it took, with their results in d; or, if one
// was refused by Redis for at least its cost until after now, takes
// nothing and returns refused, d holding the refusal.
func (s *Room) takeLocal(charges []admit.Charge, ps []*allowance, gens *generations, now time.Time, d *admit.Decision) (taken uint64, refused bool) {
	d.Reset()
	d.Results = slices.Grow(d.Results, len(charges))[:len(charges)]
	for i, p := range ps {
		if p == nil {
			continue
		}
		c, r := &charges[i], &d.Results[i]
		p.mu.Lock()
		p.release(now)
		switch {
		case c.Cost == 0 || p.avail >= c.Cost && now.Before(p.until):
			p.avail -= c.Cost
			p.used += c.Cost
			p.lastUse = now
			gens[i] = p.gen
			*r = p.result(now, true)
			if p.avail+p.future < p.grant/2 && !p.exact && p.fetch == nil {
				p.startFetch(s, 0, now)
			}
			taken |= 1 << i
		case p.avail+p.future >= c.Cost && now.Before(p.until) && !p.rule.Shadow:
			// Booked, not due yet: what this server may admit of the key
			// until then is in hand, and the rest of the refill is booked
			// by others or beyond reach.
			p.used += c.Cost
			p.lastUse = now
			*r = p.result(now, false)
			r.RetryAfter = p.dueIn(c.Cost-p.avail, now)
			r.ResetAfter = max(r.ResetAfter, r.RetryAfter)
			if p.avail+p.future < p.grant/2 && !p.exact && p.fetch == nil {
				p.startFetch(s, 0, now)
			}
			refused = true
		case now.Before(p.refusedUntil) && c.Cost >= p.refusedCost && !p.rule.Shadow:
			*r = p.refusal
			r.Remaining = 0
			r.RetryAfter = p.refusalEnds.Sub(now)
			r.ResetAfter = max(r.ResetAfter, r.RetryAfter)
			refused = true
		}
		p.mu.Unlock()
		if refused {
			s.putBack(charges, ps, gens, taken)
			for j, q := range ps { // the others report what they hold
				if j == i {
					continue
				}
				if q == nil {
					d.Results[j] = admit.Result{Rule: charges[j].Rule.Name, Shadow: charges[j].Rule.Shadow, Debit: charges[j].Debit, Limit: charges[j].Rule.Capacity()}
					continue
				}
				q.mu.Lock()
				d.Results[j] = q.result(now, q.avail >= charges[j].Cost && now.Before(q.until))
				q.mu.Unlock()
			}
			return 0, true
		}
	}
	return taken, false
}

// result is what p reports for a charge decided from it. p.mu is held.
func (p *allowance) result(now time.Time, allowed bool) admit.Result {
	return admit.Result{
		Rule: p.rule.Name, Allowed: allowed, Shadow: p.rule.Shadow, Limit: p.rule.Capacity(),
		Remaining: p.avail + p.shared, ResetAfter: max(p.reset.Sub(now), 0),
	}
}

// putBack returns to their allowances the charges in taken, unless an
// allowance was replaced meanwhile (its units expired): then they are
// lost, which only admits less.
func (s *Room) putBack(charges []admit.Charge, ps []*allowance, gens *generations, taken uint64) {
	for i, p := range ps {
		if taken&(1<<i) == 0 {
			continue
		}
		p.mu.Lock()
		if p.gen == gens[i] {
			p.avail += charges[i].Cost
			p.used -= charges[i].Cost
		}
		p.mu.Unlock()
	}
}

// fetchFor returns the withdrawal that should cover cost in p, started
// if need be, or nil when p covers cost already or must be decided
// exactly: it is near its limit, or too cold to be worth a withdrawal.
func (p *allowance) fetchFor(s *Room, cost int64, now time.Time) *fetch {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.fetch != nil {
		return p.fetch
	}
	if p.exact || (p.avail+p.future >= cost && now.Before(p.until)) || now.Before(p.refusedUntil) {
		return nil
	}
	if p.want(now) < minLease {
		return nil
	}
	return p.startFetch(s, cost, now)
}

// want is how much a withdrawal at now should ask for, from the demand
// since the last one. p.mu is held.
func (p *allowance) want(now time.Time) int64 {
	elapsed := max(now.Sub(p.since), 10*time.Millisecond)
	return min(int64(float64(p.used)*float64(leaseHorizon)/float64(elapsed)), maxLease)
}

// startFetch starts a withdrawal for p of its demand plus need. p.mu is
// held.
func (p *allowance) startFetch(s *Room, need int64, now time.Time) *fetch {
	f := &fetch{done: make(chan struct{})}
	a := &s.allowances
	a.fetchMu.Lock()
	if a.closing {
		a.fetchMu.Unlock()
		f.err = errClosing
		close(f.done)
		return f
	}
	a.fetches.Add(1)
	a.fetchMu.Unlock()
	p.fetch = f
	want := min(max(p.want(now), minLease)+need, maxLease)
	p.used, p.since = 0, now
	if s.region != nil {
		go s.takePool(p, f, want)
	} else {
		go s.withdraw(p, f, want)
	}
	return f
}

// withdraw asks Redis for want units of p and adds what it grants.
func (s *Room) withdraw(p *allowance, f *fetch, want int64) {
	defer s.allowances.fetches.Done()
	ctx, cancel := context.WithTimeout(context.Background(), s.link.Timeout)
	defer cancel()
	sent := s.link.Now()
	v, err := s.exact.Withdraw(ctx, admit.Charge{Key: p.key, Rule: p.rule, Cost: want, Share: p.share}, p.tag)
	recv := s.link.Now()
	if err == nil && len(v.V) != 6 {
		err = admit.Errorf(admit.CodeInternal, "redisstore: a withdrawal replied %d values, want 6", len(v.V))
	}
	s.Withdrawals.Add(1)
	p.mu.Lock()
	p.fetch = nil
	if err != nil {
		f.err = err
		p.mu.Unlock()
		close(f.done)
		return
	}
	granted, left := v.V[5], v.V[2]
	resetIn := s.replyReset(p.rule, v, v.V[3])
	if p.books() {
		p.book(granted, recv.Add(time.Duration(v.V[4])), sent)
		p.takenU, p.takenN = v.NU, v.NSub
		left = max(left-granted, 0)
		s.Withdrawn.Add(granted)
	} else if granted > 0 {
		until, period := s.allowanceEnd(p.rule, v, sent)
		if period == 0 {
			// A shared bucket's tokens (not booked: see books) keep
			// their worth: add them, and hold all for bucketHold more.
			p.avail += granted
			p.until = until
		} else if !sent.Before(p.until) || period != p.period {
			// Units of a period that has ended (a grant from a later
			// period lands only after it has): the grant replaces them,
			// and units taken from them are not put back. Units of the
			// same period are added to, even when none is in hand: a
			// caller may be about to put one back.
			s.Expired.Add(p.avail)
			p.avail, p.until, p.period = granted, until, period
			p.gen++
		} else {
			p.avail += granted
			p.until = minTime(p.until, until)
		}
		p.takenU, p.takenN = v.NU, v.NSub
		s.Withdrawn.Add(granted)
	}
	p.grant = granted
	p.shared = left
	p.reset = sent.Add(resetIn)
	p.exact = left < shareOf
	if p.books() {
		p.exact = granted == 0
	}
	p.mu.Unlock()
	close(f.done)
}

// books reports whether p's withdrawals book the refill of a bucket: not
// a shared bucket's, whose tokens booked ahead for one class would come
// before every other class's share (the library, withdraw).
func (p *allowance) books() bool {
	return (p.rule.Algorithm == admit.TokenBucket || p.rule.Algorithm == admit.GCRA) && p.share == nil
}

// book adds to p the n units of a withdrawal sent at sent, the first
// due at first, the others one per token's span after it. Units booked
// earlier come first: the new ones are due after them, and never before
// their own time, so the schedule of both starts at the later of the
// old one's and the new one's moved back by the old units' span. p.mu is
// held.
func (p *allowance) book(n int64, first, sent time.Time) {
	if !sent.Before(p.until) && p.avail+p.future > 0 {
		// Expired before the sweep saw it: the sweep gives back what is
		// in hand; none of it may be spent now.
		p.avail, p.future = 0, 0
		p.gen++
	}
	if n <= 0 {
		return
	}
	if p.future > 0 {
		first = maxTime(p.due, first.Add(-engine.SpanOf(p.rule.Rate, p.future)))
	}
	p.future += n
	p.due = first
	p.until = sent.Add(bucketHold)
}

// release moves to avail the booked units due by now. p.mu is held.
func (p *allowance) release(now time.Time) {
	if p.future == 0 || now.Before(p.due) {
		return
	}
	k := min(engine.TokensIn(p.rule.Rate, now.Sub(p.due))+1, p.future)
	p.avail += k
	p.future -= k
	p.due = p.due.Add(engine.SpanOf(p.rule.Rate, k))
}

// dueIn returns how long from now until n more booked units are due.
// p.mu is held, and release has run.
func (p *allowance) dueIn(n int64, now time.Time) time.Duration {
	if n <= 0 {
		return 0
	}
	return max(p.due.Add(engine.SpanOf(p.rule.Rate, n-1)).Sub(now), 0)
}

func maxTime(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// replyReset returns the reset time a reply reports for a charge of r,
// whose reply values x[3] (reset) says.
func (s *Room) replyReset(r *admit.Rule, v exact.Reply, reset int64) time.Duration {
	if r.Algorithm == admit.Quota || r.Algorithm == admit.FirstHitWindow {
		return time.Duration(reset*1000 - (v.NU*1000 + v.NSub))
	}
	return time.Duration(reset)
}

// allowanceEnd returns when units of r withdrawn in the call of reply v,
// sent at sent, stop being spendable, and the end of the period they
// were withdrawn from in Redis's time (µs; 0 for a bucket).
func (s *Room) allowanceEnd(r *admit.Rule, v exact.Reply, sent time.Time) (time.Time, int64) {
	var endu int64
	switch r.Algorithm {
	case admit.FixedWindow:
		endu = v.NU + (v.V[3]+v.NSub)/1000
	case admit.Quota, admit.FirstHitWindow:
		endu = v.V[3] // the script runs a first-hit window as a quota
	case admit.SlidingWindow:
		wu := r.Window.Microseconds()
		endu = v.NU - v.NU%wu + wu
	default:
		return sent.Add(bucketHold), 0
	}
	return sent.Add(time.Duration(endu*1000 - (v.NU*1000 + v.NSub))), endu
}

func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

// learn updates p from the exact decision res of charge c, and, if
// refusals says so, learns when a refusal of c's cost ends.
func (p *allowance) learn(c *admit.Charge, res *admit.Result, now time.Time, refusals bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.lastUse = now
	p.used += c.Cost
	p.shared = res.Remaining
	p.reset = now.Add(res.ResetAfter)
	if res.Remaining >= shareOf {
		p.exact = false
	}
	if refusals && !res.Allowed && !res.Shadow && res.RetryAfter > 0 {
		// Refused locally for at most refusalHold: units another server
		// holds come back within it (its allowance's hold, or its
		// idleness), and may end the refusal early — after a rule
		// change, units booked under the old rule are a debt of the new
		// one's tokens until they do. Past it, Redis is asked again, at
		// most once per refusalHold while the key refuses.
		p.refusedUntil = now.Add(min(res.RetryAfter, refusalHold))
		p.refusalEnds, p.refusedCost, p.refusal = now.Add(res.RetryAfter), c.Cost, *res
		// When the refusal ends the bucket has refilled: room to book
		// again, if the rule's bucket is big enough to be booked at all.
		if p.books() && p.rule.Burst+engine.TokensIn(p.rule.Rate, bookAhead) >= 2*shareOf {
			p.exact = false
		}
	}
}

// sweepLoop sweeps the store's allowances until it is closed.
func (s *Room) sweepLoop() {
	t := time.NewTicker(sweepEvery)
	defer t.Stop()
	for {
		select {
		case <-s.link.Closed:
			return
		case <-t.C:
			s.sweep(s.link.Now())
		}
	}
}

// sweep gives back the units of keys idle for leaseIdle, lets expire the
// units of ended periods (giving back a bucket's), and forgets allowances
// unused for leaseForget.
func (s *Room) sweep(now time.Time) {
	var back, recent []*allowance
	s.allowances.mu.Lock()
	for k, p := range s.allowances.m {
		p.mu.Lock()
		if s.region != nil && (now.Sub(p.lastUse) < leaseForget || p.owing) {
			recent = append(recent, p)
		}
		switch {
		case p.avail+p.future > 0 && !now.Before(p.until):
			if s.region != nil {
				back = append(back, p) // home, through the pool
			} else if p.rule.Algorithm == admit.TokenBucket || p.rule.Algorithm == admit.GCRA {
				back = append(back, p)
			} else {
				s.Expired.Add(p.avail)
				p.avail = 0
				p.gen++
			}
		case p.avail+p.future > 0 && now.Sub(p.lastUse) >= leaseIdle:
			back = append(back, p)
		case p.avail+p.future == 0 && p.fetch == nil && now.Sub(p.lastUse) >= leaseForget && !now.Before(p.refusedUntil) && !p.owing:
			delete(s.allowances.m, k)
		}
		p.mu.Unlock()
	}
	s.allowances.mu.Unlock()
	for _, p := range back {
		s.refund(p)
	}
	if s.region != nil {
		s.sweepRegion(recent, now)
	}
}

// refund gives back the units p holds.
func (s *Room) refund(p *allowance) {
	if s.region != nil {
		s.returnToPool(p)
		return
	}
	p.mu.Lock()
	n, tu, tn := p.avail+p.future, p.takenU, p.takenN
	p.avail, p.future = 0, 0
	p.gen++
	p.mu.Unlock()
	if n <= 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), s.link.Timeout)
	defer cancel()
	if err := s.exact.GiveBack(ctx, admit.Charge{Key: p.key, Rule: p.rule, Cost: n}, p.tag, tu, tn); err != nil {
		s.Lost.Add(n)
		return
	}
	s.Refunded.Add(n)
}

// ReturnAll gives back every allowance, as the store closes, once the
// withdrawals in flight have landed; no other starts.
func (s *Room) ReturnAll() {
	s.allowances.fetchMu.Lock()
	s.allowances.closing = true
	s.allowances.fetchMu.Unlock()
	s.allowances.fetches.Wait()
	s.allowances.mu.Lock()
	ps := make([]*allowance, 0, len(s.allowances.m))
	for _, p := range s.allowances.m {
		ps = append(ps, p)
	}
	s.allowances.m = nil
	s.allowances.mu.Unlock()
	var wg sync.WaitGroup
	for _, p := range ps {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s.refund(p)
		}()
	}
	wg.Wait()
}

// Forget drops the allowances of charges' keys, which Reset cleared in
// Redis: their units were withdrawn from a state that is gone.
func (s *Room) Forget(charges []admit.Charge) {
	s.allowances.mu.Lock()
	defer s.allowances.mu.Unlock()
	for k, p := range s.allowances.m {
		if !slices.ContainsFunc(charges, func(c admit.Charge) bool { return c.Key == k.key }) {
			continue
		}
		p.mu.Lock()
		p.avail, p.future, p.exact, p.refusedUntil = 0, 0, false, time.Time{}
		p.gen++
		p.mu.Unlock()
		delete(s.allowances.m, k)
	}
}
