package httplimit

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/admitdev/admit/memstore"
	"github.com/admitdev/admit/policy"
	"github.com/admitdev/admit/storetest"
)

func n(v int64) *int64 { return &v }

func tb(name, scope string, actions []string, rate string, burst int64) policy.RuleSpec {
	return policy.RuleSpec{Name: name, Scope: scope, Actions: actions, Algorithm: "token_bucket", Rate: rate, Burst: n(burst)}
}

const (
	keyA = "ak_tenant_a_key"
	keyB = "ak_tenant_b_key"
)

// testPolicy: 3 requests per IP for everyone (anonymous too); per user 2,
// per tenant 4; "search" has its own tenant bucket of 1; "report" fails
// closed.
func testPolicy(t testing.TB) *policy.Policy {
	t.Helper()
	p, err := policy.Compile(&policy.Spec{
		Global: []policy.RuleSpec{tb("per-ip", "ip", nil, "1/min", 3)},
		Tiers: map[string]policy.TierSpec{"free": {Rules: []policy.RuleSpec{
			tb("per-user", "user", nil, "1/min", 2),
			tb("per-tenant", "tenant", nil, "1/min", 4),
			tb("searches", "tenant", []string{"search"}, "1/min", 1),
			{Name: "reports", Scope: "tenant", Actions: []string{"report"}, Algorithm: "token_bucket", Rate: "1/min", Burst: n(9), OnError: "closed"},
		}}},
		Tenants: map[string]policy.TenantSpec{
			"a":    {Tier: "free", APIKeysSHA256: []string{policy.HashKey(keyA)}},
			"b":    {Tier: "free", APIKeysSHA256: []string{policy.HashKey(keyB)}},
			"open": {Tier: "free"},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

type fixture struct {
	lim    *Limiter
	hits   atomic.Int64 // requests that reached the handler
	seen   atomic.Pointer[policy.Request]
	server http.Handler
}

func newFixture(t testing.TB, opts Options) *fixture {
	t.Helper()
	p := testPolicy(t)
	if opts.Store == nil && opts.Decider == nil {
		st := memstore.New(nil)
		t.Cleanup(func() { st.Close() })
		opts.Store = st
	}
	opts.Policy = func() *policy.Policy { return p }
	f := &fixture{}
	inner := opts.Identify
	opts.Identify = func(r *http.Request, req *policy.Request) error {
		if inner != nil {
			if err := inner(r, req); err != nil {
				return err
			}
		}
		c := *req
		f.seen.Store(&c)
		return nil
	}
	lim, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lim.Close() })
	f.lim = lim
	f.server = lim.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f.hits.Add(1)
		_, _ = w.Write([]byte("ok"))
	}))
	return f
}

// do sends a request from peer with the given headers.
func (f *fixture) do(method, target, peer string, headers ...string) *httptest.ResponseRecorder {
	r := httptest.NewRequest(method, target, nil)
	r.RemoteAddr = peer
	for i := 0; i+1 < len(headers); i += 2 {
		r.Header.Add(headers[i], headers[i+1])
	}
	w := httptest.NewRecorder()
	f.server.ServeHTTP(w, r)
	return w
}

func TestAPIKeyIsolation(t *testing.T) {
	f := newFixture(t, Options{})
	// Tenant a's key spends a's buckets only: 2 per user... no user, so
	// a's tenant bucket (4) and the per-IP bucket of each peer.
	for i := range 4 {
		peer := "198.51.100." + strconv.Itoa(i+1) + ":1000"
		if w := f.do("GET", "/x", peer, "X-API-Key", keyA); w.Code != 200 {
			t.Fatalf("a's request %d: %d %s", i, w.Code, w.Body)
		}
		if got := f.seen.Load(); got.Tenant != "a" || got.APIKey != keyA {
			t.Fatalf("a's key identified tenant %q", got.Tenant)
		}
	}
	w := f.do("GET", "/x", "198.51.100.9:1000", "Authorization", "Bearer "+keyA)
	if w.Code != 429 || !strings.Contains(w.Header().Get("RateLimit"), `"per-tenant";r=0`) {
		t.Fatalf("a's 5th request: %d %v", w.Code, w.Header())
	}
	// b's bucket is untouched by a's spending.
	if w := f.do("GET", "/x", "198.51.100.10:1000", "Authorization", "Bearer "+keyB); w.Code != 200 {
		t.Fatalf("b after a is spent: %d %s", w.Code, w.Body)
	}
	if got := f.seen.Load(); got.Tenant != "b" {
		t.Fatalf("b's key identified tenant %q", got.Tenant)
	}
	// Unknown keys are 401 and reach nothing.
	before := f.hits.Load()
	for _, h := range [][]string{{"X-API-Key", "ak_nobody"}, {"Authorization", "Bearer ak_nobody"}, {"X-API-Key", strings.ToUpper(keyA)}} {
		w := f.do("GET", "/x", "198.51.100.11:1000", h...)
		if w.Code != 401 || w.Header().Get("WWW-Authenticate") == "" || w.Header().Get("Content-Type") != "application/problem+json" {
			t.Fatalf("%v: %d %v", h, w.Code, w.Header())
		}
		if strings.Contains(w.Body.String(), "ak_nobody") {
			t.Fatalf("the answer repeats the key: %s", w.Body)
		}
	}
	if f.hits.Load() != before {
		t.Fatal("a refused request reached the handler")
	}
}

