package admit_test

import (
	"context"
	"fmt"
	"time"

	"github.com/admitdev/admit"
	"github.com/admitdev/admit/memstore"
	"github.com/admitdev/admit/storetest"
)

// Seed 002's hierarchy: a request passes only if the user's, the tenant's
// and the global bucket all admit it, and a refusal charges none of them.
func Example_hierarchy() {
	clock := storetest.NewClock() // a fixed instant, for repeatable output
	store := memstore.New(&memstore.Options{Clock: clock.Now})
	defer store.Close()

	user := &admit.Rule{Name: "user", Algorithm: admit.TokenBucket, Rate: admit.PerSecond(100), Burst: 50}
	tenant := &admit.Rule{Name: "tenant", Algorithm: admit.TokenBucket, Rate: admit.PerSecond(1000), Burst: 200}
	global := &admit.Rule{Name: "global", Algorithm: admit.TokenBucket, Rate: admit.PerSecond(10000), Burst: 1000}
	charges := func(u string, cost int64) []admit.Charge {
		return []admit.Charge{
			{Key: admit.Key{Scope: "user", Tenant: "acme", Subject: u}.String(), Rule: user, Cost: cost},
			{Key: admit.Key{Scope: "tenant", Tenant: "acme"}.String(), Rule: tenant, Cost: cost},
			{Key: admit.Key{Scope: "global"}.String(), Rule: global, Cost: cost},
		}
	}
	var d admit.Decision
	ctx := context.Background()
	_ = store.Decide(ctx, charges("alice", 50), &d)
	fmt.Println("alice takes 50:", d.Allowed, "remaining", d.Results[0].Remaining, d.Results[1].Remaining, d.Results[2].Remaining)
	_ = store.Decide(ctx, charges("alice", 1), &d)
	fmt.Println("alice takes 1 more:", d.Allowed, "denied by", d.DeniedBy, "retry after", d.RetryAfter)
	fmt.Println("tenant and global untouched:", d.Results[1].Remaining, d.Results[2].Remaining)
	// Output:
	// alice takes 50: true remaining 0 150 950
	// alice takes 1 more: false denied by user retry after 10ms
	// tenant and global untouched: 150 950
}

// A rule with a rate parsed from configuration syntax.
func ExampleParseRate() {
	r, err := admit.ParseRate("5/30s")
	fmt.Println(r.N, r.Per, r.Per/time.Duration(r.N), err)
	// Output: 5 30s 6s <nil>
}

// Reservations wait for tokens instead of being refused (seed 000).
func ExampleStore_reserve() {
	clock := storetest.NewClock()
	store := memstore.New(&memstore.Options{Clock: clock.Now})
	defer store.Close()
	docs := &admit.Rule{Name: "doc-summaries", Algorithm: admit.TokenBucket, Rate: admit.Rate{N: 10, Per: time.Minute}, Burst: 20}
	c := []admit.Charge{{Key: admit.Key{Scope: "tenant", Tenant: "t1234", Action: "invoke-doc-summary-ai"}.String(), Rule: docs, Cost: 20}}
	var d admit.Decision
	_ = store.Decide(context.Background(), c, &d)
	fmt.Println("claim 20 at once:", d.Allowed)
	c[0].Cost = 3
	r, _ := store.Reserve(context.Background(), c, time.Minute)
	fmt.Println("reserve 3 more: ok", r.OK, "wait", r.Wait)
	// Output:
	// claim 20 at once: true
	// reserve 3 more: ok true wait 18s
}

// A Limiter in two statements: a user's limit inside its tenant's, decided
// all or nothing.
func ExampleLimiter() {
	store := memstore.New(&memstore.Options{Clock: storetest.NewClock().Now}) // memstore.New(nil) outside tests
	defer store.Close()
	limiter, err := admit.NewLimiter(store,
		admit.Bucket("user", admit.PerSecond(1), 2).Per(admit.PerTenant, admit.PerUser),
		admit.Bucket("tenant", admit.PerSecond(10), 3).Per(admit.PerTenant),
	)
	if err != nil {
		panic(err)
	}
	ctx := context.Background()
	for _, user := range []string{"alice", "alice", "alice", "bob", "bob"} {
		d, err := limiter.Allow(ctx, admit.Who{Tenant: "acme", User: user})
		if err != nil {
			panic(err)
		}
		fmt.Println(user, d.Allowed, d.DeniedBy, d.RetryAfter)
	}
	_, err = limiter.Allow(ctx, admit.Who{User: "carol"})
	fmt.Println(err)
	// Output:
	// alice true  0s
	// alice true  0s
	// alice false user 1s
	// bob true  0s
	// bob false tenant 100ms
	// limit "user" is per tenant and the request's Who has no tenant
}

