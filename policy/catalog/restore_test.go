package catalog

import (
	"context"
	"encoding/json"
	"errors"
	"sync"
	"testing"

	"github.com/admitdev/admit/policy"
)

// sharedStore is a Store shared by several catalogs, as one Redis
// is, that can lose what it holds.
type sharedStore struct {
	mu    sync.Mutex
	saved []byte // JSON, as Redis keeps it; nil: empty
}

func (s *sharedStore) Load(ctx context.Context) (*Changes, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.saved == nil {
		return &Changes{Version: 1}, nil
	}
	var ch Changes
	err := json.Unmarshal(s.saved, &ch)
	return &ch, err
}

func (s *sharedStore) Save(ctx context.Context, ch *Changes) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	var rev int64
	if s.saved != nil {
		var cur Changes
		if err := json.Unmarshal(s.saved, &cur); err != nil {
			return err
		}
		rev = cur.Revision
	}
	if rev != ch.Base {
		return ErrStale
	}
	b, err := json.Marshal(ch)
	s.saved = b
	return err
}

// lose empties the store: a Redis restarted without persistence.
func (s *sharedStore) lose() {
	s.mu.Lock()
	s.saved = nil
	s.mu.Unlock()
}

// snapshot returns what the store holds now; restore puts it back: a
// Redis restarted from an older snapshot.
func (s *sharedStore) snapshot() []byte {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.saved
}

func (s *sharedStore) restore(b []byte) {
	s.mu.Lock()
	s.saved = b
	s.mu.Unlock()
}

