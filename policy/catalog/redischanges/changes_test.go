package redischanges_test

import (
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/admitdev/admit/policy"
	"github.com/admitdev/admit/policy/catalog"
	"github.com/admitdev/admit/policy/catalog/changestest"
	"github.com/admitdev/admit/policy/catalog/redischanges"
	"github.com/admitdev/admit/redisstore"
	"github.com/admitdev/admit/redistest"
)

func catalogSpec() *policy.Spec {
	burst := int64(5)
	return &policy.Spec{
		Tiers: map[string]policy.TierSpec{
			"free": {Rules: []policy.RuleSpec{{Name: "user", Scope: "user", Algorithm: "token_bucket", Rate: "10/s", Burst: &burst}}},
			"pro":  {Rules: []policy.RuleSpec{{Name: "user", Scope: "user", Algorithm: "token_bucket", Rate: "100/s", Burst: &burst}}},
		},
		Tenants: map[string]policy.TenantSpec{"acme": {Tier: "free"}},
	}
}

// TestSharedCatalog: two servers' catalogs on one Redis. A change made
// through one reaches the other within a second; concurrent changes are
// never lost; everything survives both servers restarting.
func TestSharedCatalog(t *testing.T) {
	srv := redistest.Start(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	open := func() (*catalog.Catalog, *redischanges.Store) {
		s, err := redisstore.Open(ctx, "redis://"+srv.Addr, &redisstore.Options{Timeout: 10 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		cs := redischanges.New(s)
		c, err := catalog.New(ctx, catalogSpec(), cs)
		if err != nil {
			t.Fatal(err)
		}
		// A long poll, so that only the pub/sub message can be fast.
		go cs.Watch(ctx, time.Hour, func() error { return c.Refresh(ctx) })
		return c, cs
	}
	a, _ := open()
	b, _ := open()
	time.Sleep(100 * time.Millisecond) // let both subscriptions start

	start := time.Now()
	if _, err := a.PutTenant(ctx, "globex", policy.TenantSpec{Tier: "pro"}); err != nil {
		t.Fatal(err)
	}
	// Pub/sub brings it in milliseconds; the bound leaves room for a
	// loaded machine's scheduler.
	for b.Policy().Tenant("globex") == nil {
		if time.Since(start) > 5*time.Second {
			t.Fatal("server b did not see server a's new tenant within 5s")
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Logf("server b saw the change after %v", time.Since(start))

	// Both edit at once, neither having seen the other's change: both land.
	errc := make(chan error, 2)
	go func() { _, err := a.PutTenant(ctx, "initech", policy.TenantSpec{Tier: "free"}); errc <- err }()
	go func() { _, err := b.PutTier(ctx, "team", catalogSpec().Tiers["pro"]); errc <- err }()
	for range 2 {
		if err := <-errc; err != nil {
			t.Fatal(err)
		}
	}
	key, err := b.CreateAPIKey(ctx, "acme")
	if err != nil {
		t.Fatal(err)
	}

	// Every server restarts: the changes are in Redis.
	c, cs := open()
	p := c.Policy()
	if p.Tenant("globex") == nil || p.Tenant("initech") == nil || p.Tier("team") == nil {
		t.Fatalf("after restart: tenants %v, tier team %v", p.Tenants(), p.Tier("team"))
	}
	if tn := p.TenantByKey(key); tn == nil || tn.ID != "acme" {
		t.Fatalf("the API key does not find its tenant after restart")
	}

	// A save on top of an old revision is refused.
	old, err := cs.Load(ctx)
	if err != nil {
		t.Fatal(err)
	}
	old.Base, old.Revision = old.Revision-1, old.Revision+1 // as a server that missed the last save would
	if err := cs.Save(ctx, old); !errors.Is(err, catalog.ErrStale) {
		t.Fatalf("stale save: %v, want ErrStale", err)
	}
}

func TestConformance(t *testing.T) {
	srv := redistest.Start(t)
	prefixes := 0
	changestest.Run(t, func(t *testing.T) (a, b catalog.Store) {
		prefixes++ // each test its own, empty catalog
		prefix := "conf" + strconv.Itoa(prefixes) + ":"
		server := func() catalog.Store {
			s, err := redisstore.Open(context.Background(), "redis://"+srv.Addr, &redisstore.Options{Prefix: prefix})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { s.Close() })
			return redischanges.New(s)
		}
		return server(), server()
	}, changestest.Options{Shared: true})
}