func TestRequireKeyAndAnonymous(t *testing.T) {
	f := newFixture(t, Options{RequireKey: true})
	if w := f.do("GET", "/x", "198.51.100.1:1"); w.Code != 401 {
		t.Fatalf("no key with RequireKey: %d", w.Code)
	}
	g := newFixture(t, Options{})
	// Anonymous: the per-IP rule only, 3 per address.
	for i := range 3 {
		if w := g.do("GET", "/x", "198.51.100.1:1"); w.Code != 200 || !strings.HasPrefix(w.Header().Get("RateLimit"), `"per-ip";r=`+strconv.Itoa(2-i)+`;t=`+strconv.Itoa(60*(i+1))+`;pk=:`) {
			t.Fatalf("anonymous %d: %d %q", i, w.Code, w.Header().Get("RateLimit"))
		}
	}
	w := g.do("GET", "/x", "198.51.100.1:1")
	if w.Code != 429 {
		t.Fatalf("4th anonymous request from one address: %d", w.Code)
	}
	if w := g.do("GET", "/x", "198.51.100.2:1"); w.Code != 200 {
		t.Fatalf("another address: %d", w.Code)
	}
	if got := g.seen.Load(); got.Tenant != "" || got.IP != "198.51.100.2" {
		t.Fatalf("anonymous request identified as %+v", got)
	}
}

func TestRefusalAnswer(t *testing.T) {
	f := newFixture(t, Options{RetryJitter: 5 * time.Second})
	for range 3 {
		f.do("GET", "/x", "198.51.100.1:1")
	}
	hits := f.hits.Load()
	seen := map[string]bool{}
	for range 40 {
		w := f.do("GET", "/x", "198.51.100.1:1")
		if w.Code != 429 || w.Header().Get("Content-Type") != "application/problem+json" {
			t.Fatalf("refusal: %d %v", w.Code, w.Header())
		}
		var p struct {
			Status       int    `json:"status"`
			RetryAfterMS int64  `json:"retry_after_ms"`
			DeniedBy     string `json:"denied_by"`
		}
		if err := json.Unmarshal(w.Body.Bytes(), &p); err != nil || p.Status != 429 || p.DeniedBy != "per-ip" {
			t.Fatalf("problem: %s (%v)", w.Body, err)
		}
		ra, err := strconv.ParseInt(w.Header().Get("Retry-After"), 10, 64)
		// One token a minute: the true wait is 60 s, the jitter adds up
		// to 5 s more, never less.
		if err != nil || ra*1000 < p.RetryAfterMS || ra > 65 || ra < 60 {
			t.Fatalf("Retry-After %q with a true wait of %d ms", w.Header().Get("Retry-After"), p.RetryAfterMS)
		}
		seen[w.Header().Get("Retry-After")] = true
	}
	if len(seen) < 2 {
		t.Fatalf("40 refusals all said Retry-After %v: no jitter", seen)
	}
	if f.hits.Load() != hits {
		t.Fatal("a refused request reached the handler")
	}
	// Without jitter Retry-After is the true wait rounded up.
	g := newFixture(t, Options{RetryJitter: -1})
	for range 3 {
		g.do("GET", "/x", "198.51.100.1:1")
	}
	if w := g.do("GET", "/x", "198.51.100.1:1"); w.Header().Get("Retry-After") != "60" {
		t.Fatalf("Retry-After without jitter: %q", w.Header().Get("Retry-After"))
	}
}

