package engine_test

import (
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/admitdev/admit"
	"github.com/admitdev/admit/internal/bounds"
	"github.com/admitdev/admit/internal/engine"
)

// TestRulePrepare: a rule is prepared once and the preparation kept; a
// change to any parameter its algorithm reads is validated again, never
// decided by the stale preparation.
func TestRulePrepare(t *testing.T) {
	initial := int64(3)
	rules := map[string]func() *admit.Rule{
		"token_bucket": func() *admit.Rule {
			i := initial
			return &admit.Rule{Name: "r", Algorithm: admit.TokenBucket, Rate: admit.PerSecond(10), Burst: 5, Initial: &i}
		},
		"gcra": func() *admit.Rule {
			return &admit.Rule{Name: "r", Algorithm: admit.GCRA, Rate: admit.PerSecond(10), Burst: 5}
		},
		"combination": func() *admit.Rule {
			return &admit.Rule{Name: "r", Algorithm: admit.Combination, Rate: admit.PerSecond(10), Burst: 5, Floor: admit.PerSecond(2)}
		},
		"fixed_window": func() *admit.Rule {
			return &admit.Rule{Name: "r", Algorithm: admit.FixedWindow, Limit: 5, Window: time.Second}
		},
		"sliding_log": func() *admit.Rule {
			return &admit.Rule{Name: "r", Algorithm: admit.SlidingLog, Limit: 5, Window: time.Second}
		},
		"concurrency": func() *admit.Rule { return &admit.Rule{Name: "r", Algorithm: admit.Concurrency, Max: 5} },
	}
	// Each change makes the rule invalid in a parameter its algorithm
	// reads, so a stale preparation would show as a missing error.
	changes := []struct {
		alg, field string
		change     func(*admit.Rule)
	}{
		{"token_bucket", "rate", func(r *admit.Rule) { r.Rate.N = 0 }},
		{"token_bucket", "burst", func(r *admit.Rule) { r.Burst = 0 }},
		{"token_bucket", "initial", func(r *admit.Rule) { *r.Initial = 9 }}, // same pointer, new value
		{"gcra", "rate", func(r *admit.Rule) { r.Rate.Per = 0 }},
		{"gcra", "initial", func(r *admit.Rule) { r.Initial = &initial }},
		{"combination", "floor", func(r *admit.Rule) { r.Floor.N = 0 }},
		{"combination", "burst", func(r *admit.Rule) { r.Burst = -1 }},
		{"fixed_window", "limit", func(r *admit.Rule) { r.Limit = 0 }},
		{"fixed_window", "window", func(r *admit.Rule) { r.Window = time.Nanosecond }},
		{"sliding_log", "limit", func(r *admit.Rule) { r.Limit = bounds.MaxSlidingLogLimit + 1 }},
		{"concurrency", "max", func(r *admit.Rule) { r.Max = 0 }},
		{"concurrency", "lease_ttl", func(r *admit.Rule) { r.LeaseTTL = -time.Second }},
		{"concurrency", "algorithm", func(r *admit.Rule) { r.Algorithm = admit.TokenBucket }},
	}
	for _, c := range changes {
		r := rules[c.alg]()
		p1, err := engine.Prepare(r)
		if err != nil {
			t.Fatalf("%s: %v", c.alg, err)
		}
		if p2, _ := engine.Prepare(r); p2 != p1 || p1.Rule() != r {
			t.Errorf("%s: prepared twice, or for another rule", c.alg)
		}
		c.change(r)
		var e *admit.Error
		_, err = engine.Prepare(r)
		if !errors.As(err, &e) {
			t.Errorf("%s, %s changed to an invalid value: Prepare = %v, want its error", c.alg, c.field, err)
			continue
		}
		if want := c.field; c.field != "algorithm" && e.Field != want {
			t.Errorf("%s, %s changed: error about %q: %v", c.alg, c.field, e.Field, err)
		}
	}

	// A valid change gives a new preparation that decides by the new value.
	r := rules["gcra"]()
	p1, _ := engine.Prepare(r)
	r.Burst = 8
	p2, err := engine.Prepare(r)
	if err != nil || p2 == p1 {
		t.Fatalf("burst changed: %v, same preparation %v", err, p2 == p1)
	}
	var res admit.Result
	p2.StepOneTo(&res, engine.State{}, time.Now().UnixNano(), 1, false)
	if res.Limit != 8 || res.Remaining != 7 {
		t.Errorf("burst 8, one taken: limit %d remaining %d, want 8 and 7", res.Limit, res.Remaining)
	}

	// A copy is prepared on its own.
	cp := *r
	p3, err := engine.Prepare(&cp)
	if err != nil || p3 == p2 || p3.Rule() != &cp {
		t.Errorf("a copy of a prepared rule: %v, shares its preparation %v", err, p3 == p2)
	}
}

// TestRulePrepareConcurrent: many goroutines preparing one rule at once
// all get a preparation of it (run with -race).
func TestRulePrepareConcurrent(t *testing.T) {
	r := &admit.Rule{Name: "r", Algorithm: admit.TokenBucket, Rate: admit.PerSecond(10), Burst: 5}
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 100 {
				if p, err := engine.Prepare(r); err != nil || p.Rule() != r {
					t.Errorf("Prepare: %v", err)
					return
				}
			}
		})
	}
	wg.Wait()
}
