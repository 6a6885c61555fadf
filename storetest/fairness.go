package storetest

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/admitdev/admit"
)

// FairLoad is the load one class of callers offers a shared limit in a
// fairness scenario.
type FairLoad struct {
	Class  string
	Weight int64
	// Subs are the class's members (anonymous callers' addresses): each
	// request comes from the next, in turn. None: the class has no subs.
	Subs []string
	// Rate is the requests the class sends per second, evenly spaced.
	Rate float64
	// Hold is, for a concurrency rule, the slots the class wants held:
	// whenever it holds fewer it asks for another (at most MaxAsks a
	// tick, the last refused one ending the tick's asking; with Subs,
	// each sub asks on its own), and each slot it gets is released
	// after HoldFor.
	Hold int64
}

// FairScenario is a fairness scenario: classes offering loads to one key
// of a shared rule, decided on a manual clock in ticks.
type FairScenario struct {
	Name     string
	Rule     admit.Rule
	Loads    []FairLoad
	Duration time.Duration
	// MaxWait, for a rule that is not concurrency, makes the requests
	// waiters of /v1/acquire as admit serve serves them on a shared
	// limit: a request refused on arriving waits, up to MaxWait, in its
	// class's queue on its server (store), whose first waiter asks again
	// when the last refusal said it could pass.
	MaxWait time.Duration
	// Tick is the clock's step (default 1ms, 10ms for a concurrency
	// rule); HoldFor how long a concurrency slot is held (default
	// 500ms); MaxAsks bounds a class's asks for slots in one tick
	// (default 3).
	Tick    time.Duration
	HoldFor time.Duration
	MaxAsks int
}

// FairReport is what each class got in a fairness scenario.
type FairReport struct {
	Offered  []int64 // requests (or asks for a slot) per class
	Admitted []int64 // admitted per class
	// Held is, for a concurrency rule, the mean slots held per class
	// after the first second (the time the classes take to get there).
	Held  []float64
	Total int64 // admitted in all
	// Bound is the most the rule could admit over the scenario (burst +
	// rate × duration, or the limit per window); Over is the most the
	// admissions passed the rule's bound at any tick (0 when never).
	Bound int64
	Over  int64
	// HeldMax is the most slots held at once.
	HeldMax int64
}

// String formats r for test logs.
func (r FairReport) String() string {
	s := fmt.Sprintf("total %d of bound %d, over %d;", r.Total, r.Bound, r.Over)
	for i := range r.Offered {
		if r.Held != nil {
			s += fmt.Sprintf(" [%d] held %.2f (%d/%d)", i, r.Held[i], r.Admitted[i], r.Offered[i])
		} else {
			s += fmt.Sprintf(" [%d] %d/%d", i, r.Admitted[i], r.Offered[i])
		}
	}
	return s
}