// down returns a store that is always unavailable.
func down(t testing.TB) *storetest.Faulty {
	f := &storetest.Faulty{Store: memstore.New(nil)}
	f.Down.Store(true)
	t.Cleanup(func() { f.Store.Close() })
	return f
}

func TestStoreDown(t *testing.T) {
	f := newFixture(t, Options{Store: down(t)})
	// Fail open by default, with the RateLimit fields of every charge...
	w := f.do("GET", "/x", "198.51.100.1:1", "X-API-Key", keyA)
	if w.Code != 200 || strings.Count(w.Header().Get("RateLimit"), ";r=") < 2 {
		t.Fatalf("fail open: %d %v %s", w.Code, w.Header(), w.Body)
	}
	// ...and 503 with Retry-After when a rule fails closed.
	act := Options{Store: down(t), Actions: []Action{{Pattern: "POST /reports/", Name: "report"}}}
	g := newFixture(t, act)
	w = g.do("POST", "/reports/q3", "198.51.100.1:1", "X-API-Key", keyA)
	if w.Code != 503 || w.Header().Get("Retry-After") == "" || g.hits.Load() != 0 {
		t.Fatalf("fail closed: %d %v, %d hits", w.Code, w.Header(), g.hits.Load())
	}
}

// TestShortDecision: a store that answers fewer results than charges is
// an internal error, never a read past the results.
func TestShortDecision(t *testing.T) {
	st := &storetest.Faulty{Store: memstore.New(nil)}
	t.Cleanup(func() { st.Store.Close() })
	st.Short.Store(true)
	f := newFixture(t, Options{Store: st})
	if w := f.do("GET", "/x", "198.51.100.1:1", "X-API-Key", keyA); w.Code != 500 || f.hits.Load() != 0 {
		t.Fatalf("short decision: %d %s, %d hits", w.Code, w.Body, f.hits.Load())
	}
}

func TestActions(t *testing.T) {
	f := newFixture(t, Options{Actions: []Action{
		{Pattern: "GET /search", Name: "search"},
		{Pattern: "POST /docs/{id}/summary", Name: "invoke-doc-summary-ai"},
		{Pattern: "/files/"},
		{Pattern: "api.example.com/v2/", Name: "v2"},
	}})
	for _, tc := range []struct{ method, target, want string }{
		{"GET", "/search", "search"},
		{"POST", "/search", ""},
		{"POST", "/docs/42/summary", "invoke-doc-summary-ai"},
		{"GET", "/docs/42/summary", ""},
		{"DELETE", "/files/a/b", "/files/"},
		{"GET", "http://api.example.com/v2/x", "v2"},
		{"GET", "http://other.example.com/v2/x", ""},
		{"GET", "/elsewhere", ""},
	} {
		f.do(tc.method, tc.target, "198.51.100.1:1", "X-API-Key", keyA)
		if got := f.seen.Load().Action; got != tc.want {
			t.Errorf("%s %s: action %q, want %q", tc.method, tc.target, got, tc.want)
		}
	}
	// search has its own bucket of 1 for the tenant.
	g := newFixture(t, Options{Actions: []Action{{Pattern: "GET /search", Name: "search"}}})
	if w := g.do("GET", "/search", "198.51.100.1:1", "X-API-Key", keyA); w.Code != 200 {
		t.Fatalf("first search: %d", w.Code)
	}
	if w := g.do("GET", "/search", "198.51.100.2:1", "X-API-Key", keyA); w.Code != 429 || !strings.Contains(w.Body.String(), "searches") {
		t.Fatalf("second search: %d %s", w.Code, w.Body)
	}
	if w := g.do("GET", "/other", "198.51.100.3:1", "X-API-Key", keyA); w.Code != 200 {
		t.Fatalf("another action after the search bucket is spent: %d", w.Code)
	}
}

