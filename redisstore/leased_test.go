package redisstore_test

import (
	"context"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/admitdev/admit"
	"github.com/admitdev/admit/redisstore"
	"github.com/admitdev/admit/redistest"
	"github.com/admitdev/admit/storetest"
)

// The leased suite: several stores, each with its own connection, stand
// for several servers sharing one Redis. Their clock is stopped (the
// stores' and Redis's alike), so that a limit cannot refill while they
// spend it and every bound below is exact: what Redis gave out is what
// the servers admitted plus what they hold.

func leasedRule(a admit.Algorithm, n int64) *admit.Rule {
	r := &admit.Rule{Name: "hot", Algorithm: a, Distribution: admit.Leased}
	switch a {
	case admit.TokenBucket, admit.GCRA:
		r.Rate, r.Burst = admit.Rate{N: 1, Per: 10 * time.Minute}, n
	case admit.Quota:
		r.Limit, r.Period, r.Location = n, admit.Day, time.UTC
	default:
		r.Limit, r.Window = n, time.Minute
	}
	return r
}

var leasedPrefixes atomic.Int64

// newPrefix returns a key prefix no other test uses.
func newPrefix() string { return "leased" + itoa(leasedPrefixes.Add(1)) + ":" }

func itoa(n int64) string { return strconv.FormatInt(n, 10) }

// servers opens n stores on url with prefix, each with its own client,
// on clock.
func servers(t *testing.T, url, prefix string, n int, clock func() time.Time) []*redisstore.Store {
	t.Helper()
	ss := make([]*redisstore.Store, n)
	for i := range ss {
		s, err := redisstore.Open(context.Background(), url, &redisstore.Options{Clock: clock, Timeout: 10 * time.Second, Prefix: prefix, ExactRefusals: true})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		ss[i] = s
	}
	return ss
}

// drain has callers goroutines per store decide charges until each is
// refused once, and returns how many decisions each store admitted.
func drain(t *testing.T, ss []*redisstore.Store, callers int, charges []admit.Charge) []int64 {
	t.Helper()
	admitted := make([]atomic.Int64, len(ss))
	var wg sync.WaitGroup
	for i, s := range ss {
		for range callers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				var d admit.Decision
				for {
					if err := s.Decide(context.Background(), charges, &d); err != nil {
						t.Errorf("decide: %v", err)
						return
					}
					if !d.Allowed {
						return
					}
					admitted[i].Add(1)
				}
			}()
		}
	}
	wg.Wait()
	out := make([]int64, len(ss))
	for i := range admitted {
		out[i] = admitted[i].Load()
	}
	return out
}

func sum(xs []int64) (n int64) {
	for _, x := range xs {
		n += x
	}
	return n
}

// settle waits until no withdrawal for key is in flight in s, and returns
// what s holds of it.
func settle(t *testing.T, s *redisstore.Store, key string) int64 {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		held, fetching := redisstore.Held(s, key)
		if !fetching {
			return held
		}
		if time.Now().After(deadline) {
			t.Fatalf("a withdrawal for %s still in flight after 10s", key)
		}
		time.Sleep(time.Millisecond)
	}
}

// left returns what key has left in Redis for rule r, by an exact look.
func left(t *testing.T, s *redisstore.Store, key string, r *admit.Rule) int64 {
	t.Helper()
	exact := *r
	exact.Distribution = admit.Exact
	d, err := storetest.Check(context.Background(), s, admit.Charge{Key: key, Rule: &exact})
	if err != nil {
		t.Fatal(err)
	}
	return d.Results[0].Remaining
}

func hotKey(tenant string) string {
	return admit.Key{Scope: "tenant", Tenant: tenant, Rule: "hot"}.String()
}

