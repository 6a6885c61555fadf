package httplimit_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/admitdev/admit"
	"github.com/admitdev/admit/httplimit"
	"github.com/admitdev/admit/internal/bounds"
	"github.com/admitdev/admit/memstore"
	"github.com/admitdev/admit/policy"
	"github.com/admitdev/admit/problem"
	"github.com/admitdev/admit/storetest"
)

func newStore(t *testing.T) *memstore.Store {
	t.Helper()
	s := memstore.New(&memstore.Options{Clock: storetest.NewClock().Now})
	t.Cleanup(func() { s.Close() })
	return s
}

// byHeader identifies a request by its X-Tenant and X-User headers and
// its path as the action.
func byHeader(r *http.Request) (admit.Who, error) {
	return admit.Who{Tenant: r.Header.Get("X-Tenant"), User: r.Header.Get("X-User"), Action: r.URL.Path}, nil
}

func get(h http.Handler, path, tenant, user string) *httptest.ResponseRecorder {
	r := httptest.NewRequest(http.MethodGet, path, nil)
	if tenant != "" {
		r.Header.Set("X-Tenant", tenant)
	}
	if user != "" {
		r.Header.Set("X-User", user)
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}

// The first case of the front door: a tenant × action bucket of 10/s,
// burst 20, in front of a handler.
func TestMiddleware(t *testing.T) {
	l, err := admit.NewLimiter(newStore(t), admit.Bucket("docs", admit.PerSecond(10), 20).Per(admit.PerTenant, admit.PerAction))
	if err != nil {
		t.Fatal(err)
	}
	var served atomic.Int64
	h := httplimit.Middleware(l, byHeader)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		served.Add(1)
	}))
	for i := range 20 {
		if w := get(h, "/summary", "acme", ""); w.Code != http.StatusOK {
			t.Fatalf("request %d: %d %s", i+1, w.Code, w.Body)
		}
	}
	w := get(h, "/summary", "acme", "")
	if w.Code != http.StatusTooManyRequests || served.Load() != 20 {
		t.Fatalf("21st: %d, %d served; want 429 and 20", w.Code, served.Load())
	}
	if got := w.Header().Get("Retry-After"); got != "1" {
		t.Errorf("Retry-After %q, want 1 (100 ms rounded up)", got)
	}
	if got := w.Header().Get("RateLimit"); !regexp.MustCompile(`^"docs";r=0;t=2;pk=:[A-Za-z0-9+/]{12}:$`).MatchString(got) {
		t.Errorf("RateLimit %q", got)
	}
	if got := w.Header().Get("RateLimit-Policy"); !regexp.MustCompile(`^"docs";q=20;w=2;pk=:[A-Za-z0-9+/]{12}:$`).MatchString(got) {
		t.Errorf("RateLimit-Policy %q", got)
	}
	var p struct {
		Type         string   `json:"type"`
		Status       int      `json:"status"`
		Violated     []string `json:"violated-policies"`
		DeniedBy     string   `json:"denied_by"`
		RetryAfterMS int64    `json:"retry_after_ms"`
	}
	if ct := w.Header().Get("Content-Type"); ct != "application/problem+json" {
		t.Errorf("Content-Type %q", ct)
	}
	if err := json.Unmarshal(w.Body.Bytes(), &p); err != nil || p.Status != 429 || p.DeniedBy != "docs" || p.RetryAfterMS != 100 ||
		p.Type != problem.QuotaExceeded || len(p.Violated) != 1 || p.Violated[0] != "docs" {
		t.Errorf("body %s: %+v %v", w.Body, p, err)
	}
	// Another action and another tenant have buckets of their own.
	if w := get(h, "/export", "acme", ""); w.Code != http.StatusOK {
		t.Errorf("another action: %d", w.Code)
	}
	if w := get(h, "/summary", "globex", ""); w.Code != http.StatusOK {
		t.Errorf("another tenant: %d", w.Code)
	}
}

