package engine

import (
	"testing"
	"time"

	"github.com/admitdev/admit"
	"github.com/admitdev/admit/internal/bounds"
)

const base = int64(1_767_225_600_000_000_000) // 2026-01-01T00:00:00Z, day-aligned

type tstep struct {
	at      time.Duration
	cost    int64
	ok      bool
	rem     int64
	retry   time.Duration
	noRetry bool // do not check retry
}

// runSteps runs a timeline through the pure transition, keeping the state
// of admitted steps, as a store would.
func runSteps(t *testing.T, r *admit.Rule, steps []tstep) {
	t.Helper()
	if err := r.Validate(); err != nil {
		t.Fatal(err)
	}
	var st [2]State
	for i, s := range steps {
		next, res := Step(r, st, base+int64(s.at), s.cost)
		if res.Allowed != s.ok || res.Remaining != s.rem || (!s.noRetry && res.RetryAfter != s.retry) {
			t.Fatalf("step %d at %v cost %d: got ok=%v rem=%d retry=%v, want ok=%v rem=%d retry=%v",
				i, s.at, s.cost, res.Allowed, res.Remaining, res.RetryAfter, s.ok, s.rem, s.retry)
		}
		st = next
	}
}

func TestExtremeRates(t *testing.T) {
	day := 24 * time.Hour
	t.Run("1/d", func(t *testing.T) {
		runSteps(t, &admit.Rule{Algorithm: admit.TokenBucket, Rate: admit.Rate{N: 1, Per: day}, Burst: 1}, []tstep{
			{at: 0, cost: 1, ok: true},
			{at: day - 1, cost: 1, retry: 1},
			{at: day, cost: 1, ok: true},
		})
	})
	t.Run("1e9/s", func(t *testing.T) {
		runSteps(t, &admit.Rule{Algorithm: admit.GCRA, Rate: admit.PerSecond(1e9), Burst: 1e9}, []tstep{
			{at: 0, cost: 1e9, ok: true},
			{at: 1, cost: 2, rem: 1, retry: 1},
			{at: time.Millisecond, cost: 1e6, ok: true},
		})
	})
	t.Run("7e8/s", func(t *testing.T) {
		// 1/0.7 ns a token: exact after a millisecond of refill.
		runSteps(t, &admit.Rule{Algorithm: admit.TokenBucket, Rate: admit.PerSecond(7e8), Burst: 1e6}, []tstep{
			{at: 0, cost: 1e6, ok: true},
			{at: time.Millisecond, cost: 700_000, ok: true},
			{at: time.Millisecond, cost: 1, retry: 2}, // 1.43ns, rounded up
		})
	})
	t.Run("year window", func(t *testing.T) {
		runSteps(t, &admit.Rule{Algorithm: admit.SlidingWindow, Limit: bounds.MaxCount, Window: bounds.MaxRatePeriod}, []tstep{
			{at: 0, cost: bounds.MaxCost, ok: true, rem: bounds.MaxCount - bounds.MaxCost},
			{at: 0, cost: bounds.MaxCost, ok: true, rem: bounds.MaxCount - 2*bounds.MaxCost},
		})
	})
}

// TestLongRunExactness admits 300,000 requests at 3/s, each at the first
// nanosecond it may, and refuses each one nanosecond earlier: integer
// arithmetic with exact thirds of nanoseconds never drifts.
func TestLongRunExactness(t *testing.T) {
	r := &admit.Rule{Algorithm: admit.TokenBucket, Rate: admit.PerSecond(3), Burst: 3}
	st, _ := Step(r, [2]State{}, base, 3)
	for k := int64(1); k <= 300_000; k++ {
		at := base + (k*int64(time.Second)+2)/3
		if _, res := Step(r, st, at-1, 1); res.Allowed || res.RetryAfter != 1 {
			t.Fatalf("k=%d: admitted one nanosecond early (retry %v)", k, res.RetryAfter)
		}
		next, res := Step(r, st, at, 1)
		if !res.Allowed {
			t.Fatalf("k=%d: refused at ceil(k·T)", k)
		}
		st = next
	}
}

func TestRuleValidate(t *testing.T) {
	i := func(n int64) *int64 { return &n }
	// Each bad rule, and the field its error is about.
	bad := []struct {
		r     admit.Rule
		field string
	}{
		{admit.Rule{}, "algorithm"},
		{admit.Rule{Algorithm: admit.TokenBucket, Rate: admit.PerSecond(0), Burst: 1}, "rate"},
		{admit.Rule{Algorithm: admit.TokenBucket, Rate: admit.PerSecond(10), Burst: 0}, "burst"},
		{admit.Rule{Algorithm: admit.TokenBucket, Rate: admit.PerSecond(10), Burst: 10, Initial: i(11)}, "initial"},
		{admit.Rule{Algorithm: admit.GCRA, Rate: admit.PerSecond(10), Burst: 10, Initial: i(1)}, "initial"},
		{admit.Rule{Algorithm: admit.TokenBucket, Rate: admit.Rate{N: 1, Per: 24 * time.Hour}, Burst: 100_000}, "burst"}, // 273 years to refill
		{admit.Rule{Algorithm: admit.TokenBucket, Rate: admit.PerSecond(2e9), Burst: 1}, "rate"},                         // faster than 1/ns
		{admit.Rule{Algorithm: admit.FixedWindow, Limit: 10, Window: time.Microsecond}, "window"},
		{admit.Rule{Algorithm: admit.SlidingLog, Limit: bounds.MaxSlidingLogLimit + 1, Window: time.Second}, "limit"},
		{admit.Rule{Algorithm: admit.Combination, Rate: admit.PerSecond(1), Burst: 10}, "floor"},
		{admit.Rule{Algorithm: admit.Concurrency, Max: 0}, "max"},
		{admit.Rule{Algorithm: admit.Concurrency, Max: 1, LeaseTTL: -1}, "lease_ttl"},
		{admit.Rule{Algorithm: admit.TokenBucket, Rate: admit.PerSecond(10), Burst: 10, MaxDebt: -1}, "max_debt"},
		{admit.Rule{Algorithm: admit.TokenBucket, Rate: admit.Rate{N: 1, Per: 24 * time.Hour}, Burst: 10, MaxDebt: 100_000}, "max_debt"}, // 273 years to repay
		{admit.Rule{Algorithm: admit.Combination, Rate: admit.PerSecond(1), Burst: 10, Floor: admit.PerSecond(1), MaxDebt: 5}, "max_debt"},
		{admit.Rule{Algorithm: admit.FixedWindow, Limit: 10, Window: time.Second, MaxDebt: 5}, "max_debt"},
	}
	for _, c := range bad {
		err := c.r.Validate()
		if err == nil || admit.ErrorCode(err) != admit.CodeInvalid {
			t.Errorf("%+v: Validate() = %v, want an invalid error", c.r, err)
		}
		if got := admit.ErrorField(err); got != c.field {
			t.Errorf("%+v: the error is about %q, want %q (%v)", c.r, got, c.field, err)
		}
	}
	good := admit.Rule{Algorithm: admit.TokenBucket, Rate: admit.PerSecond(10), Burst: 10, Initial: i(0)}
	if err := good.Validate(); err != nil {
		t.Errorf("Validate() = %v", err)
	}
	if err := CheckCost(&good, 11); admit.ErrorCode(err) != admit.CodeInvalid {
		t.Errorf("cost > burst: %v", err)
	}
	if n := testing.AllocsPerRun(100, func() { _ = good.Validate(); _ = CheckCost(&good, 1) }); n != 0 {
		t.Errorf("validating a good rule allocates %v times", n)
	}
}
