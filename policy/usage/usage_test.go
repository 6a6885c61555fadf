package usage_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/admitdev/admit"
	"github.com/admitdev/admit/memstore"
	"github.com/admitdev/admit/policy"
	"github.com/admitdev/admit/policy/usage"
	"github.com/admitdev/admit/policy/usage/usagetest"
)

func TestMemoryUsageConformance(t *testing.T) {
	usagetest.Run(t, func(*testing.T) usage.Store { return usage.NewMemory(0, 0) })
}

// TestMemoryUsageBound: past its bound, the records of the oldest periods
// go first.
func TestMemoryUsageBound(t *testing.T) {
	m := usage.NewMemory(0, 3)
	now := time.Now().UTC()
	ctx := context.Background()
	for d := 5; d >= 1; d-- {
		start := now.AddDate(0, 0, -d).Truncate(24 * time.Hour)
		if err := m.AddUsage(ctx, []usage.Record{{Tenant: "t", Rule: "daily", PeriodStart: start, PeriodEnd: start.Add(24 * time.Hour), Admitted: int64(d)}}); err != nil {
			t.Fatal(err)
		}
	}
	got, _ := m.Usage(ctx, "t", now.AddDate(0, 0, -10), now)
	if len(got) != 3 || got[0].Admitted != 3 || got[2].Admitted != 1 {
		t.Fatalf("kept %+v, want the 3 newest days", got)
	}
}

type failing struct {
	usage.Store
	fail bool
}

func (f *failing) AddUsage(ctx context.Context, recs []usage.Record) error {
	if f.fail {
		return errors.New("down")
	}
	return f.Store.AddUsage(ctx, recs)
}

// TestUsageMeter: decisions through a Decider are counted per tenant, quota
// and period, written when the meter flushes; a flush the store refuses is
// kept for the next.
func TestUsageMeter(t *testing.T) {
	p, err := policy.Compile(&policy.Spec{
		Tiers: map[string]policy.TierSpec{"free": {Rules: []policy.RuleSpec{
			{Name: "ai", Scope: "tenant", Algorithm: "quota", Limit: ptr(3), Period: "month", MaxCost: ptr(10)},
			{Name: "rps", Scope: "tenant", Algorithm: "token_bucket", Rate: "100/s", Burst: ptr(100)},
		}}},
		Tenants: map[string]policy.TenantSpec{"acme": {Tier: "free"}},
	})
	if err != nil {
		t.Fatal(err)
	}
	mem := memstore.New(nil)
	defer mem.Close()
	store := &failing{Store: usage.NewMemory(0, 0)}
	meter := usage.NewMeter(store, time.Hour) // flushed by hand
	dec := policy.NewDecider(mem, 1)
	dec.MeterUsage(meter)
	ctx := context.Background()
	decide := func(cost int64, debit, dry bool) {
		t.Helper()
		req := policy.Request{Tenant: "acme", Cost: cost, Debit: debit, DryRun: dry}
		var res policy.Resolution
		var d admit.Decision
		if err := p.Resolve(&req, &res); err != nil {
			t.Fatal(err)
		}
		if _, err := dec.Decide(ctx, &res, &d); err != nil {
			t.Fatal(err)
		}
	}
	decide(1, false, false)
	decide(2, false, false)
	decide(1, false, false) // over the quota of 3: refused
	decide(5, true, false)  // a debit: its cost
	decide(1, false, true)  // a dry run: nothing
	store.fail = true
	if err := meter.Flush(ctx); err == nil {
		t.Fatal("a failing store's flush did not fail")
	}
	decide(0, false, false) // a peek, refused (over), counted
	store.fail = false
	if err := meter.Close(ctx); err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	got, _ := store.Usage(ctx, "acme", now.AddDate(0, -1, 0), now.AddDate(0, 1, 0))
	if len(got) != 1 || got[0].Rule != "ai" || got[0].Admitted != 2 || got[0].Refused != 2 || got[0].Cost != 8 {
		t.Fatalf("records %+v, want ai: 2 admitted, 2 refused, cost 8", got)
	}
	start, end := got[0].PeriodStart.UTC(), got[0].PeriodEnd.UTC()
	if start.Day() != 1 || start.Hour() != 0 || !end.Equal(start.AddDate(0, 1, 0)) {
		t.Errorf("period %v – %v, want a calendar month", start, end)
	}
}

func ptr(v int64) *int64 { return &v }

// downStore is a store that is down: every decision fails unavailable.
type downStore struct{ admit.Store }

func (downStore) Decide(context.Context, []admit.Charge, *admit.Decision) error {
	return admit.Errorf(admit.CodeUnavailable, "down")
}

// TestUsageMeterFailover: requests admitted without the store (on_error
// open) are recorded apart from what the quota counted, so the records'
// admitted agree with the quota's count (they were added to it: 18,060
// recorded admitted where the quota counted 12,881, the rest admitted
// open while Redis was paused).
func TestUsageMeterFailover(t *testing.T) {
	p, err := policy.Compile(&policy.Spec{
		Tiers: map[string]policy.TierSpec{"free": {Rules: []policy.RuleSpec{
			{Name: "ai", Scope: "tenant", Algorithm: "quota", Limit: ptr(100), Period: "month"},
		}}},
		Tenants: map[string]policy.TenantSpec{"acme": {Tier: "free"}},
	})
	if err != nil {
		t.Fatal(err)
	}
	mem := memstore.New(nil)
	defer mem.Close()
	records := usage.NewMemory(0, 0)
	meter := usage.NewMeter(records, time.Hour)
	ctx := context.Background()
	for i, store := range []admit.Store{mem, downStore{mem}, downStore{mem}, mem} {
		dec := policy.NewDecider(store, 1)
		dec.MeterUsage(meter)
		req := policy.Request{Tenant: "acme", Cost: int64(i + 1)}
		var res policy.Resolution
		var d admit.Decision
		if err := p.Resolve(&req, &res); err != nil {
			t.Fatal(err)
		}
		if _, err := dec.Decide(ctx, &res, &d); err != nil || !d.Allowed {
			t.Fatalf("decision %d: %v %+v", i, err, d)
		}
	}
	if err := meter.Close(ctx); err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	got, _ := records.Usage(ctx, "acme", now.AddDate(0, -1, 0), now.AddDate(0, 1, 0))
	if len(got) != 1 || got[0].Admitted != 2 || got[0].Cost != 5 || got[0].Failover != 2 || got[0].FailoverCost != 5 {
		t.Fatalf("records %+v, want 2 admitted of cost 5 counted, 2 of cost 5 admitted open", got)
	}
}