// RunFairScenario runs sc against stores, which share their state (one
// store, or several servers of one shared store), in turn; clock is the
// stores' clock, moved tick by tick from Epoch. The requests of a tick
// are decided concurrently, in an order shuffled with a fixed seed.
func RunFairScenario(ctx context.Context, sc FairScenario, stores []admit.Store, clock *Clock) (FairReport, error) {
	tick, holdFor, maxAsks := sc.Tick, sc.HoldFor, sc.MaxAsks
	if tick <= 0 {
		tick = time.Millisecond
		if sc.Rule.Algorithm == admit.Concurrency {
			tick = 10 * time.Millisecond
		}
	}
	if holdFor <= 0 {
		holdFor = 500 * time.Millisecond
	}
	if maxAsks <= 0 {
		maxAsks = 3
	}
	rule := sc.Rule
	key := admit.Key{Scope: "global", Rule: rule.Name}.String()
	n := len(sc.Loads)
	rep := FairReport{Offered: make([]int64, n), Admitted: make([]int64, n)}
	conc := rule.Algorithm == admit.Concurrency
	if conc {
		rep.Held = make([]float64, n)
	}
	shares := make([]admit.Share, n)
	for i, l := range sc.Loads {
		shares[i] = admit.Share{Class: l.Class, Weight: l.Weight}
	}
	type lease struct {
		id    string
		until time.Duration
		store admit.Store
	}
	held := make([][]lease, n)
	next := make([]float64, n) // the next request's time, in seconds
	subNext := make([]int, n)
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range next {
		next[i] = rng.Float64() / max(sc.Loads[i].Rate, 1)
	}
	type ask struct {
		class int
		sub   string
	}
	decide := func(a ask, st admit.Store) (admit.Decision, error) {
		sh := shares[a.class]
		sh.Sub = a.sub
		c := admit.Charge{Key: key, Rule: &rule, Cost: 1, Share: &sh}
		var d admit.Decision
		err := st.Decide(ctx, []admit.Charge{c}, &d)
		return d, err
	}
	ticks := int(sc.Duration / tick)
	turn := 0
	queues := make([][]waitQueue, len(stores))
	for i := range queues {
		queues[i] = make([]waitQueue, n)
	}
	for k := range ticks {
		at := time.Duration(k) * tick
		clock.Set(at)
		var asks []ask
		if conc {
			// Release what is due, then ask for what is wanted.
			for i := range held {
				kept := held[i][:0]
				for _, l := range held[i] {
					if l.until <= at {
						if err := l.store.ReleaseLease(ctx, l.id); err != nil {
							return rep, fmt.Errorf("release: %w", err)
						}
						continue
					}
					kept = append(kept, l)
				}
				held[i] = kept
			}
			// Slots are asked for one round at a time: a round asks
			// one of every class still short, concurrently; a class
			// refused stops asking for the tick.
			short := make([]bool, n)
			refusedSubs := make([]map[string]bool, n)
			for i := range short {
				short[i] = int64(len(held[i])) < sc.Loads[i].Hold
			}
			for round := 0; round < maxAsks; round++ {
				asks = asks[:0]
				for i, l := range sc.Loads {
					if !short[i] || int64(len(held[i])) >= l.Hold {
						continue
					}
					sub := subOf(l, &subNext[i])
					for tries := 0; refusedSubs[i][sub] && tries < len(l.Subs); tries++ {
						sub = subOf(l, &subNext[i])
					}
					if refusedSubs[i][sub] {
						continue
					}
					asks = append(asks, ask{class: i, sub: sub})
				}
				if len(asks) == 0 {
					break
				}
				rng.Shuffle(len(asks), func(x, y int) { asks[x], asks[y] = asks[y], asks[x] })
				storeOf := func(j int) admit.Store { return stores[(turn+j)%len(stores)] }
				res, err := decideAll(len(asks), func(j int) (admit.Decision, error) { return decide(asks[j], storeOf(j)) })
				if err != nil {
					return rep, err
				}
				for j, a := range asks {
					rep.Offered[a.class]++
					if res[j].Allowed {
						rep.Admitted[a.class]++
						held[a.class] = append(held[a.class], lease{id: res[j].Lease.ID, until: at + holdFor, store: storeOf(j)})
					} else if a.sub != "" {
						if refusedSubs[a.class] == nil {
							refusedSubs[a.class] = map[string]bool{}
						}
						refusedSubs[a.class][a.sub] = true
					} else {
						short[a.class] = false
					}
				}
				turn++
			}
			total := int64(0)
			for i := range held {
				if at >= time.Second {
					rep.Held[i] += float64(len(held[i]))
				}
				total += int64(len(held[i]))
			}
			rep.HeldMax = max(rep.HeldMax, total)
			rep.Over = max(rep.Over, total-rule.Max)
			continue
		}
		sec := at.Seconds()
		asks = asks[:0]
		for i, l := range sc.Loads {
			for next[i] <= sec && l.Rate > 0 {
				asks = append(asks, ask{class: i, sub: subOf(l, &subNext[i])})
				next[i] += 1 / l.Rate
			}
		}
		rng.Shuffle(len(asks), func(x, y int) { asks[x], asks[y] = asks[y], asks[x] })
		res, err := decideAll(len(asks), func(j int) (admit.Decision, error) { return decide(asks[j], stores[(turn+j)%len(stores)]) })
		turn++
		if err != nil {
			return rep, err
		}
		for j, a := range asks {
			rep.Offered[a.class]++
			if res[j].Allowed {
				rep.Admitted[a.class]++
				rep.Total++
			} else if sc.MaxWait > 0 {
				q := &queues[(turn-1+j)%len(stores)][a.class]
				if len(q.deadlines) == 0 {
					q.next = at
				}
				q.deadlines = append(q.deadlines, at+sc.MaxWait)
			}
		}
		if sc.MaxWait > 0 {
			got, err := serveWaiters(ctx, queues, stores, at, func(class int, st admit.Store) (admit.Decision, error) {
				return decide(ask{class: class, sub: subOf(sc.Loads[class], &subNext[class])}, st)
			})
			if err != nil {
				return rep, err
			}
			for class, k := range got {
				rep.Admitted[class] += k
				rep.Total += k
			}
		}
		if b := boundAt(&rule, at); rep.Total > b {
			rep.Over = max(rep.Over, rep.Total-b)
		}
	}
	if conc {
		warm := int(time.Second / tick)
		for i := range rep.Held {
			rep.Held[i] /= float64(ticks - warm)
			rep.Total += rep.Admitted[i]
		}
		rep.Bound = rule.Max
	} else {
		rep.Bound = boundAt(&rule, sc.Duration)
	}
	return rep, nil
}

