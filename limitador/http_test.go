package limitador

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	dto "github.com/prometheus/client_model/go"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/admitdev/admit/memstore"
	"github.com/admitdev/admit/policy"
	"github.com/admitdev/admit/redisstore"
	"github.com/admitdev/admit/redistest"
	"github.com/admitdev/admit/storetest"
)

func post(t *testing.T, h http.Handler, path, body string) (*http.Response, string) {
	t.Helper()
	req := httptest.NewRequest("POST", path, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	w := httptest.NewRecorder()
	h.ServeHTTP(w, req)
	b, _ := io.ReadAll(w.Result().Body)
	return w.Result(), string(b)
}

func get(t *testing.T, h http.Handler, path string) (int, string) {
	t.Helper()
	w := httptest.NewRecorder()
	h.ServeHTTP(w, httptest.NewRequest("GET", path, nil))
	return w.Code, w.Body.String()
}

func TestHTTPAPI(t *testing.T) {
	l, _ := newLimiter(t, perUser)
	h := Handler(l, HandlerOptions{})
	body := `{"namespace":"app","values":{"req.method":"GET","user":"alice"},"delta":1,"response_headers":"DraftVersion03"}`
	for i, want := range []int{200, 200, 429} {
		resp, out := post(t, h, "/check_and_report", body)
		if resp.StatusCode != want || out != "null" {
			t.Fatalf("call %d: %d %q, want %d null", i, resp.StatusCode, out, want)
		}
		//lint:ignore SA1008 Limitador's name, which Handler writes as it is
		if got := resp.Header["X-RateLimit-Limit"]; len(got) != 1 || got[0] != `2, 2;w=60;name="per-user"` {
			t.Fatalf("X-RateLimit-Limit = %q", got)
		}
	}
	if resp, out := post(t, h, "/check", body); resp.StatusCode != 429 || out != "Too many requests" {
		t.Fatalf("check: %d %q", resp.StatusCode, out)
	}
	if resp, out := post(t, h, "/report", strings.Replace(body, `"delta":1`, `"delta":0`, 1)); resp.StatusCode != 200 || out != "null" {
		t.Fatalf("report: %d %q", resp.StatusCode, out)
	}
	if resp, _ := post(t, h, "/check_and_report", `{"namespace":"nope","values":{},"delta":5}`); resp.StatusCode != 200 {
		t.Fatalf("a namespace without limits: %d", resp.StatusCode)
	}
	for _, bad := range []string{`{"namespace":"app","values":{}}`, `{"namespace":"app","values":{},"delta":-1}`, `not json`, `{"namespace":"app","namespace":"x","values":{},"delta":1}`} {
		resp, out := post(t, h, "/check", bad)
		if resp.StatusCode != 400 || resp.Header.Get("Content-Type") != "application/problem+json" {
			t.Fatalf("%s: %d %s %q", bad, resp.StatusCode, resp.Header.Get("Content-Type"), out)
		}
	}
	code, out := get(t, h, "/counters/app")
	var cs []counterJSON
	if code != 200 || json.Unmarshal([]byte(out), &cs) != nil || len(cs) != 1 || cs[0].Remaining != 0 || cs[0].ExpiresInSeconds != 60 ||
		cs[0].SetVariables["descriptors[0].user"] != "alice" || *cs[0].Limit.Name != "per-user" {
		t.Fatalf("counters: %d %s", code, out)
	}
	code, out = get(t, h, "/limits/app")
	if code != 200 || !strings.Contains(out, `"max_value":2,"seconds":60,"name":"per-user","conditions":["descriptors[0]['req.method'] == 'GET'"]`) || !strings.Contains(out, `"id":null`) {
		t.Fatalf("limits: %d %s", code, out)
	}
	if code, out := get(t, h, "/limits/none"); code != 200 || out != "[]" {
		t.Fatalf("limits of no namespace: %d %s", code, out)
	}
	if code, out := get(t, h, "/status"); code != 200 || !strings.Contains(out, `"config_version":0,"config_err_since":0`) {
		t.Fatalf("status: %d %s", code, out)
	}
}

func TestHTTPAPIGuard(t *testing.T) {
	l, _ := newLimiter(t, perUser)
	h := Handler(l, HandlerOptions{Authorize: func(r *http.Request) bool { return r.Header.Get("Authorization") == "Bearer ok" }, Denied: "no"})
	if resp, _ := post(t, h, "/report", `{"namespace":"app","values":{},"delta":1}`); resp.StatusCode != 401 {
		t.Fatalf("report without the token: %d", resp.StatusCode)
	}
	if code, _ := get(t, h, "/counters/app"); code != 401 {
		t.Fatalf("counters without the token: %d", code)
	}
	if code, _ := get(t, h, "/status"); code != 200 {
		t.Fatalf("status is every health check's: %d", code)
	}
}

func rlsRequest(domain string, hits uint32, kv ...string) *rlsv3.RateLimitRequest {
	d := &rlv3.RateLimitDescriptor{}
	for i := 0; i+1 < len(kv); i += 2 {
		d.Entries = append(d.Entries, &rlv3.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
	}
	return &rlsv3.RateLimitRequest{Domain: domain, Descriptors: []*rlv3.RateLimitDescriptor{d}, HitsAddend: hits}
}

func TestService(t *testing.T) {
	l, _ := newLimiter(t, perUser)
	s := NewService(l, HeadersDraft03)
	ctx := context.Background()
	req := rlsRequest("app", 0, "req.method", "GET", "user", "u")
	for i, want := range []rlsv3.RateLimitResponse_Code{rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OVER_LIMIT} {
		resp, err := s.ShouldRateLimit(ctx, req)
		if err != nil || resp.OverallCode != want || len(resp.Statuses) != 0 {
			t.Fatalf("call %d: %v %v", i, resp, err)
		}
		if hs := resp.ResponseHeadersToAdd; len(hs) != 3 || hs[0].Key != "X-RateLimit-Limit" || hs[1].Key != "X-RateLimit-Remaining" {
			t.Fatalf("headers %v", hs)
		}
	}
	// Kuadrant's: a check of 1 counts nothing; a report of 5 counts past
	// the limit.
	other := rlsRequest("app", 0, "req.method", "GET", "user", "v")
	for range 3 {
		if resp, err := s.CheckRateLimit(ctx, other); err != nil || resp.OverallCode != rlsv3.RateLimitResponse_OK {
			t.Fatalf("check: %v %v", resp, err)
		}
	}
	other.HitsAddend = 5
	if resp, err := s.Report(ctx, other); err != nil || resp.OverallCode != rlsv3.RateLimitResponse_OK {
		t.Fatalf("report: %v %v", resp, err)
	}
	if resp, _ := s.CheckRateLimit(ctx, other); resp.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("after a report past the limit: %v", resp)
	}
	if resp, err := s.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{}); err != nil || resp.OverallCode != rlsv3.RateLimitResponse_UNKNOWN {
		t.Fatalf("no domain: %v %v", resp, err)
	}
	big := rlsRequest("app", 1)
	for range MaxDescriptors {
		big.Descriptors = append(big.Descriptors, big.Descriptors[0])
	}
	if _, err := s.ShouldRateLimit(ctx, big); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("too many descriptors: %v", err)
	}
}