func TestBadOptions(t *testing.T) {
	p := testPolicy(t)
	pol := func() *policy.Policy { return p }
	st := memstore.New(nil)
	defer st.Close()
	for name, o := range map[string]Options{
		"no policy":           {Store: st},
		"no store":            {Policy: pol},
		"bad pattern":         {Store: st, Policy: pol, Actions: []Action{{Pattern: "GET search"}}},
		"conflicting":         {Store: st, Policy: pol, Actions: []Action{{Pattern: "/a/{x}", Name: "a"}, {Pattern: "/a/{y}", Name: "b"}}},
		"bad header":          {Store: st, Policy: pol, ForwardedHeader: "X-Real-IP"},
		"bad user header":     {Store: st, Policy: pol, UserHeader: "X User"},
		"short secret":        {Store: st, Policy: pol, JWT: &JWT{Keys: []JWTKey{{Alg: "HS256", Secret: []byte("short")}}}},
		"none":                {Store: st, Policy: pol, JWT: &JWT{Keys: []JWTKey{{Alg: "none"}}}},
		"rsa key for ES256":   {Store: st, Policy: pol, JWT: &JWT{Keys: []JWTKey{{Alg: "ES256", Public: &rsa.PublicKey{}}}}},
		"no keys":             {Store: st, Policy: pol, JWT: &JWT{}},
		"long action name":    {Store: st, Policy: pol, Actions: []Action{{Pattern: "/a", Name: strings.Repeat("x", 200)}}},
		"secret for RS256":    {Store: st, Policy: pol, JWT: &JWT{Keys: []JWTKey{{Alg: "RS256", Secret: []byte(strings.Repeat("s", 40))}}}},
		"small RSA for RS256": {Store: st, Policy: pol, JWT: &JWT{Keys: []JWTKey{{Alg: "RS256", Public: smallRSA(t)}}}},
	} {
		if _, err := New(o); err == nil {
			t.Errorf("%s: New accepted %+v", name, o)
		}
	}
}

func smallRSA(t *testing.T) *rsa.PublicKey {
	k, err := rsa.GenerateKey(rand.Reader, 1024)
	if err != nil {
		t.Fatal(err)
	}
	return &k.PublicKey
}

func TestUserHeaderFromTrustedProxiesOnly(t *testing.T) {
	f := newFixture(t, Options{UserHeader: "x-user-id", TrustedProxies: mustProxies(t, "10.0.0.0/8")})
	f.do("GET", "/x", "10.0.0.1:1", "X-API-Key", keyA, "X-User-Id", "alice", "X-Forwarded-For", "198.51.100.7")
	if got := f.seen.Load(); got.User != "alice" || got.IP != "198.51.100.7" {
		t.Fatalf("from a trusted proxy: %+v", got)
	}
	f.do("GET", "/x", "198.51.100.8:1", "X-API-Key", keyA, "X-User-Id", "alice", "X-Forwarded-For", "1.2.3.4")
	if got := f.seen.Load(); got.User != "" || got.IP != "198.51.100.8" {
		t.Fatalf("from an untrusted peer: %+v", got)
	}
	// The underscore spelling never reaches the application.
	r := httptest.NewRequest("GET", "/x", nil)
	r.RemoteAddr = "10.0.0.1:1"
	r.Header["X_user_id"] = []string{"mallory"}
	r.Header["X_Forwarded_For"] = []string{"6.6.6.6"}
	var leaked []string
	h := f.lim.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		for k := range r.Header {
			if strings.Contains(k, "_") {
				leaked = append(leaked, k)
			}
		}
	}))
	h.ServeHTTP(httptest.NewRecorder(), r)
	if len(leaked) > 0 || f.seen.Load().User != "" {
		t.Fatalf("underscore headers reached the application: %v (user %q)", leaked, f.seen.Load().User)
	}
}

// jwtKeys makes one key of each algorithm.
type jwtKeys struct {
	hs  []byte
	rsa *rsa.PrivateKey
	ec  *ecdsa.PrivateKey
}

func newJWTKeys(t testing.TB) *jwtKeys {
	rk, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	ek, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return &jwtKeys{hs: []byte(strings.Repeat("k", 32)), rsa: rk, ec: ek}
}

func (k *jwtKeys) config(now time.Time) *JWT {
	return &JWT{
		Keys: []JWTKey{
			{Alg: "HS256", Secret: k.hs},
			{Alg: "RS256", Public: &k.rsa.PublicKey},
			{Alg: "ES256", ID: "ec-1", Public: &k.ec.PublicKey},
		},
		TenantClaim: "tenant", Issuer: "https://idp.example", Audience: "api",
		Now: func() time.Time { return now },
	}
}

