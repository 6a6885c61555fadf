// Package changestest is the conformance suite of catalog.Store: the
// behaviour every implementation must have, run on each of them.
package changestest

import (
	"context"
	"encoding/json"
	"errors"
	"testing"

	"github.com/admitdev/admit/policy"
	"github.com/admitdev/admit/policy/catalog"
)

// Options describe the store under test.
type Options struct {
	// Shared is whether several servers share the store, which must then
	// refuse a save not made on the revision it holds.
	Shared bool
}

// Run runs the suite; open returns an empty store, closed when the test
// ends. With opts.Shared, open is called twice per test and both stores
// must hold the same changes, as two servers of one deployment.
func Run(t *testing.T, open func(t *testing.T) (a, b catalog.Store), opts Options) {
	ctx := context.Background()
	burst := int64(3)
	first := &catalog.Changes{
		Version: 1, Revision: 1,
		Tenants: map[string]*catalog.TenantChange{
			"acme": {TenantSpec: policy.TenantSpec{Tier: "pro", APIKeysSHA256: []string{"0123abcd"}, Overrides: []policy.RuleSpec{{Name: "user", Burst: &burst}}}},
			"gone": {Deleted: true},
		},
		Tiers: map[string]*policy.TierSpec{
			"pro": {Rules: []policy.RuleSpec{{Name: "user", Scope: "user", Algorithm: "token_bucket", Rate: "10/s", Burst: &burst}}},
		},
		Written: map[string]int64{"tenants/acme": 1, "tenants/gone": 1, "tiers/pro": 1},
	}

	t.Run("empty", func(t *testing.T) {
		a, _ := open(t)
		got, err := a.Load(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if got.Version != 1 || got.Revision != 0 || len(got.Tenants) != 0 || len(got.Tiers) != 0 {
			t.Errorf("an empty store loads %+v, want version 1 and nothing else", got)
		}
	})

	t.Run("round trip", func(t *testing.T) {
		a, b := open(t)
		if err := a.Save(ctx, first); err != nil {
			t.Fatal(err)
		}
		same(t, load(t, b), first)
		second := *first
		second.Base, second.Revision = 1, 2
		second.Tenants = map[string]*catalog.TenantChange{"acme": {TenantSpec: policy.TenantSpec{Tier: "free"}}}
		if err := b.Save(ctx, &second); err != nil {
			t.Fatal(err)
		}
		same(t, load(t, a), &second) // replaced, not merged
	})

	if !opts.Shared {
		return
	}
	t.Run("stale saves are refused", func(t *testing.T) {
		a, b := open(t)
		if err := a.Save(ctx, first); err != nil {
			t.Fatal(err)
		}
		// b saves revision 20 on 1; a, which has not seen it, saves its
		// own revision 30 on 1: refused, and b's stays.
		fromB := *first
		fromB.Base, fromB.Revision = 1, 20
		fromB.Tiers = nil
		if err := b.Save(ctx, &fromB); err != nil {
			t.Fatal(err)
		}
		fromA := *first
		fromA.Base, fromA.Revision = 1, 30
		fromA.Tenants = nil
		if err := a.Save(ctx, &fromA); !errors.Is(err, catalog.ErrStale) {
			t.Fatalf("a save over a revision it has not seen: %v, want ErrStale", err)
		}
		same(t, load(t, a), &fromB)
		// Made on a revision the store never held: as stale.
		fromA.Base = 25
		if err := a.Save(ctx, &fromA); !errors.Is(err, catalog.ErrStale) {
			t.Fatalf("a save made on revision 25 over 20: %v, want ErrStale", err)
		}
		fromA.Base = 20
		if err := a.Save(ctx, &fromA); err != nil {
			t.Fatalf("the save made on the revision held: %v", err)
		}
		same(t, load(t, b), &fromA)
	})
}

func load(t *testing.T, s catalog.Store) *catalog.Changes {
	t.Helper()
	c, err := s.Load(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// same compares changes as they are saved: as JSON.
func same(t *testing.T, got, want *catalog.Changes) {
	t.Helper()
	g, _ := json.Marshal(got)
	w, _ := json.Marshal(want)
	if string(g) != string(w) {
		t.Errorf("loaded %s\nwant   %s", g, w)
	}
}
