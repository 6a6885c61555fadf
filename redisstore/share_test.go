package redisstore_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/admitdev/admit"
	"github.com/admitdev/admit/internal/engine"
	"github.com/admitdev/admit/memstore"
	"github.com/admitdev/admit/redisstore"
	"github.com/admitdev/admit/redistest"
	"github.com/admitdev/admit/storetest"
)

// TestSharesMatchMemstore decides 4,000 random charges of shared limits —
// every algorithm, classes of several weights, anonymous callers from a
// few addresses, debits, peeks, leases taken and released — through two
// Redis stores in turn and through the memory store, and checks that each
// decision is the same: admitted or not, and how its share decided it.
// The library (internal/exact/lua) mirrors admit.DecideShare. The stores decide
// every charge in Redis (ExactRefusals): a refusal kept locally counts no
// class active meanwhile, which the memory store does, so the decisions that
// follow may differ (TestFairShares measures what the shares give then).
func TestSharesMatchMemstore(t *testing.T) {
	srv := redistest.Start(t)
	clock := storetest.NewClock()
	var servers [2]*redisstore.Store
	for i := range servers {
		servers[i] = redisstore.New(dial(t, "redis://"+srv.Addr).Client(), &redisstore.Options{Clock: clock.Now, Timeout: 10 * time.Second, Prefix: "sharetwin:", ExactRefusals: true})
		defer servers[i].Close()
	}
	ms := memstore.New(&memstore.Options{Clock: clock.Now})
	defer ms.Close()
	rules := []*admit.Rule{
		{Name: "bucket", Algorithm: admit.TokenBucket, Rate: admit.PerSecond(40), Burst: 20},
		{Name: "odd", Algorithm: admit.TokenBucket, Rate: admit.Rate{N: 7, Per: 3 * time.Second}, Burst: 9, ShareCeiling: 6},
		{Name: "gcra", Algorithm: admit.GCRA, Rate: admit.PerSecond(25), Burst: 8},
		{Name: "fixed", Algorithm: admit.FixedWindow, Limit: 40, Window: time.Second},
		{Name: "sliding", Algorithm: admit.SlidingWindow, Limit: 40, Window: time.Second},
		{Name: "log", Algorithm: admit.SlidingLog, Limit: 30, Window: time.Second},
		{Name: "quota", Algorithm: admit.Quota, Limit: 300, Period: admit.Day},
		{Name: "combo", Algorithm: admit.Combination, Floor: admit.PerSecond(10), Rate: admit.PerSecond(10), Burst: 10},
		{Name: "slots", Algorithm: admit.Concurrency, Max: 6, LeaseTTL: time.Second},
	}
	shares := []admit.Share{
		{Class: "tenant:a", Weight: 1}, {Class: "tenant:b", Weight: 3}, {Class: "tenant:c", Weight: 1},
		{Class: "anonymous", Weight: 2, Sub: "192.0.2.1"}, {Class: "anonymous", Weight: 2, Sub: "192.0.2.2"},
	}
	rng := rand.New(rand.NewPCG(3, 4))
	ctx := context.Background()
	type held struct{ redis, mem string }
	var leases []held
	at := time.Duration(0)
	var got, want admit.Decision
	paths := map[admit.SharePath]int{}
	for i := range 4000 {
		at += time.Duration(rng.IntN(12)) * time.Millisecond
		clock.Set(at)
		r := rules[rng.IntN(len(rules))]
		sh := shares[rng.IntN(len(shares))]
		c := admit.Charge{Key: admit.Key{Scope: "global", Rule: r.Name}.String(), Rule: r, Cost: 1 + int64(rng.IntN(3)), Share: &sh}
		switch k := rng.IntN(20); {
		case k == 0:
			c.Cost = 0
		case k == 1 && engine.CheckDebit(r, 0) == nil:
			c.Debit, c.Cost = true, 1+int64(rng.IntN(10))
		case k == 2 && r.Algorithm != admit.Concurrency:
			// Up to the ceiling: classes that take their parts, and
			// more, at once.
			c.Cost = 1 + int64(rng.IntN(int(r.Capacity()/2)))
		}
		s := servers[i%2]
		if err := s.Decide(ctx, []admit.Charge{c}, &got); err != nil {
			t.Fatalf("decision %d: %v", i, err)
		}
		if err := ms.Decide(ctx, []admit.Charge{c}, &want); err != nil {
			t.Fatalf("decision %d: %v", i, err)
		}
		g, w := got.Results[0], want.Results[0]
		if got.Allowed != want.Allowed || g.Share != w.Share {
			t.Fatalf("decision %d at %v (%s, %s/%s, cost %d, debit %v): allowed %v by %q, memstore %v by %q (%+v, memstore %+v)",
				i, at, r.Name, sh.Class, sh.Sub, c.Cost, c.Debit, got.Allowed, g.Share, want.Allowed, w.Share, g, w)
		}
		if g.Remaining != w.Remaining || g.Shared != w.Shared || g.ShareWhole != w.ShareWhole {
			t.Fatalf("decision %d at %v (%s, %s/%s, cost %d): remaining %d of the share, %d of the rule, whole %v; memstore %d, %d, %v",
				i, at, r.Name, sh.Class, sh.Sub, c.Cost, g.Remaining, g.Shared, g.ShareWhole, w.Remaining, w.Shared, w.ShareWhole)
		}
		if d := g.RetryAfter - w.RetryAfter; w.Share == admit.ShareRefused && (d < -time.Microsecond || d > time.Microsecond) {
			t.Fatalf("decision %d at %v (%s, %s/%s, cost %d): a share's refusal waits %v, memstore %v", i, at, r.Name, sh.Class, sh.Sub, c.Cost, g.RetryAfter, w.RetryAfter)
		}
		paths[w.Share]++
		if got.Lease.ID != "" {
			leases = append(leases, held{got.Lease.ID, want.Lease.ID})
		}
		if len(leases) > 0 && rng.IntN(3) == 0 {
			k := rng.IntN(len(leases))
			_ = s.ReleaseLease(ctx, leases[k].redis)
			_ = ms.ReleaseLease(ctx, leases[k].mem)
			leases = append(leases[:k], leases[k+1:]...)
		}
	}
	t.Log(fmt.Sprint(paths))
	if paths[admit.ShareAssured] < 500 || paths[admit.ShareBorrowed] < 100 || paths[admit.ShareRefused] < 100 {
		t.Errorf("paths %v: the sequence does not test every way a share decides", paths)
	}
}
