package redisstore_test

import (
	"context"
	"encoding/binary"
	"math"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/admitdev/admit"
	"github.com/admitdev/admit/memstore"
	"github.com/admitdev/admit/redisstore"
	"github.com/admitdev/admit/redistest"
	"github.com/admitdev/admit/storetest"
)

// TestBatchMatchesMemstore queues decisions of every algorithm — admitted,
// refused, dry runs, leases, a key charged twice, keys shared between
// decisions — into one batch, and checks that each is decided exactly as
// the memory store decides the same sequence one at a time.
func TestBatchMatchesMemstore(t *testing.T) {
	rs, ms, _, _ := redisBesideMemstore(t, "batch:", 1500*time.Microsecond)

	tb := func(name string, rate admit.Rate, burst int64) *admit.Rule {
		return &admit.Rule{Name: name, Algorithm: admit.TokenBucket, Rate: rate, Burst: burst}
	}
	user, tenant := tb("user", admit.PerSecond(10), 3), tb("tenant", admit.PerSecond(100), 5)
	odd := tb("odd", admit.Rate{N: 7, Per: 3 * time.Second}, 4)
	gcra := &admit.Rule{Name: "gcra", Algorithm: admit.GCRA, Rate: admit.PerSecond(5), Burst: 2}
	fixed := &admit.Rule{Name: "fixed", Algorithm: admit.FixedWindow, Limit: 3, Window: time.Minute}
	sliding := &admit.Rule{Name: "sliding", Algorithm: admit.SlidingWindow, Limit: 3, Window: time.Minute}
	log := &admit.Rule{Name: "log", Algorithm: admit.SlidingLog, Limit: 3, Window: time.Minute}
	combo := &admit.Rule{Name: "combo", Algorithm: admit.Combination, Floor: admit.PerSecond(2), Rate: admit.PerSecond(1), Burst: 2}
	conc := &admit.Rule{Name: "conc", Algorithm: admit.Concurrency, Max: 2, LeaseTTL: time.Minute}
	ch := func(tn, subject string, r *admit.Rule, cost int64) admit.Charge {
		return admit.Charge{Key: admit.Key{Scope: "user", Tenant: tn, Subject: subject, Rule: r.Name}.String(), Rule: r, Cost: cost}
	}
	shared := func(r *admit.Rule, cost int64) admit.Charge {
		return admit.Charge{Key: admit.Key{Scope: "tenant", Tenant: "acme", Rule: r.Name}.String(), Rule: r, Cost: cost}
	}
	dry := func(c admit.Charge) admit.Charge { c.DryRun = true; return c }
	windows := func(cost int64) []admit.Charge {
		return []admit.Charge{ch("b", "u", gcra, cost), ch("b", "u", fixed, cost), ch("b", "u", sliding, cost), ch("b", "u", log, cost)}
	}
	decisions := [][]admit.Charge{
		{ch("acme", "u1", user, 1), shared(tenant, 1)},
		{ch("acme", "u1", user, 2), shared(tenant, 2)},
		{ch("acme", "u1", user, 1), shared(tenant, 1)}, // the user's bucket refuses; the tenant keeps its tokens
		{ch("acme", "u2", user, 2), shared(tenant, 2)},
		{ch("acme", "u3", user, 1), shared(tenant, 1)}, // the tenant's bucket refuses
		windows(1),
		windows(2),
		windows(1), // every window full
		{dry(ch("c", "u", combo, 2))},
		{ch("c", "u", combo, 2)},
		{ch("c", "u", combo, 2)},
		{ch("c", "u", combo, 1)},
		{ch("d", "u", conc, 1)},
		{ch("d", "u", conc, 1), ch("d", "u", odd, 1)},
		{ch("d", "u", conc, 1)}, // both slots held
		{ch("d", "u", odd, 2), ch("d", "u", odd, 2)},
		{ch("d", "u", odd, 1), ch("b", "u", log, 1)},
		{},
		{ch("d", "u", odd, 0), ch("acme", "u1", user, 0)},
	}
	want := make([]admit.Decision, len(decisions))
	for i, c := range decisions {
		if err := ms.Decide(context.Background(), c, &want[i]); err != nil {
			t.Fatalf("memstore decision %d: %v", i, err)
		}
	}

	callsBefore := rs.Health().Calls
	got, errs := decideInOneBatch(rs, decisions)
	queued := 0
	for _, c := range decisions {
		if len(c) > 0 { // a decision without charges never reaches Redis
			queued++
		}
	}
	if calls := rs.Health().Calls - callsBefore; calls != 1 {
		t.Errorf("%d decisions took %d calls, want one batch", queued, calls)
	}
	for i := range decisions {
		if errs[i] != nil {
			t.Errorf("decision %d: %v", i, errs[i])
			continue
		}
		g, w := got[i], want[i]
		if (g.Lease.ID == "") != (w.Lease.ID == "") || !g.Lease.ExpiresAt.Equal(w.Lease.ExpiresAt) {
			t.Errorf("decision %d: lease %+v, memstore %+v", i, g.Lease, w.Lease)
		}
		g.Lease, w.Lease = admit.Lease{}, admit.Lease{}
		if !equalDecisions(g, w) {
			t.Errorf("decision %d:\n batch    %+v\n memstore %+v", i, g, w)
		}
	}
	// The leases taken in the batch are real: releasing one frees a slot.
	if err := rs.ReleaseLease(context.Background(), got[12].Lease.ID); err != nil {
		t.Fatal(err)
	}
	var d admit.Decision
	if err := rs.Decide(context.Background(), []admit.Charge{ch("d", "u", conc, 1)}, &d); err != nil || !d.Allowed {
		t.Errorf("after a release: %+v, %v; want admitted", d, err)
	}
}

