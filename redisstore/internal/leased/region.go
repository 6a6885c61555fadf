package leased

import (
	"context"
	_ "embed"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/rueidis"

	"github.com/admitdev/admit"
	"github.com/admitdev/admit/internal/bounds"
	"github.com/admitdev/admit/internal/engine"
	"github.com/admitdev/admit/redisstore/internal/exact"
	"github.com/admitdev/admit/redisstore/internal/link"
)

// Limits across regions. A store opened with Options.Home is one region
// of limits that hold across every region whose stores share that home
// Redis. Buckets (token buckets, GCRA) and counts (fixed windows, quotas)
// can be held so. Each bucket's timeline lives at home (homeScript): the
// end of the part of it handed out (TAT, as a GCRA keeps it), which only
// grows as regions are granted stretches of it and shrinks only by units
// given back that nobody can spend any more. Token k of a grant owns the
// stretch [TAT+kT, TAT+(k+1)T) and unlocks at TAT+(k+1)T−τ (T = 1/rate,
// τ = burst·T), so the home hands out no more than burst + rate·t by t,
// and a unit is spent only after it unlocks: the regions together never
// admit more than the bucket would (docs/architecture.md has the proof).
// A count's home grants units of its period in progress, at most its
// limit less what it granted.
//
// A region keeps what it was granted in a pool in its own Redis
// (poolScript): chunks of units with the times they unlock and expire.
// Servers take their allowances from the pool as leased allowances do
// from a bucket (see leased.go), and decide locally; a server whose take
// leaves the pool below half its target — the region's demand over
// regionPeriod — refills it from home in the background, one server at a
// time per key (a lock in the region's Redis). A take short of what its
// callers need waits for the home only when its region asks for no more
// than its fair share and the regions together not for much more than the
// limit (see poolScript): so under overload no decision waits.
//
// Times cross processes as offsets, each measured so that a unit unlocks
// late and expires early, and reach the pool as absolute times of its
// clock through a reading of it (see refill). Only the clocks' rates must
// agree.
//
// Sizing only affects how much of the rate is used, never safety: the
// home grants a region at most its max-min fair share, by the demands
// the regions report, of what has unlocked or will within
// regionLookahead; a pool gives back, latest units first, what exceeds
// twice its target, and everything it held when a chunk expires.
// Give-backs carry a sequence number per region and the incarnation of
// the home key they came from, and are applied once, to that
// incarnation only: a duplicated or late one is ignored. Debits a region
// could not pay go home as negative give-backs.
//
// A region cut from its home spends what its pool and servers hold, at
// most what its demand would spend in regionPeriod plus regionLookahead,
// until it expires (holdOf after its last unit unlocks); then it
// refuses, or with FailWhenCut (redisstore) its decisions fail with CodeUnavailable
// so that each rule's on_error applies. The other regions' shares grow
// as soon as the cut region's demand report is a second old.
const (
	// regionLookahead is how far beyond the present the home grants a
	// bucket's refill.
	regionLookahead = 250 * time.Millisecond
	// regionHold is how long a pool holds a grant's units after the
	// last of them unlocks.
	regionHold = time.Second
	// regionPeriod is how long what a pool holds should last at its
	// region's demand: a refill is asked for below half of it.
	regionPeriod = 300 * time.Millisecond
	// regionHorizon is how far ahead of their unlocking a server takes
	// units from its pool.
	regionHorizon = 250 * time.Millisecond
	// agentLock bounds how long one server refills a key's pool before
	// another may too: short, so that a server that died holding it
	// delays its region little. Two refills at once are safe (each
	// gives back only what it took out of the pool).
	agentLock = 500 * time.Millisecond
	// agentEvery is how often a key's pool is looked at when its
	// servers have not refilled it, to give back what it no longer
	// needs.
	agentEvery = 500 * time.Millisecond
	// maxRefills bounds the refills one store has in flight, so that a
	// flood of keys costs the home a bounded number of calls: past it, a
	// decision waiting for the home is refused for a moment instead, and
	// a pool running low waits for its next take to be refilled.
	maxRefills = 128
	// maxColdRefills bounds those of keys the store never had units of,
	// apart; maxTenantRefills those of one tenant's keys (keys without a
	// tenant aside).
	maxColdRefills   = 32
	maxTenantRefills = 8
	// maxSweptPools bounds the pools one sweep looks at: those that held
	// the most when last seen.
	maxSweptPools = 32
	// cutRetry is how often a key's refill is tried while the home does
	// not answer.
	cutRetry = 250 * time.Millisecond
)