func mustCatalog(t *testing.T, store Store) *Catalog {
	t.Helper()
	c, err := New(context.Background(), spec(), store)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestCatalogNeverGoesBack: a store that loses what it holds (emptied, or
// restored from an older snapshot) is restored from the servers' copies,
// and no server's older copy undoes a change acknowledged after it: a
// revoked key stays revoked, a new tenant stays, a deleted one stays
// deleted. (A server paused over a Redis restart once saved its older
// copy back over the newer catalog, as a higher revision than the
// restored one.)
func TestCatalogNeverGoesBack(t *testing.T) {
	ctx := context.Background()
	setup := func(t *testing.T) (store *sharedStore, a, b *Catalog, old, kept string) {
		store = &sharedStore{}
		a, b = mustCatalog(t, store), mustCatalog(t, store)
		var err error
		if old, err = a.CreateAPIKey(ctx, "acme"); err != nil {
			t.Fatal(err)
		}
		if kept, err = a.CreateAPIKey(ctx, "acme"); err != nil {
			t.Fatal(err)
		}
		if _, err := a.PutTenant(ctx, "pad-1", policy.TenantSpec{Tier: "free"}); err != nil {
			t.Fatal(err)
		}
		if err := b.Refresh(ctx); err != nil { // b has seen it all, then pauses
			t.Fatal(err)
		}
		return store, a, b, old, kept
	}
	// after makes the changes acknowledged after the loss, on a.
	after := func(t *testing.T, a *Catalog, old string) {
		t.Helper()
		if err := a.RevokeAPIKey(ctx, "acme", APIKeyID(policy.HashKey(old))); err != nil {
			t.Fatal(err)
		}
		if _, err := a.PutTenant(ctx, "new1", policy.TenantSpec{Tier: "free"}); err != nil {
			t.Fatal(err)
		}
		if err := a.DeleteTenant(ctx, "pad-1"); err != nil {
			t.Fatal(err)
		}
	}
	check := func(t *testing.T, cs map[string]*Catalog, old, kept string) {
		t.Helper()
		for name, c := range cs {
			p := c.Policy()
			if p.TenantByKey(old) != nil {
				t.Errorf("server %s: the revoked key finds its tenant again", name)
			}
			if tn := p.TenantByKey(kept); tn == nil || tn.ID != "acme" {
				t.Errorf("server %s: acme's other key is lost", name)
			}
			if p.Tenant("new1") == nil {
				t.Errorf("server %s: tenant new1, created after the loss, is gone", name)
			}
			if p.Tenant("pad-1") != nil {
				t.Errorf("server %s: tenant pad-1, deleted after the loss, is back", name)
			}
			if p.Tenant("beta") == nil {
				t.Errorf("server %s: the configuration's tenant beta is gone", name)
			}
		}
	}

	t.Run("emptied, a paused server resumes", func(t *testing.T) {
		store, a, b, old, kept := setup(t)
		store.lose()
		if n, err := a.Sync(ctx); err != nil || n == 0 {
			t.Fatalf("a's sync over an empty store: restored %d, %v; want its entries back", n, err)
		}
		after(t, a, old)
		if n, err := b.Sync(ctx); err != nil || n != 0 {
			t.Fatalf("b's sync after the restore: restored %d, %v; want 0: it holds nothing newer", n, err)
		}
		check(t, map[string]*Catalog{"a": a, "b": b, "restarted": mustCatalog(t, store)}, old, kept)
	})
	t.Run("emptied, the paused server restores first", func(t *testing.T) {
		store, a, b, old, kept := setup(t)
		// Another change b missed: a tier, on a.
		if _, err := a.PutTier(ctx, "team", spec().Tiers["free"]); err != nil {
			t.Fatal(err)
		}
		store.lose()
		if _, err := b.Sync(ctx); err != nil { // b's copy lacks tier team
			t.Fatal(err)
		}
		after(t, a, old) // a's edit finds b's restore, and adds team back
		if err := b.Refresh(ctx); err != nil {
			t.Fatal(err)
		}
		check(t, map[string]*Catalog{"a": a, "b": b}, old, kept)
		for name, c := range map[string]*Catalog{"a": a, "b": b} {
			if c.Policy().Tier("team") == nil {
				t.Errorf("server %s: tier team, which only a had seen before the loss, is lost", name)
			}
		}
	})
	t.Run("back to an older snapshot", func(t *testing.T) {
		store, a, b, old, kept := setup(t)
		snap := store.snapshot()
		after(t, a, old)
		if err := b.Refresh(ctx); err != nil {
			t.Fatal(err)
		}
		store.restore(snap) // Redis restarted from an RDB taken before
		for _, c := range []*Catalog{b, a} {
			if _, err := c.Sync(ctx); err != nil {
				t.Fatal(err)
			}
		}
		check(t, map[string]*Catalog{"a": a, "b": b, "restarted": mustCatalog(t, store)}, old, kept)
	})
	t.Run("concurrent restores and edits", func(t *testing.T) {
		store, a, b, old, kept := setup(t)
		store.lose()
		var wg sync.WaitGroup
		errs := make(chan error, 2)
		wg.Add(2)
		go func() { defer wg.Done(); _, err := b.Sync(ctx); errs <- err }()
		go func() { defer wg.Done(); _, err := a.Sync(ctx); errs <- err }()
		wg.Wait()
		for range 2 {
			if err := <-errs; err != nil && !errors.Is(err, ErrStale) {
				t.Fatal(err)
			}
		}
		after(t, a, old)
		if err := b.Refresh(ctx); err != nil {
			t.Fatal(err)
		}
		check(t, map[string]*Catalog{"a": a, "b": b}, old, kept)
	})
}

// TestCatalogKeysMerge: API keys merge as sets, a revocation winning: a
// key revoked on a server whose copy alone holds it, while another server
// writes the tenant on a copy from before, stays revoked once the first
// is back (the later write of the whole entry won, and brought the
// revoked key back for good); a key created on one side is not lost to a
// later write of the tenant on the other; and two servers that each
// revoked one of a tenant's two keys leave it locked, not open.
func TestCatalogKeysMerge(t *testing.T) {
	ctx := context.Background()
	store := &sharedStore{}
	a, b := mustCatalog(t, store), mustCatalog(t, store)
	k1, err := a.CreateAPIKey(ctx, "acme")
	if err != nil {
		t.Fatal(err)
	}
	k2, err := a.CreateAPIKey(ctx, "acme")
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	// a is paused; b revokes k1; the store loses it all; b is paused.
	if err := b.RevokeAPIKey(ctx, "acme", APIKeyID(policy.HashKey(k1))); err != nil {
		t.Fatal(err)
	}
	store.lose()
	if _, err := a.Sync(ctx); err != nil { // a restores its copy: k1 in it
		t.Fatal(err)
	}
	k3, err := a.CreateAPIKey(ctx, "acme") // a later write of acme, on that copy
	if err != nil {
		t.Fatal(err)
	}
	if n, err := b.Sync(ctx); err != nil || n == 0 { // b is back
		t.Fatalf("b's sync: %d restored, %v; want its revocation merged back", n, err)
	}
	if err := a.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	for name, c := range map[string]*Catalog{"a": a, "b": b, "restarted": mustCatalog(t, store)} {
		p := c.Policy()
		if p.TenantByKey(k1) != nil {
			t.Errorf("server %s: the revoked key k1 finds acme again", name)
		}
		for _, k := range []string{k2, k3} {
			if tn := p.TenantByKey(k); tn == nil || tn.ID != "acme" {
				t.Errorf("server %s: a key of acme never revoked is lost", name)
			}
		}
	}

	// A key created on b, lost by the store (an older snapshot), and a
	// later write of acme on a: the key comes back with b.
	snap := store.snapshot()
	k4, err := b.CreateAPIKey(ctx, "acme")
	if err != nil {
		t.Fatal(err)
	}
	store.restore(snap)
	if _, err := a.PutTenant(ctx, "acme", policy.TenantSpec{Tier: "free", Weight: 3}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	if err := a.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	for name, c := range map[string]*Catalog{"a": a, "b": b} {
		p := c.Policy()
		if tn := p.TenantByKey(k4); tn == nil || tn.ID != "acme" {
			t.Errorf("server %s: k4, created on b and lost by the store, is gone", name)
		}
		if p.Tenant("acme").Spec.Weight != 3 {
			t.Errorf("server %s: a's later write of acme (weight 3) is lost", name)
		}
	}

	// Two revocations made apart: each server revokes one of beta's two
	// keys while the store has lost the catalog.
	b1, _ := a.CreateAPIKey(ctx, "beta")
	b2, _ := a.CreateAPIKey(ctx, "beta")
	if err := b.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	store.lose()
	if err := a.RevokeAPIKey(ctx, "beta", APIKeyID(policy.HashKey(b1))); err != nil {
		t.Fatal(err)
	}
	store.lose()
	if err := b.RevokeAPIKey(ctx, "beta", APIKeyID(policy.HashKey(b2))); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	if err := b.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	for name, c := range map[string]*Catalog{"a": a, "b": b} {
		p := c.Policy()
		beta := p.Tenant("beta")
		if p.TenantByKey(b1) != nil || p.TenantByKey(b2) != nil || beta == nil || len(beta.Spec.APIKeysSHA256) == 0 {
			t.Errorf("server %s: beta, both its keys revoked apart, is %+v: want it kept needing a key it cannot have", name, beta)
		}
	}
	// A new key opens it again, the lock gone.
	b3, err := a.CreateAPIKey(ctx, "beta")
	if err != nil {
		t.Fatal(err)
	}
	if tn := a.Policy().TenantByKey(b3); tn == nil || len(tn.Spec.APIKeysSHA256) != 1 {
		t.Errorf("beta after a new key: %+v, want that key alone", tn)
	}
}
