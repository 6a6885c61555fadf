package storetest

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/admitdev/admit"
)

// Hammer settings: bounded in time and goroutines, so the suite stays fast
// on a two-core machine and against a remote store.
const (
	hammerGoroutines = 16
	hammerFor        = 400 * time.Millisecond
)

// RunConcurrency hammers single keys from many goroutines and checks each
// algorithm's admission bounds: with the real clock the upper bounds and
// the lower bounds the decisions themselves imply, with the store's clock
// stopped the exact counts.
func RunConcurrency(t *testing.T, newStore Factory) {
	t.Run("token_bucket", func(t *testing.T) {
		testBucketBound(t, newStore(t, nil), admit.TokenBucket, true)
	})
	t.Run("gcra", func(t *testing.T) {
		testBucketBound(t, newStore(t, nil), admit.GCRA, true)
	})
	t.Run("windows", func(t *testing.T) { testWindowBounds(t, newStore(t, nil), allWindows, true) })
	t.Run("hierarchy", func(t *testing.T) { testHierarchyBound(t, newStore(t, nil), true) })
	t.Run("concurrency_leases", func(t *testing.T) { testLeaseBound(t, newStore(t, nil)) })
	t.Run("stopped_clock", func(t *testing.T) { testStoppedClockExact(t, newStore) })
	t.Run("lease_slots", func(t *testing.T) { testLeaseSlotsExact(t, newStore(t, nil)) })
}

// RunUpperBounds hammers single keys from many goroutines with the real
// clock and checks only that nothing is admitted past its limit: token
// buckets, GCRA, a fixed window and a three-level hierarchy of buckets.
// It is the suite of a store that may refuse while capacity is held
// elsewhere — a region of limits held across regions, whose units wait
// in its pool and at home — and so keeps no promise of how soon it
// admits, only of how much.
func RunUpperBounds(t *testing.T, newStore Factory) {
	t.Run("token_bucket", func(t *testing.T) {
		testBucketBound(t, newStore(t, nil), admit.TokenBucket, false)
	})
	t.Run("gcra", func(t *testing.T) {
		testBucketBound(t, newStore(t, nil), admit.GCRA, false)
	})
	t.Run("fixed_window", func(t *testing.T) { testWindowBounds(t, newStore(t, nil), fixedWindowOnly, false) })
	t.Run("hierarchy", func(t *testing.T) { testHierarchyBound(t, newStore(t, nil), false) })
}

// The real-clock tests above check upper bounds, which hold however the
// scheduler runs the goroutines, and lower bounds that follow from the
// decisions themselves (a refusal means the bucket was spent). How much of
// a bound a loaded machine manages to use is not asserted: that is the
// scheduler's, not the store's. The exact counts come from the tests
// below, whose clock is stopped.

// exactAttempts is how many decisions the stopped-clock tests make, from
// hammerGoroutines goroutines: several times every limit they test.
const exactAttempts = 1600