// region is the state of a store that is one region of limits held
// across regions.
type region struct {
	name        string
	home        *link.Link // the home Redis's
	failWhenCut bool

	homeCalls, homeFailures atomic.Int64
	granted, givenBack      atomic.Int64 // units
	owed                    atomic.Int64 // units of debts sent home
	share                   atomic.Int64 // of the last grant, parts per million
	held                    atomic.Int64 // what the last pool looked at held
	rtt                     atomic.Int64 // a moving average of home calls, ns
	cutSince                atomic.Int64 // unix ns of the first failure in a row, 0 when the home answers
	lastErr                 atomic.Pointer[string]

	refills     chan struct{} // a slot per refill in flight (maxRefills)
	coldRefills chan struct{} // of keys the store never had units of (maxColdRefills)

	mu      sync.Mutex
	agents  map[string]time.Time // last refill started, by pool key
	tenants map[string]int       // refills in flight, by tenant tag
	// inflight has this store's refills in flight, by pool key; each
	// channel is closed when its refill is done.
	inflight map[string]chan struct{}
}

// setErr records the last call to the home's failure, or that it answered.
func (rg *region) setErr(err error) {
	if err == nil {
		if rg.lastErr.Load() != nil {
			rg.lastErr.Store(nil)
		}
		return
	}
	msg := err.Error()
	rg.lastErr.Store(&msg)
}

// Health is what a region's store reports about its home
// (redisstore.RegionHealth).
type Health struct {
	Region       string
	HomeCalls    int64 // calls to the home Redis
	HomeFailures int64 // calls that failed or timed out
	Granted      int64 // units the home granted this region
	GivenBack    int64 // units this region gave back home
	Owed         int64 // units of debits it could not pay, sent home
	Share        float64
	Held         int64         // units the region's pool held when last looked at
	RTT          time.Duration // home calls' round trip, a moving average
	Cut          bool          // the last call to the home failed
	LastError    string        // and why
}

// Region reports the region's state, or false when the store has no home.
func (s *Room) Region() (Health, bool) {
	rg := s.region
	if rg == nil {
		return Health{}, false
	}
	return Health{
		Region: rg.name, HomeCalls: rg.homeCalls.Load(), HomeFailures: rg.homeFailures.Load(),
		Granted: rg.granted.Load(), GivenBack: rg.givenBack.Load(), Owed: rg.owed.Load(),
		Share: float64(rg.share.Load()) / 1e6, Held: rg.held.Load(), RTT: time.Duration(rg.rtt.Load()),
		Cut: rg.cutSince.Load() != 0, LastError: deref(rg.lastErr.Load()),
	}, true
}

// CheckRegionRule reports whether rule r can be held across regions:
// token buckets, GCRA, fixed windows and quotas can; sliding windows and
// logs, floor + burst combinations and concurrency limits not yet.
func CheckRegionRule(r *admit.Rule) error {
	if err := exact.CheckRule(r); err != nil {
		return err
	}
	if !regionAlgorithm(r.Algorithm) {
		return admit.Errorf(admit.CodeInvalid, "rule %q: %s limits are not held across regions yet; with a home store, rules must be token_bucket, gcra, fixed_window or quota", r.Name, r.Algorithm)
	}
	if msg := fractionalPeriod(r); msg != "" {
		return &admit.Error{Code: admit.CodeInvalid, Field: "rate", Message: msg}
	}
	return nil
}

// holdOf returns how long a bucket's units are held, in a pool and by a
// server, after they unlock: regionHold, or for a slow bucket as long as
// its burst takes to refill (at most maxHold), so that units can gather
// for a check costing up to the burst, as in the bucket itself, rather
// than go back home before it comes.
func holdOf(r *admit.Rule) time.Duration {
	if !isBucket(r) {
		return regionHold
	}
	return min(max(regionHold, engine.SpanOf(r.Rate, r.Burst)), maxHold)
}

// maxHold bounds holdOf.
const maxHold = 10 * time.Second

// regionAlgorithm reports whether limits of algorithm a can be held
// across regions.
func regionAlgorithm(a admit.Algorithm) bool {
	switch a {
	case admit.TokenBucket, admit.GCRA, admit.FixedWindow, admit.Quota:
		return true
	}
	return false
}