// A request whose Who lacks what a limit is per is refused, never served
// unlimited; an error of who's own picks the status by its code.
func TestMiddlewareRefusesUnidentified(t *testing.T) {
	l, err := admit.NewLimiter(newStore(t), admit.Bucket("user", admit.PerSecond(1), 100).Per(admit.PerTenant, admit.PerUser))
	if err != nil {
		t.Fatal(err)
	}
	var served atomic.Int64
	next := http.HandlerFunc(func(http.ResponseWriter, *http.Request) { served.Add(1) })
	h := httplimit.Middleware(l, byHeader)(next)
	for _, tc := range []struct{ tenant, user string }{{"", "alice"}, {"acme", ""}, {"", ""}} {
		w := get(h, "/", tc.tenant, tc.user)
		if w.Code != http.StatusBadRequest || !strings.Contains(w.Body.String(), "has no") {
			t.Errorf("tenant %q user %q: %d %s, want 400", tc.tenant, tc.user, w.Code, w.Body)
		}
	}
	if w := get(h, "/", "acme", strings.Repeat("u", bounds.MaxWhoLen+1)); w.Code != http.StatusBadRequest {
		t.Errorf("a user name too long for a key: %d", w.Code)
	}
	if served.Load() != 0 {
		t.Fatalf("%d unidentified requests served", served.Load())
	}
	unauth := httplimit.Middleware(l, func(*http.Request) (admit.Who, error) {
		return admit.Who{}, admit.Errorf(admit.CodeUnauthenticated, "no API key")
	})(next)
	if w := get(unauth, "/", "acme", "alice"); w.Code != http.StatusUnauthorized || !strings.Contains(w.Body.String(), "no API key") {
		t.Errorf("who's unauthenticated error: %d %s", w.Code, w.Body)
	}
	// A plain error's text may say what the client must not see.
	plain := httplimit.Middleware(l, func(*http.Request) (admit.Who, error) {
		return admit.Who{}, errors.New("lookup in postgres://admin:pw@10.0.0.5/keys: timeout")
	})(next)
	if w := get(plain, "/", "acme", "alice"); w.Code != http.StatusBadRequest || strings.Contains(w.Body.String(), "postgres") || !strings.Contains(w.Body.String(), "who makes it") {
		t.Errorf("who's plain error: %d %s", w.Code, w.Body)
	}
}

// Wiring mistakes show at wiring: a nil limiter, who or handler panics
// when the middleware is built, naming it, never at the first request;
// nil decisions and requests are errors.
func TestMiddlewareWiringMistakes(t *testing.T) {
	l, err := admit.NewLimiter(memstore.New(nil), admit.Bucket("b", admit.PerSecond(1), 1).Per(admit.PerTenant))
	if err != nil {
		t.Fatal(err)
	}
	for name, build := range map[string]func(){
		"*admit.Limiter": func() { httplimit.Middleware(nil, byHeader) },
		"who":            func() { httplimit.Middleware(l, nil) },
		"next handler":   func() { httplimit.Middleware(l, byHeader)(nil) },
		"NewLimiter":     func() { httplimit.Middleware(&admit.Limiter{}, byHeader) },
	} {
		func() {
			defer func() {
				if msg, _ := recover().(string); !strings.Contains(msg, name) {
					t.Errorf("nil %s: panic %q, want one naming it", name, msg)
				}
			}()
			build()
		}()
	}
	if err := httplimit.Debit(nil, 1); err == nil {
		t.Error("Debit(nil request): no error")
	}
	ctx := context.Background()
	if err := l.Decide(ctx, admit.Who{Tenant: "a"}, 1, nil); admit.ErrorField(err) != "d" {
		t.Errorf("Decide into nil: %v", err)
	}
	if err := l.Release(ctx, nil); admit.ErrorField(err) != "d" {
		t.Errorf("Release(nil): %v", err)
	}
}

