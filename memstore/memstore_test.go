package memstore_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/admitdev/admit"
	"github.com/admitdev/admit/internal/bounds"
	"github.com/admitdev/admit/memstore"
	"github.com/admitdev/admit/storetest"
)

var (
	userRule   = &admit.Rule{Name: "user", Algorithm: admit.TokenBucket, Rate: admit.PerSecond(100), Burst: 50}
	tenantRule = &admit.Rule{Name: "tenant", Algorithm: admit.TokenBucket, Rate: admit.PerSecond(1000), Burst: 200}
	globalRule = &admit.Rule{Name: "global", Algorithm: admit.GCRA, Rate: admit.PerSecond(10000), Burst: 1000}
)

func hier3(user int) []admit.Charge {
	return []admit.Charge{
		{Key: fmt.Sprintf("user/%d", user), Rule: userRule, Cost: 1},
		{Key: fmt.Sprintf("tenant/%d", user%100), Rule: tenantRule, Cost: 1},
		{Key: "global", Rule: globalRule, Cost: 1},
	}
}

func TestDecideDoesNotAllocate(t *testing.T) {
	s := memstore.New(nil)
	defer s.Close()
	ctx := context.Background()
	one := hier3(1)[:1]
	three := hier3(2)
	var d admit.Decision
	_ = s.Decide(ctx, three, &d) // size d.Results once
	for name, c := range map[string][]admit.Charge{"one": one, "three": three} {
		if n := testing.AllocsPerRun(1000, func() { _ = s.Decide(ctx, c, &d) }); n != 0 {
			t.Errorf("%s charge(s): %v allocations per decision", name, n)
		}
	}
}

func TestExpiryAndSweep(t *testing.T) {
	clock := storetest.NewClock()
	s := memstore.New(&memstore.Options{Clock: clock.Now, SweepInterval: -1})
	defer s.Close()
	ctx := context.Background()
	var d admit.Decision
	for u := range 100 {
		if err := s.Decide(ctx, hier3(u), &d); err != nil || !d.Allowed {
			t.Fatalf("user %d: %v %+v", u, err, d)
		}
	}
	if got := s.Stats().Keys; got != 201 { // 100 users, 100 tenants, global
		t.Fatalf("keys = %d, want 201", got)
	}
	// A user bucket is full again 10ms after its one request, a tenant
	// bucket 1ms after its one, the global bucket 100 × 0.1ms after its
	// hundred. Sweeping in between keeps exactly the buckets not yet full.
	clock.Set(5 * time.Millisecond)
	s.Sweep()
	if got := s.Stats().Keys; got != 101 {
		t.Fatalf("after 5ms: keys = %d, want the 100 users and global", got)
	}
	clock.Set(10 * time.Millisecond)
	s.Sweep()
	if st := s.Stats(); st.Keys != 0 || st.Expirations != 201 {
		t.Fatalf("after 10ms: %+v", st)
	}
}

func TestMaxKeysEvicts(t *testing.T) {
	s := memstore.New(&memstore.Options{Shards: 1, MaxKeys: 100, SweepInterval: -1})
	defer s.Close()
	r := &admit.Rule{Name: "r", Algorithm: admit.TokenBucket, Rate: admit.Rate{N: 1, Per: time.Hour}, Burst: 10}
	var d admit.Decision
	for i := range 1000 {
		c := []admit.Charge{{Key: fmt.Sprint("k", i), Rule: r, Cost: 1}}
		if err := s.Decide(context.Background(), c, &d); err != nil || !d.Allowed {
			t.Fatalf("key %d: %v %+v", i, err, d)
		}
	}
	if st := s.Stats(); st.Keys != 100 || st.Evictions != 900 {
		t.Fatalf("stats %+v, want 100 keys and 900 evictions", st)
	}
}

