package policy

import (
	"errors"
	"strconv"
	"strings"
	"testing"

	"github.com/admitdev/admit"
)

func n(v int64) *int64 { return &v }

func spec() *Spec {
	return &Spec{
		Global: []RuleSpec{{Name: "g", Scope: "global", Algorithm: "gcra", Rate: "100/s", Burst: n(10)},
			{Name: "per-ip", Scope: "ip", Algorithm: "fixed_window", Limit: n(5), Window: "1m"}},
		Tiers: map[string]TierSpec{
			"free": {Rules: []RuleSpec{
				{Name: "user", Scope: "user", Algorithm: "token_bucket", Rate: "10/s", Burst: n(5)},
				{Name: "search", Scope: "user", Actions: []string{"search", "find"}, PerAction: true, Algorithm: "token_bucket", Rate: "1/s", Burst: n(2)},
				{Name: "keyed", Scope: "api_key", Algorithm: "sliding_window", Limit: n(3), Window: "1s"},
				{Name: "region", Scope: "attribute:region", Algorithm: "sliding_log", Limit: n(3), Window: "1s"},
				{Name: "jobs", Scope: "tenant", Actions: []string{"job"}, Algorithm: "concurrency", Max: n(2)},
			}},
		},
		Tenants: map[string]TenantSpec{
			"acme": {Tier: "free", Overrides: []RuleSpec{{Name: "user", Burst: n(50)}}},
			"beta": {Tier: "free"},
		},
	}
}

func TestResolveScopes(t *testing.T) {
	p, err := Compile(spec())
	if err != nil {
		t.Fatal(err)
	}
	var res Resolution
	names := func(req Request) string {
		t.Helper()
		req.Cost = 1
		if err := p.Resolve(&req, &res); err != nil {
			t.Fatal(err)
		}
		var out []string
		for i, r := range res.Rules {
			k := keyFields(t, res.Charges[i].Key)
			out = append(out, r.Name+"="+k[1]+"|"+k[2]+"|"+k[3])
		}
		return strings.Join(out, " ")
	}
	for _, tc := range []struct {
		req  Request
		want string
	}{
		{Request{}, "g=||"},
		{Request{IP: "192.0.2.1"}, "g=|| per-ip=|192.0.2.1|"},
		{Request{Tenant: "acme"}, "g=||"},
		{Request{Tenant: "acme", User: "al", Action: "search"}, "g=|| user=acme|al| search=acme|al|search"},
		{Request{Tenant: "acme", User: "al", Action: "find"}, "g=|| user=acme|al| search=acme|al|find"},
		{Request{Tenant: "beta", APIKey: "k", Attributes: map[string]string{"region": "eu"}}, "g=|| keyed=beta|" + HashKey("k") + "| region=beta|eu|"},
		{Request{Tenant: "beta", Action: "job", Kind: Leases}, "jobs=beta||"},
	} {
		if got := names(tc.req); got != tc.want {
			t.Errorf("%+v: charges %s, want %s", tc.req, got, tc.want)
		}
	}
	// Overrides apply to their tenant only; the tier's rule is shared.
	if got := p.Tenant("acme").Rules[0].Burst; got != 50 {
		t.Errorf("acme's user burst = %d, want 50", got)
	}
	if got := p.Tenant("beta").Rules[0]; got != p.Tier("free").Rules[0] || got.Burst != 5 {
		t.Errorf("beta's user rule = %+v, want the tier's", got)
	}
	req := Request{Tenant: "ghost", Cost: 1}
	if err := p.Resolve(&req, &res); admit.ErrorCode(err) != admit.CodePermission {
		t.Errorf("unknown tenant: %v, want ErrPermission", err)
	}
}

func TestCompileReportsEveryError(t *testing.T) {
	s := spec()
	s.UnknownTenant = "gold"
	s.Global = append(s.Global, RuleSpec{Name: "g", Scope: "global", Algorithm: "gcra", Rate: "1/s", Burst: n(1)})
	s.Tiers["bad"] = TierSpec{Rules: []RuleSpec{
		{Name: "a", Scope: "user", Algorithm: "token_bucket", Rate: "10/s"},
		{Name: "b", Scope: "User", Algorithm: "fixed_window", Limit: n(1), Window: "1m", Rate: "1/s"},
		{Name: "c", Scope: "user", Algorithm: "bogus"},
		{Name: "d e", Scope: "user", Algorithm: "concurrency", Max: n(1)},
		{Name: "e", Scope: "user", Algorithm: "concurrency", Max: n(0)},
	}}
	s.Tenants["x"] = TenantSpec{Tier: "none"}
	s.Tenants["acme"] = TenantSpec{Tier: "free", Overrides: []RuleSpec{{Name: "zzz"}, {Name: "user", Scope: "ip"}}, APIKeysSHA256: []string{"abc"}}
	_, err := Compile(s)
	var errs Errors
	if !errors.As(err, &errs) || admit.ErrorCode(err) != admit.CodeInvalid {
		t.Fatalf("error %v is not Errors/CodeInvalid", err)
	}
	want := []string{
		"global[2].name", "tiers.bad.rules[0].burst", "tiers.bad.rules[1].scope", "tiers.bad.rules[1].rate",
		"tiers.bad.rules[2].algorithm", "tiers.bad.rules[3].name", "tiers.bad.rules[4].max", "unknown_tenant",
		"tenants.acme.api_keys_sha256[0]", "tenants.acme.overrides[0].name", "tenants.acme.overrides[1]", "tenants.x.tier",
	}
	got := map[string]bool{}
	for _, e := range errs {
		got[e.Path] = true
	}
	for _, w := range want {
		if !got[w] {
			t.Errorf("no error at %s; got %v", w, errs)
		}
	}
	if len(errs) != len(want) {
		t.Errorf("%d errors, want %d: %v", len(errs), len(want), errs)
	}
}