// redisBesideMemstore starts a redis-server and returns a Redis store on
// it (keys prefixed by prefix, refusals asked of Redis) and a memory
// store, both on one stopped clock set to at, and the server.
func redisBesideMemstore(t *testing.T, prefix string, at time.Duration) (*redisstore.Store, *memstore.Store, *storetest.Clock, *redistest.Server) {
	t.Helper()
	srv := redistest.Start(t)
	clock := storetest.NewClock()
	clock.Set(at)
	rs := redisstore.New(dial(t, "redis://"+srv.Addr).Client(), &redisstore.Options{Clock: clock.Now, Timeout: 10 * time.Second, Prefix: prefix, ExactRefusals: true})
	ms := memstore.New(&memstore.Options{Clock: clock.Now})
	t.Cleanup(func() { ms.Close() })
	return rs, ms, clock, srv
}

// decideInOneBatch decides every list of charges on rs, queued in order
// behind held calls and then sent together, and returns the decisions and
// errors in the same order.
func decideInOneBatch(rs *redisstore.Store, decisions [][]admit.Charge) ([]admit.Decision, []error) {
	release := redisstore.HoldBatches(rs)
	got := make([]admit.Decision, len(decisions))
	errs := make([]error, len(decisions))
	var wg sync.WaitGroup
	queued := 0
	for i, c := range decisions {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = rs.Decide(context.Background(), c, &got[i])
		}()
		if len(c) > 0 { // a decision without charges never reaches Redis
			queued++
		}
		for redisstore.Queued(rs) < queued { // queue them in order
			time.Sleep(100 * time.Microsecond)
		}
	}
	release()
	wg.Wait()
	return got, errs
}

func equalDecisions(a, b admit.Decision) bool {
	return slices.Equal(a.Results, b.Results) && a.Allowed == b.Allowed && a.Limit == b.Limit &&
		a.Remaining == b.Remaining && a.ResetAfter == b.ResetAfter && a.RetryAfter == b.RetryAfter && a.DeniedBy == b.DeniedBy
}