// waitQueue is acquire's waiters of one class on one server: the
// deadlines of those waiting, in order, and when the first asks next.
type waitQueue struct {
	deadlines []time.Duration
	next      time.Duration
}

// serveWaiters serves the waiters of queues (by server, then class) at
// at: those past their deadline leave, refused; the first of each queue
// asks (decide) when its time has come, and while it is admitted the next
// asks at once. It returns how many of each class were admitted.
func serveWaiters(ctx context.Context, queues [][]waitQueue, stores []admit.Store, at time.Duration, decide func(class int, st admit.Store) (admit.Decision, error)) (map[int]int64, error) {
	got := map[int]int64{}
	for round := 0; ; round++ {
		type due struct{ server, class int }
		var ask []due
		for s := range queues {
			for c := range queues[s] {
				q := &queues[s][c]
				for len(q.deadlines) > 0 && q.deadlines[0] <= at {
					q.deadlines = q.deadlines[1:]
				}
				if len(q.deadlines) > 0 && q.next <= at {
					ask = append(ask, due{s, c})
				}
			}
		}
		if len(ask) == 0 || round == 100 {
			return got, nil
		}
		res, err := decideAll(len(ask), func(j int) (admit.Decision, error) { return decide(ask[j].class, stores[ask[j].server]) })
		if err != nil {
			return got, err
		}
		for j, a := range ask {
			q := &queues[a.server][a.class]
			if res[j].Allowed {
				q.deadlines = q.deadlines[1:]
				got[a.class]++
				q.next = at // the next asks when its turn comes
			} else {
				q.next = at + max(res[j].RetryAfter, time.Millisecond)
			}
		}
	}
}

func subOf(l FairLoad, next *int) string {
	if len(l.Subs) == 0 {
		return ""
	}
	s := l.Subs[*next%len(l.Subs)]
	*next++
	return s
}

// boundAt is the most rule admits from Epoch to Epoch+d: a bucket's burst
// and refill, or the limit of every window begun.
func boundAt(r *admit.Rule, d time.Duration) int64 {
	switch r.Algorithm {
	case admit.TokenBucket, admit.GCRA:
		return r.Burst + int64(float64(r.Rate.N)*float64(d)/float64(r.Rate.Per))
	}
	// A window counts at most its limit in each aligned window (a
	// sliding window's estimate includes the current one's count).
	return r.Limit * int64((d+r.Window-1)/r.Window)
}

