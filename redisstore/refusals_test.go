package redisstore_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/admitdev/admit"
	"github.com/admitdev/admit/memstore"
	"github.com/admitdev/admit/redisstore"
	"github.com/admitdev/admit/redistest"
	"github.com/admitdev/admit/storetest"
)

// TestLocalRefusals checks that a key Redis refused is refused without a
// call until the time Redis gave, and only until then; that a rule
// change, a smaller cost and a reset are sent; and that a debit is always
// sent.
func TestLocalRefusals(t *testing.T) {
	srv := redistest.Start(t)
	clock := storetest.NewClock()
	s := redisstore.New(dial(t, "redis://"+srv.Addr).Client(), &redisstore.Options{Clock: clock.Now, Timeout: 10 * time.Second, Prefix: "refuse:"})
	defer s.Close()
	ctx := context.Background()
	window := &admit.Rule{Name: "w", Algorithm: admit.FixedWindow, Limit: 5, Window: time.Minute}
	user := &admit.Rule{Name: "u", Algorithm: admit.TokenBucket, Rate: admit.PerSecond(100), Burst: 100}
	charges := func(r *admit.Rule, cost int64) []admit.Charge {
		return []admit.Charge{
			{Key: "user:acme:bob", Rule: user, Cost: 1},
			{Key: "tenant:acme", Rule: r, Cost: cost},
		}
	}
	var d admit.Decision
	decide := func(cs []admit.Charge) (bool, int64) {
		t.Helper()
		before := s.Health().Calls
		if err := s.Decide(ctx, cs, &d); err != nil {
			t.Fatal(err)
		}
		return d.Allowed, s.Health().Calls - before
	}
	for i := range 5 {
		if ok, _ := decide(charges(window, 1)); !ok {
			t.Fatalf("decision %d refused", i)
		}
	}
	if ok, calls := decide(charges(window, 1)); ok || calls != 1 {
		t.Fatalf("6th decision: allowed %v after %d calls, want a refusal from Redis", ok, calls)
	}
	clock.Set(30 * time.Second)
	for i := range 100 {
		ok, calls := decide(charges(window, 1))
		if ok || calls != 0 {
			t.Fatalf("refusal %d: allowed %v after %d calls, want a local refusal", i, ok, calls)
		}
	}
	if d.DeniedBy != "w" || d.RetryAfter != 30*time.Second || d.Results[1].RetryAfter != 30*time.Second {
		t.Errorf("local refusal: denied by %q, retry %v (charge %v), want w, 30s", d.DeniedBy, d.RetryAfter, d.Results[1].RetryAfter)
	}
	if h := s.Health(); h.LocalRefusals != 100 {
		t.Errorf("LocalRefusals = %d, want 100", h.LocalRefusals)
	}
	// A larger cost is refused locally too; a debit is sent, and applied.
	if _, calls := decide(charges(window, 3)); calls != 0 {
		t.Errorf("cost 3: %d calls, want 0", calls)
	}
	debit := charges(window, 2)
	debit[1].Debit = true
	if _, calls := decide(debit); calls != 1 {
		t.Errorf("debit: %d calls, want 1", calls)
	}
	// A changed rule is another rule: asked of Redis.
	changed := *window
	changed.Limit = 20
	if ok, calls := decide(charges(&changed, 1)); !ok || calls != 1 {
		t.Errorf("changed rule: allowed %v after %d calls, want admitted by Redis", ok, calls)
	}
	// The window ends: the key is asked again, and admits.
	clock.Set(time.Minute)
	if ok, calls := decide(charges(window, 1)); !ok || calls != 1 {
		t.Errorf("next window: allowed %v after %d calls, want admitted by Redis", ok, calls)
	}
	// A reset forgets the refusal with the state.
	for range 5 {
		decide(charges(window, 1))
	}
	if ok, calls := decide(charges(window, 1)); ok || calls != 0 {
		t.Fatalf("full window: allowed %v after %d calls, want a local refusal", ok, calls)
	}
	if err := s.Reset(ctx, charges(window, 1)[1:]); err != nil {
		t.Fatal(err)
	}
	if ok, calls := decide(charges(window, 1)); !ok || calls != 1 {
		t.Errorf("after reset: allowed %v after %d calls, want admitted by Redis", ok, calls)
	}
}

