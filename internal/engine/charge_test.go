package engine_test

import (
	"strings"
	"testing"
	"time"

	"github.com/admitdev/admit"
	"github.com/admitdev/admit/internal/bounds"
	"github.com/admitdev/admit/internal/engine"
)

// TestPrepare: a prepared charge gives the hashes of its key, and a charge
// whose Key is replaced after Prepare gives the new key's, never the old.
func TestPrepare(t *testing.T) {
	keys := []string{
		admit.Key{Scope: "user", Tenant: "acme", Subject: "al", Rule: "r"}.String(),
		admit.Key{Scope: "global", Rule: "g"}.String(),
		"not-a-key", "",
	}
	for _, k := range keys {
		c := admit.Charge{Key: k}
		engine.PrepareCharge(&c)
		if got, want := engine.KeyHash(&c), engine.KeyHash(&admit.Charge{Key: k}); got != want || got == 0 {
			t.Errorf("%q: KeyHash %x, want %x (non-zero)", k, got, want)
		}
		gh, gok := engine.TenantHash(&c)
		wh, wok := engine.TenantHash(&admit.Charge{Key: k})
		if gh != wh || gok != wok {
			t.Errorf("%q: TenantHash %x %v, want %x %v", k, gh, gok, wh, wok)
		}
		for _, other := range []string{k + "x", strings.Clone(k), admit.Key{Scope: "user", Tenant: "beta", Subject: "al", Rule: "r"}.String()} {
			d := c
			d.Key = other
			if engine.KeyHash(&d) != keyHash(other) {
				t.Errorf("%q prepared, Key replaced by %q: KeyHash is the old key's", k, other)
			}
			wantH, wantOK := keyTenantHash(other)
			if h, ok := engine.TenantHash(&d); h != wantH || ok != wantOK {
				t.Errorf("%q prepared, Key replaced by %q: TenantHash is the old key's", k, other)
			}
		}
	}
	// A tenant's keys share the tenant hash; keys of no tenant have none;
	// a key Key did not make is its own tenant.
	a1, _ := keyTenantHash(keys[0])
	a2, _ := keyTenantHash(admit.Key{Scope: "tenant", Tenant: "acme", Rule: "x"}.String())
	if a1 != a2 {
		t.Error("two keys of tenant acme have different tenant hashes")
	}
	if _, ok := keyTenantHash(keys[1]); ok {
		t.Error("a global key has a tenant")
	}
	if _, ok := keyTenantHash("not-a-key"); !ok {
		t.Error("a key Key did not make has no tenant")
	}
	// Reading a prepared charge's hashes allocates nothing (parsing the
	// key for its tenant would not either; BenchmarkKeyHash shows the
	// time saved).
	c := admit.Charge{Key: keys[0]}
	engine.PrepareCharge(&c)
	if n := testing.AllocsPerRun(100, func() { _ = engine.KeyHash(&c); _, _ = engine.TenantHash(&c) }); n != 0 {
		t.Errorf("reading a prepared charge's hashes allocates %v times", n)
	}
}

func BenchmarkKeyHash(b *testing.B) {
	c := admit.Charge{Key: admit.Key{Scope: "user", Tenant: "acme", Subject: "user-12345", Rule: "requests"}.String()}
	b.Run("unprepared", func(b *testing.B) {
		for range b.N {
			_ = engine.KeyHash(&c)
		}
	})
	engine.PrepareCharge(&c)
	b.Run("prepared", func(b *testing.B) {
		for range b.N {
			_ = engine.KeyHash(&c)
		}
	})
}

