package catalog

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/admitdev/admit/policy"
)

func n(v int64) *int64 { return &v }

func spec() *policy.Spec {
	return &policy.Spec{
		Global: []policy.RuleSpec{{Name: "g", Scope: "global", Algorithm: "gcra", Rate: "100/s", Burst: n(10)},
			{Name: "per-ip", Scope: "ip", Algorithm: "fixed_window", Limit: n(5), Window: "1m"}},
		Tiers: map[string]policy.TierSpec{
			"free": {Rules: []policy.RuleSpec{
				{Name: "user", Scope: "user", Algorithm: "token_bucket", Rate: "10/s", Burst: n(5)},
				{Name: "search", Scope: "user", Actions: []string{"search", "find"}, PerAction: true, Algorithm: "token_bucket", Rate: "1/s", Burst: n(2)},
				{Name: "keyed", Scope: "api_key", Algorithm: "sliding_window", Limit: n(3), Window: "1s"},
				{Name: "region", Scope: "attribute:region", Algorithm: "sliding_log", Limit: n(3), Window: "1s"},
				{Name: "jobs", Scope: "tenant", Actions: []string{"job"}, Algorithm: "concurrency", Max: n(2)},
			}},
		},
		Tenants: map[string]policy.TenantSpec{
			"acme": {Tier: "free", Overrides: []policy.RuleSpec{{Name: "user", Burst: n(50)}}},
			"beta": {Tier: "free"},
		},
	}
}

func TestCatalogPersistsAndSurvivesFailedWrites(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "data", "catalog.json")
	c, err := New(ctx, spec(), &FileStore{Path: path})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.PutTenant(ctx, "newco", policy.TenantSpec{Tier: "free"}); err != nil {
		t.Fatal(err)
	}
	key, err := c.CreateAPIKey(ctx, "newco")
	if err != nil {
		t.Fatal(err)
	}
	if err := c.DeleteTenant(ctx, "beta"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.PutTier(ctx, "free", policy.TierSpec{Rules: []policy.RuleSpec{{Name: "user", Scope: "user", Algorithm: "gcra", Rate: "1/s", Burst: n(9)}}}); err != nil {
		t.Fatal(err)
	}
	raw, _ := os.ReadFile(path)
	if strings.Contains(string(raw), key) {
		t.Fatal("the catalog file holds an API key in clear")
	}

	// A crash mid-write: a half-written temporary file next to the catalog,
	// and a write that fails half-way. Neither may change what loads.
	if err := os.WriteFile(filepath.Join(filepath.Dir(path), ".catalog-123.tmp"), raw[:len(raw)/2], 0o600); err != nil {
		t.Fatal(err)
	}
	writeFile = func(f *os.File, b []byte) (int, error) {
		n, _ := f.Write(b[:len(b)/2])
		return n, errors.New("disk full")
	}
	_, err = c.PutTenant(ctx, "doomed", policy.TenantSpec{Tier: "free"})
	writeFile = func(f *os.File, b []byte) (int, error) { return f.Write(b) }
	if err == nil {
		t.Fatal("a failed write was reported as saved")
	}
	if c.Policy().Tenant("doomed") != nil {
		t.Error("a change that was not saved took effect")
	}

	// A restart: the same configuration, the saved changes.
	c2, err := New(ctx, spec(), &FileStore{Path: path})
	if err != nil {
		t.Fatal(err)
	}
	p := c2.Policy()
	switch {
	case p.Tenant("newco") == nil || p.Tenant("newco").Source != "admin":
		t.Error("created tenant lost")
	case p.TenantByKey(key) != p.Tenant("newco"):
		t.Error("API key lost")
	case p.Tenant("beta") != nil:
		t.Error("deleted tenant is back")
	case p.Tenant("doomed") != nil:
		t.Error("unsaved tenant appeared")
	case p.Tier("free").Rules[0].Burst != 9 || p.Tier("free").Source != "admin":
		t.Error("tier change lost")
	case p.Tenant("acme").Rules[0].Burst != 50:
		t.Error("config tenant's override lost")
	}

	// A reload that conflicts with the changes is refused; the policy stays.
	bad := spec()
	bad.Global = []policy.RuleSpec{{Name: "user", Scope: "global", Algorithm: "gcra", Rate: "1/s", Burst: n(1)}}
	before := c2.Policy()
	if err := c2.SetBase(bad); err == nil {
		t.Error("a base without the tier of an admin tenant was accepted")
	}
	if c2.Policy() != before {
		t.Error("a refused reload replaced the policy")
	}
	good := spec()
	good.Global = good.Global[:1]
	if err := c2.SetBase(good); err != nil || len(c2.Policy().Global()) != 1 {
		t.Errorf("good reload: %v", err)
	}

	// A corrupt catalog file is an error, not an empty catalog.
	if err := os.WriteFile(path, []byte("{not json"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := New(ctx, spec(), &FileStore{Path: path}); err == nil {
		t.Error("a corrupt catalog loaded")
	}
}

// A tenant moved to another tier keeps its billing anchor and weight,
// unless the change sets them: its quotas renew on the same day.
func TestPutTenantKeepsBilling(t *testing.T) {
	ctx := context.Background()
	s := spec()
	s.Tiers["premium"] = s.Tiers["free"]
	s.Tenants["billed"] = policy.TenantSpec{Tier: "free", BillingAnchor: "2026-01-15", Weight: 3}
	c, err := New(ctx, s, nil)
	if err != nil {
		t.Fatal(err)
	}
	tn, err := c.PutTenant(ctx, "billed", policy.TenantSpec{Tier: "premium"})
	if err != nil {
		t.Fatal(err)
	}
	if tn.Spec.BillingAnchor != "2026-01-15" || tn.Spec.Weight != 3 || tn.Tier.Name != "premium" {
		t.Fatalf("after a tier change: %+v", tn.Spec)
	}
	if tn, err = c.PutTenant(ctx, "billed", policy.TenantSpec{Tier: "free", BillingAnchor: "2026-02-01"}); err != nil || tn.Spec.BillingAnchor != "2026-02-01" {
		t.Fatalf("a new anchor: %+v %v", tn, err)
	}
}