// TestAuthenticateRequestThenResolve: a request authenticated with
// AuthenticateRequest resolves to exactly the charges Authenticate and
// Resolve give, the key hashed once; a request changed after it, or
// resolved against another policy, is resolved afresh.
func TestAuthenticateRequestThenResolve(t *testing.T) {
	s := spec()
	s.Tenants["keyed"] = TenantSpec{Tier: "free", APIKeysSHA256: []string{HashKey("secret")}}
	p, err := Compile(s)
	if err != nil {
		t.Fatal(err)
	}
	keys := func(req *Request) []string {
		t.Helper()
		var res Resolution
		if err := p.Resolve(req, &res); err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, c := range res.Charges {
			out = append(out, c.Key)
		}
		return out
	}
	for _, base := range []Request{
		{APIKey: "secret", User: "u"},                  // the key names the tenant
		{Tenant: "keyed", APIKey: "secret", User: "u"}, // and agrees with the one named
		{Tenant: "acme", User: "u"},                    // no key
		{Tenant: "newco", User: "u"},                   // unknown: refused by Resolve below
	} {
		plain := base
		tenant, authErr := p.Authenticate(Credentials{Tenant: plain.Tenant, APIKey: plain.APIKey})
		plain.Tenant = tenant
		once := base
		if err := p.AuthenticateRequest(&once, false); (err != nil) != (authErr != nil) {
			t.Fatalf("%+v: AuthenticateRequest %v, Authenticate %v", base, err, authErr)
		}
		if once.Tenant != plain.Tenant {
			t.Fatalf("%+v: tenant %q, want %q", base, once.Tenant, plain.Tenant)
		}
		if base.Tenant == "newco" {
			var res Resolution
			if err := p.Resolve(&once, &res); admit.ErrorCode(err) != admit.CodePermission {
				t.Errorf("an unknown tenant resolved: %v", err)
			}
			continue
		}
		if got, want := keys(&once), keys(&plain); strings.Join(got, " ") != strings.Join(want, " ") {
			t.Errorf("%+v: charges\n%v, want\n%v", base, got, want)
		}
		if base.APIKey != "" && allocs(func() { keys(&once) }) >= allocs(func() { keys(&plain) }) {
			t.Errorf("%+v: resolving an authenticated request allocates as much as hashing the key again", base)
		}
	}
	// Changed after authenticating: the remembered tenant is not used.
	req := Request{Tenant: "keyed", APIKey: "secret", User: "u"}
	if err := p.AuthenticateRequest(&req, false); err != nil {
		t.Fatal(err)
	}
	req.Tenant = "acme"
	if got := keys(&req); !strings.Contains(strings.Join(got, " "), "4:acme") {
		t.Errorf("a request changed to acme resolved to %v", got)
	}
	// Another policy: resolved against its own catalog.
	other, _ := Compile(spec()) // without tenant keyed
	req = Request{Tenant: "keyed", APIKey: "secret", User: "u", Cost: 1}
	if err := p.AuthenticateRequest(&req, false); err != nil {
		t.Fatal(err)
	}
	var res Resolution
	if err := other.Resolve(&req, &res); admit.ErrorCode(err) != admit.CodePermission {
		t.Errorf("another policy resolved tenant keyed: %v", err)
	}
}

func allocs(f func()) float64 { return testing.AllocsPerRun(20, f) }

// keyFields decodes a key admit.Key made into its five fields (scope,
// tenant, subject, action, rule), each its length, a colon and its bytes.
func keyFields(t *testing.T, key string) (f [5]string) {
	t.Helper()
	rest := key
	for i := range f {
		n, tail, _ := strings.Cut(rest, ":")
		size, err := strconv.Atoi(n)
		if err != nil || size < 0 || size > len(tail) {
			t.Fatalf("key %q: field %d is not length-prefixed", key, i+1)
		}
		f[i], rest = tail[:size], tail[size:]
	}
	if rest != "" {
		t.Fatalf("key %q: trailing bytes", key)
	}
	return f
}