func TestJWT(t *testing.T) {
	now := time.Date(2026, 11, 21, 12, 0, 0, 0, time.UTC)
	keys := newJWTKeys(t)
	claims := func(mod func(jwt.MapClaims)) jwt.MapClaims {
		c := jwt.MapClaims{"sub": "alice", "tenant": "open", "iss": "https://idp.example", "aud": "api", "exp": now.Add(time.Minute).Unix()}
		if mod != nil {
			mod(c)
		}
		return c
	}
	sign := func(m jwt.SigningMethod, key any, c jwt.MapClaims, kid string) string {
		tok := jwt.NewWithClaims(m, c)
		if kid != "" {
			tok.Header["kid"] = kid
		}
		s, err := tok.SignedString(key)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	otherRSA, _ := rsa.GenerateKey(rand.Reader, 2048)
	noneTok, _ := jwt.NewWithClaims(jwt.SigningMethodNone, claims(nil)).SignedString(jwt.UnsafeAllowNoneSignatureType)
	// An HS256 token whose secret is the RSA public key: the algorithm
	// confusion attack.
	pubDER := keys.rsa.PublicKey.N.Bytes()
	cases := []struct {
		name   string
		token  string
		status int
		user   string
		tenant string
	}{
		{"HS256", sign(jwt.SigningMethodHS256, keys.hs, claims(nil), ""), 200, "alice", "open"},
		{"RS256", sign(jwt.SigningMethodRS256, keys.rsa, claims(nil), ""), 200, "alice", "open"},
		{"ES256 with kid", sign(jwt.SigningMethodES256, keys.ec, claims(nil), "ec-1"), 200, "alice", "open"},
		{"numeric sub", sign(jwt.SigningMethodHS256, keys.hs, claims(func(c jwt.MapClaims) { c["sub"] = 1234 }), ""), 200, "1234", "open"},
		{"ES256 wrong kid", sign(jwt.SigningMethodES256, keys.ec, claims(nil), "ec-2"), 401, "", ""},
		{"alg none", noneTok, 401, "", ""},
		{"expired", sign(jwt.SigningMethodHS256, keys.hs, claims(func(c jwt.MapClaims) { c["exp"] = now.Add(-time.Second).Unix() }), ""), 401, "", ""},
		{"no exp", sign(jwt.SigningMethodHS256, keys.hs, claims(func(c jwt.MapClaims) { delete(c, "exp") }), ""), 401, "", ""},
		{"not yet valid", sign(jwt.SigningMethodHS256, keys.hs, claims(func(c jwt.MapClaims) { c["nbf"] = now.Add(time.Hour).Unix() }), ""), 401, "", ""},
		{"wrong issuer", sign(jwt.SigningMethodHS256, keys.hs, claims(func(c jwt.MapClaims) { c["iss"] = "https://evil.example" }), ""), 401, "", ""},
		{"wrong audience", sign(jwt.SigningMethodHS256, keys.hs, claims(func(c jwt.MapClaims) { c["aud"] = "other" }), ""), 401, "", ""},
		{"wrong RSA key", sign(jwt.SigningMethodRS256, otherRSA, claims(nil), ""), 401, "", ""},
		{"wrong HMAC secret", sign(jwt.SigningMethodHS256, []byte(strings.Repeat("x", 32)), claims(nil), ""), 401, "", ""},
		{"alg confusion", sign(jwt.SigningMethodHS256, pubDER, claims(nil), ""), 401, "", ""},
		{"HS384 not allowed", sign(jwt.SigningMethodHS384, keys.hs, claims(nil), ""), 401, "", ""},
		{"tampered payload", tamper(sign(jwt.SigningMethodHS256, keys.hs, claims(nil), "")), 401, "", ""},
		{"non-string tenant", sign(jwt.SigningMethodHS256, keys.hs, claims(func(c jwt.MapClaims) { c["tenant"] = []string{"a"} }), ""), 401, "", ""},
		{"unknown tenant", sign(jwt.SigningMethodHS256, keys.hs, claims(func(c jwt.MapClaims) { c["tenant"] = "nobody" }), ""), 403, "", ""},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, Options{JWT: keys.config(now)})
			peer := "198.51.100." + strconv.Itoa(i+1) + ":1"
			w := f.do("GET", "/x", peer, "Authorization", "Bearer "+tc.token)
			if w.Code != tc.status {
				t.Fatalf("status %d, want %d: %s", w.Code, tc.status, w.Body)
			}
			if tc.status == 200 {
				if got := f.seen.Load(); got.User != tc.user || got.Tenant != tc.tenant {
					t.Fatalf("identified %q of %q, want %q of %q", got.User, got.Tenant, tc.user, tc.tenant)
				}
			}
			if tc.status == 401 && w.Header().Get("WWW-Authenticate") == "" {
				t.Fatal("401 without WWW-Authenticate")
			}
		})
	}
	// A key and a token of different tenants: refused.
	f := newFixture(t, Options{JWT: keys.config(now)})
	tok := sign(jwt.SigningMethodHS256, keys.hs, claims(nil), "")
	if w := f.do("GET", "/x", "198.51.100.200:1", "Authorization", "Bearer "+tok, "X-API-Key", keyA); w.Code != 403 {
		t.Fatalf("key of a, token of open: %d", w.Code)
	}
	// A token names a keyed tenant: the token is the credential.
	tokA := sign(jwt.SigningMethodHS256, keys.hs, claims(func(c jwt.MapClaims) { c["tenant"] = "a" }), "")
	if w := f.do("GET", "/x", "198.51.100.201:1", "Authorization", "Bearer "+tokA); w.Code != 200 || f.seen.Load().Tenant != "a" {
		t.Fatalf("token of keyed tenant a: %d", w.Code)
	}
	// Two keys of one algorithm without kids, as while a signing key
	// rotates: a token of either verifies, not only of the first.
	cfg := keys.config(now)
	cfg.Keys = append([]JWTKey{{Alg: "RS256", Public: &otherRSA.PublicKey}}, cfg.Keys...)
	rot := newFixture(t, Options{JWT: cfg})
	for i, key := range []*rsa.PrivateKey{otherRSA, keys.rsa} {
		if w := rot.do("GET", "/x", "198.51.100.21"+strconv.Itoa(i)+":1", "Authorization", "Bearer "+sign(jwt.SigningMethodRS256, key, claims(nil), "")); w.Code != 200 {
			t.Errorf("RS256 token of key %d of 2 without kids: %d %s", i+1, w.Code, w.Body)
		}
	}
	if w := rot.do("GET", "/x", "198.51.100.219:1", "Authorization", "Bearer "+sign(jwt.SigningMethodRS256, mustRSA(t), claims(nil), "")); w.Code != 401 {
		t.Errorf("RS256 token of a third key: %d", w.Code)
	}
}