// FairScenarios are the fairness scenarios of the conformance suite: a
// global bucket of 1,000/s (burst 1,000) and a global concurrency limit
// of 100 slots, shared by ten classes of equal weight for 60 s:
//
//   - one class at 100× its share, nine at half theirs (and the same
//     with the anonymous callers, from 50 addresses, as the greedy one);
//   - all ten at twice their share.
func FairScenarios() []FairScenario {
	bucket := admit.Rule{Name: "global-requests", Algorithm: admit.TokenBucket, Rate: admit.PerSecond(1000), Burst: 1000}
	slots := admit.Rule{Name: "global-exports", Algorithm: admit.Concurrency, Max: 100, LeaseTTL: time.Minute}
	window := admit.Rule{Name: "global-minute", Algorithm: admit.FixedWindow, Limit: 6000, Window: time.Minute}
	sliding := admit.Rule{Name: "global-sliding", Algorithm: admit.SlidingWindow, Limit: 6000, Window: time.Minute}
	// share is a class's share of the rule's rate (per second) or slots;
	// the greedy class asks for 100 times its share, the others for
	// light times theirs.
	tenants := func(rule admit.Rule, greedy, anon bool, light float64) []FairLoad {
		ls := make([]FairLoad, 10)
		for i := range ls {
			if rule.Algorithm == admit.Concurrency {
				ls[i] = FairLoad{Class: fmt.Sprintf("tenant-%d", i), Weight: 1, Hold: int64(light * float64(rule.Max) / 10)}
			} else {
				perSecond := float64(rule.Rate.N) / rule.Rate.Per.Seconds()
				if rule.Window > 0 {
					perSecond = float64(rule.Limit) / rule.Window.Seconds()
				}
				ls[i] = FairLoad{Class: fmt.Sprintf("tenant-%d", i), Weight: 1, Rate: light * perSecond / 10}
			}
		}
		if greedy {
			ls[0].Rate = 100 * ls[0].Rate / light
			if rule.Algorithm == admit.Concurrency {
				ls[0].Hold = 100 * rule.Max / 10
			}
		}
		if anon {
			ls[0].Class = "anonymous"
			for a := range 50 {
				ls[0].Subs = append(ls[0].Subs, fmt.Sprintf("203.0.113.%d", a))
			}
		}
		return ls
	}
	// weighted is four classes of weights 1 to 4, each asking twice its
	// weighted share of the rule's rate.
	weighted := func(rule admit.Rule) []FairLoad {
		perSecond := float64(rule.Rate.N) / rule.Rate.Per.Seconds()
		var ls []FairLoad
		for w := int64(1); w <= 4; w++ {
			ls = append(ls, FairLoad{Class: fmt.Sprintf("tenant-w%d", w), Weight: w, Rate: 2 * perSecond * float64(w) / 10})
		}
		return ls
	}
	const d = 60 * time.Second
	return []FairScenario{
		{Name: "bucket/one_at_100x", Rule: bucket, Duration: d, Loads: tenants(bucket, true, false, 0.5)},
		{Name: "bucket/anonymous_at_100x", Rule: bucket, Duration: d, Loads: tenants(bucket, true, true, 0.5)},
		{Name: "bucket/all_at_2x", Rule: bucket, Duration: d, Loads: tenants(bucket, false, false, 2)},
		{Name: "bucket/weighted_at_2x", Rule: bucket, Duration: d, Loads: weighted(bucket)},
		{Name: "acquire/one_at_100x", Rule: bucket, Duration: d, MaxWait: time.Second, Loads: tenants(bucket, true, false, 0.5)},
		{Name: "acquire/all_at_2x", Rule: bucket, Duration: d, MaxWait: time.Second, Loads: tenants(bucket, false, false, 2)},
		{Name: "fixed_window/one_at_100x", Rule: window, Duration: d, Loads: tenants(window, true, false, 0.5)},
		{Name: "fixed_window/all_at_2x", Rule: window, Duration: d, Loads: tenants(window, false, false, 2)},
		{Name: "sliding_window/one_at_100x", Rule: sliding, Duration: 2 * d, Loads: tenants(sliding, true, false, 0.5)},
		{Name: "sliding_window/all_at_2x", Rule: sliding, Duration: 2 * d, Loads: tenants(sliding, false, false, 2)},
		{Name: "concurrency/one_at_100x", Rule: slots, Duration: d, Loads: tenants(slots, true, false, 0.5)},
		{Name: "concurrency/anonymous_at_100x", Rule: slots, Duration: d, Loads: tenants(slots, true, true, 0.5)},
		{Name: "concurrency/all_at_2x", Rule: slots, Duration: d, Loads: tenants(slots, false, false, 2)},
	}
}