// TestLeasedBound: four servers × 16 callers drain one hot key. For every
// leasable algorithm, what they admitted plus what they hold is exactly
// what Redis gave out, never more than the limit; and since demand
// exceeded supply, at least 95 % of the limit was admitted. Once they give
// back on closing, Redis has exactly the limit less what was admitted.
func TestLeasedBound(t *testing.T) {
	srv := redistest.Start(t)
	for _, a := range []admit.Algorithm{admit.FixedWindow, admit.SlidingWindow, admit.TokenBucket, admit.GCRA, admit.Quota, admit.FirstHitWindow} {
		t.Run(a.String(), func(t *testing.T) {
			const limit = 5000
			clock := storetest.NewClock()
			prefix := newPrefix()
			ss := servers(t, "redis://"+srv.Addr, prefix, 4, clock.Now)
			rule := leasedRule(a, limit)
			key := hotKey("bound")
			per := drain(t, ss, 16, []admit.Charge{{Key: key, Rule: rule, Cost: 1}})
			admitted := sum(per)
			var held, local, calls, decisions int64
			for _, s := range ss {
				held += settle(t, s, key)
				h := s.Health()
				local, calls, decisions = local+h.LocalDecisions, calls+h.Calls, decisions+h.Decisions
			}
			rest := left(t, ss[0], key, rule)
			t.Logf("admitted %d %v, held %d, left %d; %d decisions, %d local, %d calls", admitted, per, held, rest, decisions, local, calls)
			if admitted+held+rest != limit {
				t.Errorf("admitted %d + held %d + left in Redis %d = %d, want the limit %d", admitted, held, rest, admitted+held+rest, limit)
			}
			if admitted > limit || admitted < limit*95/100 {
				t.Errorf("admitted %d of a limit of %d, want from 95%% to 100%%", admitted, limit)
			}
			if local < decisions/2 {
				t.Errorf("%d of %d decisions local; allowances were not used", local, decisions)
			}
			for _, s := range ss {
				s.Close()
			}
			if got := left(t, servers(t, "redis://"+srv.Addr, prefix, 1, clock.Now)[0], key, rule); got != limit-admitted {
				t.Errorf("after the servers closed Redis has %d left, want %d (limit %d − admitted %d)", got, limit-admitted, limit, admitted)
			}
		})
	}
}

// warm makes s withdraw an allowance for charges: decisions at one
// instant until it holds units, and returns how many it admitted.
func warm(t *testing.T, s *redisstore.Store, charges []admit.Charge) int64 {
	t.Helper()
	var d admit.Decision
	for n := int64(1); n <= 1000; n++ {
		if err := s.Decide(context.Background(), charges, &d); err != nil || !d.Allowed {
			t.Fatalf("warming up: %v, allowed %v", err, d.Allowed)
		}
		if held := settle(t, s, charges[0].Key); held > 0 {
			return n
		}
	}
	t.Fatal("1000 decisions at one instant withdrew no allowance")
	return 0
}

// TestLeasedRefunds: units a server holds go back to Redis when its key
// goes idle and, for a bucket, when they may no longer be spent; a
// window's units expire with their window and are not given back into
// the next one.
func TestLeasedRefunds(t *testing.T) {
	srv := redistest.Start(t)
	const limit = 1000
	for _, tc := range []struct {
		a     admit.Algorithm
		after time.Duration // idle this long, then swept
		back  bool          // whether the units come back
	}{
		{admit.FixedWindow, redisstore.LeaseIdle, true},
		{admit.SlidingWindow, redisstore.LeaseIdle, true},
		{admit.Quota, redisstore.LeaseIdle, true},
		{admit.TokenBucket, redisstore.LeaseIdle, true},
		{admit.TokenBucket, redisstore.BucketHold, true},
		{admit.FixedWindow, time.Minute, false}, // the window has ended
	} {
		t.Run(tc.a.String()+"/"+tc.after.String(), func(t *testing.T) {
			clock := storetest.NewClock()
			s := servers(t, "redis://"+srv.Addr, newPrefix(), 1, clock.Now)[0]
			rule := leasedRule(tc.a, limit)
			key := hotKey("refunds")
			admitted := warm(t, s, []admit.Charge{{Key: key, Rule: rule, Cost: 1}})
			held := settle(t, s, key)
			if got := left(t, s, key, rule); got != limit-admitted-held {
				t.Fatalf("Redis has %d left, want %d − %d admitted − %d held", got, limit, admitted, held)
			}
			clock.Set(tc.after)
			redisstore.Sweep(s, clock.Now())
			if h, _ := redisstore.Held(s, key); h != 0 {
				t.Errorf("still holds %d after %v", h, tc.after)
			}
			want := limit - admitted
			if !tc.back {
				want = limit // a new window
			}
			if tc.a == admit.TokenBucket {
				want = min(limit, limit-admitted+int64(tc.after/(10*time.Minute)))
			}
			if got := left(t, s, key, rule); got != want {
				t.Errorf("after %v Redis has %d left, want %d (admitted %d, held %d)", tc.after, got, want, admitted, held)
			}
			h := s.Health()
			if tc.back && h.Refunded != held || !tc.back && h.Expired != held {
				t.Errorf("refunded %d, expired %d; held %d", h.Refunded, h.Expired, held)
			}
		})
	}
}