// fractionalPeriod says why bucket rule r cannot be held across regions
// when its rate's period is not a whole number of µs, in which the home
// keeps its timelines (it would hold the rule faster); "" when it is. A
// window's length the Redis store checks already.
func fractionalPeriod(r *admit.Rule) string {
	if !isBucket(r) || r.Rate.Per%time.Microsecond == 0 {
		return ""
	}
	return "rule " + strconv.Quote(r.Name) + ": rate " + r.Rate.String() + ": held across regions, a rate's period must be a whole number of microseconds"
}

// regionCharge reports whether charge i can be decided across regions.
func regionCharge(i int, c *admit.Charge) error {
	var msg string
	switch {
	case !regionAlgorithm(c.Rule.Algorithm): // the rule itself checkCharge checked
		msg = "rule " + strconv.Quote(c.Rule.Name) + ": " + c.Rule.Algorithm.String() + " limits are not held across regions yet"
	case c.Share != nil:
		msg = "rule " + strconv.Quote(c.Rule.Name) + ": shared limits (fair shares) are not decided across regions yet"
	case fractionalPeriod(c.Rule) != "":
		// A rule another server accepted into a shared catalog.
		msg = fractionalPeriod(c.Rule)
	default:
		return nil
	}
	return &admit.Error{Code: admit.CodeInvalid, Field: "charges[" + strconv.Itoa(i) + "]", Message: "redisstore: " + msg}
}

// The keys of a limit held across regions: its pool and the lock of its
// agent in the region's Redis, its state at home. They name the kind of
// state they hold (b, a bucket, or c, a count), so that a rule whose
// algorithm changed under the same name starts anew.
func (s *Room) poolKey(p *allowance) string {
	return s.link.Prefix + "r{" + p.tag + "}" + kindOf(p.rule) + p.key
}
func (s *Room) agentKey(p *allowance) string {
	return s.link.Prefix + "a{" + p.tag + "}" + kindOf(p.rule) + p.key
}
func homeKey(home *link.Link, p *allowance) string {
	return home.Prefix + "h{" + p.tag + "}" + kindOf(p.rule) + p.key
}

func kindOf(r *admit.Rule) string {
	if isBucket(r) {
		return "b"
	}
	return "c"
}