// Middleware answers a refusal as the policy-driven Limiter (what admit
// proxy serves) does: the same status, headers and body.
func TestMiddlewareAnswersAsTheProxy(t *testing.T) {
	p := tenantPolicy(t)
	proxy, err := httplimit.New(httplimit.Options{
		Store:  newStore(t),
		Policy: func() *policy.Policy { return p },
		// The proxy spreads Retry-After by a random second; Middleware
		// says the wait itself.
		RetryJitter: -1,
		Identify: func(r *http.Request, req *policy.Request) error {
			req.Tenant = r.Header.Get("X-Tenant")
			return nil
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer proxy.Close()
	l, err := admit.NewLimiter(newStore(t), admit.Bucket("tenant", admit.PerSecond(10), 3).Per(admit.PerTenant))
	if err != nil {
		t.Fatal(err)
	}
	ok := http.HandlerFunc(func(http.ResponseWriter, *http.Request) {})
	handlers := map[string]http.Handler{"proxy": proxy.Handler(ok), "middleware": httplimit.Middleware(l, byHeader)(ok)}
	answers := map[string][]string{}
	for name, h := range handlers {
		for range 4 {
			w := get(h, "/", "acme", "")
			res := w.Result()
			body, _ := io.ReadAll(res.Body)
			// The partitions are hashes of keys, which a policy and a
			// Limiter spell apart: each has one, and the rest is alike.
			policyField, limitField := res.Header.Get("RateLimit-Policy"), res.Header.Get("RateLimit")
			if !partition.MatchString(policyField) || !partition.MatchString(limitField) {
				t.Errorf("%s: no partition in %q, %q", name, policyField, limitField)
			}
			answers[name] = append(answers[name], strings.Join([]string{
				res.Status, res.Header.Get("Content-Type"), res.Header.Get("Retry-After"),
				partition.ReplaceAllString(limitField, ""), partition.ReplaceAllString(policyField, ""), string(body),
			}, "\n"))
		}
	}
	for i := range answers["proxy"] {
		if answers["proxy"][i] != answers["middleware"][i] {
			t.Errorf("request %d:\nproxy:\n%s\nmiddleware:\n%s", i+1, answers["proxy"][i], answers["middleware"][i])
		}
	}
}

// partition matches the pk parameter of a RateLimit field's item.
var partition = regexp.MustCompile(`;pk=:[A-Za-z0-9+/]{12}:`)

func ptr[T any](v T) *T { return &v }

// tenantPolicy: one rule, a bucket of 10/s burst 3 per tenant; every
// tenant is of its tier.
func tenantPolicy(t *testing.T) *policy.Policy {
	t.Helper()
	p, err := policy.Compile(&policy.Spec{
		Tiers: map[string]policy.TierSpec{"free": {Rules: []policy.RuleSpec{
			{Name: "tenant", Scope: "tenant", Algorithm: "token_bucket", Rate: "10/s", Burst: ptr(int64(3))},
		}}},
		UnknownTenant: "free",
	})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// A handler learns its cost while working and debits it for the request's
// own Who; the next request of that Who meets the debt, another tenant's
// does not.
func TestMiddlewareDebit(t *testing.T) {
	l, err := admit.NewLimiter(newStore(t), admit.Bucket("tokens", admit.PerSecond(100), 1000).Per(admit.PerTenant))
	if err != nil {
		t.Fatal(err)
	}
	h := httplimit.Middleware(l, byHeader)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := httplimit.Debit(r, 1500); err != nil {
			t.Errorf("Debit: %v", err)
		}
	}))
	if w := get(h, "/", "acme", ""); w.Code != http.StatusOK {
		t.Fatalf("first: %d", w.Code)
	}
	if w := get(h, "/", "acme", ""); w.Code != http.StatusTooManyRequests || w.Header().Get("Retry-After") != "6" {
		t.Errorf("after a debit of 1,500 (1 + 1,500 of 1,000): %d, Retry-After %q; want 429 and 6", w.Code, w.Header().Get("Retry-After"))
	}
	if w := get(h, "/", "globex", ""); w.Code != http.StatusOK {
		t.Errorf("another tenant: %d", w.Code)
	}
	r := httptest.NewRequest(http.MethodGet, "/", nil)
	if err := httplimit.Debit(r, 1); err == nil {
		t.Error("Debit on a request that did not come through Middleware: no error")
	}
}

// The concurrency slots of a request are held while its handler runs and
// released when it returns.
func TestMiddlewareConcurrency(t *testing.T) {
	l, err := admit.NewLimiter(newStore(t), admit.Concurrent("in-flight", 1).Per(admit.PerTenant))
	if err != nil {
		t.Fatal(err)
	}
	var inner http.Handler
	var nested *httptest.ResponseRecorder
	outer := httplimit.Middleware(l, byHeader)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// A second request of the tenant while this one runs.
		nested = get(inner, "/", "acme", "")
	}))
	inner = outer
	if w := get(outer, "/", "acme", ""); w.Code != http.StatusOK {
		t.Fatalf("outer: %d", w.Code)
	}
	if nested == nil || nested.Code != http.StatusTooManyRequests {
		t.Fatalf("the request made while the first ran: %v, want 429", nested)
	}
	d, err := l.Peek(context.Background(), admit.Who{Tenant: "acme"})
	if err != nil || !d.Allowed || d.Remaining != 0 {
		t.Errorf("after both returned: %+v %v, want the slot free (a request admitted, none left after it)", d, err)
	}
}