// TestLeasedWindowEnds: units withdrawn in one window are never spent in
// the next, even by a server that holds them when the window turns.
func TestLeasedWindowEnds(t *testing.T) {
	srv := redistest.Start(t)
	const limit = 1000
	for _, a := range []admit.Algorithm{admit.FixedWindow, admit.SlidingWindow} {
		t.Run(a.String(), func(t *testing.T) {
			clock := storetest.NewClock()
			clock.Set(59 * time.Second) // a second before the window ends
			ss := servers(t, "redis://"+srv.Addr, newPrefix(), 2, clock.Now)
			rule := leasedRule(a, limit)
			key := hotKey("ends")
			charges := []admit.Charge{{Key: key, Rule: rule, Cost: 1}}
			first := warm(t, ss[0], charges)
			held := settle(t, ss[0], key)
			clock.Set(time.Minute) // the next window
			per := drain(t, ss, 8, charges)
			// In the new window every admitted unit came from it: with the
			// previous window's count weighed in for a sliding window.
			carried := int64(0)
			if a == admit.SlidingWindow {
				carried = first + held
			}
			admitted := sum(per)
			heldNow := settle(t, ss[0], key) + settle(t, ss[1], key)
			if got := admitted + heldNow + left(t, ss[0], key, rule) + carried; got != limit {
				t.Errorf("new window: admitted %d + held %d + left + %d carried = %d, want %d (the old window's %d held units spent?)", admitted, heldNow, carried, got, limit, held)
			}
		})
	}
}

// TestLeasedServerDeath: a server that dies holding units takes them with
// it. They are never spent twice: the others admit the limit less what the
// dead server admitted and held.
func TestLeasedServerDeath(t *testing.T) {
	srv := redistest.Start(t)
	const limit = 2000
	clock := storetest.NewClock()
	prefix := newPrefix()
	ss := servers(t, "redis://"+srv.Addr, prefix, 3, clock.Now)
	rule := leasedRule(admit.FixedWindow, limit)
	key := hotKey("death")
	charges := []admit.Charge{{Key: key, Rule: rule, Cost: 1}}
	deadAdmitted := warm(t, ss[0], charges)
	deadHeld := settle(t, ss[0], key)
	ss[0].Client().Close() // the process is gone: its give-back never comes
	ss[0].Close()
	per := drain(t, ss[1:], 16, charges)
	if got := sum(per); got != limit-deadAdmitted-deadHeld {
		t.Errorf("the living admitted %d, want %d − %d admitted − %d held by the dead", got, limit, deadAdmitted, deadHeld)
	}
	if h := ss[0].Health(); h.Lost != deadHeld {
		t.Errorf("the dead server counts %d units lost, want %d", h.Lost, deadHeld)
	}
}

// TestLeasedRedisOutage: while Redis is down a server keeps deciding from
// the allowance in hand — exactly the units it holds — and then fails with
// CodeUnavailable, for on_error to apply.
func TestLeasedRedisOutage(t *testing.T) {
	srv := redistest.Start(t)
	clock := storetest.NewClock()
	s := servers(t, "redis://"+srv.Addr, newPrefix(), 1, clock.Now)[0]
	rule := leasedRule(admit.FixedWindow, 100000)
	key := hotKey("outage")
	charges := []admit.Charge{{Key: key, Rule: rule, Cost: 1}}
	warm(t, s, charges)
	held := settle(t, s, key)
	srv.Kill()
	var d admit.Decision
	served := int64(0)
	for {
		err := s.Decide(context.Background(), charges, &d)
		if err != nil {
			if admit.ErrorCode(err) != admit.CodeUnavailable {
				t.Fatalf("with Redis down: %v, want CodeUnavailable", err)
			}
			break
		}
		if !d.Allowed {
			t.Fatal("refused with Redis down and units in hand")
		}
		served++
		if served > held {
			t.Fatalf("served %d with Redis down, more than the %d held", served, held)
		}
	}
	if served != held {
		t.Errorf("served %d with Redis down, want the %d units held", served, held)
	}
}