// DecideRegion decides charges from allowances taken from the region's
// pools: all or nothing, locally once the allowances are in hand.
func (s *Room) DecideRegion(ctx context.Context, charges []admit.Charge, d *admit.Decision) error {
	if len(charges) > bounds.MaxCharges {
		return admit.Errorf(admit.CodeInvalid, "redisstore: %d charges in one decision; at most %d", len(charges), bounds.MaxCharges)
	}
	if err := engine.CheckDebits(charges); err != nil {
		return err
	}
	for i := range charges {
		if err := exact.Check(i, &charges[i]); err != nil {
			return err
		}
		if err := regionCharge(i, &charges[i]); err != nil {
			return err
		}
	}
	s.Decisions.Add(1)
	d.Reset()
	if len(charges) == 0 {
		d.Allowed = true
		return nil
	}
	now := s.link.Now()
	var pools [bounds.MaxCharges]*allowance
	ps := pools[:len(charges)]
	dry := false
	for i := range charges {
		if ps[i] = s.allowanceOf(&charges[i], now); ps[i] == nil {
			// A bound on this server's memory: a flood of new keys is
			// refused until the sweep forgets idle ones.
			for i := range charges {
				c := &charges[i]
				d.Results = append(d.Results, admit.Result{Rule: c.Rule.Name, Shadow: c.Rule.Shadow, Debit: c.Debit,
					Limit: c.Rule.Capacity(), RetryAfter: time.Second, ResetAfter: time.Second})
			}
			d.At = now
			engine.Summarize(d)
			return nil
		}
		dry = dry || charges[i].DryRun
	}
	if dry {
		s.peekRegion(charges, ps, now, d)
		return nil
	}
	for i, p := range ps {
		p.mu.Lock()
		p.asked += charges[i].Cost
		p.mu.Unlock()
	}
	// Debits are charged once the checks are admitted, whatever they
	// find: takeLocal sees only the checks.
	var checks [bounds.MaxCharges]*allowance
	cs := checks[:len(charges)]
	var all uint64
	for i, p := range ps {
		if !charges[i].Debit {
			cs[i] = p
			all |= 1 << i
		}
	}
	var gens generations
	for try := 0; ; try++ {
		taken, refused := s.takeLocal(charges, cs, &gens, now, d)
		if refused || taken == all && try == 1 {
			if !refused {
				s.debit(charges, ps, now, d)
			}
			s.LocalDecisions.Add(1)
			d.At = now
			engine.Summarize(d)
			return nil
		}
		if try == 1 {
			s.putBack(charges, cs, &gens, taken)
			break
		}
		// Fetch for the checks short of units, and for the debits too,
		// so that a debit finds its units when the region has them.
		var waits [bounds.MaxCharges]*fetch
		n := 0
		for i, p := range ps {
			if taken&(1<<i) != 0 {
				continue
			}
			if f := p.fetchRegion(s, charges[i].Cost, charges[i].Debit, now); f != nil {
				waits[n] = f
				n++
			}
		}
		if n == 0 && taken == all {
			s.debit(charges, ps, now, d)
			s.LocalDecisions.Add(1)
			d.At = now
			engine.Summarize(d)
			return nil
		}
		s.putBack(charges, cs, &gens, taken)
		if n == 0 {
			break
		}
		if err := waitFetches(ctx, waits[:n]); err != nil {
			return err
		}
		now = s.link.Now()
	}
	// What is in hand does not cover the request: refuse it, each charge
	// reporting what it holds and when it could be admitted.
	d.Reset()
	d.Results = d.Results[:0]
	for i, p := range ps {
		c := &charges[i]
		p.mu.Lock()
		p.release(now)
		covered := p.avail >= c.Cost && now.Before(p.until)
		r := p.result(now, covered)
		if !covered {
			r.RetryAfter = p.retryIn(c.Cost, now)
			r.ResetAfter = max(r.ResetAfter, r.RetryAfter)
		}
		r.Debit = c.Debit
		p.mu.Unlock()
		d.Results = append(d.Results, r)
	}
	s.LocalDecisions.Add(1)
	d.At = now
	engine.Summarize(d)
	return nil
}

// debit charges the debits of an admitted decision to their allowances:
// what an allowance holds pays, and the rest is owed home, where it
// charges the limit as a debit charges one Redis's key (a bucket's
// timeline moves on, a count goes up), so that every region's next grants
// pay it. A debit that the allowance did not cover is reported over the
// limit, with the time the debt takes to repay as its retry.
func (s *Room) debit(charges []admit.Charge, ps []*allowance, now time.Time, d *admit.Decision) {
	var owes [bounds.MaxCharges]int64
	for i, p := range ps {
		c := &charges[i]
		if !c.Debit {
			continue
		}
		p.mu.Lock()
		p.release(now)
		if !now.Before(p.until) && p.avail > 0 {
			s.Expired.Add(p.avail)
			p.avail = 0
			p.gen++
		}
		covered := p.avail >= c.Cost
		owe := c.Cost - max(p.avail, 0)
		p.avail = max(p.avail-c.Cost, 0)
		p.used += c.Cost
		p.lastUse = now
		r := p.result(now, covered)
		r.Debit = true
		if !covered {
			owes[i] = owe
			r.RetryAfter = p.repayIn(owe, now)
			r.ResetAfter = max(r.ResetAfter, r.RetryAfter)
		}
		p.mu.Unlock()
		d.Results[i] = r
	}
	// What the allowances could not pay is owed home, through the pool,
	// before the decision is answered: so it outlives this server.
	for i, owe := range owes {
		if owe > 0 {
			s.owe(ps[i], owe)
		}
	}
}

// repayIn estimates how long a debt of owe units of p's limit takes to
// repay: a bucket's refill of them, a count's period. p.mu is held.
func (p *allowance) repayIn(owe int64, now time.Time) time.Duration {
	if !isBucket(p.rule) {
		return max(periodEnd(p.rule, now).Sub(now), time.Millisecond)
	}
	return max(engine.SpanOf(p.rule.Rate, owe), time.Millisecond)
}