// Retry-After and the decision's wait agree once the time has passed: a
// refused client that waits as told is admitted.
func TestMiddlewareRetryAfterHolds(t *testing.T) {
	clock := storetest.NewClock()
	s := memstore.New(&memstore.Options{Clock: clock.Now})
	defer s.Close()
	l, err := admit.NewLimiter(s, admit.Window("minute", 2, time.Minute).Per(admit.PerUser))
	if err != nil {
		t.Fatal(err)
	}
	h := httplimit.Middleware(l, byHeader)(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	clock.Set(20 * time.Second)
	get(h, "/", "", "alice")
	get(h, "/", "", "alice")
	w := get(h, "/", "", "alice")
	if w.Code != http.StatusTooManyRequests || w.Header().Get("Retry-After") != "40" {
		t.Fatalf("third in the window: %d, Retry-After %q; want 429 and 40", w.Code, w.Header().Get("Retry-After"))
	}
	clock.Set(60 * time.Second)
	if w := get(h, "/", "", "alice"); w.Code != http.StatusOK {
		t.Errorf("after waiting 40 s: %d", w.Code)
	}
}

// The policy-driven Limiter: a request that names no tenant, where no
// global rule applies, is refused, never served unlimited; and RequireKey
// accepts a request whose tenant the Identify hook named.
func TestPolicyLimiterUnidentified(t *testing.T) {
	p := tenantPolicy(t)
	for _, requireKey := range []bool{false, true} {
		lim, err := httplimit.New(httplimit.Options{
			Store: newStore(t), Policy: func() *policy.Policy { return p }, RequireKey: requireKey,
			Identify: func(r *http.Request, req *policy.Request) error {
				req.Tenant = r.Header.Get("X-Tenant")
				return nil
			},
		})
		if err != nil {
			t.Fatal(err)
		}
		defer lim.Close()
		var served atomic.Int64
		h := lim.Handler(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { served.Add(1) }))
		for range 3 {
			if w := get(h, "/", "", ""); w.Code != http.StatusUnauthorized {
				t.Errorf("RequireKey %v, no tenant: %d %s, want 401", requireKey, w.Code, w.Body)
			}
		}
		for i := range 4 {
			w := get(h, "/", "acme", "")
			want := http.StatusOK
			if i == 3 {
				want = http.StatusTooManyRequests
			}
			if w.Code != want {
				t.Errorf("RequireKey %v, tenant named by Identify, request %d: %d %s, want %d", requireKey, i+1, w.Code, w.Body, want)
			}
		}
		if served.Load() != 3 {
			t.Errorf("RequireKey %v: %d served, want the tenant's 3", requireKey, served.Load())
		}
	}
}

// captureLog sends slog's default logger to a buffer until the test ends.
func captureLog(t *testing.T) *bytes.Buffer {
	var buf bytes.Buffer
	old := slog.Default()
	slog.SetDefault(slog.New(slog.NewTextHandler(&buf, nil)))
	t.Cleanup(func() { slog.SetDefault(old) })
	return &buf
}