// TestLeasedCluster: a tenant's key and the global key, in two slots of a
// 3-master cluster, both leased, decided all or nothing by three servers:
// each limit holds exactly, and the smaller one is what was admitted.
func TestLeasedCluster(t *testing.T) {
	nodes := redistest.StartCluster(t, 3)
	url := "redis+cluster://" + nodes[0].Addr + "," + nodes[1].Addr
	clock := storetest.NewClock()
	prefix := newPrefix()
	ss := servers(t, url, prefix, 3, clock.Now)
	tenantRule, globalRule := leasedRule(admit.FixedWindow, 3000), leasedRule(admit.TokenBucket, 2000)
	globalRule.Name = "global"
	tk := hotKey("cluster")
	gk := admit.Key{Scope: "global", Rule: "global"}.String()
	charges := []admit.Charge{{Key: tk, Rule: tenantRule, Cost: 1}, {Key: gk, Rule: globalRule, Cost: 1}}
	admitted := sum(drain(t, ss, 16, charges))
	if admitted != 2000 {
		t.Errorf("admitted %d, want the global limit of 2000", admitted)
	}
	for _, s := range ss {
		s.Close()
	}
	s := servers(t, url, prefix, 1, clock.Now)[0]
	if got := left(t, s, tk, tenantRule); got != 3000-admitted {
		t.Errorf("tenant key: %d left, want %d", got, 3000-admitted)
	}
	if got := left(t, s, gk, globalRule); got != 2000-admitted {
		t.Errorf("global key: %d left, want %d", got, 2000-admitted)
	}
}

// TestLeasedMixed: in a decision with an exact charge, the leased charge
// is taken from the allowance and the exact one decided in Redis; when
// Redis refuses, the leased unit goes back to the allowance. A rule that
// changes gives back what was held under the old one.
func TestLeasedMixed(t *testing.T) {
	srv := redistest.Start(t)
	clock := storetest.NewClock()
	s := servers(t, "redis://"+srv.Addr, newPrefix(), 1, clock.Now)[0]
	rule := leasedRule(admit.FixedWindow, 1000)
	key := hotKey("mixed")
	admitted := warm(t, s, []admit.Charge{{Key: key, Rule: rule, Cost: 1}})
	exact := &admit.Rule{Name: "user", Algorithm: admit.FixedWindow, Limit: 5, Window: time.Minute}
	uk := admit.Key{Scope: "user", Tenant: "mixed", Subject: "u", Rule: "user"}.String()
	mixed := []admit.Charge{{Key: key, Rule: rule, Cost: 1}, {Key: uk, Rule: exact, Cost: 1}}
	var d admit.Decision
	before := s.Health().LocalDecisions
	for i := range 6 {
		if err := s.Decide(context.Background(), mixed, &d); err != nil {
			t.Fatal(err)
		}
		if d.Allowed != (i < 5) {
			t.Fatalf("mixed decision %d: allowed %v", i, d.Allowed)
		}
	}
	if d.DeniedBy != "user" {
		t.Errorf("the sixth mixed decision was refused by %q, want user", d.DeniedBy)
	}
	held := settle(t, s, key)
	if got := left(t, s, key, rule); got+held+admitted+5 != 1000 {
		t.Errorf("Redis has %d left, the server holds %d, %d admitted: %d, want 1000 (the refused decision's unit put back)", got, held, admitted+5, got+held+admitted+5)
	}
	if got := left(t, s, uk, exact); got != 0 {
		t.Errorf("the exact rule has %d left, want 0", got)
	}
	if s.Health().LocalDecisions != before {
		t.Errorf("a decision with an exact charge counted as local")
	}
	changed := *rule
	changed.Limit = 2000
	if err := s.Decide(context.Background(), []admit.Charge{{Key: key, Rule: &changed, Cost: 1}}, &d); err != nil || !d.Allowed {
		t.Fatalf("decision under the new rule: %v %v", err, d.Allowed)
	}
	waitRefund := time.Now().Add(10 * time.Second)
	for s.Health().Refunded != held && time.Now().Before(waitRefund) {
		time.Sleep(time.Millisecond)
	}
	if got := s.Health().Refunded; got != held {
		t.Errorf("refunded %d after the rule changed, want the %d held", got, held)
	}
}

