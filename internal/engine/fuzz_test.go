package engine

import (
	"testing"
	"time"
	_ "time/tzdata" // FuzzQuota's zones

	"github.com/admitdev/admit"
	"github.com/admitdev/admit/internal/bounds"
	"github.com/admitdev/admit/internal/wide"
)

// checkRetry asserts what RetryAfter promises: the same request passes
// exactly RetryAfter later if nothing else happens, and not a nanosecond
// sooner.
func checkRetry(t *testing.T, r *admit.Rule, st [2]State, now, cost int64) ([2]State, admit.Result) {
	t.Helper()
	next, res := Step(r, st, now, cost)
	checkPrepared(t, r, st, now, cost, next, res)
	if CheckDebit(r, cost) == nil {
		checkDebit(t, r, st[0], now, cost, &next[0], &res)
		checkDebit(t, r, st[0], now, cost*3, nil, nil) // past any burst
	}
	if res.Remaining < 0 || res.Remaining > r.Capacity() || res.RetryAfter < 0 || res.ResetAfter < 0 {
		t.Fatalf("%+v at %d cost %d: out of range %+v", r, now, cost, res)
	}
	if res.Allowed {
		if res.RetryAfter != 0 {
			t.Fatalf("admitted with a retry-after: %+v", res)
		}
		return next, res
	}
	st = next // a refusal may record a new key
	if res.RetryAfter <= 0 {
		t.Fatalf("refused with no retry-after: %+v", res)
	}
	later := now + int64(res.RetryAfter)
	if _, again := Step(r, st, later, cost); !again.Allowed {
		t.Fatalf("%+v: refused at %d, retry after %v, still refused then: %+v", r, now, res.RetryAfter, again)
	}
	if _, early := Step(r, st, later-1, cost); early.Allowed {
		t.Fatalf("%+v: refused at %d, retry after %v, but admitted 1ns sooner", r, now, res.RetryAfter)
	}
	return next, res
}

// checkDebit asserts what a debit of cost does from s at now, given what
// the same charge did (next, res): a debit that fits is that charge; one
// that does not is charged anyway, after which a request of cost 1 is
// refused until exactly RetryAfter. next and res are nil when the charge
// was not made.
func checkDebit(t *testing.T, r *admit.Rule, s State, now, cost int64, next *State, res *admit.Result) {
	t.Helper()
	p, _ := Prepare(r)
	var d admit.Result
	debited := p.StepOneTo(&d, s, now, cost, true)
	if !d.Debit || d.Rule != r.Name || d.Limit != r.Capacity() {
		t.Fatalf("%+v: debit %d reported as %+v", r, cost, d)
	}
	if d.Allowed {
		d.Debit = false
		if next != nil && (debited != *next || d != *res) {
			t.Fatalf("%+v at %d: a debit of %d that fits: %v %+v, the charge: %v %+v", r, now, cost, debited, d, *next, *res)
		}
		return
	}
	if d.Remaining != 0 || d.RetryAfter <= 0 {
		t.Fatalf("%+v at %d: a debit of %d in debt reports %+v", r, now, cost, d)
	}
	var one admit.Result
	p.StepOneTo(&one, debited, now+int64(d.RetryAfter)-1, 1, false)
	if one.Allowed {
		t.Fatalf("%+v: after a debit of %d at %d, a request passes before RetryAfter %v", r, cost, now, d.RetryAfter)
	}
	p.StepOneTo(&one, debited, now+int64(d.RetryAfter), 1, false)
	if !one.Allowed {
		t.Fatalf("%+v: after a debit of %d at %d, a request is still refused at RetryAfter %v: %+v", r, cost, now, d.RetryAfter, one)
	}
}

// checkPrepared asserts that r prepared decides exactly as r does.
func checkPrepared(t *testing.T, r *admit.Rule, st [2]State, now, cost int64, next [2]State, res admit.Result) {
	t.Helper()
	p, err := Prepare(r)
	if err != nil {
		t.Fatalf("%+v: Prepare: %v", r, err)
	}
	for _, c := range []int64{cost, -1, 0, r.Capacity(), r.Capacity() + 1, bounds.MaxCost + 1} {
		if (p.CheckCost(c) == nil) != (CheckCost(r, c) == nil) {
			t.Fatalf("%+v: cost %d: prepared CheckCost %v, CheckCost %v", r, c, p.CheckCost(c), CheckCost(r, c))
		}
	}
	var pres admit.Result
	if pnext := p.StepTo(&pres, st, now, cost, false); pnext != next || pres != res {
		t.Fatalf("%+v at %d cost %d: prepared %v %+v, unprepared %v %+v", r, now, cost, pnext, pres, next, res)
	}
	if Slots(r.Algorithm) == 1 {
		if one := p.StepOneTo(&pres, st[0], now, cost, false); one != next[0] || pres != res {
			t.Fatalf("%+v at %d cost %d: StepOneTo %v %+v, StepTo %v %+v", r, now, cost, one, pres, next[0], res)
		}
	}
}

// fuzzStart rejects inputs outside the documented bounds and maps start to
// an instant within a year after base.
func fuzzStart(r *admit.Rule, cost, gap, start int64) (int64, bool) {
	if r.Validate() != nil || CheckCost(r, cost) != nil || cost == 0 || gap < 0 || gap > int64(bounds.MaxRatePeriod) {
		return 0, false
	}
	now := base + start%int64(bounds.MaxRatePeriod)
	if now < base {
		now += int64(bounds.MaxRatePeriod)
	}
	return now, true
}