// TestMiddlewareHidesWrappedWhoErrors: a who error the client sees is an
// *admit.Error returned as it is; one that wraps a cause, or is wrapped,
// answers with its code's status and a detail of the middleware's own,
// its text (a DSN here) going to the log only.
func TestMiddlewareHidesWrappedWhoErrors(t *testing.T) {
	logged := captureLog(t)
	l, err := admit.NewLimiter(newStore(t), admit.Bucket("user", admit.PerSecond(1), 100).Per(admit.PerTenant, admit.PerUser))
	if err != nil {
		t.Fatal(err)
	}
	dsn := errors.New("dial postgres://app:s3cret@10.0.0.5:5432/users: connection refused")
	for _, tc := range []struct {
		name string
		err  error
		code int
	}{
		{"wrapping an admit error", fmt.Errorf("tenant lookup via %w: %w", dsn, admit.Errorf(admit.CodePermission, "permission denied")), http.StatusForbidden},
		{"an admit error wrapping the cause", admit.Errorf(admit.CodeUnauthenticated, "token check: %w", dsn), http.StatusUnauthorized},
		{"an admit error with the cause", &admit.Error{Code: admit.CodePermission, Err: dsn}, http.StatusForbidden},
		{"joined", errors.Join(dsn, admit.Errorf(admit.CodeUnauthenticated, "unauthenticated")), http.StatusUnauthorized},
		{"an invalid request wrapping the cause", admit.Errorf(admit.CodeInvalid, "bad tenant: %w", dsn), http.StatusBadRequest},
		{"the store's outage", fmt.Errorf("%w: %w", dsn, admit.Errorf(admit.CodeUnavailable, "store unavailable")), http.StatusServiceUnavailable},
		{"an internal error", &admit.Error{Code: admit.CodeInternal, Message: "lookup", Err: dsn}, http.StatusInternalServerError},
		// A wrapped error that would choose its own status (a body too
		// large: 413) and show its text.
		{"an internal error wrapping a body too large", admit.Errorf(admit.CodeInternal, "lookup in %v failed: %w", dsn, &http.MaxBytesError{Limit: 1024}), http.StatusInternalServerError},
		{"joined with a body too large", errors.Join(admit.Errorf(admit.CodeUnavailable, "%v", dsn), &http.MaxBytesError{Limit: 1024}), http.StatusServiceUnavailable},
	} {
		logged.Reset()
		httplimit.ForgetOutageLog()
		h := httplimit.Middleware(l, func(*http.Request) (admit.Who, error) { return admit.Who{}, tc.err })(http.NotFoundHandler())
		w := get(h, "/", "acme", "alice")
		if w.Code != tc.code || strings.Contains(w.Body.String(), "postgres") || strings.Contains(w.Body.String(), "10.0.0.5") {
			t.Errorf("%s: %d %s; want %d, no DSN", tc.name, w.Code, w.Body, tc.code)
		}
		if !strings.Contains(logged.String(), "10.0.0.5") {
			t.Errorf("%s: the log has not the error: %q", tc.name, logged)
		}
	}
	// A nil *admit.Error returned as an error (a typed nil): refused,
	// never a panic.
	var none *admit.Error
	for name, err := range map[string]error{"as is": none, "wrapped": fmt.Errorf("identify: %w", none)} {
		h := httplimit.Middleware(l, func(*http.Request) (admit.Who, error) { return admit.Who{}, err })(http.NotFoundHandler())
		if w := get(h, "/", "acme", "alice"); w.Code != http.StatusBadRequest {
			t.Errorf("a typed nil *admit.Error from who, %s: %d %s, want 400", name, w.Code, w.Body)
		}
	}
}