// TestLeasedClose: a store that closes gives back every unit it holds.
// Its clock moves 1 or 7 µs at each reading, so that withdrawals see their
// call take different times and compute their units' end differently:
// units of one window must add up all the same, not replace each other.
func TestLeasedClose(t *testing.T) {
	srv := redistest.Start(t)
	clock := storetest.NewClock()
	var ticks atomic.Int64
	var at atomic.Int64
	ticking := func() time.Time {
		return clock.Now().Add(time.Duration(at.Add(1+6*(ticks.Add(1)%2))) * time.Microsecond)
	}
	prefix := newPrefix()
	s := servers(t, "redis://"+srv.Addr, prefix, 1, ticking)[0]
	rule := leasedRule(admit.FixedWindow, 1000)
	key := hotKey("close")
	charges := []admit.Charge{{Key: key, Rule: rule, Cost: 1}}
	admitted := warm(t, s, charges)
	var d admit.Decision
	for before := s.Health().Withdrawals; s.Health().Withdrawals < before+3; admitted++ {
		if err := s.Decide(context.Background(), charges, &d); err != nil || !d.Allowed {
			t.Fatalf("decide: %v %v", err, d.Allowed)
		}
		settle(t, s, key)
	}
	held := settle(t, s, key)
	s.Close()
	if got := s.Health().Refunded; got != held {
		t.Errorf("closing gave back %d, want the %d held", got, held)
	}
	if got := left(t, servers(t, "redis://"+srv.Addr, prefix, 1, clock.Now)[0], key, rule); got != 1000-admitted {
		t.Errorf("after closing Redis has %d left, want %d", got, 1000-admitted)
	}
}

// TestLeasedBooking: two servers share a bucket of 1,000/s burst 100 that
// their callers ask three times its rate of, on a clock stepped a
// millisecond at a time (Redis's with it) for 2 s. The servers book its
// refill ahead: at every step they have admitted no more than the bucket
// holds (burst + rate × elapsed), by the end at least 90 % of it, with
// at most one Redis call per 10 decisions, and each server a share.
func TestLeasedBooking(t *testing.T) {
	srv := redistest.Start(t)
	for _, tc := range []struct {
		a    admit.Algorithm
		rate int64
	}{
		{admit.TokenBucket, 1000},
		{admit.GCRA, 1000},
		{admit.TokenBucket, 997}, // a token every 1,003,009.03 ns
	} {
		t.Run(tc.a.String()+"/"+itoa(tc.rate), func(t *testing.T) {
			const burst, steps = 100, 2000
			rate := tc.rate
			clock := storetest.NewClock()
			ss := servers(t, "redis://"+srv.Addr, newPrefix(), 2, clock.Now)
			rule := &admit.Rule{Name: "hot", Algorithm: tc.a, Rate: admit.PerSecond(rate), Burst: burst, Distribution: admit.Leased}
			key := hotKey("booking")
			charges := []admit.Charge{{Key: key, Rule: rule, Cost: 1}}
			var per [2]int64
			var decisions int64
			var d admit.Decision
			for step := range steps {
				elapsed := time.Duration(step) * time.Millisecond
				clock.Set(elapsed)
				// 3 a millisecond in all: 2 on one server, 1 on the other,
				// turn about.
				for k := range 3 {
					i := (step + k) % 2
					if err := ss[i].Decide(context.Background(), charges, &d); err != nil {
						t.Fatal(err)
					}
					decisions++
					if d.Allowed {
						per[i]++
					} else if d.RetryAfter <= 0 {
						t.Fatalf("step %d: refused with retry-after %v", step, d.RetryAfter)
					}
					// Withdrawals land before the clock moves on.
					settle(t, ss[i], key)
				}
				if bound := burst + rate*int64(elapsed)/int64(time.Second); per[0]+per[1] > bound {
					t.Fatalf("at %v: admitted %d (%v), more than the bucket's %d", elapsed, per[0]+per[1], per, bound)
				}
			}
			var calls int64
			for _, s := range ss {
				calls += s.Health().Calls
			}
			admitted := per[0] + per[1]
			bound := burst + rate*(steps-1)/1000
			t.Logf("%d decisions, %d admitted %v of %d, %d calls", decisions, admitted, per, bound, calls)
			if admitted < bound*9/10 {
				t.Errorf("admitted %d of %d, want at least 90 %%", admitted, bound)
			}
			if calls*10 > decisions {
				t.Errorf("%d calls for %d decisions, want at most 1 per 10", calls, decisions)
			}
			for i, n := range per {
				if n < admitted/4 {
					t.Errorf("server %d admitted %d of %d: booking shares the refill, want a quarter at least", i, n, admitted)
				}
			}
		})
	}
}