// TestBatchedHierarchyExact hammers user, tenant and global buckets from
// 64 goroutines on one store, the clock stopped so that nothing refills:
// the batches that form must admit exactly the global bucket's burst,
// each tenant and user within its own, and refused decisions charge
// nothing (else fewer would be admitted).
func TestBatchedHierarchyExact(t *testing.T) {
	srv := redistest.Start(t)
	clock := storetest.NewClock()
	s := redisstore.New(dial(t, "redis://"+srv.Addr).Client(), &redisstore.Options{Clock: clock.Now, Timeout: 10 * time.Second, Prefix: "hier:", ExactRefusals: true})
	user := &admit.Rule{Name: "user", Algorithm: admit.TokenBucket, Rate: admit.PerSecond(1), Burst: 50}
	tenant := &admit.Rule{Name: "tenant", Algorithm: admit.GCRA, Rate: admit.PerSecond(1), Burst: 300}
	global := &admit.Rule{Name: "global", Algorithm: admit.TokenBucket, Rate: admit.PerSecond(1), Burst: 1000}
	const goroutines, tenants, attempts = 64, 4, 100
	var perTenant [tenants]atomic.Int64
	var total atomic.Int64
	var wg sync.WaitGroup
	for g := range goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			tn := "t" + strconv.Itoa(g%tenants)
			charges := []admit.Charge{
				{Key: admit.Key{Scope: "user", Tenant: tn, Subject: strconv.Itoa(g), Rule: "user"}.String(), Rule: user, Cost: 1},
				{Key: admit.Key{Scope: "tenant", Tenant: tn, Rule: "tenant"}.String(), Rule: tenant, Cost: 1},
				{Key: admit.Key{Scope: "global", Rule: "global"}.String(), Rule: global, Cost: 1},
			}
			mine := 0
			var d admit.Decision
			for range attempts {
				if err := s.Decide(context.Background(), charges, &d); err != nil {
					t.Error(err)
					return
				}
				if d.Allowed {
					mine++
				}
			}
			if mine > 50 {
				t.Errorf("goroutine %d: %d admitted, over its user bucket's 50", g, mine)
			}
			perTenant[g%tenants].Add(int64(mine))
			total.Add(int64(mine))
		}()
	}
	wg.Wait()
	for i := range perTenant {
		if n := perTenant[i].Load(); n > 300 {
			t.Errorf("tenant %d: %d admitted, over its bucket's 300", i, n)
		}
	}
	calls := s.Health().Calls
	t.Logf("%d decisions in %d calls; %d admitted", goroutines*attempts, calls, total.Load())
	if total.Load() != 1000 {
		t.Errorf("admitted %d, want exactly the global burst 1000", total.Load())
	}
	if calls >= goroutines*attempts {
		t.Errorf("%d decisions took %d calls: no batch formed", goroutines*attempts, calls)
	}
}

// TestBatchContainsAFailedDecision: a decision whose key holds another
// type, or a string not the size of its algorithm's state (a rule that
// changed its algorithm keeps its key), fails alone; the decisions batched
// with it are decided. Both leave the usual path (decideFast, no pcall)
// for decide's.
func TestBatchContainsAFailedDecision(t *testing.T) {
	srv := redistest.Start(t)
	rs := redisstore.New(dial(t, "redis://"+srv.Addr).Client(), &redisstore.Options{Timeout: 10 * time.Second, Prefix: "fail:"})
	tb := &admit.Rule{Name: "tb", Algorithm: admit.TokenBucket, Rate: admit.PerSecond(10), Burst: 5}
	charge := func(tenant string) []admit.Charge {
		return []admit.Charge{{Key: admit.Key{Scope: "user", Tenant: tenant, Subject: "u", Rule: "tb"}.String(), Rule: tb, Cost: 1}}
	}
	// Find the bad tenants' keys as the store writes them, then make one a
	// hash and the other a string too short for a bucket's state.
	c := rs.Client()
	keyOf := func(tenant string) string {
		t.Helper()
		var d admit.Decision
		if err := rs.Decide(context.Background(), charge(tenant), &d); err != nil || !d.Allowed {
			t.Fatalf("first decision: %+v %v", d, err)
		}
		keys, err := c.Do(context.Background(), c.B().Keys().Pattern("fail:*").Build()).AsStrSlice()
		if err != nil || len(keys) != 1 {
			t.Fatalf("KEYS: %q %v", keys, err)
		}
		if err := c.Do(context.Background(), c.B().Del().Key(keys[0]).Build()).Error(); err != nil {
			t.Fatal(err)
		}
		return keys[0]
	}
	hashKey, shortKey := keyOf("bad"), keyOf("short")
	for _, cmd := range []rueidis.Completed{
		c.B().Hset().Key(hashKey).FieldValue().FieldValue("f", "v").Build(),
		c.B().Set().Key(shortKey).Value("0123456789abcdef").Build(),
	} {
		if err := c.Do(context.Background(), cmd).Error(); err != nil {
			t.Fatal(err)
		}
	}

	tenants := []string{"a", "bad", "c", "short", "d"}
	batch := make([][]admit.Charge, len(tenants))
	for i, tn := range tenants {
		batch[i] = charge(tn)
	}
	got, errs := decideInOneBatch(rs, batch)
	for i, tn := range tenants {
		bad := tn == "bad" || tn == "short"
		switch {
		case bad && admit.ErrorCode(errs[i]) != admit.CodeInternal:
			t.Errorf("%s tenant: %+v, %v; want an internal error", tn, got[i], errs[i])
		case !bad && (errs[i] != nil || !got[i].Allowed || got[i].Results[0].Remaining != 4):
			t.Errorf("tenant %s: %+v, %v; want admitted, 4 left", tn, got[i], errs[i])
		}
	}
}

