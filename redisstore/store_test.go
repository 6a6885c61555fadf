package redisstore_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/admitdev/admit"
	"github.com/admitdev/admit/internal/engine"
	"github.com/admitdev/admit/redisstore"
	"github.com/admitdev/admit/redistest"
	"github.com/admitdev/admit/storetest"
)

var prefixes atomic.Int64

// factory returns a storetest.Factory whose stores share one client and
// keep apart by key prefix, so each timeline starts empty.
func factory(client rueidis.Client) storetest.Factory {
	return func(t *testing.T, clock func() time.Time) admit.Store {
		s := redisstore.New(client, &redisstore.Options{
			Clock: clock, Timeout: 10 * time.Second, ExactRefusals: true, // the timelines check every charge of a refusal
			Prefix: "test" + strconv.FormatInt(prefixes.Add(1), 10) + ":",
		})
		t.Cleanup(func() { s.Close() })
		return s
	}
}

func dial(t *testing.T, url string) *redisstore.Store {
	t.Helper()
	s, err := redisstore.Open(context.Background(), url, &redisstore.Options{Timeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func TestConformanceStandalone(t *testing.T) {
	srv := redistest.Start(t)
	s := dial(t, "redis://"+srv.Addr)
	storetest.Run(t, factory(s.Client()))
}

func TestConformanceCluster(t *testing.T) {
	nodes := redistest.StartCluster(t, 3)
	s := dial(t, "redis+cluster://"+nodes[0].Addr+","+nodes[1].Addr)
	if s.String() != "redis (cluster)" {
		t.Fatalf("store is %s, want a cluster client", s)
	}
	storetest.Run(t, factory(s.Client()))
}

func TestParseURL(t *testing.T) {
	for _, tc := range []struct {
		url  string
		want string // Config printed with %+v, or the start of the error
	}{
		{"redis://127.0.0.1:6379/2", "{Mode:standalone Addrs:[127.0.0.1:6379] MasterName: DB:2 Username: Password:}"},
		{"redis://localhost", "{Mode:standalone Addrs:[localhost:6379] MasterName: DB:0 Username: Password:}"},
		{"redis://:s3cret@h:7000", "{Mode:standalone Addrs:[h:7000] MasterName: DB:0 Username: Password:s3cret}"},
		{"redis://bob:pw@h:7000/1", "{Mode:standalone Addrs:[h:7000] MasterName: DB:1 Username:bob Password:pw}"},
		{"redis+sentinel://mymaster@h1:26379,h2", "{Mode:sentinel Addrs:[h1:26379 h2:26379] MasterName:mymaster DB:0 Username: Password:}"},
		{"redis+sentinel://:pw@mymaster@h1:1", "{Mode:sentinel Addrs:[h1:1] MasterName:mymaster DB:0 Username: Password:pw}"},
		{"redis+cluster://a:1,b:2,c:3", "{Mode:cluster Addrs:[a:1 b:2 c:3] MasterName: DB:0 Username: Password:}"},
		{"memcached://x", `store URL "memcached://x": scheme`},
		{"redis+sentinel://h1:26379", "store URL \"redis+sentinel://h1:26379\": a sentinel URL names the master"},
		{"redis+cluster://a:1/3", "store URL \"redis+cluster://a:1/3\": a cluster has no database"},
		{"redis://a:1,b:2", "store URL \"redis://a:1,b:2\": a standalone server has one address"},
		{"redis://h:99999", "store URL \"redis://h:99999\": address \"h:99999\": port"},
		{"redis://h/x", "store URL \"redis://h/x\": database \"x\""},
		{"redis://u:hidden@h:1/99", "store URL \"redis://***@h:1/99\": database"},
		{"redis://", "store URL \"redis://\": no address"},
		// A password alone, with no colon, is hidden too.
		{"redis://s3cret@h:1/99", "store URL \"redis://***@h:1/99\": database"},
		{"redis+sentinel://u:pw@mymaster@h1:1/x", "store URL \"redis+sentinel://***@mymaster@h1:1/x\": database"},
		// A master's name and a password, as "name:password", is refused,
		// hidden.
		{"redis+sentinel://mymaster:s3cret@h1:1", "store URL \"redis+sentinel://***@h1:1\": the master's name holds a \":\""},
		{"redis+sentinel://:pw@mymaster:s3cret@h1:1", "store URL \"redis+sentinel://***@***@h1:1\": the master's name"},
		{"rediss://u:pw@h:6380/1?tls_ca_file=/ca.pem", "{Mode:standalone Addrs:[h:6380] MasterName: DB:1 Username:u Password:pw}"},
		{"rediss+cluster://a:1?tls_server_name=redis.example", "{Mode:cluster Addrs:[a:1] MasterName: DB:0 Username: Password:}"},
		{"redis://h:1?tls_ca_file=/ca.pem", "store URL \"redis://h:1?tls_ca_file=/ca.pem\": query parameters are TLS settings"},
		{"rediss://pw@h:1?tls_bogus=1", "store URL \"rediss://***@h:1?***\": unknown query parameter \"tls_bogus\""},
		{"rediss://h:1?password=pw&tls_ca_file=/ca.pem", "store URL \"rediss://h:1?***&tls_ca_file=/ca.pem\": an unknown query parameter"},
	} {
		c, err := redisstore.ParseURL(tc.url)
		got := fmt.Sprintf("{Mode:%s Addrs:%v MasterName:%s DB:%d Username:%s Password:%s}", c.Mode, c.Addrs, c.MasterName, c.DB, c.Username, c.Password)
		if err != nil {
			got = err.Error()
		}
		if !strings.HasPrefix(got, tc.want) || (err != nil && admit.ErrorCode(err) != admit.CodeInvalid) {
			t.Errorf("ParseURL(%q) = %s, want %s", tc.url, got, tc.want)
		}
	}
}

func TestCheckRule(t *testing.T) {
	ok := []*admit.Rule{
		{Name: "monthly", Algorithm: admit.FixedWindow, Limit: 100000, Window: 31 * 24 * time.Hour},
		{Name: "daily", Algorithm: admit.TokenBucket, Rate: admit.Rate{N: 1000, Per: 24 * time.Hour}, Burst: 1000},
		{Name: "thirds", Algorithm: admit.GCRA, Rate: admit.PerSecond(3), Burst: 1_000_000},
	}
	for _, r := range ok {
		if err := redisstore.CheckRule(r); err != nil {
			t.Errorf("%s: %v", r.Name, err)
		}
	}
	bad := map[string]*admit.Rule{
		"burst × interval": {Name: "yearly", Algorithm: admit.TokenBucket, Rate: admit.Rate{N: 1, Per: 24 * time.Hour}, Burst: 365},
		"window of":        {Name: "year", Algorithm: admit.SlidingWindow, Limit: 10, Window: 366 * 24 * time.Hour},
		"whole microsec":   {Name: "odd", Algorithm: admit.FixedWindow, Limit: 10, Window: time.Millisecond + 1},
		"lease_ttl":        {Name: "long", Algorithm: admit.Concurrency, Max: 1, LeaseTTL: 100 * 24 * time.Hour},
	}
	for want, r := range bad {
		err := redisstore.CheckRule(r)
		if err == nil || !strings.Contains(err.Error(), want) || admit.ErrorCode(err) != admit.CodeInvalid {
			t.Errorf("%s: error %v, want one about %q", r.Name, err, want)
		}
	}
}

// TestServersShareOneKey is DESIGN §11's exactness across servers: three
// stores, each with its own connection as separate servers would have,
// hammer one key; the admitted total stays within burst + rate × elapsed.
func TestServersShareOneKey(t *testing.T) {
	srv := redistest.Start(t)
	rule := &admit.Rule{Name: "shared", Algorithm: admit.TokenBucket, Rate: admit.PerSecond(1000), Burst: 50}
	charges := []admit.Charge{{Key: admit.Key{Scope: "tenant", Tenant: "acme", Rule: "shared"}.String(), Rule: rule, Cost: 1}}
	var stores []*redisstore.Store
	for range 3 {
		stores = append(stores, dial(t, "redis://"+srv.Addr))
	}
	var admitted, attempts atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	deadline := start.Add(500 * time.Millisecond)
	for g := range 24 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var d admit.Decision
			for time.Now().Before(deadline) {
				if err := stores[g%3].Decide(context.Background(), charges, &d); err != nil {
					t.Error(err)
					return
				}
				attempts.Add(1)
				if d.Allowed {
					admitted.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	bound := rule.Burst + int64(elapsed)*rule.Rate.N/int64(time.Second)
	t.Logf("3 stores, 24 goroutines: admitted %d of %d attempts; bound %d in %v", admitted.Load(), attempts.Load(), bound, elapsed)
	if admitted.Load() > bound {
		t.Errorf("admitted %d > burst + rate × elapsed = %d", admitted.Load(), bound)
	}
	// A refusal comes only once the burst is spent: what the decisions
	// imply, however the goroutines were scheduled.
	if attempts.Load() > admitted.Load() && admitted.Load() < rule.Burst {
		t.Errorf("refused %d having admitted only %d; the first refusal comes after the burst of %d", attempts.Load()-admitted.Load(), admitted.Load(), rule.Burst)
	}
}

// TestScriptCacheLossAndExpiry: after FUNCTION FLUSH (what a restart
// without persistence does), decisions go on, the library loaded again.
func TestScriptCacheLossAndExpiry(t *testing.T) {
	srv := redistest.Start(t)
	s := dial(t, "redis://"+srv.Addr)
	rules := []*admit.Rule{
		{Name: "tb", Algorithm: admit.TokenBucket, Rate: admit.PerSecond(10), Burst: 5},
		{Name: "combo", Algorithm: admit.Combination, Floor: admit.PerSecond(2), Rate: admit.PerSecond(1), Burst: 3},
		{Name: "win", Algorithm: admit.SlidingWindow, Limit: 10, Window: time.Minute},
		{Name: "log", Algorithm: admit.SlidingLog, Limit: 10, Window: time.Minute},
		{Name: "conc", Algorithm: admit.Concurrency, Max: 5, LeaseTTL: time.Minute},
	}
	var charges []admit.Charge
	for _, r := range rules {
		charges = append(charges, admit.Charge{Key: admit.Key{Scope: "user", Tenant: "t", Subject: "u", Rule: r.Name}.String(), Rule: r, Cost: 1})
	}
	ctx := context.Background()
	for i := range 3 {
		if i == 1 {
			if _, err := redistest.Command(srv.Addr, "FUNCTION", "FLUSH"); err != nil {
				t.Fatal(err)
			}
		}
		d, err := storetest.Check(ctx, s, charges...)
		if err != nil || !d.Allowed {
			t.Fatalf("decision %d: %+v, %v", i, d, err)
		}
	}
	// Every key the store wrote expires when idle: within two windows
	// (a sliding window's counts matter for two).
	keys, err := s.Client().Do(ctx, s.Client().B().Keys().Pattern("admit:*").Build()).AsStrSlice()
	if err != nil {
		t.Fatal(err)
	}
	if len(keys) < len(rules)+1 { // the rules' keys and lease records
		t.Fatalf("keys %q", keys)
	}
	for _, k := range keys {
		ttl, err := s.Client().Do(ctx, s.Client().B().Pttl().Key(k).Build()).AsInt64()
		if err != nil || ttl <= 0 || ttl > int64(2*time.Minute/time.Millisecond) {
			t.Errorf("key %q: PTTL %d, %v; want an expiry within two windows", k, ttl, err)
		}
	}
}

// TestClusterTenantSlots: a tenant's keys, its lease record included, share
// one hash slot; keys without a tenant share the global slot.
func TestClusterTenantSlots(t *testing.T) {
	nodes := redistest.StartCluster(t, 3)
	s := dial(t, "redis+cluster://"+nodes[0].Addr)
	ctx := context.Background()
	// Slow rates: idle keys expire once full again, and the keys must
	// still be there when they are listed, however slow the machine.
	hourly := admit.Rate{N: 10, Per: time.Hour}
	user := &admit.Rule{Name: "user", Algorithm: admit.TokenBucket, Rate: hourly, Burst: 5}
	conc := &admit.Rule{Name: "conc", Algorithm: admit.Concurrency, Max: 5, LeaseTTL: time.Hour}
	global := &admit.Rule{Name: "global", Algorithm: admit.GCRA, Rate: hourly, Burst: 10}
	for _, tenant := range []string{"acme", "globex", "initech", "a{b}c"} {
		d, err := storetest.Check(ctx, s,
			admit.Charge{Key: admit.Key{Scope: "user", Tenant: tenant, Subject: "u1", Rule: "user"}.String(), Rule: user, Cost: 1},
			admit.Charge{Key: admit.Key{Scope: "tenant", Tenant: tenant, Rule: "conc"}.String(), Rule: conc, Cost: 1},
			admit.Charge{Key: admit.Key{Scope: "global", Rule: "global"}.String(), Rule: global, Cost: 1},
		)
		if err != nil || !d.Allowed || d.Lease.ID == "" {
			t.Fatalf("%s: %+v %v", tenant, d, err)
		}
	}
	slots := map[string]map[string]bool{} // tag → slots of its keys
	for _, n := range nodes {
		c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{n.Addr}, ForceSingleClient: true})
		if err != nil {
			t.Fatal(err)
		}
		keys, err := c.Do(ctx, c.B().Keys().Pattern("admit:*").Build()).AsStrSlice()
		if err != nil {
			t.Fatal(err)
		}
		for _, k := range keys {
			slot, err := c.Do(ctx, c.B().ClusterKeyslot().Key(k).Build()).AsInt64()
			if err != nil {
				t.Fatal(err)
			}
			tag := k[strings.IndexByte(k, '{')+1 : strings.IndexByte(k, '}')]
			if slots[tag] == nil {
				slots[tag] = map[string]bool{}
			}
			slots[tag][fmt.Sprint(slot)] = true
		}
		c.Close()
	}
	if len(slots) != 5 { // four tenants and the global tag
		t.Errorf("tags %v, want 4 tenants and g", slots)
	}
	for tag, s := range slots {
		if len(s) != 1 {
			t.Errorf("tag %s spans slots %v", tag, s)
		}
	}
}

// TestClusterTenantsPerDecision: a Cluster store told that its decisions
// name one tenant (Options.TenantsPerDecision, as admit serve tells it)
// holds a lease in that tenant's group and the global one, refuses a
// lease or a reservation of two tenants as invalid, charging nothing, and
// finds no lease behind an id of two tenants' groups without asking
// Redis. A decision without a lease may still name several.
func TestClusterTenantsPerDecision(t *testing.T) {
	nodes := redistest.StartCluster(t, 3)
	s, err := redisstore.Open(context.Background(), "redis+cluster://"+nodes[0].Addr, &redisstore.Options{Timeout: 10 * time.Second, TenantsPerDecision: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()
	conc := &admit.Rule{Name: "conc", Algorithm: admit.Concurrency, Max: 1, LeaseTTL: time.Hour}
	bucket := &admit.Rule{Name: "bucket", Algorithm: admit.TokenBucket, Rate: admit.Rate{N: 10, Per: time.Hour}, Burst: 5}
	charge := func(r *admit.Rule, tenant string) admit.Charge {
		return admit.Charge{Key: admit.Key{Scope: "tenant", Tenant: tenant, Rule: r.Name}.String(), Rule: r, Cost: 1}
	}
	global := admit.Charge{Key: admit.Key{Scope: "global", Rule: "conc"}.String(), Rule: conc, Cost: 1}

	if _, err := storetest.Check(ctx, s, charge(conc, "acme"), charge(conc, "globex")); admit.ErrorCode(err) != admit.CodeInvalid {
		t.Errorf("a lease of two tenants: %v, want invalid", err)
	}
	if _, err := s.Reserve(ctx, []admit.Charge{charge(bucket, "acme"), charge(bucket, "globex")}, time.Second); admit.ErrorCode(err) != admit.CodeInvalid {
		t.Errorf("a reservation of two tenants: %v, want invalid", err)
	}
	if d, err := storetest.Check(ctx, s, charge(bucket, "acme"), charge(bucket, "globex")); err != nil || !d.Allowed {
		t.Errorf("a check of two tenants without a lease: %+v %v", d, err)
	}
	d, err := storetest.Check(ctx, s, charge(conc, "acme"), global) // the refused lease took no slot
	if err != nil || !d.Allowed || strings.Count(d.Lease.ID, ".") != 2 {
		t.Fatalf("a lease of acme and the global group: %+v %v", d, err)
	}
	if _, err := s.RenewLease(ctx, d.Lease.ID); err != nil {
		t.Errorf("renewing it: %v", err)
	}
	raw, _, _ := strings.Cut(d.Lease.ID, ".")
	if _, err := s.RenewLease(ctx, raw+".0123456789abcdef.fedcba9876543210.g"); admit.ErrorCode(err) != admit.CodeNotFound {
		t.Errorf("an id of two tenants: %v, want not found", err)
	}
	if err := s.ReleaseLease(ctx, d.Lease.ID); err != nil {
		t.Errorf("releasing it: %v", err)
	}
}

// TestClusterGlobalBound measures the Cluster design for global charges
// (tenant slot first, then the global slot, giving back on a refusal) with
// the global bucket the binding limit: nothing is admitted beyond it, and
// the log says how much of it the give-backs left unused.
func TestClusterGlobalBound(t *testing.T) {
	nodes := redistest.StartCluster(t, 3)
	s := dial(t, "redis+cluster://"+nodes[0].Addr)
	user := &admit.Rule{Name: "user", Algorithm: admit.TokenBucket, Rate: admit.PerSecond(200), Burst: 20}
	global := &admit.Rule{Name: "global", Algorithm: admit.TokenBucket, Rate: admit.PerSecond(2000), Burst: 100}
	var admitted, attempts, refusedByUser atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	deadline := start.Add(time.Second)
	for g := range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var d admit.Decision
			tenant := "tenant-" + strconv.Itoa(g%8)
			charges := []admit.Charge{
				{Key: admit.Key{Scope: "user", Tenant: tenant, Subject: strconv.Itoa(g), Rule: "user"}.String(), Rule: user, Cost: 1},
				{Key: admit.Key{Scope: "global", Rule: "global"}.String(), Rule: global, Cost: 1},
			}
			for time.Now().Before(deadline) {
				if err := s.Decide(context.Background(), charges, &d); err != nil {
					t.Error(err)
					return
				}
				attempts.Add(1)
				switch {
				case d.Allowed:
					admitted.Add(1)
				case d.DeniedBy == "user":
					refusedByUser.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	bound := global.Burst + int64(elapsed)*global.Rate.N/int64(time.Second)
	t.Logf("cluster, 32 goroutines over 8 tenants: %d attempts, %d admitted, %d refused by the user bucket; global bound %d in %v: %.1f%% of it used, over-admission %d",
		attempts.Load(), admitted.Load(), refusedByUser.Load(), bound, elapsed.Round(time.Millisecond), 100*float64(admitted.Load())/float64(bound), max(admitted.Load()-bound, 0))
	if admitted.Load() > bound {
		t.Errorf("admitted %d > the global bucket's burst + rate × elapsed = %d", admitted.Load(), bound)
	}
}

// TestSentinel reaches the master through a real Sentinel and decides.
func TestSentinel(t *testing.T) {
	master := redistest.Start(t)
	sentinel := redistest.StartSentinel(t, master, "mymaster")
	s := dial(t, "redis+sentinel://mymaster@"+sentinel.Addr)
	if s.String() != "redis (sentinel)" {
		t.Fatalf("store is %s, want a sentinel client", s)
	}
	storetest.RunTimelines(t, factory(s.Client()))
}

func TestNoCharges(t *testing.T) {
	srv := redistest.Start(t)
	s := dial(t, "redis://"+srv.Addr)
	d, err := storetest.Check(context.Background(), s)
	if err != nil || !d.Allowed {
		t.Fatalf("no charges: %+v %v, want admitted", d, err)
	}
	r, err := s.Reserve(context.Background(), nil, time.Second)
	if err != nil || !r.OK || r.Wait != 0 {
		t.Fatalf("reserve nothing: %+v %v", r, err)
	}
}

// TestConformanceLeased runs the timelines with every leasable rule
// leased, on one server: whatever it withdraws it holds alone.
func TestConformanceLeased(t *testing.T) {
	srv := redistest.Start(t)
	s := dial(t, "redis://"+srv.Addr)
	var mu sync.Mutex
	var stores []*redisstore.Store
	newStore := factory(s.Client())
	t.Run("timelines", func(t *testing.T) {
		storetest.RunTimelinesOf(t, func(t *testing.T, clock func() time.Time) admit.Store {
			st := newStore(t, clock).(*redisstore.Store)
			mu.Lock()
			stores = append(stores, st)
			mu.Unlock()
			return st
		}, storetest.Leased(storetest.Timelines()))
	})
	var h redisstore.Health
	for _, st := range stores {
		x := st.Health()
		h.Decisions += x.Decisions
		h.LocalDecisions += x.LocalDecisions
		h.Withdrawals += x.Withdrawals
	}
	t.Logf("%d decisions, %d local, %d withdrawals", h.Decisions, h.LocalDecisions, h.Withdrawals)
}

// An empty key would be one state every caller shares: an error, never a
// decision, as in memstore.
func TestEmptyKey(t *testing.T) {
	srv := redistest.Start(t)
	s := dial(t, "redis://"+srv.Addr)
	rule := &admit.Rule{Name: "r", Algorithm: admit.TokenBucket, Rate: admit.PerSecond(1), Burst: 1}
	var d admit.Decision
	err := s.Decide(context.Background(), []admit.Charge{{Key: "k", Rule: rule, Cost: 1}, {Rule: rule, Cost: 1}}, &d)
	if admit.ErrorCode(err) != admit.CodeInvalid || admit.ErrorField(err) != "key" || d.Allowed {
		t.Errorf("a charge with an empty key: %v, allowed %v", err, d.Allowed)
	}
}

// TestFairShares runs the fairness scenarios on two stores (two servers)
// sharing one Redis, deciding in turn.
func TestFairShares(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	a, b := dial(t, "redis://"+srv.Addr), dial(t, "redis://"+srv.Addr)
	storetest.RunFairScenarios(t, fairScenarios(), func(t *testing.T, clock func() time.Time) []admit.Store {
		return twoServers(t, clock, "fair", a, b)
	})
}

// fairScenarios are storetest.FairScenarios at a third of their length
// (two windows of a sliding window's minute): the memory store runs them
// whole, and here every decision is a script of Redis's.
func fairScenarios() []storetest.FairScenario {
	scs := storetest.FairScenarios()
	for i := range scs {
		scs[i].Duration = max(scs[i].Duration/3, 2*scs[i].Rule.Window)
	}
	return scs
}

// twoServers returns two stores, one on each client, as two servers sharing
// one Redis see it, under a fresh prefix.
func twoServers(t *testing.T, clock func() time.Time, name string, a, b *redisstore.Store) []admit.Store {
	prefix := name + strconv.FormatInt(prefixes.Add(1), 10) + ":"
	var stores []admit.Store
	for _, c := range []rueidis.Client{a.Client(), b.Client()} {
		s := redisstore.New(c, &redisstore.Options{Clock: clock, Timeout: 10 * time.Second, Prefix: prefix})
		t.Cleanup(func() { s.Close() })
		stores = append(stores, s)
	}
	return stores
}

// TestFairSharesLeased runs the fairness scenarios of rules decided from
// leased allowances (a class's allowance withdrawn with its share), on
// two stores sharing one Redis.
func TestFairSharesLeased(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	a, b := dial(t, "redis://"+srv.Addr), dial(t, "redis://"+srv.Addr)
	var scs []storetest.FairScenario
	for _, sc := range fairScenarios() {
		// Acquire's waiters ask as checks do: the exact run covers them.
		if engine.Leasable(sc.Rule.Algorithm) && sc.MaxWait == 0 {
			sc.Rule.Distribution = admit.Leased
			sc.Name += "/leased"
			scs = append(scs, sc)
		}
	}
	storetest.RunFairScenarios(t, scs, func(t *testing.T, clock func() time.Time) []admit.Store {
		return twoServers(t, clock, "fairleased", a, b)
	})
}

// Wiring mistakes are errors or panics that name them, at once: a nil
// context to Open, a nil client to New.
func TestWiringMistakes(t *testing.T) {
	//lint:ignore SA1012 the mistake under test
	if _, err := redisstore.Open(nil, "redis://127.0.0.1:1", nil); err == nil || !strings.Contains(err.Error(), "context is nil") {
		t.Errorf("Open(nil ctx): %v", err)
	}
	defer func() {
		if msg, _ := recover().(string); !strings.Contains(msg, "nil rueidis.Client") {
			t.Errorf("New(nil): panic %q", msg)
		}
	}()
	redisstore.New(nil, nil)
}

// TestLimiterRefusesWhatRedisCannotDecide: a limit valid on its own that
// the Redis store cannot decide (a window past its 52 days, a window of a
// fraction of a microsecond) is refused by admit.NewLimiter, at wiring,
// with the store's reason; never a 400 at every request.
func TestLimiterRefusesWhatRedisCannotDecide(t *testing.T) {
	cfg, err := redisstore.ParseURL("redis://127.0.0.1:1")
	if err != nil {
		t.Fatal(err)
	}
	s, err := redisstore.DialLazy(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for _, lim := range []admit.Limit{
		admit.Window("w90d", 10, 90*24*time.Hour),
		admit.Bucket("b-1-per-100d", admit.Rate{N: 1, Per: 100 * 24 * time.Hour}, 1),
		admit.Window("wfrac", 10, time.Millisecond+500*time.Nanosecond),
	} {
		l, err := admit.NewLimiter(s, lim)
		if err == nil || admit.ErrorCode(err) != admit.CodeInvalid || !strings.Contains(err.Error(), "Redis") {
			t.Errorf("%v: NewLimiter = %v, %v; want the Redis store's refusal", lim, l, err)
		}
	}
	if l, err := admit.NewLimiter(s, admit.Window("w1h", 10, time.Hour)); err != nil {
		t.Errorf("a window of an hour: %v", err)
	} else {
		l.Close()
	}
}

// TestBucketStateOfAnEarlierVersion reads a bucket's, a combination's and
// a sliding window's state as admit_v9 wrote them (no shape, no length):
// as the rule's own, as before, and written back with them.
func TestBucketStateOfAnEarlierVersion(t *testing.T) {
	srv := redistest.Start(t)
	s := dial(t, "redis://"+srv.Addr)
	ctx := context.Background()
	for _, tc := range []struct {
		rule        *admit.Rule
		size, older int // the state's size now and admit_v9's
		first, next int64
	}{
		{&admit.Rule{Name: "v9", Algorithm: admit.TokenBucket, Rate: admit.Rate{N: 1, Per: time.Hour}, Burst: 3}, 72, 32, 2, 1},
		{&admit.Rule{Name: "v9-combo", Algorithm: admit.Combination, Floor: admit.Rate{N: 1, Per: time.Hour}, Rate: admit.Rate{N: 1, Per: time.Hour}, Burst: 3}, 128, 48, 3, 2},
		{&admit.Rule{Name: "v9-sliding", Algorithm: admit.SlidingWindow, Limit: 3, Window: time.Hour}, 32, 24, 2, 1},
	} {
		c := []admit.Charge{{Key: admit.Key{Scope: "global", Rule: tc.rule.Name}.String(), Rule: tc.rule, Cost: 1}}
		var d admit.Decision
		if err := s.Decide(ctx, c, &d); err != nil || !d.Allowed || d.Remaining != tc.first {
			t.Fatalf("%s: first decision: %+v %v", tc.rule.Name, d, err)
		}
		key := s.Prefix() + "{g}" + c[0].Key
		client := s.Client()
		v, err := client.Do(ctx, client.B().Get().Key(key).Build()).ToString()
		if err != nil || len(v) != tc.size {
			t.Fatalf("%s: the state: %d bytes, %v; want %d", tc.rule.Name, len(v), err, tc.size)
		}
		if err := client.Do(ctx, client.B().Set().Key(key).Value(v[:tc.older]).Keepttl().Build()).Error(); err != nil {
			t.Fatal(err)
		}
		if err := s.Decide(ctx, c, &d); err != nil || !d.Allowed || d.Remaining != tc.next {
			t.Fatalf("%s: a decision on admit_v9's state: %+v %v, want admitted with %d left", tc.rule.Name, d, err, tc.next)
		}
		if v, err := client.Do(ctx, client.B().Get().Key(key).Build()).ToString(); err != nil || len(v) != tc.size {
			t.Fatalf("%s: the state written back: %d bytes, %v; want %d", tc.rule.Name, len(v), err, tc.size)
		}
	}
}