// owe records in p's pool that its region owes home n units of p's limit,
// and has the pool refilled now, which sends the debt home.
func (s *Room) owe(p *allowance, n int64) {
	p.mu.Lock()
	gen := p.hgen
	p.mu.Unlock()
	if err := s.link.Do(context.Background(), func(ctx context.Context, client rueidis.Client) error {
		return poolScript.Exec(ctx, client, []string{s.poolKey(p)}, []string{"r", itoa(gen), "0", "0", itoa(-n)}).Error()
	}); err != nil {
		s.Lost.Add(n) // a debt lost: as much admitted that should not be
		return
	}
	p.mu.Lock()
	p.owing = true // until a refill sends it: the sweep asks again
	p.mu.Unlock()
	s.goRefill(p)
}

// maxRegionKeys bounds the keys a region's server keeps allowances of
// (allowanceOf).
const maxRegionKeys = 1 << 18

// peekRegion answers a dry run from what the allowances hold.
func (s *Room) peekRegion(charges []admit.Charge, ps []*allowance, now time.Time, d *admit.Decision) {
	for i, p := range ps {
		c := &charges[i]
		p.mu.Lock()
		p.release(now)
		ok := c.Cost == 0 || p.avail >= c.Cost && now.Before(p.until)
		r := p.result(now, ok)
		if !ok {
			r.RetryAfter = p.retryIn(c.Cost, now)
		}
		p.mu.Unlock()
		d.Results = append(d.Results, r)
	}
	d.At = now
	engine.Summarize(d)
}

// retryIn estimates how long from now until p could cover cost. p.mu is
// held, and release has run.
func (p *allowance) retryIn(cost int64, now time.Time) time.Duration {
	switch {
	case now.Before(p.refusedUntil):
		return p.refusedUntil.Sub(now)
	case p.avail+p.future >= cost && now.Before(p.until):
		return p.dueIn(cost-p.avail, now)
	case !isBucket(p.rule):
		// A count admits more only when the home has more to grant, at
		// the latest when its period ends.
		return max(periodEnd(p.rule, now).Sub(now), time.Millisecond)
	}
	// Short of units, or holding expired ones: as long as the units
	// missing take to refill.
	return max(engine.SpanOf(p.rule.Rate, max(cost-p.avail-p.future, 1)), time.Millisecond)
}

func isBucket(r *admit.Rule) bool {
	return r.Algorithm == admit.TokenBucket || r.Algorithm == admit.GCRA
}

// periodEnd returns the end of the period of count rule r (a fixed window
// or a quota) that now is in.
func periodEnd(r *admit.Rule, now time.Time) time.Time {
	if r.Algorithm == admit.Quota {
		_, end := engine.PeriodAt(r, now)
		return end
	}
	us := now.UnixMicro()
	wu := r.Window.Microseconds()
	return time.UnixMicro(us - us%wu + wu)
}

// fetchRegion returns the take from the pool that should cover cost in p,
// started if need be, or nil when none would: p covers it, or the pool
// said nothing unlocks before a time still to come.
func (p *allowance) fetchRegion(s *Room, cost int64, debit bool, now time.Time) *fetch {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.avail+p.future >= cost && now.Before(p.until) {
		return nil
	}
	// A check waits out a refusal; a debit, charged whatever it finds,
	// asks until the home said it has nothing either.
	if !debit && now.Before(p.refusedUntil) || debit && now.Before(p.spentUntil) {
		return nil
	}
	// The callers waiting for the take: it should bring them all.
	p.waiting += cost
	p.short = max(p.short, p.waiting-p.avail-p.future)
	p.debits = p.debits || debit
	if p.fetch != nil {
		return p.fetch
	}
	return p.startFetch(s, cost-min(p.avail, 0), now) // a debt is paid first
}

// poolTake is the reply of a take from a pool.
type poolTake struct {
	got, ready, first, hold, held, next int64 // units; µs from the reply
	need, wait                          bool
	gen                                 int64
	spent                               int64 // µs the home has nothing
	poolNow                             int64 // the pool's clock, µs
}