// TestMiddlewareLimiterFailures: what fails in the limiter is shown to the
// client only when it is about the request (its Who); a store's outage is
// 503 naming no server and logged once every 10 seconds at most, however
// many requests fail; a closed Limiter or a limit the store cannot decide
// is the program's fault: 500, logged.
func TestMiddlewareLimiterFailures(t *testing.T) {
	logged := captureLog(t)
	down := &failingStore{err: &admit.Error{Code: admit.CodeUnavailable, Message: "redis 10.1.2.3:6379: connection refused"}}
	l, err := admit.NewLimiter(down, admit.Bucket("user", admit.PerSecond(1), 100).Per(admit.PerTenant, admit.PerUser))
	if err != nil {
		t.Fatal(err)
	}
	h := httplimit.Middleware(l, byHeader)(http.NotFoundHandler())
	httplimit.ForgetOutageLog()
	for i := range 20 {
		w := get(h, "/", "acme", "alice")
		if w.Code != http.StatusServiceUnavailable || strings.Contains(w.Body.String(), "10.1.2.3") || w.Header().Get("Retry-After") == "" {
			t.Fatalf("request %d with the store down: %d %s", i+1, w.Code, w.Body)
		}
	}
	if n := strings.Count(logged.String(), "10.1.2.3"); n != 1 {
		t.Errorf("20 requests during an outage logged it %d times, want once:\n%s", n, logged)
	}

	logged.Reset()
	down.err = &admit.Error{Code: admit.CodeInvalid, Message: `rule "w": window of 2160h0m0s is longer than the store's`}
	if w := get(h, "/", "acme", "alice"); w.Code != http.StatusInternalServerError || strings.Contains(w.Body.String(), "2160h") || !strings.Contains(logged.String(), "2160h") {
		t.Errorf("the store cannot decide a limit: %d %s, log %q; want 500, the reason logged, not shown", w.Code, w.Body, logged)
	}
	if w := get(h, "/", "", "alice"); w.Code != http.StatusBadRequest || !strings.Contains(w.Body.String(), "has no tenant") {
		t.Errorf("a Who without its tenant: %d %s; want 400 saying so", w.Code, w.Body)
	}

	logged.Reset()
	l.Close()
	if w := get(h, "/", "acme", "alice"); w.Code != http.StatusInternalServerError || strings.Contains(w.Body.String(), "closed") || !strings.Contains(logged.String(), "closed") {
		t.Errorf("a closed Limiter: %d %s, log %q; want 500, logged", w.Code, w.Body, logged)
	}
}

// failingStore fails every decision with err.
type failingStore struct {
	admit.Store
	err error
}

func (s *failingStore) Decide(context.Context, []admit.Charge, *admit.Decision) error { return s.err }

// TestMiddlewareWhoOutage: a who that cannot reach what identifies callers
// answers 503 saying so, not blaming the limiter's store, and its log does
// not use up the store outage's: a store outage right after is logged.
func TestMiddlewareWhoOutage(t *testing.T) {
	logged := captureLog(t)
	httplimit.ForgetOutageLog()
	down := &failingStore{err: &admit.Error{Code: admit.CodeUnavailable, Message: "redis 10.1.2.3:6379: connection refused"}}
	l, err := admit.NewLimiter(down, admit.Bucket("user", admit.PerSecond(1), 100).Per(admit.PerTenant, admit.PerUser))
	if err != nil {
		t.Fatal(err)
	}
	authDown := httplimit.Middleware(l, func(*http.Request) (admit.Who, error) {
		return admit.Who{}, admit.Errorf(admit.CodeUnavailable, "auth db 10.9.9.9 down")
	})(http.NotFoundHandler())
	for range 3 {
		w := get(authDown, "/", "acme", "alice")
		if w.Code != http.StatusServiceUnavailable || strings.Contains(w.Body.String(), "store") || strings.Contains(w.Body.String(), "10.9.9.9") || w.Header().Get("Retry-After") == "" {
			t.Fatalf("who's outage: %d %s", w.Code, w.Body)
		}
	}
	if n := strings.Count(logged.String(), "10.9.9.9"); n != 1 {
		t.Errorf("three requests while who's database is down logged it %d times, want once:\n%s", n, logged)
	}
	h := httplimit.Middleware(l, byHeader)(http.NotFoundHandler())
	if w := get(h, "/", "acme", "alice"); w.Code != http.StatusServiceUnavailable || !strings.Contains(logged.String(), "10.1.2.3") {
		t.Errorf("the store's outage after who's: %d, log %q; want 503 and the store's outage logged", w.Code, logged)
	}
}