// TestLocalRefusalsMatchMemstore runs random hierarchical decisions over
// every algorithm that is refused locally, alternating between two
// stores (two servers) on one Redis, on a clock that moves in random
// steps, and checks that every decision is allowed or refused exactly as
// the memory store decides the same sequence, while most refusals make no
// call.
func TestLocalRefusalsMatchMemstore(t *testing.T) {
	srv := redistest.Start(t)
	clock := storetest.NewClock()
	var servers [2]*redisstore.Store
	for i := range servers {
		servers[i] = redisstore.New(dial(t, "redis://"+srv.Addr).Client(), &redisstore.Options{Clock: clock.Now, Timeout: 10 * time.Second, Prefix: "twin:"})
		defer servers[i].Close()
	}
	ms := memstore.New(&memstore.Options{Clock: clock.Now})
	defer ms.Close()
	rules := []*admit.Rule{
		{Name: "bucket", Algorithm: admit.TokenBucket, Rate: admit.PerSecond(20), Burst: 10},
		{Name: "odd", Algorithm: admit.TokenBucket, Rate: admit.Rate{N: 7, Per: 3 * time.Second}, Burst: 4},
		{Name: "gcra", Algorithm: admit.GCRA, Rate: admit.PerSecond(5), Burst: 3},
		{Name: "fixed", Algorithm: admit.FixedWindow, Limit: 8, Window: time.Second},
		{Name: "sliding", Algorithm: admit.SlidingWindow, Limit: 8, Window: time.Second},
		{Name: "log", Algorithm: admit.SlidingLog, Limit: 6, Window: time.Second},
	}
	tenant := &admit.Rule{Name: "tenant", Algorithm: admit.TokenBucket, Rate: admit.PerSecond(30), Burst: 15}
	rng := rand.New(rand.NewPCG(1, 2))
	ctx := context.Background()
	var got, want admit.Decision
	refusals := 0
	var calls0 int64
	for _, s := range servers {
		calls0 += s.Health().Calls
	}
	at := time.Duration(0)
	for i := range 3000 {
		at += time.Duration(rng.IntN(20)) * time.Millisecond
		clock.Set(at)
		r := rules[rng.IntN(len(rules))]
		user := fmt.Sprintf("user:%d", rng.IntN(3))
		cs := []admit.Charge{
			{Key: user + ":" + r.Name, Rule: r, Cost: 1 + int64(rng.IntN(2))},
			{Key: "tenant", Rule: tenant, Cost: 1},
		}
		s := servers[i%2]
		if err := s.Decide(ctx, cs, &got); err != nil {
			t.Fatal(err)
		}
		if err := ms.Decide(ctx, cs, &want); err != nil {
			t.Fatal(err)
		}
		if got.Allowed != want.Allowed {
			t.Fatalf("decision %d at %v (%s, cost %d): allowed %v, memstore %v (%+v)", i, at, r.Name, cs[0].Cost, got.Allowed, want.Allowed, want.Results)
		}
		if !got.Allowed {
			refusals++
		}
	}
	var local, calls int64
	for _, s := range servers {
		local += s.Health().LocalRefusals
		calls += s.Health().Calls
	}
	t.Logf("3000 decisions, %d refused, %d of them locally, %d calls", refusals, local, calls-calls0)
	if refusals < 500 || local < int64(refusals)/5 {
		t.Errorf("%d refusals, %d local: the sequence does not test local refusals", refusals, local)
	}
}

// TestLocalRefusalsBounded drives more keys over their limits than the
// store remembers refusals for: the store keeps at most its bound, and
// the keys past it are still refused, by Redis.
func TestLocalRefusalsBounded(t *testing.T) {
	defer redisstore.SetMaxRefusals(50)()
	srv := redistest.Start(t)
	clock := storetest.NewClock()
	s := redisstore.New(dial(t, "redis://"+srv.Addr).Client(), &redisstore.Options{Clock: clock.Now, Timeout: 10 * time.Second, Prefix: "bound:"})
	defer s.Close()
	r := &admit.Rule{Name: "w", Algorithm: admit.FixedWindow, Limit: 1, Window: time.Minute}
	ctx := context.Background()
	var d admit.Decision
	for k := range 200 {
		cs := []admit.Charge{{Key: fmt.Sprintf("k%d", k), Rule: r, Cost: 1}}
		for j := range 3 {
			if err := s.Decide(ctx, cs, &d); err != nil {
				t.Fatal(err)
			}
			if d.Allowed != (j == 0) {
				t.Fatalf("key %d decision %d: allowed %v", k, j, d.Allowed)
			}
		}
	}
	if n := redisstore.Refusals(s); n != 50 {
		t.Errorf("the store remembers %d refusals, want its bound, 50", n)
	}
	// The first 50 keys' third decisions were local; the others' not.
	if h := s.Health(); h.LocalRefusals != 50 {
		t.Errorf("LocalRefusals = %d, want 50", h.LocalRefusals)
	}
}