// TestMaxCost: a rule's MaxCost bounds checks and debits alike, with an
// error about the cost; a prepared rule whose MaxCost changes is bounded
// by the new one.
func TestMaxCost(t *testing.T) {
	r := &admit.Rule{Name: "global", Algorithm: admit.TokenBucket, Rate: admit.PerSecond(100), Burst: 1000}
	for _, cost := range []int64{1000, 1_000_000} { // no MaxCost: debits of any cost
		if err := engine.CheckDebit(r, cost); err != nil {
			t.Fatalf("debit %d without MaxCost: %v", cost, err)
		}
	}
	if err := engine.CheckCost(r, 1001); admit.ErrorField(err) != "cost" {
		t.Fatalf("check 1001 of burst 1000: %v, want an error about the cost", err)
	}
	r.MaxCost = 50
	if err := r.Validate(); err != nil {
		t.Fatal(err)
	}
	p, err := engine.Prepare(r)
	if err != nil {
		t.Fatal(err)
	}
	for _, check := range []func(int64) error{func(c int64) error { return engine.CheckCost(r, c) }, func(c int64) error { return engine.CheckDebit(r, c) }, p.CheckCost} {
		if err := check(50); err != nil {
			t.Errorf("cost 50 with MaxCost 50: %v", err)
		}
		err := check(51)
		if admit.ErrorCode(err) != admit.CodeInvalid || admit.ErrorField(err) != "cost" || !strings.Contains(err.Error(), "max_cost 50") {
			t.Errorf("cost 51 with MaxCost 50: %v, want invalid, about cost, naming max_cost 50", err)
		}
	}
	r.MaxCost = 60 // changed after Prepare: the preparation follows
	if p, err = engine.Prepare(r); err != nil || p.CheckCost(60) != nil {
		t.Errorf("MaxCost raised to 60 after Prepare: %v, %v", err, p.CheckCost(60))
	}
	for _, bad := range []int64{-1, bounds.MaxCost + 1} {
		r.MaxCost = bad
		if err := r.Validate(); admit.ErrorField(err) != "max_cost" {
			t.Errorf("MaxCost %d: %v, want an error about max_cost", bad, err)
		}
	}
}

// keyHash is the hash a charge of key k gives, unprepared.
func keyHash(k string) uint64 { return engine.KeyHash(&admit.Charge{Key: k}) }

// keyTenantHash is the tenant hash a charge of key k gives, unprepared.
func keyTenantHash(k string) (uint64, bool) { return engine.TenantHash(&admit.Charge{Key: k}) }

// TestPrepareChargeOf: a charge prepared with the tenant its maker knows
// places the key as its parsed tenant would, and a key whose maker says it
// has no tenant has none, whatever the key spells.
func TestPrepareChargeOf(t *testing.T) {
	key := admit.Key{Scope: "user", Tenant: "acme", Subject: "al", Rule: "r"}.String()
	parsed, known := admit.Charge{Key: key}, admit.Charge{Key: key}
	engine.PrepareCharge(&parsed)
	engine.PrepareChargeOf(&known, "acme")
	ph, pok := engine.TenantHash(&parsed)
	kh, kok := engine.TenantHash(&known)
	if ph != kh || !pok || !kok {
		t.Errorf("tenant hash %x, %v as parsed; %x, %v as known", ph, pok, kh, kok)
	}
	global := admit.Charge{Key: key}
	engine.PrepareChargeOf(&global, "")
	if _, ok := engine.TenantHash(&global); ok {
		t.Error("a charge its maker says has no tenant has one")
	}
	if engine.KeyHash(&global) != engine.KeyHash(&parsed) {
		t.Error("the key's hash depends on how its tenant was given")
	}
}

// TestAlgorithmFactsAgree: the engine's account of which algorithms can
// be leased is package admit's, which keeps its own copy of the list (it
// cannot import the engine) and takes debits for the same algorithms: a
// leased rule validates exactly when Leasable says so, and the engine
// takes a debit of exactly those.
func TestAlgorithmFactsAgree(t *testing.T) {
	rules := map[admit.Algorithm]admit.Rule{
		admit.TokenBucket:   {Rate: admit.PerSecond(10), Burst: 10},
		admit.GCRA:          {Rate: admit.PerSecond(10), Burst: 10},
		admit.FixedWindow:   {Limit: 10, Window: time.Second},
		admit.SlidingWindow: {Limit: 10, Window: time.Second},
		admit.SlidingLog:    {Limit: 10, Window: time.Second},
		admit.Combination:   {Rate: admit.PerSecond(10), Burst: 10, Floor: admit.PerSecond(5)},
		admit.Concurrency:   {Max: 10},
		admit.Quota:         {Limit: 10, Period: admit.Day},
	}
	for a, r := range rules {
		r.Name, r.Algorithm = "r", a
		if err := r.Validate(); err != nil {
			t.Fatalf("%v: %v", a, err)
		}
		if takes := engine.CheckDebit(&r, 1) == nil; takes != engine.Leasable(a) || takes != engine.TakesDebits(a) {
			t.Errorf("%v: takes debits %v, Leasable %v, TakesDebits %v", a, takes, engine.Leasable(a), engine.TakesDebits(a))
		}
		r.Distribution = admit.Leased
		if got := r.Validate() == nil; got != engine.Leasable(a) {
			t.Errorf("%v: a leased rule validates %v, engine.Leasable %v", a, got, engine.Leasable(a))
		}
	}
}