// TestWindowBatchMatchesMemstore queues decisions made only of fixed
// windows — what a batch of windows (op "w") decides by INCRBY — into one
// batch: admitted, refused with the charges before the refusing one
// counted and taken back, debits past the limit, a key charged twice, a
// look at cost 0, and a shadow rule over its limit; each must be decided
// exactly as the memory store decides the same sequence one at a time.
func TestWindowBatchMatchesMemstore(t *testing.T) {
	rs, ms, clock, srv := redisBesideMemstore(t, "wb:", 90*time.Second)

	user := &admit.Rule{Name: "user", Algorithm: admit.FixedWindow, Limit: 3, Window: time.Minute}
	tenant := &admit.Rule{Name: "tenant", Algorithm: admit.FixedWindow, Limit: 5, Window: time.Second}
	shadow := &admit.Rule{Name: "shadow", Algorithm: admit.FixedWindow, Limit: 1, Window: time.Hour, Shadow: true}
	ch := func(subject string, r *admit.Rule, cost int64) admit.Charge {
		return admit.Charge{Key: admit.Key{Scope: "user", Tenant: "acme", Subject: subject, Rule: r.Name}.String(), Rule: r, Cost: cost}
	}
	tn := func(cost int64) admit.Charge {
		return admit.Charge{Key: admit.Key{Scope: "tenant", Tenant: "acme", Rule: tenant.Name}.String(), Rule: tenant, Cost: cost}
	}
	debit := func(c admit.Charge) admit.Charge { c.Debit = true; return c }
	decisions := [][]admit.Charge{
		{ch("u1", user, 1), tn(1)},
		{ch("u1", user, 2), tn(2)},
		{ch("u2", user, 1), tn(2)},                                // the tenant refuses: u2 is taken back
		{ch("u2", user, 1), tn(1)},                                // the tenant's last one
		{ch("u1", user, 1), tn(0)},                                // u1 is full; the tenant looks
		{debit(ch("u3", user, 5)), tn(0)},                         // a debit past the limit
		{ch("u3", user, 1)},                                       // refused by the debit
		{ch("u4", user, 1), ch("u4", user, 2), ch("u4", user, 1)}, // one key thrice: the third does not fit
		{ch("u5", user, 1), ch("u5", shadow, 1)},
		{ch("u5", user, 1), ch("u5", shadow, 1)}, // the shadow rule over its limit refuses nothing
	}
	if _, args := rs.Command(decisions[0]); args[0] != "w" {
		t.Fatalf("a decision of windows is sent as op %q, want a batch of windows (w)", args[0])
	}
	want := make([]admit.Decision, len(decisions))
	for i, c := range decisions {
		if err := ms.Decide(context.Background(), c, &want[i]); err != nil {
			t.Fatalf("memstore decision %d: %v", i, err)
		}
	}
	got, errs := decideInOneBatch(rs, decisions)
	for i := range decisions {
		if errs[i] != nil {
			t.Errorf("decision %d: %v", i, errs[i])
		} else if !equalDecisions(got[i], want[i]) {
			t.Errorf("decision %d:\n batch    %+v\n memstore %+v", i, got[i], want[i])
		}
	}
	// A window's count lives in a key named for the window, as an integer
	// that expires with it.
	c := dial(t, "redis://"+srv.Addr).Client()
	nowU := clock.Now().UnixMicro()
	end := nowU - nowU%time.Minute.Microseconds() + time.Minute.Microseconds()
	key := "wb:{" + redisstore.TagOf(ch("u1", user, 1)) + "}" + ch("u1", user, 1).Key + "@" + strconv.FormatInt(end, 10)
	if v, err := c.Do(context.Background(), c.B().Get().Key(key).Build()).ToString(); err != nil || v != "3" {
		t.Errorf("GET %s = %q, %v; want 3", key, v, err)
	}
	// (With a clock of the test's, 10 minutes more: see Options.Clock.)
	if ms, err := c.Do(context.Background(), c.B().Pttl().Key(key).Build()).AsInt64(); err != nil || ms <= 600_000 || ms > (end-nowU+999)/1000+600_000 {
		t.Errorf("PTTL %s = %d, %v; want the rest of its window and 10 minutes", key, ms, err)
	}
}