// TestLocalConcurrencyRefusals: a full concurrency limit is refused
// without a call for 250 ms at most, and not a moment longer once a lease
// on it is released through the same store; a share's refusal (a class at
// its ceiling) likewise, by the class's own release; outside Cluster, where
// one record holds a decision's every key.
func TestLocalConcurrencyRefusals(t *testing.T) {
	srv := redistest.Start(t)
	clock := storetest.NewClock()
	s := redisstore.New(dial(t, "redis://"+srv.Addr).Client(), &redisstore.Options{Clock: clock.Now, Timeout: 10 * time.Second, Prefix: "concrefuse:"})
	defer s.Close()
	ctx := context.Background()
	slots := &admit.Rule{Name: "slots", Algorithm: admit.Concurrency, Max: 2, LeaseTTL: time.Hour}
	tenant := &admit.Rule{Name: "t", Algorithm: admit.Concurrency, Max: 100, LeaseTTL: time.Hour}
	share := &admit.Share{Class: "tenant:a", Weight: 1}
	dry := false
	decide := func(shared bool) (admit.Decision, int64) {
		t.Helper()
		c := []admit.Charge{{Key: admit.Key{Scope: "tenant", Tenant: "a", Rule: "t"}.String(), Rule: tenant, Cost: 1}, {Key: "global-slots", Rule: slots, Cost: 1}}
		if shared {
			c[1].Share = share
		}
		c[0].DryRun, c[1].DryRun = dry, dry
		before := s.Health().Calls
		var d admit.Decision
		if err := s.Decide(ctx, c, &d); err != nil {
			t.Fatal(err)
		}
		return d, s.Health().Calls - before
	}
	for _, shared := range []bool{false, true} {
		// Unshared: two slots, then full. Shared, alone: the ceiling, 1.
		n := 2
		if shared {
			n = 1
		}
		var held []string
		for range n {
			d, _ := decide(shared)
			if !d.Allowed {
				t.Fatalf("shared %v: a lease refused: %+v", shared, d.Results)
			}
			held = append(held, d.Lease.ID)
		}
		first, calls := decide(shared)
		if first.Allowed || calls != 1 {
			t.Fatalf("shared %v: over the limit: allowed %v after %d calls", shared, first.Allowed, calls)
		}
		// Refused here, with the wait Redis gave (a lease's expiry, an
		// hour away; the share's turn, seconds away), not the local
		// hold's 250 ms.
		if d, calls := decide(shared); d.Allowed || calls != 0 || d.RetryAfter != first.RetryAfter || d.RetryAfter <= 250*time.Millisecond {
			t.Fatalf("shared %v: again: allowed %v, retry after %v (Redis said %v), after %d calls; want a local refusal with Redis's wait", shared, d.Allowed, d.RetryAfter, first.RetryAfter, calls)
		}
		// A dry run is answered as the decision it mirrors would be.
		dry = true
		if d, calls := decide(shared); d.Allowed || calls != 0 || d.RetryAfter != first.RetryAfter {
			t.Fatalf("shared %v: a dry run: allowed %v, retry after %v, after %d calls; want the decision's answer", shared, d.Allowed, d.RetryAfter, calls)
		}
		dry = false
		clock.Set(clock.Now().Sub(storetest.Epoch) + 251*time.Millisecond)
		if d, calls := decide(shared); d.Allowed || calls != 1 {
			t.Fatalf("shared %v: after 251 ms: allowed %v after %d calls, want Redis's refusal", shared, d.Allowed, calls)
		}
		if err := s.ReleaseLease(ctx, held[0]); err != nil {
			t.Fatal(err)
		}
		if d, _ := decide(shared); !d.Allowed {
			t.Fatalf("shared %v: after a release: refused %+v", shared, d.Results)
		} else {
			held[0] = d.Lease.ID
		}
		for _, id := range held {
			if err := s.ReleaseLease(ctx, id); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// TestLocalRefusalAfterDebit: a debit into a key refused here moves its
// wait; the refusal remembered before it is dropped, so that the next
// decision answers the new wait, as Redis (and a dry run) would, not the
// old one.
func TestLocalRefusalAfterDebit(t *testing.T) {
	srv := redistest.Start(t)
	clock := storetest.NewClock()
	s := redisstore.New(dial(t, "redis://"+srv.Addr).Client(), &redisstore.Options{Clock: clock.Now, Timeout: 10 * time.Second, Prefix: "debitrefuse:"})
	defer s.Close()
	ctx := context.Background()
	llm := &admit.Rule{Name: "llm", Algorithm: admit.TokenBucket, Rate: admit.PerSecond(1), Burst: 10, MaxDebt: 1000}
	decide := func(cost int64, debit, dry bool) admit.Decision {
		t.Helper()
		var d admit.Decision
		if err := s.Decide(ctx, []admit.Charge{{Key: "tenant:acme", Rule: llm, Cost: cost, Debit: debit, DryRun: dry}}, &d); err != nil {
			t.Fatal(err)
		}
		return d
	}
	decide(10, false, false)
	if d := decide(1, false, false); d.Allowed || d.RetryAfter != time.Second {
		t.Fatalf("the empty bucket: %+v, want refused for 1s", d)
	}
	decide(600, true, false) // 600 tokens of debt: 10 minutes more
	d := decide(1, false, false)
	peek := decide(1, false, true)
	if d.Allowed || d.RetryAfter != peek.RetryAfter || d.RetryAfter < 10*time.Minute {
		t.Fatalf("after a debit of 600: refused for %v, a dry run says %v; want the debt's wait (over 10 minutes) from both", d.RetryAfter, peek.RetryAfter)
	}
}