func TestLeasesOutliveNothing(t *testing.T) {
	clock := storetest.NewClock()
	s := memstore.New(&memstore.Options{Clock: clock.Now, SweepInterval: -1})
	defer s.Close()
	r := &admit.Rule{Name: "exports", Algorithm: admit.Concurrency, Max: 2, LeaseTTL: time.Second}
	c := []admit.Charge{{Key: "tenant/acme", Rule: r, Cost: 1}}
	d, err := storetest.Check(context.Background(), s, c...)
	if err != nil || !d.Allowed || d.Lease.ID == "" || !d.Lease.ExpiresAt.Equal(storetest.Epoch.Add(time.Second)) {
		t.Fatalf("%v %+v", err, d)
	}
	// The holder dies: after its TTL the sweeper reclaims key and record.
	clock.Set(time.Second)
	s.Sweep()
	if st := s.Stats(); st.Keys != 0 || st.Leases != 0 {
		t.Fatalf("after expiry: %+v", st)
	}
}

func TestInvalidInput(t *testing.T) {
	s := memstore.New(nil)
	defer s.Close()
	ctx := context.Background()
	var d admit.Decision
	for name, c := range map[string][]admit.Charge{
		"nil rule":      {{Key: "k", Cost: 1}},
		"negative cost": {{Key: "k", Rule: userRule, Cost: -1}},
		"too many":      make([]admit.Charge, bounds.MaxCharges+1),
	} {
		if err := s.Decide(ctx, c, &d); admit.ErrorCode(err) != admit.CodeInvalid {
			t.Errorf("%s: %v, want invalid", name, err)
		}
	}
	if err := s.ReleaseLease(ctx, "nope"); admit.ErrorCode(err) != admit.CodeNotFound {
		t.Errorf("release unknown: %v", err)
	}
}

func TestCloseIdempotent(t *testing.T) {
	s := memstore.New(&memstore.Options{SweepInterval: time.Millisecond})
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() { defer wg.Done(); _ = s.Close() }()
	}
	wg.Wait()
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
}

func BenchmarkDecide(b *testing.B) {
	for _, keys := range []int{1_000, 1_000_000} {
		for _, n := range []int{1, 3} {
			b.Run(fmt.Sprintf("keys=%d/charges=%d", keys, n), func(b *testing.B) {
				s := memstore.New(nil)
				defer s.Close()
				charges := make([][]admit.Charge, keys)
				for i := range charges {
					charges[i] = hier3(i)[:n]
				}
				b.ReportAllocs()
				b.ResetTimer()
				b.RunParallel(func(pb *testing.PB) {
					var d admit.Decision
					i := 0
					for pb.Next() {
						i = (i + 7919) % keys
						_ = s.Decide(context.Background(), charges[i], &d)
					}
				})
			})
		}
	}
}

func BenchmarkDecideSerial(b *testing.B) {
	s := memstore.New(nil)
	defer s.Close()
	charges := make([][]admit.Charge, 1000)
	for i := range charges {
		charges[i] = hier3(i)[:1]
	}
	var d admit.Decision
	b.ReportAllocs()
	i := 0
	for range b.N {
		i = (i + 7919) % len(charges)
		_ = s.Decide(context.Background(), charges[i], &d)
	}
}

// An empty key would be one state every caller shares: an error, never a
// decision.
func TestEmptyKey(t *testing.T) {
	s := memstore.New(nil)
	defer s.Close()
	rule := &admit.Rule{Name: "r", Algorithm: admit.TokenBucket, Rate: admit.PerSecond(1), Burst: 1}
	for _, charges := range [][]admit.Charge{{{Rule: rule, Cost: 1}}, {{Key: "k", Rule: rule, Cost: 1}, {Rule: rule, Cost: 1}}} {
		var d admit.Decision
		err := s.Decide(context.Background(), charges, &d)
		if admit.ErrorCode(err) != admit.CodeInvalid || admit.ErrorField(err) != "key" || d.Allowed {
			t.Errorf("%d charges, one with an empty key: %v, allowed %v", len(charges), err, d.Allowed)
		}
	}
}
