package admit_test

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/admitdev/admit"
	"github.com/admitdev/admit/internal/bounds"
	"github.com/admitdev/admit/internal/engine"
	"github.com/admitdev/admit/memstore"
	"github.com/admitdev/admit/storetest"
)

// recorder is a Store that admits everything and keeps the charges of the
// last decision, for tests of what a Limiter asks.
type recorder struct {
	admit.Store
	charges []admit.Charge
}

func (r *recorder) Decide(_ context.Context, charges []admit.Charge, d *admit.Decision) error {
	r.charges = append(r.charges[:0], charges...)
	d.Reset()
	for _, c := range charges {
		d.Results = append(d.Results, admit.Result{Rule: c.Rule.Name, Allowed: true})
	}
	engine.Summarize(d)
	return nil
}

func newLimiter(t *testing.T, s admit.Store, limits ...admit.Limit) *admit.Limiter {
	t.Helper()
	l, err := admit.NewLimiter(s, limits...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

func clockStore(t *testing.T) (*memstore.Store, *storetest.Clock) {
	clock := storetest.NewClock()
	s := memstore.New(&memstore.Options{Clock: clock.Now})
	t.Cleanup(func() { s.Close() })
	return s, clock
}

func TestLimiterKeys(t *testing.T) {
	rec := &recorder{}
	l := newLimiter(t, rec,
		admit.Bucket("global", admit.PerSecond(10), 10),
		admit.Bucket("tenant", admit.PerSecond(10), 10).Per(admit.PerTenant),
		admit.Window("user-action", 5, time.Minute).Per(admit.PerAction, admit.PerUser, admit.PerTenant),
		admit.Sliding("ip", 5, time.Minute).Per(admit.PerIP),
		admit.Bucket("user-ip", admit.PerSecond(1), 1).Per(admit.PerUser, admit.PerIP),
	)
	who := admit.Who{Tenant: "acme", User: "alice", Action: "export", IP: "192.0.2.1"}
	if _, err := l.Allow(context.Background(), who); err != nil {
		t.Fatal(err)
	}
	want := []admit.Key{
		{Scope: "per:", Rule: "global"},
		{Scope: "per:tenant", Tenant: "acme", Rule: "tenant"},
		{Scope: "per:tenant+user+action", Tenant: "acme", Subject: "alice", Action: "export", Rule: "user-action"},
		{Scope: "per:ip", Subject: "192.0.2.1", Rule: "ip"},
		{Scope: "per:user+ip", Subject: "5:alice9:192.0.2.1", Rule: "user-ip"},
	}
	if len(rec.charges) != len(want) {
		t.Fatalf("%d charges, want %d", len(rec.charges), len(want))
	}
	for i, c := range rec.charges {
		k, err := admit.ParseKey(c.Key)
		if err != nil {
			t.Fatalf("charge %d: key %q: %v", i, c.Key, err)
		}
		if k != want[i] {
			t.Errorf("charge %d: key %+v, want %+v", i, k, want[i])
		}
		if c.Cost != 1 || c.Rule.Name != want[i].Rule || c.Debit {
			t.Errorf("charge %d: %+v", i, c)
		}
		// The prepared hashes a store reads must be the key's own.
		if h := engine.KeyHash(&c); h != engine.KeyHash(&admit.Charge{Key: c.Key}) {
			t.Errorf("charge %d: prepared key hash %x, want %x", i, h, engine.KeyHash(&admit.Charge{Key: c.Key}))
		}
		th, ok := engine.TenantHash(&c)
		wh, wok := engine.TenantHash(&admit.Charge{Key: c.Key})
		if th != wh || ok != wok {
			t.Errorf("charge %d: prepared tenant hash %x %v, want %x %v", i, th, ok, wh, wok)
		}
	}
	// A user and IP pair that would read as another if the two were
	// simply joined.
	if _, err := l.Allow(context.Background(), admit.Who{Tenant: "acme", User: "a:1", Action: "x", IP: "2.0.0.1"}); err != nil {
		t.Fatal(err)
	}
	first := rec.charges[4].Key
	if _, err := l.Allow(context.Background(), admit.Who{Tenant: "acme", User: "a", Action: "x", IP: "1::2.0.0.1"}); err != nil {
		t.Fatal(err)
	}
	if rec.charges[4].Key == first {
		t.Errorf("two user and IP pairs share the key %q", first)
	}
}

// An IP is kept as the address it names: with or without its port, an
// IPv4-mapped IPv6 address as the IPv4 one, an IPv6 address per /64 (or
// the limit's prefix); what is not an address is an error.
func TestLimiterIPs(t *testing.T) {
	s, _ := clockStore(t)
	l := newLimiter(t, s,
		admit.Bucket("ip", admit.PerSecond(1), 1).Per(admit.PerIP),
		admit.Bucket("host", admit.PerSecond(1), 1).Per(admit.PerIP).IPv6Prefix(128))
	ctx := context.Background()
	spent := func(ip string) string {
		t.Helper()
		d, err := l.Allow(ctx, admit.Who{IP: ip})
		if err != nil {
			t.Fatalf("%q: %v", ip, err)
		}
		if d.Allowed {
			return ""
		}
		return d.DeniedBy
	}
	if got := spent("198.51.100.7"); got != "" {
		t.Fatalf("first request: refused by %s", got)
	}
	for _, same := range []string{"198.51.100.7:443", "::ffff:198.51.100.7", "[::ffff:198.51.100.7]:8080"} {
		if got := spent(same); got == "" {
			t.Errorf("%q: admitted, a bucket of its own", same)
		}
	}
	if got := spent("2001:db8::1"); got != "" {
		t.Fatalf("an IPv6 host: refused by %s", got)
	}
	// Another address of the same /64: the per-/64 limit refuses it.
	if got := spent("[2001:db8::2%eth0]:99"); got != "ip" {
		t.Errorf("another host of the /64: %q, want refused by the /64's limit", got)
	}
	for _, bad := range []string{"not-an-ip", "198.51.100.7:", "1.2.3", "[2001:db8::1]"} {
		if _, err := l.Allow(ctx, admit.Who{IP: bad}); admit.ErrorField(err) != "ip" {
			t.Errorf("%q: %v, want an error about the IP", bad, err)
		}
	}
	if _, err := admit.NewLimiter(s, admit.Bucket("v6", admit.PerSecond(1), 1).Per(admit.PerIP).IPv6Prefix(129)); admit.ErrorField(err) != "ip" {
		t.Errorf("IPv6Prefix(129): %v", err)
	}
}

// Two Limiters of one program on one store never share a limit's state
// unknowingly: a second Limiter with a limit of a name the first keeps is
// an error, until the first is closed; named Limiters keep apart.
func TestLimitersNamespaced(t *testing.T) {
	s, _ := clockStore(t)
	ctx := context.Background()
	a := newLimiter(t, s, admit.Window("api", 5, time.Minute))
	if _, err := admit.NewLimiter(s, admit.Window("api", 5, time.Minute)); admit.ErrorField(err) != "name" || !strings.Contains(err.Error(), "another Limiter") {
		t.Fatalf("a second Limiter keeping %q: %v", "api", err)
	}
	// On another store, or named apart, each keeps its own.
	other, _ := clockStore(t)
	b := newLimiter(t, other, admit.Window("api", 5, time.Minute))
	checkout, err := admit.NewNamedLimiter(s, "checkout", admit.Window("api", 5, time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	defer checkout.Close()
	for range 5 {
		for _, l := range []*admit.Limiter{a, b, checkout} {
			if d, err := l.Allow(ctx, admit.Who{}); err != nil || !d.Allowed {
				t.Fatalf("%+v %v", d, err)
			}
		}
	}
	for _, l := range []*admit.Limiter{a, b, checkout} {
		if d, _ := l.Allow(ctx, admit.Who{}); d.Allowed {
			t.Fatal("a sixth request in the minute admitted: state shared")
		}
	}
	if _, err := admit.NewNamedLimiter(s, "check out", admit.Window("api", 5, time.Minute)); admit.ErrorField(err) != "name" {
		t.Errorf("a name with a space: %v", err)
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Allow(ctx, admit.Who{}); err == nil {
		t.Error("a closed Limiter decided")
	}
	again, err := admit.NewLimiter(s, admit.Window("api", 5, time.Minute))
	if err != nil {
		t.Fatalf("after Close: %v", err)
	}
	if d, _ := again.Allow(ctx, admit.Who{}); d.Allowed {
		t.Error("the state stays in the store after Close: want the window still spent")
	}
	again.Close()
}

func TestNewLimiterRefuses(t *testing.T) {
	s, _ := clockStore(t)
	ok := admit.Bucket("user", admit.PerSecond(1), 1).Per(admit.PerUser)
	for _, tc := range []struct {
		name   string
		store  admit.Store
		limits []admit.Limit
		field  string
		says   string
	}{
		{"nil store", nil, []admit.Limit{ok}, "", "memstore.New"},
		{"no limits", s, nil, "", "no limits"},
		{"shared name", s, []admit.Limit{ok, admit.Window("user", 1, time.Second)}, "name", "never share state"},
		{"no name", s, []admit.Limit{admit.Bucket("", admit.PerSecond(1), 1)}, "name", "no name"},
		{"unknown scope", s, []admit.Limit{ok.Per("users")}, "per", `"users"`},
		{"no burst", s, []admit.Limit{admit.Bucket("b", admit.PerSecond(1), 0)}, "burst", "burst"},
		{"no rate", s, []admit.Limit{admit.Bucket("b", admit.Rate{}, 1)}, "rate", "rate"},
		{"no window", s, []admit.Limit{admit.Window("w", 1, 0)}, "window", "window"},
		{"long name", s, []admit.Limit{admit.Bucket(strings.Repeat("n", 200), admit.PerSecond(1), 1)}, "name", "at most 128"},
		// A constructor's failure, its error unread: refused now, not at
		// the first request.
		{"typed nil store", (*memstore.Store)(nil), []admit.Limit{ok}, "", "nil *memstore.Store"},
		// A limit the store says it cannot decide.
		{"store's bounds", checkingStore{s}, []admit.Limit{ok, admit.Window("long", 1, 90*24*time.Hour)}, "window", "longer than this store's"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l, err := admit.NewLimiter(tc.store, tc.limits...)
			if err == nil || l != nil {
				t.Fatalf("NewLimiter = %v, %v; want an error", l, err)
			}
			if admit.ErrorCode(err) != admit.CodeInvalid || admit.ErrorField(err) != tc.field || !strings.Contains(err.Error(), tc.says) {
				t.Errorf("error %q (code %v, field %q), want code invalid, field %q, saying %q", err, admit.ErrorCode(err), admit.ErrorField(err), tc.field, tc.says)
			}
		})
	}
}

// A Who that lacks a scope some limit is per is an error, never an
// unlimited request, and nothing is charged for it.
func TestLimiterMissingScope(t *testing.T) {
	s, _ := clockStore(t)
	l := newLimiter(t, s,
		admit.Bucket("global", admit.PerSecond(1), 1),
		admit.Bucket("user", admit.PerSecond(1), 5).Per(admit.PerTenant, admit.PerUser),
	)
	ctx := context.Background()
	for _, who := range []admit.Who{{User: "alice"}, {Tenant: "acme"}, {}} {
		d, err := l.Allow(ctx, who)
		if err == nil || d.Allowed {
			t.Fatalf("Allow(%+v) = %+v, %v; want an error", who, d, err)
		}
		if admit.ErrorCode(err) != admit.CodeInvalid {
			t.Errorf("Allow(%+v): code %v, want invalid", who, admit.ErrorCode(err))
		}
	}
	long := admit.Who{Tenant: "acme", User: strings.Repeat("u", bounds.MaxWhoLen+1)}
	if _, err := l.Allow(ctx, long); admit.ErrorField(err) != "user" {
		t.Errorf("a user of %d bytes: %v, want an error about the user", bounds.MaxWhoLen+1, err)
	}
	// The global bucket's one token is still there.
	if d, err := l.Allow(ctx, admit.Who{Tenant: "acme", User: "alice"}); err != nil || !d.Allowed {
		t.Fatalf("a complete Who after refused ones: %+v, %v", d, err)
	}
}

// The seed's hierarchy through the front door: all or nothing, each limit
// its own state.
func TestLimiterAllOrNothing(t *testing.T) {
	s, clock := clockStore(t)
	l := newLimiter(t, s,
		admit.Bucket("user", admit.PerSecond(1), 2).Per(admit.PerTenant, admit.PerUser),
		admit.Bucket("tenant", admit.PerSecond(1), 3).Per(admit.PerTenant),
	)
	ctx := context.Background()
	alice, bob := admit.Who{Tenant: "acme", User: "alice"}, admit.Who{Tenant: "acme", User: "bob"}
	var got []string
	for _, w := range []admit.Who{alice, alice, alice, bob, bob} {
		d, err := l.Allow(ctx, w)
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, w.User+":"+strconv.FormatBool(d.Allowed)+":"+d.DeniedBy)
	}
	want := "alice:true: alice:true: alice:false:user bob:true: bob:false:tenant"
	if strings.Join(got, " ") != want {
		t.Fatalf("got %s\nwant %s", strings.Join(got, " "), want)
	}
	// Bob's refusal by the tenant charged his own bucket nothing: a second
	// later it is full again (2), and the tenant has refilled one token.
	clock.Set(time.Second)
	d, err := l.Peek(ctx, bob)
	if err != nil || !d.Allowed || d.Remaining != 0 || len(d.Results) != 2 || d.Results[0].Remaining != 1 || d.Results[1].Remaining != 0 {
		t.Fatalf("peek at bob after 1s: %+v %v; want admitted, none left after it (the tenant's one token, closest to refusing), each limit's level in Results", d, err)
	}
	var full admit.Decision
	if err := l.Decide(ctx, bob, 1, &full); err != nil || !full.Allowed || full.Results[0].Remaining != 1 || full.Results[1].Remaining != 0 {
		t.Fatalf("a peek charged something: %+v %v; want 2 and 1 before this request", full.Results, err)
	}
	if r, ok := full.Result("tenant"); !ok || r.Remaining != 0 {
		t.Errorf("Result(tenant) = %+v %v", r, ok)
	}
	if _, ok := full.Result("nobody"); ok {
		t.Error("Result of a limit that is not there")
	}
	clock.Set(2 * time.Second)
	if d, err := l.AllowN(ctx, bob, 2); err != nil || d.Allowed || d.DeniedBy != "tenant" {
		t.Errorf("AllowN 2 with 1 left for the tenant: %+v %v", d, err)
	}
	for _, n := range []int64{0, -1} {
		if _, err := l.AllowN(ctx, bob, n); admit.ErrorField(err) != "cost" {
			t.Errorf("AllowN(%d): %v, want an error about the cost", n, err)
		}
	}
}

// Two limits of one Limiter keyed by the same scopes keep their own state:
// a day's window is not drained by a second's bucket.
func TestLimiterLimitsNeverShare(t *testing.T) {
	s, _ := clockStore(t)
	l := newLimiter(t, s,
		admit.Bucket("second", admit.PerSecond(10), 10).Per(admit.PerUser),
		admit.Window("day", 1000, 24*time.Hour).Per(admit.PerUser),
	)
	w := admit.Who{User: "alice"}
	for range 10 {
		if d, err := l.Allow(context.Background(), w); err != nil || !d.Allowed {
			t.Fatal(d, err)
		}
	}
	var d admit.Decision
	err := l.Decide(context.Background(), w, 1, &d)
	if err != nil || d.Allowed || d.DeniedBy != "second" {
		t.Fatalf("11th: %+v %v, want refused by the bucket", d, err)
	}
	if day, _ := d.Result("day"); day.Remaining != 990 || day.ResetAfter < time.Hour {
		t.Errorf("the day's window: %+v, want 990 left and a reset hours away", day)
	}
}

func TestLimiterDebit(t *testing.T) {
	s, _ := clockStore(t)
	l := newLimiter(t, s,
		admit.Bucket("tokens", admit.PerSecond(100), 1000).Per(admit.PerTenant),
		admit.Concurrent("in-flight", 2).Per(admit.PerTenant),
	)
	ctx := context.Background()
	w := admit.Who{Tenant: "acme"}
	d, err := l.Allow(ctx, w)
	if err != nil || !d.Allowed || d.Lease.ID == "" {
		t.Fatalf("allow: %+v %v, want admitted with a lease", d, err)
	}
	// The work took 1,500 tokens: more than the 999 the bucket holds.
	debit, err := l.Debit(ctx, w, 1500)
	if err != nil || debit.Allowed || debit.DeniedBy != "tokens" || debit.Remaining != 0 || debit.RetryAfter != 5020*time.Millisecond {
		t.Fatalf("debit: %+v %v, want applied and not fitted: 501 owed, 5.02 s to a token", debit, err)
	}
	if err := l.Release(ctx, &d); err != nil {
		t.Fatal(err)
	}
	next, err := l.Allow(ctx, w)
	if err != nil || next.Allowed || next.DeniedBy != "tokens" || next.RetryAfter != 5020*time.Millisecond {
		t.Fatalf("after the debit: %+v %v, want refused by tokens for 5.02s (502 tokens at 100/s)", next, err)
	}
	if _, err := l.Debit(ctx, w, 0); admit.ErrorField(err) != "cost" {
		t.Errorf("Debit(0): %v", err)
	}
	only := newLimiter(t, s, admit.Concurrent("jobs", 1))
	if _, err := only.Debit(ctx, w, 1); admit.ErrorField(err) != "debit" {
		t.Errorf("Debit on concurrency alone: %v, want an error about debits", err)
	}
}

func TestLimiterConcurrent(t *testing.T) {
	s, _ := clockStore(t)
	l := newLimiter(t, s, admit.Concurrent("jobs", 1).Per(admit.PerUser))
	ctx := context.Background()
	w := admit.Who{User: "alice"}
	first, _ := l.Allow(ctx, w)
	second, _ := l.Allow(ctx, w)
	if !first.Allowed || second.Allowed {
		t.Fatalf("max 1: first %v, second %v", first.Allowed, second.Allowed)
	}
	if err := l.Release(ctx, &first); err != nil {
		t.Fatal(err)
	}
	if err := l.Release(ctx, &first); err != nil {
		t.Errorf("releasing twice: %v, want nil (the decision holds nothing any more)", err)
	}
	if third, _ := l.Allow(ctx, w); !third.Allowed {
		t.Error("after the release: refused")
	}
}

// More users than the Limiter's key cache holds: each still has a state
// of its own, the cache's slots replaced over and over.
func TestLimiterManyKeys(t *testing.T) {
	s, _ := clockStore(t)
	l := newLimiter(t, s, admit.Bucket("user", admit.PerSecond(1), 1).Per(admit.PerUser))
	ctx := context.Background()
	var d admit.Decision
	for round, want := range []bool{true, false} {
		for u := range 20_000 {
			if err := l.Decide(ctx, admit.Who{User: strconv.Itoa(u)}, 1, &d); err != nil {
				t.Fatal(err)
			}
			if d.Allowed != want {
				t.Fatalf("round %d, user %d: allowed %v", round, u, d.Allowed)
			}
		}
	}
}

func TestLimiterZeroAllocations(t *testing.T) {
	s, _ := clockStore(t)
	l := newLimiter(t, s,
		admit.Bucket("user", admit.PerSecond(1_000_000), 1_000_000).Per(admit.PerTenant, admit.PerUser),
		admit.Bucket("tenant", admit.PerSecond(1_000_000), 1_000_000).Per(admit.PerTenant),
		admit.Bucket("global", admit.PerSecond(1_000_000), 1_000_000),
	)
	ctx := context.Background()
	w := admit.Who{Tenant: "acme", User: "alice"}
	var d admit.Decision
	if err := l.Decide(ctx, w, 1, &d); err != nil {
		t.Fatal(err)
	}
	if n := testing.AllocsPerRun(100, func() { _ = l.Decide(ctx, w, 1, &d) }); n != 0 {
		t.Errorf("%v allocations per decision of a known Who, want 0", n)
	}
	// The calls that return a Decision: its summary, without Results,
	// from a scratch Decision the Limiter keeps; Peek's Results a copy,
	// its one allocation.
	if raceEnabled {
		t.Skip("the race detector's sync.Pool drops buffers")
	}
	for name, call := range map[string]func() (admit.Decision, error){
		"Allow":  func() (admit.Decision, error) { return l.Allow(ctx, w) },
		"AllowN": func() (admit.Decision, error) { return l.AllowN(ctx, w, 3) },
		"Peek":   func() (admit.Decision, error) { return l.Peek(ctx, w) },
		"Debit":  func() (admit.Decision, error) { return l.Debit(ctx, w, 2) },
	} {
		got, err := call()
		peek := name == "Peek"
		if err != nil || !got.Allowed || (got.Results != nil) != peek || got.Limit != 1_000_000 {
			t.Fatalf("%s: %+v, %v; want admitted, a summary with its limit and Results only for a peek", name, got, err)
		}
		want := 0.0
		if peek {
			want = 1
		}
		if n := testing.AllocsPerRun(100, func() { _, _ = call() }); n != want {
			t.Errorf("%s: %v allocations per call, want %v", name, n, want)
		}
	}
}

// A limit that fails open admits, uncounted, while its store is down; a
// decision with any limit that does not fails with the store's error.
func TestLimiterFailOpen(t *testing.T) {
	mem := memstore.New(nil)
	t.Cleanup(func() { mem.Close() })
	s := &storetest.Faulty{Store: mem}
	open := newLimiter(t, s, admit.Bucket("open", admit.PerSecond(1), 1).Per(admit.PerUser).FailOpen())
	mixed := newLimiter(t, s, admit.Bucket("open2", admit.PerSecond(1), 1).Per(admit.PerUser).FailOpen(), admit.Bucket("closed", admit.PerSecond(1), 1))
	ctx := context.Background()
	w := admit.Who{User: "alice"}
	s.Down.Store(true)
	for range 3 {
		d, err := open.Allow(ctx, w)
		if err != nil || !d.Allowed || !d.FailedOpen || d.Remaining != 1 {
			t.Fatalf("store down, failing open: %+v %v", d, err)
		}
	}
	if d, err := mixed.Allow(ctx, w); admit.ErrorCode(err) != admit.CodeUnavailable || d.Allowed {
		t.Fatalf("store down, one limit failing closed: %+v %v", d, err)
	}
	s.Down.Store(false)
	if d, err := open.Allow(ctx, w); err != nil || !d.Allowed || d.FailedOpen {
		t.Fatalf("store back: %+v %v", d, err)
	}
}

// TestPeekAsAllow: Peek answers what Allow would, for every limit a
// Limiter builds: admitted while the limit holds one more request, and
// once it is spent refused, by it, with when to retry, charging nothing
// either way (no lease held, the next Allow admitted as before).
func TestPeekAsAllow(t *testing.T) {
	for _, lim := range []admit.Limit{
		admit.Bucket("bucket", admit.PerSecond(1), 2),
		admit.GCRABucket("gcra", admit.PerSecond(1), 2),
		admit.Window("window", 2, time.Minute),
		admit.Sliding("sliding", 2, time.Minute),
		admit.CalendarQuota("quota", 2, admit.Day, time.UTC),
		admit.Concurrent("concurrent", 2),
	} {
		s, _ := clockStore(t)
		l := newLimiter(t, s, lim)
		ctx := context.Background()
		name := l.Rules()[0].Name
		for i := range 2 {
			p, err := l.Peek(ctx, admit.Who{})
			if err != nil || !p.Allowed || p.Lease.ID != "" {
				t.Fatalf("%s: peek %d: %+v %v; want admitted, no lease", name, i+1, p, err)
			}
			if d, err := l.Allow(ctx, admit.Who{}); err != nil || !d.Allowed {
				t.Fatalf("%s: allow %d after a peek: %+v %v", name, i+1, d, err)
			}
		}
		p, err := l.Peek(ctx, admit.Who{})
		if err != nil || p.Allowed || p.DeniedBy != name || p.Remaining != 0 || p.RetryAfter <= 0 {
			t.Fatalf("%s: peek at a spent limit: %+v %v; want refused by it, nothing left, a retry time", name, p, err)
		}
		if d, err := l.Allow(ctx, admit.Who{}); err != nil || d.Allowed || d.RetryAfter != p.RetryAfter {
			t.Errorf("%s: allow after the refused peek: %+v %v; want refused, retry as the peek said (%v)", name, d, err, p.RetryAfter)
		}
	}
}

// checkingStore is a store that decides windows of at most a day
// (engine.RuleChecker).
type checkingStore struct{ admit.Store }

func (checkingStore) CheckRule(r *admit.Rule) error {
	if r.Window > 24*time.Hour {
		e := admit.Errorf(admit.CodeInvalid, "rule %q: window %v is longer than this store's day", r.Name, r.Window)
		e.Field = "window"
		return e
	}
	return nil
}

// TestLimiterUnhashableStore: a store value that cannot key a map (here a
// comparable wrapper holding a store of a type with a slice) is not
// checked for shared names, and never panics NewLimiter.
func TestLimiterUnhashableStore(t *testing.T) {
	s, _ := clockStore(t)
	type tagged struct {
		admit.Store
		labels []string
	}
	type traced struct{ admit.Store }
	store := traced{tagged{s, []string{"a"}}}
	for range 2 {
		l, err := admit.NewLimiter(store, admit.Bucket("b", admit.PerSecond(1), 1))
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
	}
}