func mustRSA(t *testing.T) *rsa.PrivateKey {
	k, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func tamper(tok string) string {
	parts := strings.Split(tok, ".")
	parts[1] = strings.TrimRight(parts[1], "=") + "e30" // a changed payload
	return strings.Join(parts, ".")
}

// TestConcurrentExactBound hammers one tenant through the middleware: the
// handler is reached exactly as often as the tenant's bucket allows.
func TestConcurrentExactBound(t *testing.T) {
	f := newFixture(t, Options{})
	done := make(chan struct{})
	for g := range 16 {
		go func() {
			defer func() { done <- struct{}{} }()
			for i := range 20 {
				f.do("GET", "/x", "198.51.100."+strconv.Itoa(g)+":"+strconv.Itoa(i), "X-API-Key", keyB)
			}
		}()
	}
	for range 16 {
		<-done
	}
	// per-tenant: burst 4 at 1/min; the test takes far less than 15 s.
	if got := f.hits.Load(); got != 4 {
		t.Fatalf("%d requests reached the handler, want exactly 4", got)
	}
}

// FuzzCheck: whatever credentials and forwarding headers a request
// carries, the middleware answers 200, 400, 401, 403 or 429, never 500, and
// never panics.
func FuzzCheck(f *testing.F) {
	f.Add(keyA, "Bearer "+keyB, "198.51.100.1, 10.0.0.2", "alice", "GET", "/search")
	f.Add("", "Bearer a.b.c", "", "", "POST", "/docs/1/summary")
	f.Add("", "bearer  ", "[::1]:80", "\x00", "DELETE", "/")
	keys := newJWTKeys(f)
	st := memstore.New(nil)
	defer st.Close()
	p := testPolicy(f)
	lim, err := New(Options{Store: st, Policy: func() *policy.Policy { return p }, UserHeader: "X-User",
		TrustedProxies: mustProxies(f, "10.0.0.0/8"), JWT: keys.config(time.Now()),
		Actions: []Action{{Pattern: "GET /search", Name: "search"}, {Pattern: "POST /docs/{id}/summary"}}})
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, apiKey, authz, xff, user, method, path string) {
		r := &http.Request{Method: method, URL: &url.URL{Path: path}, RemoteAddr: "10.0.0.1:1", Header: http.Header{}, Host: "x"}
		r.Header.Set("X-API-Key", apiKey)
		r.Header.Set("Authorization", authz)
		r.Header.Set("X-Forwarded-For", xff)
		r.Header.Set("X-User", user)
		w := httptest.NewRecorder()
		lim.Check(w, r)
		switch w.Code {
		case 200, 400, 401, 403, 429:
		default:
			t.Fatalf("status %d: %s", w.Code, w.Body)
		}
	})
}