// A limit tenants share, divided fairly: each charge names its class of
// callers (Charge.Share). Alone, a class takes at most the share ceiling
// of the bucket (half, by default), so a class that comes later finds its
// part at once.
func Example_fairShare() {
	clock := storetest.NewClock()
	store := memstore.New(&memstore.Options{Clock: clock.Now})
	defer store.Close()

	global := &admit.Rule{Name: "global", Algorithm: admit.TokenBucket, Rate: admit.PerSecond(1), Burst: 100}
	take := func(class string) int {
		share := &admit.Share{Class: class, Weight: 1}
		var d admit.Decision
		n := 0
		for store.Decide(context.Background(), []admit.Charge{{Key: "global", Rule: global, Cost: 1, Share: share}}, &d) == nil && d.Allowed {
			n++
		}
		return n
	}
	fmt.Println("acme alone takes:", take("tenant:acme"))
	fmt.Println("globex, coming later, takes:", take("tenant:globex"))
	// Output:
	// acme alone takes: 50
	// globex, coming later, takes: 50
}

// A debit charges a cost known after the work, whether it fits or not: a
// bucket goes into debt, of at most MaxDebt (one burst by default), and
// refuses until it is repaid at its rate.
func ExampleRule_maxDebt() {
	clock := storetest.NewClock()
	store := memstore.New(&memstore.Options{Clock: clock.Now})
	defer store.Close()

	tokens := &admit.Rule{Name: "tokens", Algorithm: admit.TokenBucket, Rate: admit.PerSecond(10), Burst: 10, MaxDebt: 1000}
	var d admit.Decision
	ctx := context.Background()
	_ = store.Decide(ctx, []admit.Charge{{Key: "acme", Rule: tokens, Cost: 100, Debit: true}}, &d)
	fmt.Println("a debit of 100 from 10:", d.Allowed)
	_ = store.Decide(ctx, []admit.Charge{{Key: "acme", Rule: tokens, Cost: 1}}, &d)
	fmt.Println("the next check:", d.Allowed, "retry after", d.RetryAfter)
	// Output:
	// a debit of 100 from 10: true
	// the next check: false retry after 9.1s
}

// A cost known after the work, and what a client's address names: Debit
// charges it whether it fits or not, and says whether it did; an IP is
// the address it names, its port dropped.
func ExampleLimiter_Debit() {
	store := memstore.New(&memstore.Options{Clock: storetest.NewClock().Now})
	defer store.Close()
	limiter, err := admit.NewNamedLimiter(store, "llm",
		admit.Bucket("tokens", admit.PerSecond(100), 1000).Per(admit.PerIP).MaxDebt(100_000),
	)
	if err != nil {
		panic(err)
	}
	defer limiter.Close()
	ctx := context.Background()
	client := admit.Who{IP: "198.51.100.7:52114"} // r.RemoteAddr
	d, _ := limiter.Debit(ctx, client, 1500)      // the call took 1,500 tokens
	fmt.Println("fitted:", d.Allowed, "wait:", d.RetryAfter)
	d, _ = limiter.Allow(ctx, admit.Who{IP: "::ffff:198.51.100.7"}) // the same client
	fmt.Println("next:", d.Allowed, d.DeniedBy)
	// Output:
	// fitted: false wait: 5.01s
	// next: false tokens
}

// Waiting instead of being refused, as x/time/rate's Wait does: each call
// blocks until the limits admit it, or the context ends. Here the third
// call waits about a millisecond for its token.
func ExampleLimiter_Wait() {
	store := memstore.New(nil)
	defer store.Close()
	limiter, err := admit.NewLimiter(store, admit.Bucket("calls", admit.PerSecond(1000), 2).Per(admit.PerTenant))
	if err != nil {
		panic(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for i := range 3 {
		if _, err := limiter.Wait(ctx, admit.Who{Tenant: "acme"}); err != nil {
			fmt.Println("call", i+1, err)
			continue
		}
		fmt.Println("call", i+1, "admitted")
	}
	// A cost no limit ever holds can never be admitted.
	_, err = limiter.WaitN(ctx, admit.Who{Tenant: "acme"}, 5)
	fmt.Println(admit.ErrorCode(err))
	// Output:
	// call 1 admitted
	// call 2 admitted
	// call 3 admitted
	// invalid
}