// RunFairShares runs FairScenarios against the stores newStores makes
// (sharing one state) and checks what the shares promise: the classes at
// half their share get at least 95 % of what they ask and the limit is
// used to at least 95 % (work-conserving; of a concurrency limit, 99 % of
// what the greedy class's share ceiling lets be held); classes all over
// their share each get their share within 10 %; and no tick passes the
// rule's bound.
func RunFairShares(t *testing.T, newStores func(t *testing.T, clock func() time.Time) []admit.Store) {
	RunFairScenarios(t, FairScenarios(), newStores)
}

// RunFairScenarios is RunFairShares for scenarios scs.
func RunFairScenarios(t *testing.T, scs []FairScenario, newStores func(t *testing.T, clock func() time.Time) []admit.Store) {
	for _, sc := range scs {
		t.Run(sc.Name, func(t *testing.T) {
			// Each scenario has a clock and state of its own: they run
			// together, waiting on the store's round trips together.
			t.Parallel()
			clock := NewClock()
			stores := newStores(t, clock.Now)
			rep, err := RunFairScenario(context.Background(), sc, stores, clock)
			if err != nil {
				t.Fatal(err)
			}
			t.Log(rep)
			CheckFairReport(t, sc, rep)
		})
	}
}

// CheckFairReport checks what the shares promise of rep, the report of
// sc: see RunFairShares.
func CheckFairReport(t testing.TB, sc FairScenario, rep FairReport) {
	t.Helper()
	if rep.Over > 0 {
		t.Errorf("admitted %d past the rule's bound", rep.Over)
	}
	conc := sc.Rule.Algorithm == admit.Concurrency
	greedy := sc.Loads[0].Rate > sc.Loads[1].Rate || sc.Loads[0].Hold > sc.Loads[1].Hold
	n := float64(len(sc.Loads))
	totalWeight := int64(0)
	for _, l := range sc.Loads {
		totalWeight += l.Weight
	}
	for i := range sc.Loads {
		switch {
		case greedy && i == 0:
		case greedy && conc:
			if want := 0.95 * float64(sc.Loads[i].Hold); rep.Held[i] < want {
				t.Errorf("class %d held %.2f slots on average; it wanted %d, at half its share", i, rep.Held[i], sc.Loads[i].Hold)
			}
		case greedy:
			if got, want := rep.Admitted[i], int64(0.95*float64(rep.Offered[i])); got < want {
				t.Errorf("class %d got %d of its %d requests, at half its share; want ≥ 95%%", i, got, rep.Offered[i])
			}
		case conc:
			share := float64(sc.Rule.Max) / n
			if got := rep.Held[i]; got < 0.9*share || got > 1.1*share {
				t.Errorf("class %d held %.2f slots on average; its share is %.1f (±10%%)", i, got, share)
			}
		default:
			share := float64(rep.Bound) * float64(sc.Loads[i].Weight) / float64(totalWeight)
			if got := float64(rep.Admitted[i]); got < 0.9*share || got > 1.1*share {
				t.Errorf("class %d (weight %d) got %.0f; its share is %.0f (±10%%)", i, sc.Loads[i].Weight, got, share)
			}
		}
	}
	if greedy && conc {
		// Slots: the greedy class holds at most its share ceiling (half
		// of the slots by default), the others what they want; all of
		// that, but for the moments a slot is between a release and the
		// next ask (a server refuses a full limit for up to a quarter of
		// a second on its own), is held.
		used, most := 0.0, 0.0
		for i, h := range rep.Held {
			used += h
			if i == 0 {
				most += float64(max(1, sc.Rule.Max/2))
			} else {
				most += float64(sc.Loads[i].Hold)
			}
		}
		most = min(most, float64(sc.Rule.Max))
		if used < 0.99*most {
			t.Errorf("the classes held %.2f slots of the %.0f the share ceiling lets be held: not work-conserving (want ≥ 99%%)", used, most)
		}
	} else if greedy {
		used := float64(rep.Total)
		if want := 0.95 * float64(rep.Bound); used < want-1e-6 {
			t.Errorf("the classes used %.0f of the rule's %d: not work-conserving (want ≥ 95%%)", used, rep.Bound)
		}
	}
}

