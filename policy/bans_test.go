package policy

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/admitdev/admit"
	"github.com/admitdev/admit/memstore"
)

// countingStore counts the decisions its store is asked.
type countingStore struct {
	admit.Store
	calls atomic.Int64
}

func (c *countingStore) Decide(ctx context.Context, charges []admit.Charge, d *admit.Decision) error {
	c.calls.Add(1)
	return c.Store.Decide(ctx, charges, d)
}

func banPolicy(t *testing.T) *Policy {
	t.Helper()
	p, err := Compile(&Spec{
		Global: []RuleSpec{{Name: "per-ip", Scope: "ip", Algorithm: "token_bucket", Rate: "100/s", Burst: n(100)}},
		Tiers: map[string]TierSpec{"free": {Rules: []RuleSpec{
			{Name: "api", Scope: "user", Algorithm: "fixed_window", Limit: n(1), Window: "1h"},
		}}},
		Tenants: map[string]TenantSpec{
			"acme": {Tier: "free", APIKeysSHA256: []string{HashKey("k-live-123"), HashKey("k-live-124")}},
			"beta": {Tier: "free"}, "open": {Tier: "free"},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// decideOne authenticates req as the front ends do (trusted unless
// Untrusted), resolves it at cost 1 against p and decides it with d.
func decideOne(t *testing.T, p *Policy, d *Decider, req Request) (admit.Decision, Outcome) {
	t.Helper()
	var res Resolution
	req.Cost = 1
	if err := p.AuthenticateRequest(&req, !req.Untrusted); err != nil {
		t.Fatal(err)
	}
	if err := p.Resolve(&req, &res); err != nil {
		t.Fatal(err)
	}
	var dec admit.Decision
	out, err := d.Decide(context.Background(), &res, &dec)
	if err != nil {
		t.Fatal(err)
	}
	return dec, out
}

func startBans(t *testing.T, store admit.Store) *Bans {
	t.Helper()
	b := NewBans(&MemoryBans{})
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	if err := b.Start(ctx, store); err != nil {
		t.Fatal(err)
	}
	return b
}

// TestBansRefuseWithoutTheStore bans each kind of identifier and checks
// that its requests, and only its, are refused by the ban, naming it,
// until it ends, with no store call.
func TestBansRefuseWithoutTheStore(t *testing.T) {
	ctx := context.Background()
	p := banPolicy(t)
	st := &countingStore{Store: memstore.New(nil)}
	d := NewDecider(st, 1)
	b := startBans(t, st)
	d.EnforceBans(b)
	decide := func(req Request) (admit.Decision, Outcome) { return decideOne(t, p, d, req) }
	for _, tc := range []struct {
		ban         Ban
		hit, missed Request
	}{
		{Ban{Scope: BanIP, Value: "198.51.100.7"}, Request{IP: "198.51.100.7"}, Request{IP: "198.51.100.8"}},
		{Ban{Scope: BanIP, Value: "::ffff:198.51.100.9"}, Request{IP: "198.51.100.9:4431"}, Request{IP: "198.51.100.10"}},
		{Ban{Scope: BanIP, Value: "203.0.113.77/24"}, Request{IP: "203.0.113.200"}, Request{IP: "203.0.114.1"}},
		{Ban{Scope: BanIP, Value: "2001:db8:1:2::1"}, Request{IP: "2001:db8:1:2:ffff::9"}, Request{IP: "2001:db8:1:3::1"}},
		{Ban{Scope: BanIP, Value: "2001:db8:a000::/36"}, Request{IP: "2001:db8:a0ff:1::1"}, Request{IP: "2001:db8:b000::1"}},
		// The address the request came from, which it does not name.
		{Ban{Scope: BanIP, Value: "192.0.2.80"}, Request{Tenant: "beta", User: "x", Client: "192.0.2.80:5555", Untrusted: true}, Request{Tenant: "beta", User: "x", Client: "192.0.2.81", Untrusted: true}},
		{Ban{Scope: BanAPIKey, Value: "k-live-123"}, Request{Tenant: "acme", User: "u", APIKey: "k-live-123"}, Request{Tenant: "acme", User: "u", APIKey: "k-live-124"}},
		{Ban{Scope: BanUser, Tenant: "acme", Value: "mallory"}, Request{Tenant: "acme", User: "mallory"}, Request{Tenant: "beta", User: "mallory"}},
		{Ban{Scope: BanTenant, Value: "beta"}, Request{Tenant: "beta", User: "x"}, Request{Tenant: "acme", User: "x"}},
	} {
		ban, err := b.Add(ctx, tc.ban, 10*time.Minute)
		if err != nil {
			t.Fatalf("ban %+v: %v", tc.ban, err)
		}
		before := st.calls.Load()
		dec, out := decide(tc.hit)
		if dec.Allowed || out != Banned || dec.DeniedBy != "ban:"+ban.ID || len(dec.Results) != 1 ||
			dec.RetryAfter < 9*time.Minute || dec.RetryAfter > 10*time.Minute {
			t.Errorf("%+v under ban %+v: %+v, %v; want refused by ban:%s for 10m", tc.hit, ban, dec, out, ban.ID)
		}
		if n := st.calls.Load() - before; n != 0 {
			t.Errorf("a banned request cost the store %d calls", n)
		}
		if dec, out := decide(tc.missed); out == Banned || dec.DeniedBy == "ban:"+ban.ID {
			t.Errorf("%+v refused by ban %+v", tc.missed, ban)
		}
		if ok, err := b.Remove(ctx, ban.ID); err != nil || !ok {
			t.Fatalf("lifting %s: %v, %v", ban.ID, ok, err)
		}
		if _, out := decide(tc.hit); out == Banned {
			t.Errorf("%+v still banned once the ban was lifted", tc.hit)
		}
	}
}

// TestBanExpires checks a ban refuses no more once it ends.
func TestBanExpires(t *testing.T) {
	b := NewBans(&MemoryBans{})
	now := time.Now()
	b.set.Store(newBanSet([]Ban{{ID: "x", Scope: BanTenant, Value: "acme", Created: now, Expires: now.Add(time.Minute)}}, now))
	res := Resolution{who: identity{tenant: "acme"}}
	if _, ok := b.Matched(&res, now.Add(59*time.Second)); !ok {
		t.Fatal("not banned before the end")
	}
	if _, ok := b.Matched(&res, now.Add(time.Minute)); ok {
		t.Fatal("banned at the end")
	}
}

func TestNormalizeBanRefuses(t *testing.T) {
	for _, b := range []Ban{
		{Scope: "ip", Value: "example.com"},
		{Scope: "ip", Value: "10.0.0.0/7"},
		{Scope: "ip", Value: "2001::/15"},
		{Scope: "user", Value: "bob"},
		{Scope: "tenant", Value: "acme", Tenant: "x"},
		{Scope: "api_key", Value: "sha256:abc"},
		{Scope: "session", Value: "s"},
		{Scope: "tenant"},
	} {
		if err := NormalizeBan(&b); admit.ErrorCode(err) != admit.CodeInvalid {
			t.Errorf("%+v: %v; want invalid", b, err)
		}
	}
}

// waitFor waits for cond, which the escalation goroutine makes true, for
// at most 10 s (a deadline, not a pace: it returns as soon as cond holds).
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 10s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// TestEscalationBansAndDoubles refuses a user until the escalation bans
// it, lifts the ban, and checks that the next ban lasts twice as long and
// that a caller the escalation does not trust to name an address gets no
// one banned.
func TestEscalationBansAndDoubles(t *testing.T) {
	ctx := context.Background()
	p := banPolicy(t)
	st := memstore.New(nil)
	d := NewDecider(st, 1)
	b := startBans(t, st)
	d.EnforceBans(b)
	if err := b.SetEscalations([]Escalation{
		{Name: "abuse", Rule: "api", Scope: BanUser, Refusals: 3, Within: time.Minute, Ban: time.Minute, Max: 3 * time.Minute},
		{Name: "addr", Rule: "api", Scope: BanIP, Refusals: 1, Within: time.Minute, Ban: time.Hour},
	}); err != nil {
		t.Fatal(err)
	}
	decide := func(req Request) Outcome {
		_, out := decideOne(t, p, d, req)
		return out
	}
	mallory := Request{Tenant: "acme", User: "mallory"}
	decide(mallory) // admitted: the limit is 1
	for range 3 {
		if out := decide(mallory); out == Banned {
			t.Fatal("banned before the third refusal was counted")
		}
	}
	var first Ban
	waitFor(t, "the escalation's ban", func() bool {
		for _, x := range b.List() {
			if x.Scope == BanUser {
				first = x
				return true
			}
		}
		return false
	})
	if first.Value != "mallory" || first.Tenant != "acme" || first.Strike != 1 || first.Source != "escalation:abuse" ||
		first.Expires.Sub(first.Created) != time.Minute {
		t.Fatalf("first ban %+v; want mallory of acme for 1m", first)
	}
	if out := decide(mallory); out != Banned {
		t.Fatalf("mallory's next request: %v; want Banned", out)
	}
	// Lifted by hand; the count started over with the ban, so one refusal
	// does not ban again (within is as long as the ban)…
	if _, err := b.Remove(ctx, first.ID); err != nil {
		t.Fatal(err)
	}
	decide(mallory)
	// (the queue is counted in order: once a later refusal's ban is made,
	// mallory's refusal was counted)
	decide(Request{Tenant: "acme", User: "marker", IP: "192.0.2.99"})
	decide(Request{Tenant: "acme", User: "marker", IP: "192.0.2.99"})
	waitFor(t, "the marker's ban", func() bool {
		for _, x := range b.List() {
			if x.Value == "192.0.2.99" {
				return true
			}
		}
		return false
	})
	if x, ok := b.Get(first.ID); ok {
		t.Fatalf("one refusal after the ban was lifted banned again: %+v", x)
	}
	// …three do, for twice as long.
	for range 2 {
		decide(mallory)
	}
	waitFor(t, "the second ban", func() bool {
		x, ok := b.Get(first.ID)
		return ok && x.Strike == 2
	})
	second, _ := b.Get(first.ID)
	if got := second.Expires.Sub(second.Created); got != 2*time.Minute {
		t.Fatalf("second ban lasts %s; want 2m", got)
	}
	// An address an untrusted caller names is not the client's: never
	// banned (nor its user, whom no credential vouches for).
	trent := Request{Tenant: "open", User: "trent", IP: "192.0.2.50", Untrusted: true}
	for range 5 {
		decide(trent)
	}
	// Nor a keyless tenant's user, or the tenant, an anonymous caller
	// names: anyone may name them (the tenant scope's escalation would
	// ban the tenant for everyone).
	if err := b.SetEscalations([]Escalation{
		{Name: "abuse", Rule: "api", Scope: BanUser, Refusals: 3, Within: time.Minute, Ban: time.Minute, Max: 3 * time.Minute},
		{Name: "tenants", Rule: "api", Scope: BanTenant, Refusals: 1, Within: time.Minute, Ban: time.Minute},
		{Name: "addr", Rule: "api", Scope: BanIP, Refusals: 1, Within: time.Minute, Ban: time.Hour},
	}); err != nil {
		t.Fatal(err)
	}
	for range 5 {
		decide(Request{Tenant: "open", User: "victim", Untrusted: true, Client: "192.0.2.70"})
	}
	// A trusted caller's address is the client's: one refusal bans it.
	decide(Request{Tenant: "acme", User: "eve", IP: "192.0.2.60"})
	decide(Request{Tenant: "acme", User: "eve", IP: "192.0.2.60"})
	waitFor(t, "the address's ban", func() bool {
		for _, x := range b.List() {
			if x.Scope == BanIP && x.Value == "192.0.2.60" {
				return true
			}
		}
		return false
	})
	// The queue is one goroutine's, in order: trent's refusals were
	// counted before eve's.
	for _, x := range b.List() {
		if x.Value == "192.0.2.50" || x.Value == "trent" || x.Value == "victim" || x.Value == "open" {
			t.Fatalf("an untrusted caller's values were banned: %+v", x)
		}
	}
}

func TestEscalatedLength(t *testing.T) {
	for _, tc := range []struct {
		strikes int
		want    time.Duration
	}{{0, time.Minute}, {1, 2 * time.Minute}, {2, 4 * time.Minute}, {3, 5 * time.Minute}, {60, 5 * time.Minute}} {
		if got := EscalatedLength(time.Minute, 5*time.Minute, tc.strikes); got != tc.want {
			t.Errorf("strikes %d: %s; want %s", tc.strikes, got, tc.want)
		}
	}
}

// BenchmarkDecideBansIdle is a decision with bans enforced and none in
// force: what every decision pays for bans.
func BenchmarkDecideBansIdle(b *testing.B) {
	benchBans(b, 0)
}

// BenchmarkDecideBans1000 is a decision with 1,000 bans in force, none of
// them the request's.
func BenchmarkDecideBans1000(b *testing.B) {
	benchBans(b, 1000)
}

func benchBans(b *testing.B, n int) {
	p, err := Compile(&Spec{Tiers: map[string]TierSpec{"free": {Rules: []RuleSpec{
		{Name: "api", Scope: "user", Algorithm: "token_bucket", Rate: "1000000/s", Burst: n64(1000000)},
	}}}, Tenants: map[string]TenantSpec{"acme": {Tier: "free"}}})
	if err != nil {
		b.Fatal(err)
	}
	st := memstore.New(nil)
	d := NewDecider(st, 1)
	bans := NewBans(&MemoryBans{})
	now := time.Now()
	var list []Ban
	for i := range n {
		list = append(list, Ban{ID: string(rune('a' + i%26)), Scope: BanIP, Value: "10.1." + itoa(i/256) + "." + itoa(i%256), Expires: now.Add(time.Hour)})
	}
	bans.set.Store(newBanSet(list, now))
	d.EnforceBans(bans)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		var res Resolution
		var dec admit.Decision
		req := Request{Tenant: "acme", User: "u", IP: "192.0.2.1", Cost: 1}
		for pb.Next() {
			r := req
			if err := p.Resolve(&r, &res); err != nil {
				b.Fatal(err)
			}
			if _, err := d.Decide(context.Background(), &res, &dec); err != nil {
				b.Fatal(err)
			}
		}
	})
}

func n64(v int64) *int64 { return &v }

func itoa(i int) string {
	if i < 10 {
		return string(rune('0' + i))
	}
	return itoa(i/10) + string(rune('0'+i%10))
}

// TestEscalationBounds: one network's addresses take at most
// MaxEscalatedPerNetwork of the escalations' bans, and other networks are
// banned still; no escalation bans a protected address (a trusted
// proxy's); a trusted caller is not refused by its own address's ban.
func TestEscalationBounds(t *testing.T) {
	ctx := context.Background()
	p := banPolicy(t)
	st := memstore.New(nil)
	d := NewDecider(st, 1)
	b := startBans(t, st)
	d.EnforceBans(b)
	b.SetProtected([]netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")})
	if err := b.SetEscalations([]Escalation{{Name: "addr", Rule: "api", Scope: BanIP, Refusals: 1, Within: time.Minute, Ban: time.Hour}}); err != nil {
		t.Fatal(err)
	}
	decideOne(t, p, d, Request{Tenant: "beta", User: "u"}) // the limit is 1: every next one is refused
	for i := range MaxEscalatedPerNetwork + 50 {
		decideOne(t, p, d, Request{Tenant: "beta", User: "u", IP: fmt.Sprintf("2001:db8:1:%x::1", i)})
	}
	decideOne(t, p, d, Request{Tenant: "beta", User: "u", IP: "10.1.2.3"})
	decideOne(t, p, d, Request{Tenant: "beta", User: "u", IP: "2a00:1::1"})
	waitFor(t, "the other network's ban", func() bool {
		_, ok := b.MatchIdentity("", "", "2a00:1::/64", "", time.Now())
		return ok
	})
	n := 0
	for _, x := range b.List() {
		switch {
		case strings.HasPrefix(x.Value, "2001:db8:1:"):
			n++
		case x.Value == "10.1.2.3":
			t.Fatalf("a protected address was banned: %+v", x)
		}
	}
	if n != MaxEscalatedPerNetwork {
		t.Fatalf("one /32 holds %d bans; want %d", n, MaxEscalatedPerNetwork)
	}
	// Nor the /64 around a protected address.
	b.SetProtected([]netip.Prefix{netip.MustParsePrefix("2a00:2::1/128")})
	decideOne(t, p, d, Request{Tenant: "beta", User: "u", IP: "2a00:2::2"})
	decideOne(t, p, d, Request{Tenant: "beta", User: "u", IP: "2a00:3::1"})
	waitFor(t, "a third network's ban", func() bool {
		_, ok := b.MatchIdentity("", "", "2a00:3::/64", "", time.Now())
		return ok
	})
	if x, ok := b.MatchIdentity("", "", "2a00:2::/64", "", time.Now()); ok {
		t.Fatalf("the /64 of a protected address was banned: %+v", x)
	}
	// The platform's backend, trusted, from a banned address, naming none.
	if _, err := b.Add(ctx, Ban{Scope: BanIP, Value: "192.0.2.44"}, time.Hour); err != nil {
		t.Fatal(err)
	}
	if _, out := decideOne(t, p, d, Request{Tenant: "beta", User: "v", Client: "192.0.2.44"}); out == Banned {
		t.Fatal("a trusted caller was refused by its own address's ban")
	}
}

// TestLiftedBanStaysLifted: a server that missed a lift saves the ban
// back into a store that lost its bans; the server that lifted it lifts
// it again at its next load, and a newer ban of the identifier stays.
func TestLiftedBanStaysLifted(t *testing.T) {
	ctx := context.Background()
	store := &MemoryBans{}
	a, stale := NewBans(store), NewBans(store)
	ban, err := a.Add(ctx, Ban{Scope: BanIP, Value: "192.0.2.7"}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.Remove(ctx, ban.ID); err != nil {
		t.Fatal(err)
	}
	// The stale server puts it back, as its restore would.
	if _, _, err := store.Add(ctx, ban, time.Now()); err != nil {
		t.Fatal(err)
	}
	if err := a.Reload(ctx); err != nil {
		t.Fatal(err)
	}
	if _, ok := a.Get(ban.ID); ok {
		t.Fatal("a ban lifted here came back")
	}
	if err := stale.Reload(ctx); err != nil {
		t.Fatal(err)
	}
	if _, ok := stale.Get(ban.ID); ok {
		t.Fatal("the store still holds the lifted ban")
	}
	// Banned again, later: that ban stays.
	time.Sleep(2 * time.Millisecond) // a later creation time than the lift, at millisecond precision
	again, err := stale.Add(ctx, Ban{Scope: BanIP, Value: "192.0.2.7"}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Reload(ctx); err != nil {
		t.Fatal(err)
	}
	if _, ok := a.Get(again.ID); !ok {
		t.Fatal("a newer ban of a lifted identifier was lifted")
	}
}

// TestEscalationsHoldTheirPartHere: past MaxEscalatedBans, the bans the
// new ones replace leave the bans in force here too, at once, not at the
// next load.
func TestEscalationsHoldTheirPartHere(t *testing.T) {
	p := banPolicy(t)
	st := memstore.New(nil)
	d := NewDecider(st, 1)
	b := startBans(t, st)
	d.EnforceBans(b)
	if err := b.SetEscalations([]Escalation{{Name: "addr", Rule: "api", Scope: BanIP, Refusals: 1, Within: time.Minute, Ban: time.Hour}}); err != nil {
		t.Fatal(err)
	}
	decideOne(t, p, d, Request{Tenant: "beta", User: "u"})
	n := MaxEscalatedBans + 300
	addr := func(i int) string { // 200 networks (/16s), at most 47 addresses each
		return fmt.Sprintf("10.%d.%d.%d", i%200, i/200/250, i/200%250+1)
	}
	for i := range n {
		decideOne(t, p, d, Request{Tenant: "beta", User: "u", IP: addr(i)})
		if i%1000 == 999 || i == n-1 {
			// Within the queue's bound: each refusal is counted.
			waitFor(t, "the ban of "+addr(i), func() bool {
				_, ok := b.MatchIdentity("", "", addr(i), "", time.Now())
				return ok
			})
		}
	}
	if got := len(b.List()); got > MaxEscalatedBans {
		t.Fatalf("%d bans in force here; the escalations hold at most %d", got, MaxEscalatedBans)
	}
	if got := b.Stats().Evicted.Load(); got != 300 {
		t.Fatalf("%d evicted; want 300", got)
	}
}
