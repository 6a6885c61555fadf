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

// RunConcurrency hammers single keys from many goroutines with the real
// clock and checks the exact admission bounds of each algorithm.
func RunConcurrency(t *testing.T, newStore Factory) {
	t.Run("token_bucket", func(t *testing.T) {
		testBucketBound(t, newStore(t, nil), admit.TokenBucket)
	})
	t.Run("gcra", func(t *testing.T) {
		testBucketBound(t, newStore(t, nil), admit.GCRA)
	})
	t.Run("windows", func(t *testing.T) { testWindowBounds(t, newStore(t, nil)) })
	t.Run("hierarchy", func(t *testing.T) { testHierarchyBound(t, newStore(t, nil)) })
	t.Run("concurrency_leases", func(t *testing.T) { testLeaseBound(t, newStore(t, nil)) })
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

// checkSupplyUsed asserts the lower bound: when demand exceeded supply
// (at least twice as many attempts as the bound), at least 95% of the
// bound was admitted. A machine too starved to create that demand cannot
// test it, and says so.
func checkSupplyUsed(t *testing.T, admitted, attempts, bound int64) {
	t.Helper()
	if attempts < 2*bound {
		t.Logf("only %d attempts for a bound of %d: demand did not exceed supply, lower bound not checked", attempts, bound)
		return
	}
	if float64(admitted) < 0.95*float64(bound) {
		t.Errorf("admitted %d < 95%% of %d although %d attempts were made", admitted, bound, attempts)
	}
}

func testBucketBound(t *testing.T, s admit.Store, a admit.Algorithm) {
	r := &admit.Rule{Name: "hammer", Algorithm: a, Rate: admit.PerSecond(2000), Burst: 100}
	c := []admit.Charge{{Key: "hammer-" + a.String(), Rule: r, Cost: 1}}
	var admitted, attempts atomic.Int64
	start, end := hammer(t, func(d *admit.Decision) error {
		attempts.Add(1)
		err := s.Decide(context.Background(), c, d)
		if err == nil && d.Allowed {
			admitted.Add(1)
		}
		return err
	})
	bound := bucketBound(r.Rate, r.Burst, end.Sub(start))
	got := admitted.Load()
	t.Logf("admitted %d of a possible %d in %v", got, bound, end.Sub(start))
	if got > bound {
		t.Errorf("admitted %d > burst + rate × elapsed = %d", got, bound)
	}
	checkSupplyUsed(t, got, attempts.Load(), bound)
}

func testWindowBounds(t *testing.T, s admit.Store) {
	const window = 100 * time.Millisecond
	rules := []*admit.Rule{
		{Name: "fixed", Algorithm: admit.FixedWindow, Limit: 100, Window: window},
		{Name: "sliding", Algorithm: admit.SlidingWindow, Limit: 100, Window: window},
		{Name: "log", Algorithm: admit.SlidingLog, Limit: 100, Window: window},
	}
	counts := make([]atomic.Int64, len(rules))
	start, end := hammer(t, func(d *admit.Decision) error {
		for i, r := range rules {
			err := s.Decide(context.Background(), []admit.Charge{{Key: "hammer-" + r.Name, Rule: r, Cost: 1}}, d)
			if err != nil {
				return err
			}
			if d.Allowed {
				counts[i].Add(1)
			}
		}
		return nil
	})
	// Fixed and sliding counters never count past the limit within one
	// aligned window; a log never holds more than the limit within any
	// interval of one window's length.
	aligned := (end.UnixNano()/int64(window) - start.UnixNano()/int64(window) + 1) * 100
	spans := (int64(end.Sub(start)) + int64(window) - 1) / int64(window) * 100
	for i, bound := range []int64{aligned, aligned, spans} {
		got := counts[i].Load()
		t.Logf("%s: admitted %d, bound %d", rules[i].Name, got, bound)
		if got > bound {
			t.Errorf("%s: admitted %d > %d", rules[i].Name, got, bound)
		}
		if got < bound/2 {
			t.Errorf("%s: admitted only %d of %d", rules[i].Name, got, bound)
		}
	}
}

// testHierarchyBound runs seed 002's shape: users of one tenant share the
// tenant's bucket; no user passes its own bound and the users together
// never pass the tenant's.
func testHierarchyBound(t *testing.T, s admit.Store) {
	user := &admit.Rule{Name: "user", Algorithm: admit.TokenBucket, Rate: admit.PerSecond(500), Burst: 25}
	tenant := &admit.Rule{Name: "tenant", Algorithm: admit.TokenBucket, Rate: admit.PerSecond(1000), Burst: 100}
	global := &admit.Rule{Name: "global", Algorithm: admit.TokenBucket, Rate: admit.PerSecond(100000), Burst: 1000}
	const users = 4
	var perUser [users]atomic.Int64
	var next atomic.Int64 // also the number of attempts
	start, end := hammer(t, func(d *admit.Decision) error {
		u := int(next.Add(1)) % users
		c := []admit.Charge{
			{Key: admit.Key{Scope: "user", Tenant: "acme", Subject: string(rune('a' + u))}.String(), Rule: user, Cost: 1},
			{Key: admit.Key{Scope: "tenant", Tenant: "acme"}.String(), Rule: tenant, Cost: 1},
			{Key: admit.Key{Scope: "global"}.String(), Rule: global, Cost: 1},
		}
		err := s.Decide(context.Background(), c, d)
		if err == nil && d.Allowed {
			perUser[u].Add(1)
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
	checkSupplyUsed(t, total, next.Load(), bound)
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
	if peak.Load() < r.Max {
		t.Errorf("at most %d leases held at once although %d goroutines wanted one", peak.Load(), hammerGoroutines)
	}
}