// take takes up to want units of p's pool, reporting arrivals units asked
// of this server since its last take, need the units its callers lack.
func (s *Room) take(p *allowance, want, arrivals, need int64) (poolTake, error) {
	var t poolTake
	err := s.link.Do(context.Background(), func(ctx context.Context, client rueidis.Client) error {
		v, err := poolScript.Exec(ctx, client, []string{s.poolKey(p)}, []string{"t",
			itoa(want), itoa(arrivals), itoa(regionHorizon.Microseconds()), itoa(s.region.period().Microseconds()),
			spanText(p.rule), itoa(leastHeld(p.rule)), itoa(need), poolShape(p.rule)}).ToArray()
		if err != nil {
			return err
		}
		if len(v) != 12 {
			return admit.Errorf(admit.CodeInternal, "redisstore: a pool take replied %d values, want 12", len(v))
		}
		var x [10]int64
		if err := replyInts(v, x[:]); err != nil {
			return err
		}
		now, err := v[11].ToString()
		if err != nil {
			return err
		}
		t = poolTake{got: x[0], first: x[1], hold: x[2], held: x[3], next: x[4], need: x[5] == 1, gen: x[6],
			ready: x[7], spent: x[8], wait: x[9] == 1}
		t.poolNow, err = strconv.ParseInt(now, 10, 64)
		return err
	})
	return t, err
}

// spanText returns how long one unit of r takes to refill, in µs, as the
// regions' scripts read it: "per/n", or "0" for a count.
func spanText(r *admit.Rule) string {
	if !isBucket(r) {
		return "0"
	}
	return itoa(r.Rate.Per.Microseconds()) + "/" + itoa(r.Rate.N)
}

// leastHeld returns the fewest units a pool of r should hold, whatever
// its demand, so that a key asked for now and then finds a unit: 4, or
// less for a small limit (a sixteenth of it), which the other regions
// would otherwise miss.
func leastHeld(r *admit.Rule) int64 {
	return min(4, r.Capacity()/16)
}

// period is how long a pool's units should last at its demand: at least
// regionPeriod, and four round trips to the home.
func (rg *region) period() time.Duration {
	return max(regionPeriod, 4*time.Duration(rg.rtt.Load()))
}

// takePool takes up to want units of p's pool into p. When the pool is
// empty and the home may have more, and the region asks for no more than
// its fair rate, it refills the pool from home first and the decision
// waits for it; otherwise the pool is refilled in the background when it
// runs low.
func (s *Room) takePool(p *allowance, f *fetch, want int64) {
	defer s.allowances.fetches.Done()
	p.mu.Lock()
	asked, short, debits := p.asked, p.short, p.debits
	p.asked, p.short, p.waiting, p.debits = 0, 0, 0, false
	p.mu.Unlock()
	type taken struct {
		poolTake
		sent time.Time
	}
	var takes [3]taken
	n := 1
	takes[0].sent = s.link.Now()
	t, err := s.take(p, want, asked, short)
	takes[0].poolTake = t
	got := t.got
	if err == nil && t.need {
		if t.wait || debits && t.got < short && t.spent == 0 {
			// A debit is charged whatever it finds, and would owe what
			// the home still has: it waits for the home even when its
			// region asks for more than its fair rate. Another server's
			// refill in flight is waited for, then, if it did not bring
			// enough, this one's.
			for n < len(takes) && got < short {
				g := s.refill(p, short-got)
				if g == refillElsewhere {
					s.awaitRefill(p)
				} else if g < 0 {
					break
				}
				takes[n].sent = s.link.Now()
				if takes[n].poolTake, err = s.take(p, want-got, 0, short-got); err != nil {
					break
				}
				got += takes[n].got
				n++
				if takes[n-1].spent > 0 || g >= 0 {
					break
				}
			}
		} else {
			s.goRefill(p)
		}
	}
	recv := s.link.Now()
	s.Withdrawals.Add(1)
	p.mu.Lock()
	p.fetch = nil
	if err != nil {
		f.err = err
		p.mu.Unlock()
		close(f.done)
		return
	}
	for _, x := range takes[:n] {
		s.addTake(p, x.poolTake, x.sent, recv)
	}
	last := takes[n-1].poolTake
	s.region.held.Store(last.held)
	p.grant = got
	p.shared = last.held
	p.reset = recv.Add(p.regionReset(recv))
	switch {
	case p.grant > 0:
	case s.region.failWhenCut && s.region.cutSince.Load() != 0 && last.held == 0:
		f.err = admit.Errorf(admit.CodeUnavailable, "redisstore: region %s is cut from its home and holds nothing of %q", s.region.name, p.rule.Name)
	default:
		wait := time.Duration(last.next) * time.Microsecond
		switch {
		case last.spent > 0 && last.held == 0:
			// The home has nothing until then: refuse, and let debits
			// owe, without asking before.
			wait = time.Duration(last.spent) * time.Microsecond
			p.spentUntil = recv.Add(wait)
		case last.next < 0:
			// Nothing held, the refill not in yet: ask again in a moment.
			wait = 100 * time.Millisecond
			if isBucket(p.rule) {
				wait = min(max(engine.SpanOf(p.rule.Rate, 1), time.Millisecond), wait)
			}
		}
		p.refusedUntil, p.refusedCost = recv.Add(wait), 1
		p.refusalEnds = p.refusedUntil
		p.refusal = admit.Result{Rule: p.rule.Name, Shadow: p.rule.Shadow, Limit: p.rule.Capacity(),
			ResetAfter: p.regionReset(recv)}
	}
	p.mu.Unlock()
	close(f.done)
}