// TestLeasedRuleChangeAcrossServers: server A books a hot bucket's refill
// ahead under 1000/s; the rule becomes 1/min burst 200 and server B,
// which holds nothing, decides first: the units A holds are a debt, of
// the old rate's time for them (not of the new rule's tokens, an hour
// each), until A gives them back (at once, when it meets the new rule
// itself). B's refusal then must not outlast the give-back:
// B asks Redis again within a bucket's hold, and waits at most one token
// of the new rule (it once refused locally for the debt's whole time, two
// hours, with the units back in Redis).
func TestLeasedRuleChangeAcrossServers(t *testing.T) {
	srv := redistest.Start(t)
	clock := storetest.NewClock()
	ss := servers(t, "redis://"+srv.Addr, newPrefix(), 2, clock.Now)
	fast := &admit.Rule{Name: "hot", Algorithm: admit.TokenBucket, Rate: admit.PerSecond(1000), Burst: 1000, Distribution: admit.Leased}
	slow := &admit.Rule{Name: "hot", Algorithm: admit.TokenBucket, Rate: admit.Rate{N: 1, Per: time.Minute}, Burst: 200, Distribution: admit.Leased}
	key := hotKey("rulechange")
	var d admit.Decision
	decide := func(s *redisstore.Store, r *admit.Rule) {
		t.Helper()
		if err := s.Decide(context.Background(), []admit.Charge{{Key: key, Rule: r, Cost: 1}}, &d); err != nil {
			t.Fatal(err)
		}
		settle(t, s, key)
	}
	for step := range 1500 { // 3 a millisecond against 1 of refill
		clock.Set(time.Duration(step/3) * time.Millisecond)
		decide(ss[0], fast)
	}
	held := settle(t, ss[0], key)
	if held == 0 {
		t.Fatal("server A holds nothing of the hot bucket: the test needs units booked ahead")
	}
	decide(ss[1], slow)
	first := d
	decide(ss[0], slow) // A meets the new rule: what it held goes back first
	clock.Set(500*time.Millisecond + 2*time.Second)
	decide(ss[1], slow)
	t.Logf("A held %d; B first: allowed %v, retry %v; B 2 s later: allowed %v, remaining %d, retry %v", held, first.Allowed, first.RetryAfter, d.Allowed, d.Remaining, d.RetryAfter)
	// What A booked ahead is 126 ms of the old rate's refill: a debt of
	// that time under the new rate, not of 126 of its minutes.
	if !first.Allowed && first.RetryAfter > time.Minute+time.Second {
		t.Errorf("server B's first refusal under the new rule: retry %v, more than one token of it and what A booked: the booked units became a debt of the new rule's tokens", first.RetryAfter)
	}
	if !d.Allowed && d.RetryAfter > time.Minute {
		t.Errorf("server B refused 2 s after server A gave back the %d units it held, with retry %v, more than one token of the new rule: its refusal outlasted the give-back", held, d.RetryAfter)
	}
}
