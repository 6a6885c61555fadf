package redisstore_test

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/admitdev/admit"
	"github.com/admitdev/admit/redisstore"
	"github.com/admitdev/admit/redistest"
)

// TestHomeGiveBacksOnce: a give-back sent twice, or late after a later
// one, or for another incarnation of the key, is applied at most once;
// so a duplicated or reordered message never hands out a unit twice.
func TestHomeGiveBacksOnce(t *testing.T) {
	srv, s := scriptStore(t)
	// A bucket of 1 a minute, burst 100: nothing refills meanwhile.
	bucket := func(want int, back ...string) []int64 {
		t.Helper()
		args := append([]string{"a", "b", strconv.Itoa(want), "0", "1", "60000000", "100", "100", "0", "100"}, back...)
		v, err := redisstore.HomeCall(s, "home", args...)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	// A fresh server fences new buckets for τ + lookahead (100 minutes
	// here): wait it out by letting the key start long after.
	if _, err := redistest.Command(srv.Addr, "HSET", "home", "tat", "0", "gen", "1"); err != nil {
		t.Fatal(err)
	}
	g := bucket(60)
	if g[0] != 60 || g[3] != 1 {
		t.Fatalf("granted %v, want 60 of gen 1", g)
	}
	// Give back 10 with seq 5, twice: applied once.
	bucket(0, "1", "10", "5")
	bucket(0, "1", "10", "5")
	// Then a late one (seq 4) and one of another incarnation: ignored.
	bucket(0, "1", "10", "4")
	bucket(0, "2", "10", "6")
	if g = bucket(1000); g[0] != 50 {
		t.Errorf("after give-backs, granted %d of what was left; want 50 (40 left + 10 given back once)", g[0])
	}
}

// TestPoolDepositsOnce: a grant added to a pool twice (the call sent
// again) is added once.
func TestPoolDepositsOnce(t *testing.T) {
	_, s := scriptStore(t)
	for range 2 {
		v, err := redisstore.PoolCall(s, "pool", "d", "7", "0", "25", "1000", "4000000000000000", "12345", "0", "100")
		if err != nil {
			t.Fatal(err)
		}
		if v[0] != 25 {
			t.Fatalf("the pool holds %d after the grant of 25 was added twice", v[0])
		}
	}
	// A take of everything gets 25, all unlocked within the horizon.
	v, err := redisstore.PoolCall(s, "pool", "t", "100", "0", "60000000", "300000", "1000", "0", "0")
	if err != nil {
		t.Fatal(err)
	}
	if v[0] != 25 || v[7] != 25 {
		t.Errorf("took %d (%d ready), want the 25 added, all unlocked", v[0], v[7])
	}
}

// scriptStore starts a redis-server and a store on it, for calling the
// regions' scripts directly.
func scriptStore(t *testing.T) (*redistest.Server, *redisstore.Store) {
	t.Helper()
	srv := redistest.Start(t)
	s, err := redisstore.Open(context.Background(), "redis://"+srv.Addr, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return srv, s
}

// TestPoolResendsUntilAcknowledged: what a pool has to send home (a
// debt here) is sent again by every refill until the home has it, and
// the home applies it once: a refill whose reply was lost loses nothing.
func TestPoolResendsUntilAcknowledged(t *testing.T) {
	_, s := scriptStore(t)
	if _, err := redisstore.PoolCall(s, "pool", "r", "7", "0", "0", "-40"); err != nil {
		t.Fatal(err)
	}
	prepare := func() []int64 {
		v, err := redisstore.PoolCall(s, "pool", "a", "300000", "0")
		if err != nil {
			t.Fatal(err)
		}
		return v[4:] // gen, units, seq triples
	}
	first := prepare() // its reply lost: never acknowledged
	again := prepare()
	if len(first) != 3 || first[0] != 7 || first[1] != -40 || len(again) != 3 || again[2] != first[2] {
		t.Fatalf("sent %v, then %v: want the debt of 40, gen 7, sent again with its number", first, again)
	}
	if _, err := redisstore.PoolCall(s, "pool", "k", itoa(again[2])); err != nil {
		t.Fatal(err)
	}
	if rest := prepare(); len(rest) != 0 {
		t.Errorf("after the home acknowledged it, the pool sends %v", rest)
	}
}

// homeBucket calls the home's script for a bucket of n per per, burst
// burst, with no lookahead, wanting want, with give-backs back (gen,
// units, seq triples).
func homeBucket(t *testing.T, s *redisstore.Store, key string, n int, per time.Duration, burst, want int, back ...string) []int64 {
	t.Helper()
	b := strconv.Itoa(burst)
	args := append([]string{"a", "b", strconv.Itoa(want), "0", strconv.Itoa(n), itoa(per.Microseconds()), b, b, "0", b}, back...)
	v, err := redisstore.HomeCall(s, key, args...)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// TestHomeBucketRuleChanges: the home's timeline of a bucket whose rule
// changes keeps what the key holds, as one Redis's bucket does: tokens
// (capped at the new burst) and debt (as time), refilling at the new
// rate. Read under the new rule as it was, a drained bucket of 1/min
// waited ten minutes under 1/s, and one drained at 100/min refilled to
// 999 of a new burst of 1000.
func TestHomeBucketRuleChanges(t *testing.T) {
	srv, s := scriptStore(t)
	// Keys that start long after the server's start: see
	// TestHomeGiveBacksOnce.
	fresh := func(key string) {
		t.Helper()
		if _, err := redistest.Command(srv.Addr, "HSET", key, "tat", "0", "gen", "1"); err != nil {
			t.Fatal(err)
		}
	}
	spentFor := func(v []int64) time.Duration { return time.Duration(v[7]) * time.Microsecond }

	t.Run("raised", func(t *testing.T) {
		fresh("raised")
		if g := homeBucket(t, s, "raised", 1, time.Minute, 10, 10); g[0] != 10 {
			t.Fatalf("granted %d of a full burst of 10", g[0])
		}
		v := homeBucket(t, s, "raised", 1, time.Second, 10, 10)
		if v[0] != 0 || spentFor(v) <= 0 || spentFor(v) > time.Second {
			t.Errorf("drained at 1/min, changed to 1/s: granted %d, nothing more for %v; want 0, for at most 1s", v[0], spentFor(v))
		}
	})
	t.Run("tokens_kept", func(t *testing.T) {
		fresh("kept")
		homeBucket(t, s, "kept", 1, time.Minute, 10, 4)
		// 6 held; 10/min burst 100 refills one every 6 s.
		if v := homeBucket(t, s, "kept", 10, time.Minute, 100, 1000); v[0] != 6 {
			t.Errorf("6 held at 1/min, changed to 10/min burst 100: granted %d, want the 6", v[0])
		}
	})
	t.Run("lowered", func(t *testing.T) {
		fresh("lowered")
		homeBucket(t, s, "lowered", 100, time.Minute, 100, 100)
		v := homeBucket(t, s, "lowered", 1, time.Hour, 1000, 1000)
		if v[0] != 0 || spentFor(v) < 59*time.Minute {
			t.Errorf("drained at 100/min, changed to 1/h burst 1000: granted %d, nothing more for %v; want 0, for about an hour", v[0], spentFor(v))
		}
	})
	t.Run("debt_as_time", func(t *testing.T) {
		fresh("debt")
		g := homeBucket(t, s, "debt", 1, time.Minute, 10, 10)
		// A debt of 5 at 1/min: five minutes.
		homeBucket(t, s, "debt", 1, time.Minute, 10, 0, itoa(g[3]), "-5", "1")
		v := homeBucket(t, s, "debt", 1, time.Second, 10, 10)
		if v[0] != 0 || spentFor(v) < 5*time.Minute || spentFor(v) > 5*time.Minute+2*time.Second {
			t.Errorf("5 owed at 1/min, changed to 1/s: granted %d, nothing more for %v; want 0, for 5m1s", v[0], spentFor(v))
		}
	})
	t.Run("give_back_after_lowering", func(t *testing.T) {
		// 10 granted at 1000/min, and 10 owed (600 ms); then the rule
		// goes to 1/min, and the 10 granted come back unspent: they
		// repay the debt they were granted against, 600 ms of it, and
		// leave the key drained. Given back at the new interval, they
		// would have repaid ten minutes and filled it.
		fresh("back")
		g := homeBucket(t, s, "back", 1000, time.Minute, 10, 10)
		homeBucket(t, s, "back", 1000, time.Minute, 10, 0, itoa(g[3]), "-10", "1")
		homeBucket(t, s, "back", 1, time.Minute, 10, 0)
		if v := homeBucket(t, s, "back", 1, time.Minute, 10, 10, itoa(g[3]), "10", "2"); v[0] != 0 {
			t.Errorf("granted %d after the units came back; want 0: the key holds nothing", v[0])
		}
	})
	t.Run("flips", func(t *testing.T) {
		// Changed back and forth, a bucket grants what it held, once.
		fresh("flips")
		got := int64(0)
		for i := range 20 {
			burst := 5
			if i%2 == 1 {
				burst = 8
			}
			got += homeBucket(t, s, "flips", 1, time.Hour, burst, 100)[0]
		}
		if got != 5 {
			t.Errorf("granted %d over 20 changes between bursts of 5 and 8 at 1/h; want the 5 it held", got)
		}
	})
}

// TestHomeCountRuleChanges: the home keeps a count per period end, so
// a fixed window's count survives its limit's change, a window whose
// length changes counts anew once, and a window changed back finds its
// count again (it was counted anew at every change, admitting a limit
// each time).
func TestHomeCountRuleChanges(t *testing.T) {
	srv, s := scriptStore(t)
	// Two window lengths whose windows in progress end apart, both a
	// while from now.
	now := time.Now()
	// Windows are aligned on the Unix epoch, as the script aligns them.
	end := func(w time.Duration) time.Time {
		us, wu := now.UnixMicro(), w.Microseconds()
		return time.UnixMicro(us - us%wu + wu)
	}
	var a, b time.Duration
	for m := 61; a == 0; m++ {
		for k := m + 1; k < m+60; k++ {
			wa, wb := time.Duration(m)*time.Minute, time.Duration(k)*time.Minute
			if !end(wa).Equal(end(wb)) && end(wa).Sub(now) > 10*time.Minute && end(wb).Sub(now) > 10*time.Minute {
				a, b = wa, wb
				break
			}
		}
	}
	count := func(limit int, w time.Duration, want int) int64 {
		t.Helper()
		v, err := redisstore.HomeCall(s, "count", "a", "c", strconv.Itoa(want), "0", strconv.Itoa(limit), itoa(w.Microseconds()), "0", "0", "0")
		if err != nil {
			t.Fatal(err)
		}
		return v[0]
	}
	// Counted by an earlier version: one count of the period ending p.
	if _, err := redistest.Command(srv.Addr, "HSET", "count", "p", itoa(end(a).UnixMicro()), "c", "3"); err != nil {
		t.Fatal(err)
	}
	if g := count(10, a, 100); g != 7 {
		t.Fatalf("granted %d of a window that had 3 of 10; want 7", g)
	}
	if g := count(10, b, 100); g != 10 {
		t.Errorf("granted %d of a window of another length; want its 10", g)
	}
	if g := count(10, a, 100); g != 0 {
		t.Errorf("granted %d when the window changed back; want 0: its 10 are spent", g)
	}
	if g := count(15, a, 100); g != 5 {
		t.Errorf("granted %d when the limit went from 10 to 15; want 5", g)
	}

	// A quota's period in progress keeps its end and count when the
	// rule's period changes: the new one starts at the next.
	quota := func(limit int, start, end time.Time) int64 {
		t.Helper()
		v, err := redisstore.HomeCall(s, "quota", "a", "c", "100", "0", strconv.Itoa(limit), "0",
			itoa(start.UnixMicro()), itoa(end.UnixMicro()), itoa(end.Add(end.Sub(start)).UnixMicro()))
		if err != nil {
			t.Fatal(err)
		}
		return v[0]
	}
	if g := quota(10, now.Add(-time.Hour), now.Add(time.Hour)); g != 10 {
		t.Fatalf("granted %d of a fresh quota of 10", g)
	}
	if g := quota(10, now.Add(-time.Minute), now.Add(10*time.Minute)); g != 0 {
		t.Errorf("granted %d when the quota's period changed; want 0: the period in progress has its 10", g)
	}
	if g := quota(12, now.Add(-time.Minute), now.Add(10*time.Minute)); g != 2 {
		t.Errorf("granted %d when the quota went from 10 to 12; want 2", g)
	}
}

// TestHomeTimelineInIntegers: the home's timeline moves by a grant's
// exact span, rounded up, however far from a whole µs a token's interval
// is. At 10,000,000 per 10,000,001 µs a token takes 1.0000001 µs: ten
// take 10.000001 µs, which in floating point at today's µs since 1970
// (where a double's step is 0.25 µs) round to 10, moving the timeline
// less than it hands out, one µs in a million grants.
func TestHomeTimelineInIntegers(t *testing.T) {
	srv, s := scriptStore(t)
	tat0 := time.Now().Add(1000 * time.Second).UnixMicro()
	if _, err := redistest.Command(srv.Addr, "HSET", "exact", "tat", itoa(tat0), "gen", "1"); err != nil {
		t.Fatal(err)
	}
	// Burst 1,000,000 (τ about 1 s), lookahead 2000 s: the key, granted
	// 1000 s ahead, still has units within reach.
	grant := func(want int, back ...string) (int64, int64) {
		t.Helper()
		args := append([]string{"a", "b", strconv.Itoa(want), "0", "10000000", "10000001", "1000000", "1000000", "2000000000", "1000000"}, back...)
		v, err := redisstore.HomeCall(s, "exact", args...)
		if err != nil {
			t.Fatal(err)
		}
		tat, err := redistest.Command(srv.Addr, "HGET", "exact", "tat")
		if err != nil {
			t.Fatal(err)
		}
		at, err := strconv.ParseInt(tat, 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		return v[0], at - tat0
	}
	for i, want := range []int64{11, 22} {
		if g, moved := grant(10); g != 10 || moved != want {
			t.Fatalf("grant %d: granted %d, the timeline moved to tat0 + %d µs; want 10 granted, tat0 + %d (each grant's 10.000001 µs rounded up)", i+1, g, moved, want)
		}
	}
	// Ten given back take off their span rounded down: 10 µs.
	if g, moved := grant(0, "1", "10", "1"); g != 0 || moved != 12 {
		t.Errorf("after ten given back, the timeline is at tat0 + %d µs; want tat0 + 12", moved)
	}
}

// TestRegionRuleWholeMicroseconds: the home keeps whole µs, so a rate or
// window it would round is refused, rather than held a little faster.
func TestRegionRuleWholeMicroseconds(t *testing.T) {
	for _, r := range []admit.Rule{
		{Name: "b", Algorithm: admit.TokenBucket, Rate: admit.Rate{N: 1, Per: 1500 * time.Nanosecond}, Burst: 1},
		{Name: "w", Algorithm: admit.FixedWindow, Limit: 10, Window: time.Second + 1},
	} {
		if err := r.Validate(); err != nil {
			t.Fatalf("rule %s: %v", r.Name, err)
		}
		if err := redisstore.CheckRegionRule(&r); admit.ErrorCode(err) != admit.CodeInvalid || !strings.Contains(err.Error(), "microseconds") {
			t.Errorf("rule %s held across regions: %v; want it refused, naming microseconds", r.Name, err)
		}
	}
}

// TestHomeDebtCountsFromTheLookahead: a debt a region sends home moves
// the bucket's timeline on, by at most the rule's debt past what the home
// has handed out ahead (the lookahead): counted from now, the cap of
// 1000/7s, burst 20 and a debt of 20 (280 ms) lay below a timeline handed
// out to now + τ + 250 ms, and every debit was dropped (red team: 120
// debited units, none charged).
func TestHomeDebtCountsFromTheLookahead(t *testing.T) {
	srv, s := scriptStore(t)
	// Handed out 10 s ahead, within a lookahead of 20 s (long, so that
	// no delay of the call below matters): from now, the cap (280 ms)
	// lies far below the timeline; from the lookahead's end, far above.
	tat0 := time.Now().Add(10 * time.Second).UnixMicro()
	if _, err := redistest.Command(srv.Addr, "HSET", "debt", "tat", itoa(tat0), "gen", "1"); err != nil {
		t.Fatal(err)
	}
	if _, err := redisstore.HomeCall(s, "debt", "a", "b", "0", "0", "1000", "7000000", "20", "20", "20000000", "20", "1", "-20", "1"); err != nil {
		t.Fatal(err)
	}
	v, err := redistest.Command(srv.Addr, "HGET", "debt", "tat")
	if err != nil {
		t.Fatal(err)
	}
	if tat, _ := strconv.ParseInt(v, 10, 64); tat-tat0 != 140000 {
		t.Errorf("a debt of 20 at 7 ms moved the timeline by %d µs; want 140000", tat-tat0)
	}
}