// addTake adds to p the units of take t, sent at sent and answered by
// recv. p.mu is held.
func (s *Room) addTake(p *allowance, t poolTake, sent, recv time.Time) {
	// The pool's clock less this one's, at least: the take ran before
	// its reply arrived.
	p.delta = t.poolNow - recv.UnixMicro()
	if t.got <= 0 {
		return
	}
	until := sent.Add(time.Duration(t.hold) * time.Microsecond)
	if p.books() {
		if !sent.Before(p.until) && p.avail+p.future > 0 {
			s.Expired.Add(p.avail) // expired before the sweep saw them
			p.avail, p.future = 0, 0
			p.gen++
		}
		p.until = sent.Add(holdOf(p.rule))
		p.avail += t.ready
		p.book(t.got-t.ready, recv.Add(time.Duration(t.first)*time.Microsecond), sent)
		p.until = minTime(sent.Add(holdOf(p.rule)), until)
	} else {
		// A count's units are all there at once, and last until its
		// period ends: units of an older period are worth nothing.
		if p.hgen != t.gen || !sent.Before(p.until) {
			s.Expired.Add(p.avail)
			p.avail = 0
			p.gen++
			p.until = until
		}
		p.avail += t.got
		p.until = minTime(p.until, until)
	}
	p.hgen = t.gen
	s.Withdrawn.Add(t.got)
}

// regionReset estimates how long from now until p's limit is whole again,
// from what its region knows: a count's period's end, a bucket's refill of
// what neither this server nor its pool holds. p.mu is held.
func (p *allowance) regionReset(now time.Time) time.Duration {
	if !isBucket(p.rule) {
		return max(periodEnd(p.rule, now).Sub(now), 0)
	}
	return engine.SpanOf(p.rule.Rate, max(p.rule.Burst-p.avail-p.shared, 0))
}

// ResetRegion gives the keys of charges a fresh limit: their state at
// home and this region's pools are deleted, and this server's allowances
// forgotten. What other regions hold of them is theirs to spend until it
// expires: a reset is an operator's override of the limit.
func (s *Room) ResetRegion(ctx context.Context, charges []admit.Charge) error {
	for i := range charges {
		if err := exact.Check(i, &charges[i]); err != nil {
			return err
		}
		if err := regionCharge(i, &charges[i]); err != nil {
			return err
		}
	}
	s.Forget(charges)
	for i := range charges {
		p := &allowance{rule: charges[i].Rule, key: charges[i].Key, tag: link.Tag(&charges[i])}
		if err := s.region.home.Do(ctx, func(ctx context.Context, client rueidis.Client) error {
			return client.Do(ctx, client.B().Del().Key(homeKey(s.region.home, p)).Build()).Error()
		}); err != nil {
			return err
		}
		if err := s.link.Do(ctx, func(ctx context.Context, client rueidis.Client) error {
			return client.Do(ctx, client.B().Del().Key(s.poolKey(p)).Build()).Error()
		}); err != nil {
			return err
		}
	}
	return nil
}

// RefundRegion puts back into the allowances of charges the units a
// decision took, while they last.
func (s *Room) RefundRegion(charges []admit.Charge) {
	now := s.link.Now()
	for i := range charges {
		c := &charges[i]
		if c.Cost <= 0 || regionCharge(i, c) != nil {
			continue
		}
		p := s.allowanceOf(c, now)
		if p == nil {
			continue
		}
		p.mu.Lock()
		if now.Before(p.until) {
			p.avail += c.Cost
		}
		p.mu.Unlock()
	}
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}