// TestServersShareCounters decides through two limiters on one Redis,
// as two servers would: the limit holds across them, exactly.
func TestServersShareCounters(t *testing.T) {
	srv := redistest.Start(t)
	for _, dist := range []string{"exact", "leased"} {
		t.Run(dist, func(t *testing.T) { testServersShare(t, srv, dist) })
	}
}

func testServersShare(t *testing.T, srv *redistest.Server, dist string) {
	ls, err := ParseWith("limits.yaml", []byte(strings.Replace(perUser, "namespace: app", "namespace: app\n  distribution: "+dist, 1)), ParseOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var lims []*Limiter
	for range 2 {
		st, err := redisstore.Open(context.Background(), "redis://"+srv.Addr, &redisstore.Options{Timeout: 10 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { st.Close() })
		l, err := New(Options{Decider: policy.NewDecider(st, 1), Limits: ls})
		if err != nil {
			t.Fatal(err)
		}
		lims = append(lims, l)
	}
	alice := desc("req.method", "GET", "user", dist)
	n := 0
	for i := range 6 {
		res, err := lims[i%2].Decide(context.Background(), CheckAndReport, "app", alice, 1, true)
		if err != nil {
			t.Fatal(err)
		}
		if !res.Limited {
			n++
		}
	}
	if n != 2 {
		t.Fatalf("%d admitted across two servers, want 2", n)
	}
	// The first hit started the window, in Redis's time, for both.
	cs, _, err := lims[1].Counters(context.Background(), "app")
	if dist == "leased" {
		return // a leased counter's units are in the servers' hands, not in Redis
	}
	if err != nil || len(cs) != 1 || cs[0].Remaining != 0 || cs[0].ExpiresIn > time.Minute || cs[0].ExpiresIn <= 0 {
		t.Fatalf("counters from the other server: %+v %v", cs, err)
	}
}

// TestStoreDown: a store that does not answer fails every way in as
// Limitador's does — UNAVAILABLE over gRPC (Envoy's failure_mode_deny
// decides), 503 over HTTP — whatever the deployment's failure mode, and
// the answers come back with the store.
func TestStoreDown(t *testing.T) {
	st := &storetest.Faulty{Store: memstore.New(nil)}
	t.Cleanup(func() { st.Close() })
	ls, err := Parse("limits.yaml", []byte(perUser))
	if err != nil {
		t.Fatal(err)
	}
	m := NewMetrics(false)
	l, err := New(Options{Decider: policy.NewDecider(st, 1), Limits: ls, Metrics: m})
	if err != nil {
		t.Fatal(err)
	}
	s, h := NewService(l, HeadersNone), Handler(l, HandlerOptions{})
	req := rlsRequest("app", 1, "req.method", "GET", "user", "u")
	body := `{"namespace":"app","values":{"req.method":"GET","user":"u"},"delta":1}`
	st.Down.Store(true)
	ctx := context.Background()
	for name, call := range map[string]func() error{
		"ShouldRateLimit": func() error { _, err := s.ShouldRateLimit(ctx, req); return err },
		"CheckRateLimit":  func() error { _, err := s.CheckRateLimit(ctx, req); return err },
		"Report":          func() error { _, err := s.Report(ctx, req); return err },
	} {
		if err := call(); status.Code(err) != codes.Unavailable {
			t.Errorf("%s with the store down: %v, want UNAVAILABLE", name, err)
		}
	}
	for _, path := range []string{"/check", "/report", "/check_and_report"} {
		if resp, out := post(t, h, path, body); resp.StatusCode != 503 {
			t.Errorf("%s with the store down: %d %s", path, resp.StatusCode, out)
		}
	}
	if code, _ := get(t, h, "/status"); code != 200 {
		t.Errorf("status with the store down: %d", code)
	}
	if v := gauge(t, m); v != 1 {
		t.Errorf("datastore_partitioned %v with the store down", v)
	}
	st.Down.Store(false)
	if resp, err := s.ShouldRateLimit(ctx, req); err != nil || resp.OverallCode != rlsv3.RateLimitResponse_OK {
		t.Fatalf("the store is back: %v %v", resp, err)
	}
	if v := gauge(t, m); v != 0 {
		t.Errorf("datastore_partitioned %v with the store back", v)
	}
}

// TestHTTPRefusesNonText: a value that is not UTF-8 is refused, not read
// as U+FFFD and made another caller's counter.
func TestHTTPRefusesNonText(t *testing.T) {
	l, _ := newLimiter(t, perUser)
	h := Handler(l, HandlerOptions{})
	for _, body := range []string{
		"{\"namespace\":\"app\",\"values\":{\"req.method\":\"GET\",\"user\":\"u\xff\"},\"delta\":1}",
		`{"namespace":"app","values":{"req.method":"GET","user":"u\udfff"},"delta":1}`,
	} {
		if resp, out := post(t, h, "/check_and_report", body); resp.StatusCode != 400 || !strings.Contains(out, "UTF-8") {
			t.Errorf("%q: %d %s", body, resp.StatusCode, out)
		}
	}
}

func gauge(t *testing.T, m *Metrics) float64 {
	t.Helper()
	var out dto.Metric
	if err := m.partitioned.Write(&out); err != nil {
		t.Fatal(err)
	}
	return out.GetGauge().GetValue()
}