// RunShareRenewals checks that a class holding more than its part of a
// shared concurrency limit yields when another class is owed slots: its
// renewals are refused (admit.CodeExhausted), so its leases end, while
// the classes within their parts renew; and that a class arriving later,
// refused while the limit is full, then gets the slots that end.
func RunShareRenewals(t *testing.T, newStore Factory) {
	clock := NewClock()
	s := newStore(t, clock.Now)
	ctx := context.Background()
	rule := &admit.Rule{Name: "shared-slots", Algorithm: admit.Concurrency, Max: 10, LeaseTTL: time.Minute}
	key := admit.Key{Scope: "global", Rule: rule.Name}.String()
	take := func(class string) admit.Decision {
		t.Helper()
		var d admit.Decision
		c := admit.Charge{Key: key, Rule: rule, Cost: 1, Share: &admit.Share{Class: class, Weight: 1}}
		if err := s.Decide(ctx, []admit.Charge{c}, &d); err != nil {
			t.Fatal(err)
		}
		return d
	}
	leases := map[string][]string{}
	for _, class := range []string{"a", "b"} {
		for i := range 5 {
			d := take(class)
			if !d.Allowed {
				t.Fatalf("%s's slot %d: %+v", class, i, d.Results)
			}
			leases[class] = append(leases[class], d.Lease.ID)
		}
	}
	// Full, and no one owed: everyone renews.
	clock.Set(10 * time.Second)
	for class, ids := range leases {
		if _, err := s.RenewLease(ctx, ids[0]); err != nil {
			t.Fatalf("%s renews with no one owed slots: %v", class, err)
		}
	}
	// c comes, is refused, and is owed its part: a and b, over theirs
	// now (a third each), yield their renewals.
	if d := take("c"); d.Allowed {
		t.Fatalf("c on a full limit: admitted")
	}
	for class, ids := range leases {
		_, err := s.RenewLease(ctx, ids[0])
		if admit.ErrorCode(err) != admit.CodeExhausted {
			t.Errorf("%s renews over its part while c is owed slots: %v, want exhausted", class, err)
		}
	}
	// a's lease ends (it was not renewed): c takes its slot.
	if err := s.ReleaseLease(ctx, leases["a"][1]); err != nil {
		t.Fatal(err)
	}
	if d := take("c"); !d.Allowed || d.Results[0].Share != admit.ShareAssured {
		t.Errorf("c after a slot ended: %+v", d.Results)
	}
}

// decideAll makes n decisions at once, as many servers' clients would, and
// returns them in order with the first error.
func decideAll(n int, decide func(j int) (admit.Decision, error)) ([]admit.Decision, error) {
	res := make([]admit.Decision, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for j := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res[j], errs[j] = decide(j)
		}()
	}
	wg.Wait()
	return res, errors.Join(errs...)
}
