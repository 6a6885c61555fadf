package policy

import (
	"errors"
	"testing"
	"time"

	"github.com/admitdev/admit"
	"github.com/admitdev/admit/internal/engine"
)

// TestQuotaRules: a quota's period, time zone and anchor compile into its
// rule; a billing anchor gives each tenant that has one its own copy of the
// tier's quota, starting on its day; bad values are refused at their path.
func TestQuotaRules(t *testing.T) {
	s := &Spec{
		Tiers: map[string]TierSpec{"pro": {Rules: []RuleSpec{
			{Name: "monthly", Scope: "tenant", Algorithm: "quota", Limit: n(1000), Period: "month", TimeZone: "Europe/Paris", Anchor: "billing"},
			{Name: "daily", Scope: "tenant", Algorithm: "quota", Limit: n(50), Period: "day"},
			{Name: "yearly", Scope: "tenant", Algorithm: "quota", Limit: n(9), Period: "year", Anchor: "2026-04-06"},
		}}},
		Tenants: map[string]TenantSpec{
			"anchored": {Tier: "pro", BillingAnchor: "2026-01-31"},
			"plain":    {Tier: "pro"},
		},
	}
	p, err := Compile(s)
	if err != nil {
		t.Fatal(err)
	}
	paris, _ := time.LoadLocation("Europe/Paris")
	own, shared := p.Tenant("anchored").Rules[0], p.Tenant("plain").Rules[0]
	if shared != p.Tier("pro").Rules[0] || !shared.Anchor.IsZero() || shared.Location.String() != "Europe/Paris" {
		t.Errorf("a tenant without a billing anchor: %+v, want the tier's rule on the calendar", shared.Rule)
	}
	if want := time.Date(2026, 1, 31, 0, 0, 0, 0, paris); !own.Anchor.Equal(want) || own == shared {
		t.Errorf("anchored tenant's quota anchor %v, want %v, its own rule", own.Anchor, want)
	}
	// Its February period runs from the 28th (February has no 31st), at
	// midnight in Paris.
	start, end := engine.PeriodAt(&own.Rule, time.Date(2026, 3, 10, 12, 0, 0, 0, time.UTC))
	if !start.Equal(time.Date(2026, 2, 28, 0, 0, 0, 0, paris)) || !end.Equal(time.Date(2026, 3, 31, 0, 0, 0, 0, paris)) {
		t.Errorf("period %v – %v", start, end)
	}
	if d := p.Tier("pro").Rules[1]; d.Period != admit.Day || d.Location != time.UTC {
		t.Errorf("daily: %+v", d.Rule)
	}
	if y := p.Tier("pro").Rules[2]; !y.Anchor.Equal(time.Date(2026, 4, 6, 0, 0, 0, 0, time.UTC)) {
		t.Errorf("yearly anchor %v", y.Anchor)
	}
	if sp := own.Spec(); sp.Period != "month" || sp.TimeZone != "Europe/Paris" || sp.Anchor != "billing" || *sp.Limit != 1000 {
		t.Errorf("Spec: %+v", sp)
	}

	bad := &Spec{
		Tiers: map[string]TierSpec{"x": {Rules: []RuleSpec{
			{Name: "a", Scope: "tenant", Algorithm: "quota", Limit: n(1), Period: "fortnight"},
			{Name: "b", Scope: "tenant", Algorithm: "quota", Limit: n(1), Period: "day", TimeZone: "Mars/Olympus"},
			{Name: "c", Scope: "tenant", Algorithm: "quota", Limit: n(1), Period: "day", Anchor: "someday"},
			{Name: "d", Scope: "tenant", Algorithm: "quota", Limit: n(1)},
			{Name: "e", Scope: "tenant", Algorithm: "quota", Limit: n(1), Period: "day", Window: "1h"},
			{Name: "f", Scope: "tenant", Algorithm: "fixed_window", Limit: n(1), Window: "1h", Period: "day"},
		}}},
		Tenants: map[string]TenantSpec{"t": {Tier: "x", BillingAnchor: "the 5th"}},
	}
	_, err = Compile(bad)
	var errs Errors
	if !errors.As(err, &errs) {
		t.Fatalf("bad quotas: %v", err)
	}
	got := map[string]bool{}
	for _, e := range errs {
		got[e.Path] = true
	}
	for _, w := range []string{"tiers.x.rules[0].period", "tiers.x.rules[1].time_zone", "tiers.x.rules[2].anchor",
		"tiers.x.rules[3].period", "tiers.x.rules[4].window", "tiers.x.rules[5].period", "tenants.t.billing_anchor"} {
		if !got[w] {
			t.Errorf("no error at %s; got %v", w, errs)
		}
	}
}