// hammerN runs decide exactly n times from hammerGoroutines goroutines.
func hammerN(t *testing.T, n int, decide func(d *admit.Decision) error) {
	t.Helper()
	var wg sync.WaitGroup
	var next atomic.Int64
	var failed atomic.Value
	for range hammerGoroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var d admit.Decision
			for next.Add(1) <= int64(n) {
				if err := decide(&d); err != nil {
					failed.Store(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	if err, _ := failed.Load().(error); err != nil {
		t.Fatalf("decide: %v", err)
	}
}

// testStoppedClockExact hammers single keys from many goroutines with the
// store's clock stopped, so nothing refills: every algorithm admits exactly
// its limit, and a hierarchy exactly what its tightest level allows,
// however the goroutines interleave.
func testStoppedClockExact(t *testing.T, newStore Factory) {
	// Slow rates and long windows: a store may expire idle keys on its own
	// wall clock (Redis's PEXPIRE), which no stopped clock stops; these
	// keys outlive the test by hours.
	perHour := func(n int64) admit.Rate { return admit.Rate{N: n, Per: time.Hour} }
	rules := []*admit.Rule{
		{Name: "tb", Algorithm: admit.TokenBucket, Rate: perHour(20), Burst: 100},
		{Name: "gcra", Algorithm: admit.GCRA, Rate: perHour(20), Burst: 100},
		{Name: "fixed", Algorithm: admit.FixedWindow, Limit: 100, Window: time.Hour},
		{Name: "sliding", Algorithm: admit.SlidingWindow, Limit: 100, Window: time.Hour},
		{Name: "log", Algorithm: admit.SlidingLog, Limit: 100, Window: time.Hour},
		{Name: "combo", Algorithm: admit.Combination, Floor: perHour(30), Rate: perHour(1), Burst: 70},
	}
	for _, r := range rules {
		t.Run(r.Name, func(t *testing.T) {
			clock := NewClock()
			s := newStore(t, clock.Now)
			c := []admit.Charge{{Key: "exact-" + r.Name, Rule: r, Cost: 1}}
			var admitted atomic.Int64
			hammerN(t, exactAttempts, func(d *admit.Decision) error {
				err := s.Decide(context.Background(), c, d)
				if err == nil && d.Allowed {
					admitted.Add(1)
				}
				return err
			})
			if got, want := admitted.Load(), r.Capacity(); got != want {
				t.Errorf("admitted %d of %d attempts with the clock stopped, want exactly %d", got, exactAttempts, want)
			}
		})
	}
	t.Run("hierarchy", func(t *testing.T) {
		clock := NewClock()
		s := newStore(t, clock.Now)
		user := &admit.Rule{Name: "user", Algorithm: admit.TokenBucket, Rate: perHour(5), Burst: 25}
		tenant := &admit.Rule{Name: "tenant", Algorithm: admit.TokenBucket, Rate: perHour(10), Burst: 80}
		global := &admit.Rule{Name: "global", Algorithm: admit.TokenBucket, Rate: perHour(100), Burst: 1000}
		const users = 4
		var perUser [users]atomic.Int64
		var next atomic.Int64
		hammerN(t, exactAttempts, func(d *admit.Decision) error {
			u := int(next.Add(1)) % users
			err := s.Decide(context.Background(), hierarchyCharges(u, user, tenant, global), d)
			if err == nil && d.Allowed {
				perUser[u].Add(1)
			}
			return err
		})
		// The users could take 4 × 25 = 100; the tenant's 80 binds, and
		// all or nothing leaves no user past its own 25.
		total := int64(0)
		for u := range perUser {
			got := perUser[u].Load()
			total += got
			if got > user.Burst {
				t.Errorf("user %d admitted %d > %d", u, got, user.Burst)
			}
		}
		if total != tenant.Burst {
			t.Errorf("the tenant admitted %d with the clock stopped, want exactly %d", total, tenant.Burst)
		}
	})
}

// testLeaseSlotsExact: more holders than slots ask at once, each keeping
// what it gets until all have asked: exactly Max are admitted.
func testLeaseSlotsExact(t *testing.T, s admit.Store) {
	r := &admit.Rule{Name: "slots", Algorithm: admit.Concurrency, Max: 3, LeaseTTL: time.Minute}
	c := []admit.Charge{{Key: "exact-leases", Rule: r, Cost: 1}}
	var mu sync.Mutex
	var leases []string
	hammerN(t, 40, func(d *admit.Decision) error {
		if err := s.Decide(context.Background(), c, d); err != nil || !d.Allowed {
			return err
		}
		mu.Lock()
		leases = append(leases, d.Lease.ID)
		mu.Unlock()
		return nil
	})
	if int64(len(leases)) != r.Max {
		t.Errorf("%d leases held at once after 40 attempts, want exactly %d", len(leases), r.Max)
	}
	for _, id := range leases {
		if err := s.ReleaseLease(context.Background(), id); err != nil {
			t.Error(err)
		}
	}
}

// hammer runs decide from hammerGoroutines goroutines until hammerFor has
// passed, and returns the interval that contains every decision.
func hammer(t *testing.T, decide func(d *admit.Decision) error) (start, end time.Time) {
	t.Helper()
	var wg sync.WaitGroup
	var failed atomic.Value
	start = time.Now()
	deadline := start.Add(hammerFor)
	for range hammerGoroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var d admit.Decision
			for time.Now().Before(deadline) {
				if err := decide(&d); err != nil {
					failed.Store(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	end = time.Now()
	if err, _ := failed.Load().(error); err != nil {
		t.Fatalf("decide: %v", err)
	}
	return start, end
}

// bucketBound is the most a bucket of rate and burst can admit in elapsed:
// burst + floor(elapsed / T).
func bucketBound(rate admit.Rate, burst int64, elapsed time.Duration) int64 {
	return burst + int64(elapsed)*rate.N/int64(rate.Per)
}

// checkSpentBeforeRefused asserts the lower bound that follows from the
// decisions alone: a bucket that starts full refuses only once its burst
// is spent, so a run that saw a refusal admitted at least the burst.
func checkSpentBeforeRefused(t *testing.T, what string, admitted, refused, burst int64) {
	t.Helper()
	if refused > 0 && admitted < burst {
		t.Errorf("%s: refused %d requests having admitted only %d; the first refusal comes after the burst of %d", what, refused, admitted, burst)
	}
}

// testBucketBound hammers one bucket of algorithm a; with lower, a
// refusal must come after the burst was admitted.
func testBucketBound(t *testing.T, s admit.Store, a admit.Algorithm, lower bool) {
	r := &admit.Rule{Name: "hammer", Algorithm: a, Rate: admit.PerSecond(2000), Burst: 100}
	c := []admit.Charge{{Key: "hammer-" + a.String(), Rule: r, Cost: 1}}
	var admitted, refused atomic.Int64
	start, end := hammer(t, func(d *admit.Decision) error {
		err := s.Decide(context.Background(), c, d)
		switch {
		case err != nil:
		case d.Allowed:
			admitted.Add(1)
		default:
			refused.Add(1)
		}
		return err
	})
	bound := bucketBound(r.Rate, r.Burst, end.Sub(start))
	got := admitted.Load()
	t.Logf("admitted %d of a possible %d in %v", got, bound, end.Sub(start))
	if got > bound {
		t.Errorf("admitted %d > burst + rate × elapsed = %d", got, bound)
	}
	if lower {
		checkSpentBeforeRefused(t, a.String(), got, refused.Load(), r.Burst)
	}
}

// The windows testWindowBounds hammers: all three, or the fixed one.
const (
	allWindows      = 3
	fixedWindowOnly = 1
)

// testWindowBounds hammers the first n of a fixed window, a sliding one
// and a sliding log; with lower, a refusal must come after a window's
// limit was admitted.
func testWindowBounds(t *testing.T, s admit.Store, n int, lower bool) {
	const window = 100 * time.Millisecond
	rules := []*admit.Rule{
		{Name: "fixed", Algorithm: admit.FixedWindow, Limit: 100, Window: window},
		{Name: "sliding", Algorithm: admit.SlidingWindow, Limit: 100, Window: window},
		{Name: "log", Algorithm: admit.SlidingLog, Limit: 100, Window: window},
	}[:n]
	counts := make([]atomic.Int64, len(rules))
	refusals := make([]atomic.Int64, len(rules))
	start, end := hammer(t, func(d *admit.Decision) error {
		for i, r := range rules {
			err := s.Decide(context.Background(), []admit.Charge{{Key: "hammer-" + r.Name, Rule: r, Cost: 1}}, d)
			if err != nil {
				return err
			}
			if d.Allowed {
				counts[i].Add(1)
			} else {
				refusals[i].Add(1)
			}
		}
		return nil
	})
	// Fixed and sliding counters never count past the limit within one
	// aligned window; a log never holds more than the limit within any
	// interval of one window's length.
	aligned := (end.UnixNano()/int64(window) - start.UnixNano()/int64(window) + 1) * 100
	spans := (int64(end.Sub(start)) + int64(window) - 1) / int64(window) * 100
	for i, bound := range []int64{aligned, aligned, spans}[:n] {
		got := counts[i].Load()
		t.Logf("%s: admitted %d, bound %d", rules[i].Name, got, bound)
		if got > bound {
			t.Errorf("%s: admitted %d > %d", rules[i].Name, got, bound)
		}
		// A refusal means a window held the limit: at least that many
		// were admitted.
		if lower {
			checkSpentBeforeRefused(t, rules[i].Name, got, refusals[i].Load(), rules[i].Limit)
		}
	}
}

// hierarchyCharges returns the three-scope charges of user u of tenant acme:
// its user bucket, the tenant's and the global one (its own slot in
// Cluster).
func hierarchyCharges(u int, user, tenant, global *admit.Rule) []admit.Charge {
	return []admit.Charge{
		{Key: admit.Key{Scope: "user", Tenant: "acme", Subject: string(rune('a' + u))}.String(), Rule: user, Cost: 1},
		{Key: admit.Key{Scope: "tenant", Tenant: "acme"}.String(), Rule: tenant, Cost: 1},
		{Key: admit.Key{Scope: "global"}.String(), Rule: global, Cost: 1},
	}
}

// testHierarchyBound runs the three-scope shape: users of one tenant share the
// tenant's bucket; no user passes its own bound and the users together
// never pass the tenant's; with lower, the tenant refuses only after its
// burst was admitted.
func testHierarchyBound(t *testing.T, s admit.Store, lower bool) {
	user := &admit.Rule{Name: "user", Algorithm: admit.TokenBucket, Rate: admit.PerSecond(500), Burst: 25}
	tenant := &admit.Rule{Name: "tenant", Algorithm: admit.TokenBucket, Rate: admit.PerSecond(1000), Burst: 100}
	global := &admit.Rule{Name: "global", Algorithm: admit.TokenBucket, Rate: admit.PerSecond(100000), Burst: 1000}
	const users = 4
	var perUser [users]atomic.Int64
	var next atomic.Int64
	var tenantRefused atomic.Int64 // decisions whose tenant charge refused
	start, end := hammer(t, func(d *admit.Decision) error {
		u := int(next.Add(1)) % users
		err := s.Decide(context.Background(), hierarchyCharges(u, user, tenant, global), d)
		if err == nil && d.Allowed {
			perUser[u].Add(1)
		} else if err == nil && !d.Results[1].Allowed {
			tenantRefused.Add(1)
		}
		return err
	})
	elapsed := end.Sub(start)
	total := int64(0)
	for u := range perUser {
		got := perUser[u].Load()
		total += got
		if b := bucketBound(user.Rate, user.Burst, elapsed); got > b {
			t.Errorf("user %d admitted %d > %d", u, got, b)
		}
	}
	bound := bucketBound(tenant.Rate, tenant.Burst, elapsed)
	t.Logf("tenant admitted %d of a possible %d", total, bound)
	if total > bound {
		t.Errorf("tenant admitted %d > %d", total, bound)
	}
	if lower {
		checkSpentBeforeRefused(t, "tenant", total, tenantRefused.Load(), tenant.Burst)
	}
}

func testLeaseBound(t *testing.T, s admit.Store) {
	r := &admit.Rule{Name: "exports", Algorithm: admit.Concurrency, Max: 3, LeaseTTL: time.Minute}
	c := []admit.Charge{{Key: "hammer-leases", Rule: r, Cost: 1}}
	var held, peak, acquired atomic.Int64
	hammer(t, func(d *admit.Decision) error {
		if err := s.Decide(context.Background(), c, d); err != nil || !d.Allowed {
			return err
		}
		acquired.Add(1)
		n := held.Add(1)
		for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
		}
		time.Sleep(50 * time.Microsecond) // hold it, so that holders overlap
		held.Add(-1)                      // before the release, so held never under-counts
		return s.ReleaseLease(context.Background(), d.Lease.ID)
	})
	t.Logf("%d leases acquired, at most %d held at once", acquired.Load(), peak.Load())
	if peak.Load() > r.Max {
		t.Errorf("%d leases held at once, max %d", peak.Load(), r.Max)
	}
}