// TestWindowCarriesAdmitV7Count: a window longer than a minute that an
// admit_v7 server counted in (its state in the counter's key: the
// window's end in µs and the count, little-endian doubles) goes on from
// that count after the upgrade, on both paths (a batch of windows, and a
// decision of other algorithms too); a minute window starts afresh.
func TestWindowCarriesAdmitV7Count(t *testing.T) {
	srv := redistest.Start(t)
	clock := storetest.NewClock()
	rs := redisstore.New(dial(t, "redis://"+srv.Addr).Client(), &redisstore.Options{Clock: clock.Now, Timeout: 10 * time.Second, Prefix: "v7:"})
	c := dial(t, "redis://"+srv.Addr).Client()
	hour := &admit.Rule{Name: "hour", Algorithm: admit.FixedWindow, Limit: 10, Window: time.Hour}
	minute := &admit.Rule{Name: "minute", Algorithm: admit.FixedWindow, Limit: 10, Window: time.Minute}
	bucket := &admit.Rule{Name: "bucket", Algorithm: admit.TokenBucket, Rate: admit.PerSecond(1), Burst: 100}
	nowU := clock.Now().UnixMicro()
	v7 := func(subject string, r *admit.Rule, count float64) admit.Charge {
		ch := admit.Charge{Key: admit.Key{Scope: "user", Subject: subject, Rule: r.Name}.String(), Rule: r, Cost: 1}
		w := r.Window.Microseconds()
		var b [16]byte
		binary.LittleEndian.PutUint64(b[:8], math.Float64bits(float64(nowU-nowU%w+w)))
		binary.LittleEndian.PutUint64(b[8:], math.Float64bits(count))
		key := "v7:{" + redisstore.TagOf(ch) + "}" + ch.Key
		if err := c.Do(context.Background(), c.B().Set().Key(key).Value(string(b[:])).Build()).Error(); err != nil {
			t.Fatal(err)
		}
		return ch
	}
	bk := admit.Charge{Key: admit.Key{Scope: "user", Subject: "b", Rule: bucket.Name}.String(), Rule: bucket, Cost: 1}
	for _, tc := range []struct {
		name    string
		charges []admit.Charge
		want    int64 // the window's remaining after one more
	}{
		{"hour, batch of windows", []admit.Charge{v7("a", hour, 7)}, 2},
		{"hour, beside a bucket", []admit.Charge{v7("b", hour, 7), bk}, 2},
		{"minute", []admit.Charge{v7("c", minute, 7)}, 9},
	} {
		var d admit.Decision
		if err := rs.Decide(context.Background(), tc.charges, &d); err != nil {
			t.Fatal(err)
		}
		if !d.Allowed || d.Results[0].Remaining != tc.want {
			t.Errorf("%s: allowed %v, remaining %d; want admitted with %d left", tc.name, d.Allowed, d.Results[0].Remaining, tc.want)
		}
	}
}