// FuzzBucket drives token buckets, GCRA and combinations with arbitrary
// rates, bursts, costs and times within the documented bounds: no panic, no
// overflow, exact retry-after, and never more admitted than
// burst + rate × elapsed.
func FuzzBucket(f *testing.F) {
	f.Add(uint8(0), int64(10), int64(time.Second), int64(5), int64(1), int64(0), int64(1), int64(3), int64(100), int64(0))
	f.Add(uint8(1), int64(3), int64(time.Second), int64(3), int64(2), int64(7), int64(333333333), int64(1), int64(1), int64(1))
	f.Add(uint8(2), int64(1e9), int64(time.Second), int64(4e9), int64(1e9), int64(1), int64(2), int64(1), int64(time.Second), int64(2))
	f.Fuzz(func(t *testing.T, alg uint8, n, per, burst, cost, initial, gap, floorN, floorPer, start int64) {
		r := &admit.Rule{Algorithm: []admit.Algorithm{admit.TokenBucket, admit.GCRA, admit.Combination}[alg%3], Rate: admit.Rate{N: n, Per: time.Duration(per)}, Burst: burst}
		if r.Algorithm == admit.TokenBucket && initial >= 0 {
			r.Initial = &initial
		}
		if r.Algorithm == admit.Combination {
			r.Floor = admit.Rate{N: floorN, Per: time.Duration(floorPer)}
		}
		now, ok := fuzzStart(r, cost, gap, start)
		if !ok {
			return
		}
		var st [2]State
		admitted := int64(0)
		first := now
		for range 20 {
			var res admit.Result
			st, res = checkRetry(t, r, st, now, cost)
			if res.Allowed {
				admitted += cost
			}
			now += gap
		}
		// Everything admitted in [first, now−gap] fits in the burst plus
		// the refill of that interval (both buckets for a combination).
		limit := func(rate admit.Rate, b int64) int64 {
			q, _ := wide.Mul(uint64(now-gap-first), uint64(rate.N)).Div(uint64(rate.Per))
			return b + q
		}
		bound := limit(r.Rate, r.Burst)
		if r.Algorithm == admit.Combination {
			bound += limit(r.Floor, r.Floor.N)
		}
		if admitted > bound {
			t.Fatalf("%+v: admitted %d > %d", r, admitted, bound)
		}
	})
}

// FuzzWindows does the same for fixed and sliding window counters.
func FuzzWindows(f *testing.F) {
	f.Add(false, int64(10), int64(time.Second), int64(1), int64(100_000_000), int64(0))
	f.Add(true, int64(10), int64(time.Second), int64(3), int64(77_777_777), int64(5))
	f.Add(true, int64(4e9), int64(bounds.MaxRatePeriod), int64(1e9), int64(time.Hour), int64(-9))
	f.Fuzz(func(t *testing.T, sliding bool, limit, window, cost, gap, start int64) {
		r := &admit.Rule{Algorithm: admit.FixedWindow, Limit: limit, Window: time.Duration(window)}
		if sliding {
			r.Algorithm = admit.SlidingWindow
		}
		now, ok := fuzzStart(r, cost, gap, start)
		if !ok {
			return
		}
		var st [2]State
		perWindow := map[int64]int64{}
		for range 30 {
			var res admit.Result
			if st, res = checkRetry(t, r, st, now, cost); res.Allowed {
				perWindow[now/window] += cost
			}
			now += gap
		}
		for w, n := range perWindow {
			if n > limit {
				t.Fatalf("%+v: %d admitted in window %d", r, n, w)
			}
		}
	})
}

// FuzzQuota drives calendar quotas over random zones, anchors and times:
// no panic, exact retry-after, never more admitted in one period than the
// limit, and every period contains the instants PeriodAt puts in it.
func FuzzQuota(f *testing.F) {
	f.Add(uint8(2), uint8(0), int64(3), int64(1), int64(86_400_000_000_000/7), int64(0), int64(0))
	f.Add(uint8(0), uint8(1), int64(2), int64(1), int64(3_600_000_000_000), int64(17), int64(-5))
	f.Add(uint8(3), uint8(2), int64(5), int64(2), int64(40*86_400_000_000_000), int64(1_000_000_000), int64(123456789))
	zones := []string{"UTC", "America/New_York", "Australia/Lord_Howe", "Asia/Kathmandu", "Europe/Paris"}
	f.Fuzz(func(t *testing.T, period, zone uint8, limit, cost, gap, anchorDays, start int64) {
		loc, err := time.LoadLocation(zones[int(zone)%len(zones)])
		if err != nil {
			t.Fatal(err) // time/tzdata holds them all
		}
		r := &admit.Rule{Algorithm: admit.Quota, Limit: limit, Period: admit.Period(period%4 + 1), Location: loc}
		if anchorDays != 0 {
			r.Anchor = time.Unix(0, base).Add(time.Duration(anchorDays%4000) * 24 * time.Hour).Add(time.Duration(anchorDays%86400) * time.Second)
		}
		now, ok := fuzzStart(r, cost, gap, start)
		if !ok {
			return
		}
		var st [2]State
		perPeriod := map[int64]int64{}
		for range 30 {
			tn := time.Unix(0, now)
			s, e := PeriodAt(r, tn)
			if s.After(tn) || !tn.Before(e) {
				t.Fatalf("%v is not in its period [%v, %v)", tn.In(loc), s, e)
			}
			var res admit.Result
			if st, res = checkRetry(t, r, st, now, cost); res.Allowed {
				perPeriod[s.UnixNano()] += cost
			}
			now += gap
		}
		for p, n := range perPeriod {
			if n > limit {
				t.Fatalf("%+v: %d admitted in the period from %v", r, n, time.Unix(0, p).In(loc))
			}
		}
	})
}
