package e2e

// The Limitador tests run `admit serve --limitador-config` and restate the
// scenarios of Limitador's own tests (limitador/tests/integration_tests.rs,
// and the tests of limitador-server's envoy_rls/server.rs,
// envoy_rls/kuadrant_service.rs and http_api/server.rs) as what a client
// of the binary sees: over the Envoy rate limit service and Kuadrant's
// RPCs, and over Limitador's HTTP API, on the memory store and on Redis.
// Each scenario names the Limitador test it restates.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/admitdev/admit/limitador/kuadrantpb"
	"github.com/admitdev/admit/redistest"
)

// limitadorConfig is the Admit configuration the Limitador tests serve
// with: the Envoy RLS answers carry Limitador's draft-03 headers, as
// limitador-server --rate-limit-headers DRAFT_VERSION_03 adds them.
const limitadorConfig = `version: 1
limitador:
  rate_limit_headers: DRAFT_VERSION_03
`

// serveLimitador writes limits to a file and runs `admit serve` on it with
// args (a store, say), reloading the file every 100 ms once it has stayed
// the same for 100 ms. It returns the server and the file.
func serveLimitador(t *testing.T, limits string, args ...string) (*admitProcess, string) {
	t.Helper()
	dir := t.TempDir()
	cfg := filepath.Join(dir, "admit.yaml")
	file := filepath.Join(dir, "limits.yaml")
	writeTestFile(t, cfg, limitadorConfig)
	writeTestFile(t, file, limits)
	p := startAdmit(t, append([]string{"--config", cfg, "--limitador-config", file,
		"--reload-interval", "100ms", "--reload-settle", "100ms"}, args...)...)
	return p, file
}

// limitadorStores are the stores the scenarios run on, each as the flags
// of `admit serve` that choose it.
var limitadorStores = []struct {
	name  string
	flags func(t *testing.T) []string
}{
	{"memory", func(*testing.T) []string { return nil }},
	{"redis", func(t *testing.T) []string { return []string{"--store", "redis://" + redistest.Start(t).Addr} }},
}

// vals is the map of the key, value pairs kv: a request's values (HTTP)
// or its descriptor's entries (RLS).
func vals(kv ...string) map[string]string {
	m := map[string]string{}
	for i := 0; i+1 < len(kv); i += 2 {
		m[kv[i]] = kv[i+1]
	}
	return m
}

// limitadorAPI is one way of asking Admit's Limitador drop-in: the Envoy
// rate limit service with Kuadrant's RPCs beside it, or Limitador's HTTP
// API. Its methods return errors, not fail a test, so that goroutines
// may call them.
type limitadorAPI interface {
	String() string
	// checkAndReport counts delta on every limit of ns that applies to
	// values if all of them can take it (ShouldRateLimit, POST
	// /check_and_report), and says whether they could. withHeaders asks
	// the HTTP API for draft-03's headers; the RLS adds them as the server
	// is configured (limitadorConfig), whenever a limit applies.
	checkAndReport(ns string, values map[string]string, delta uint64, withHeaders bool) (limitadorAnswer, error)
	// check says whether one more hit would fit, counting nothing
	// (Kuadrant's CheckRateLimit, POST /check with delta 1).
	check(ns string, values map[string]string) (bool, error)
	// report counts delta whether it fits or not (Kuadrant's Report, POST
	// /report); the answer is always OK.
	report(ns string, values map[string]string, delta uint64) error
}

// limitadorAnswer is what a check and report answered.
type limitadorAnswer struct {
	admitted bool
	// headers are the X-RateLimit-* headers, by name; empty when none.
	headers map[string]string
	// statuses are the codes of the RLS answer's descriptor statuses,
	// which Limitador never writes.
	statuses []string
}

// limitadorRLS asks over gRPC: Envoy's ShouldRateLimit and Kuadrant's
// CheckRateLimit and Report, each request one descriptor of the values.
type limitadorRLS struct {
	envoy    rlsv3.RateLimitServiceClient
	kuadrant kuadrantpb.RateLimitServiceClient
}

func newLimitadorRLS(t *testing.T, p *admitProcess) *limitadorRLS {
	t.Helper()
	conn, err := grpc.NewClient(p.grpc, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return &limitadorRLS{envoy: rlsv3.NewRateLimitServiceClient(conn), kuadrant: kuadrantpb.NewRateLimitServiceClient(conn)}
}

func (*limitadorRLS) String() string { return "rls" }

// limitadorRequest is a rate limit request of domain ns with hitsAddend
// and one descriptor per map, its entries sorted by key.
func limitadorRequest(ns string, hitsAddend uint64, descriptors ...map[string]string) *rlsv3.RateLimitRequest {
	req := &rlsv3.RateLimitRequest{Domain: ns, HitsAddend: uint32(hitsAddend)}
	for _, d := range descriptors {
		keys := make([]string, 0, len(d))
		for k := range d {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		desc := &rlv3.RateLimitDescriptor{}
		for _, k := range keys {
			desc.Entries = append(desc.Entries, &rlv3.RateLimitDescriptor_Entry{Key: k, Value: d[k]})
		}
		req.Descriptors = append(req.Descriptors, desc)
	}
	return req
}

// limitadorAnswerOf reads an RLS answer as Limitador writes them: OK or
// OVER_LIMIT, and headers sorted by name. The caller checks the statuses.
func limitadorAnswerOf(resp *rlsv3.RateLimitResponse) (limitadorAnswer, error) {
	a := limitadorAnswer{headers: map[string]string{}}
	for _, st := range resp.GetStatuses() {
		a.statuses = append(a.statuses, st.GetCode().String())
	}
	var keys []string
	for _, h := range resp.GetResponseHeadersToAdd() {
		a.headers[h.GetKey()] = h.GetValue()
		keys = append(keys, h.GetKey())
	}
	if !slices.IsSorted(keys) {
		return a, fmt.Errorf("response headers %v: Limitador sorts them by name", keys)
	}
	switch resp.GetOverallCode() {
	case rlsv3.RateLimitResponse_OK:
		a.admitted = true
	case rlsv3.RateLimitResponse_OVER_LIMIT:
	default:
		return a, fmt.Errorf("overall code %v; want OK or OVER_LIMIT", resp.GetOverallCode())
	}
	return a, nil
}

func (r *limitadorRLS) checkAndReport(ns string, values map[string]string, delta uint64, _ bool) (limitadorAnswer, error) {
	return r.shouldRateLimit(ns, delta, values)
}

// shouldRateLimit asks ShouldRateLimit of domain ns with hitsAddend and
// descriptors.
func (r *limitadorRLS) shouldRateLimit(ns string, hitsAddend uint64, descriptors ...map[string]string) (limitadorAnswer, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := r.envoy.ShouldRateLimit(ctx, limitadorRequest(ns, hitsAddend, descriptors...))
	if err != nil {
		return limitadorAnswer{}, fmt.Errorf("ShouldRateLimit: %w", err)
	}
	return limitadorAnswerOf(resp)
}

func (r *limitadorRLS) check(ns string, values map[string]string) (bool, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := r.kuadrant.CheckRateLimit(ctx, limitadorRequest(ns, 1, values))
	if err != nil {
		return false, fmt.Errorf("CheckRateLimit: %w", err)
	}
	a, err := limitadorAnswerOf(resp)
	if err == nil && (len(a.headers) > 0 || len(a.statuses) > 0) {
		err = fmt.Errorf("CheckRateLimit answered %v; Limitador's adds no headers and no statuses", resp)
	}
	return a.admitted, err
}

func (r *limitadorRLS) report(ns string, values map[string]string, delta uint64) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := r.kuadrant.Report(ctx, limitadorRequest(ns, delta, values))
	if err != nil {
		return fmt.Errorf("Report: %w", err)
	}
	if a, err := limitadorAnswerOf(resp); err != nil || !a.admitted || len(a.headers) > 0 || len(a.statuses) > 0 {
		return fmt.Errorf("Report answered %v (%v); Limitador's is always OK, without headers or statuses", resp, err)
	}
	return nil
}

// limitadorHTTP asks Limitador's HTTP API, each request's values
// descriptors[0].
type limitadorHTTP struct{ url string }

func (limitadorHTTP) String() string { return "http" }

var limitadorClient = &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 32}}

// post sends a check of path with its JSON fields and returns the status,
// headers and body.
func (h limitadorHTTP) post(path, ns string, values map[string]string, delta uint64, responseHeaders string) (int, http.Header, string, error) {
	body := map[string]any{"namespace": ns, "values": values, "delta": delta}
	if responseHeaders != "" {
		body["response_headers"] = responseHeaders
	}
	b, err := json.Marshal(body)
	if err != nil {
		return 0, nil, "", err
	}
	resp, err := limitadorClient.Post(h.url+path, "application/json", bytes.NewReader(b))
	if err != nil {
		return 0, nil, "", err
	}
	defer resp.Body.Close()
	out, err := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, string(out), err
}

func (h limitadorHTTP) checkAndReport(ns string, values map[string]string, delta uint64, withHeaders bool) (limitadorAnswer, error) {
	which := ""
	if withHeaders {
		which = "DraftVersion03"
	}
	code, hdr, body, err := h.post("/check_and_report", ns, values, delta, which)
	if err != nil {
		return limitadorAnswer{}, err
	}
	a := limitadorAnswer{admitted: code == http.StatusOK, headers: map[string]string{}}
	if code != http.StatusOK && code != http.StatusTooManyRequests || body != "null" || !strings.HasPrefix(hdr.Get("Content-Type"), "application/json") {
		return a, fmt.Errorf("POST /check_and_report: %d %s %q; want 200 or 429 with the JSON null", code, hdr.Get("Content-Type"), body)
	}
	for _, name := range []string{"X-RateLimit-Limit", "X-RateLimit-Remaining", "X-RateLimit-Reset"} {
		if v := hdr.Get(name); v != "" {
			a.headers[name] = v
		}
	}
	return a, nil
}

func (h limitadorHTTP) check(ns string, values map[string]string) (bool, error) {
	return h.checkDelta(ns, values, 1)
}

// checkDelta is POST /check of delta: whether delta more would fit.
func (h limitadorHTTP) checkDelta(ns string, values map[string]string, delta uint64) (bool, error) {
	code, _, body, err := h.post("/check", ns, values, delta, "")
	switch {
	case err != nil:
		return false, err
	case code == http.StatusOK && body == "null":
		return true, nil
	case code == http.StatusTooManyRequests && body == "Too many requests":
		return false, nil
	}
	return false, fmt.Errorf("POST /check: %d %q; want 200 null, or 429 Too many requests", code, body)
}

func (h limitadorHTTP) report(ns string, values map[string]string, delta uint64) error {
	code, _, body, err := h.post("/report", ns, values, delta, "")
	if err == nil && (code != http.StatusOK || body != "null") {
		err = fmt.Errorf("POST /report: %d %q; want 200 null", code, body)
	}
	return err
}

// limitadorSession is a scenario's view: an API, the namespace it owns,
// and the server (whose HTTP API lists limits and counters).
type limitadorSession struct {
	api limitadorAPI
	ns  string
	p   *admitProcess
	// outside says the namespace has no limits: Admit's own rate limit
	// service answers its ShouldRateLimit, as envoyproxy/ratelimit does
	// (a status for each descriptor), where Limitador's answers OK alone.
	// Only the overall code and the headers are compared then, as
	// Limitador's test_returns_ok_when_no_limits_apply compares them.
	outside bool
}

// in returns s on namespace ns.
func (s *limitadorSession) in(ns string) *limitadorSession {
	return &limitadorSession{api: s.api, ns: ns, p: s.p}
}

// without returns s on namespace ns, which has no limits.
func (s *limitadorSession) without(ns string) *limitadorSession {
	return &limitadorSession{api: s.api, ns: ns, p: s.p, outside: true}
}

func (s *limitadorSession) answer(t *testing.T, values map[string]string, delta uint64) limitadorAnswer {
	t.Helper()
	a, err := s.api.checkAndReport(s.ns, values, delta, true)
	if err == nil && len(a.statuses) > 0 && !s.outside {
		err = fmt.Errorf("descriptor statuses %v; Limitador's answer has none", a.statuses)
	}
	if err != nil {
		t.Fatalf("%s %s %v delta %d: %v", s.api, s.ns, values, delta, err)
	}
	return a
}

func (s *limitadorSession) admits(t *testing.T, values map[string]string, delta uint64) bool {
	t.Helper()
	a, err := s.api.checkAndReport(s.ns, values, delta, false)
	if err == nil && len(a.statuses) > 0 && !s.outside {
		err = fmt.Errorf("descriptor statuses %v; Limitador's answer has none", a.statuses)
	}
	if err != nil {
		t.Fatalf("%s %s %v delta %d: %v", s.api, s.ns, values, delta, err)
	}
	return a.admitted
}

func (s *limitadorSession) checks(t *testing.T, values map[string]string) bool {
	t.Helper()
	ok, err := s.api.check(s.ns, values)
	if err != nil {
		t.Fatalf("%s check %s %v: %v", s.api, s.ns, values, err)
	}
	return ok
}

func (s *limitadorSession) reports(t *testing.T, values map[string]string, delta uint64) {
	t.Helper()
	if err := s.api.report(s.ns, values, delta); err != nil {
		t.Fatalf("%s report %s %v delta %d: %v", s.api, s.ns, values, delta, err)
	}
}

// wantAdmitted checks and reports values n times at delta; each must be
// admitted.
func (s *limitadorSession) wantAdmitted(t *testing.T, values map[string]string, delta uint64, n int) {
	t.Helper()
	for i := range n {
		if !s.admits(t, values, delta) {
			t.Fatalf("%s: %v at delta %d refused at hit %d; want %d admitted", s.ns, values, delta, i+1, n)
		}
	}
}

// wantRefused checks and reports values at delta; it must be refused.
func (s *limitadorSession) wantRefused(t *testing.T, values map[string]string, delta uint64) {
	t.Helper()
	if s.admits(t, values, delta) {
		t.Fatalf("%s: %v at delta %d admitted; want refused", s.ns, values, delta)
	}
}

// limitadorLimit is a limit as Limitador's HTTP API writes it.
type limitadorLimit struct {
	ID         *string  `json:"id"`
	Namespace  string   `json:"namespace"`
	MaxValue   int64    `json:"max_value"`
	Seconds    int64    `json:"seconds"`
	Name       *string  `json:"name"`
	Conditions []string `json:"conditions"`
	Variables  []string `json:"variables"`
}

// limitadorCounter is a counter as Limitador's HTTP API writes it.
type limitadorCounter struct {
	Limit            limitadorLimit    `json:"limit"`
	SetVariables     map[string]string `json:"set_variables"`
	Remaining        *int64            `json:"remaining"`
	ExpiresInSeconds *int64            `json:"expires_in_seconds"`
}

func strp(s string) *string { return &s }

// limitadorGet decodes GET path of p into v, refusing fields Limitador's
// answer does not have.
func limitadorGet(t *testing.T, p *admitProcess, path string, v any) {
	t.Helper()
	resp, err := limitadorClient.Get(p.url + path)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %d %s", path, resp.StatusCode, body)
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		t.Fatalf("GET %s: %v in %s", path, err, body)
	}
}

// limitadorLimits returns GET /limits/{ns}, in an order of its own (the
// answer's is a set's) and each limit's conditions and variables sorted.
func limitadorLimits(t *testing.T, p *admitProcess, ns string) []limitadorLimit {
	t.Helper()
	var ls []limitadorLimit
	limitadorGet(t, p, "/limits/"+ns, &ls)
	if ls == nil {
		t.Fatalf("GET /limits/%s: null; want a list", ns)
	}
	for i := range ls {
		if ls[i].Conditions == nil || ls[i].Variables == nil {
			t.Fatalf("GET /limits/%s: %+v: conditions and variables are lists, [] for none", ns, ls[i])
		}
		slices.Sort(ls[i].Conditions)
		slices.Sort(ls[i].Variables)
	}
	slices.SortFunc(ls, compareLimits)
	return ls
}

// wantLimits checks that GET /limits/{ns} lists want and nothing else.
func wantLimits(t *testing.T, p *admitProcess, ns string, want ...limitadorLimit) {
	t.Helper()
	got := limitadorLimits(t, p, ns)
	for i := range want {
		if want[i].Conditions == nil {
			want[i].Conditions = []string{}
		}
		if want[i].Variables == nil {
			want[i].Variables = []string{}
		}
		slices.Sort(want[i].Conditions)
		slices.Sort(want[i].Variables)
	}
	slices.SortFunc(want, compareLimits)
	if want == nil {
		want = []limitadorLimit{}
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("GET /limits/%s:\n got %s\nwant %s", ns, limitadorJSON(got), limitadorJSON(want))
	}
}

// compareLimits orders limits by all they hold, for comparing sets.
func compareLimits(a, b limitadorLimit) int {
	return strings.Compare(limitadorJSON(a), limitadorJSON(b))
}

func limitadorJSON(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}

// limitadorCounters returns GET /counters/{ns}.
func limitadorCounters(t *testing.T, p *admitProcess, ns string) []limitadorCounter {
	t.Helper()
	var cs []limitadorCounter
	limitadorGet(t, p, "/counters/"+ns, &cs)
	if cs == nil {
		t.Fatalf("GET /counters/%s: null; want a list", ns)
	}
	return cs
}

// limitadorStatus is GET /status.
type limitadorStatus struct {
	StartedAt       string `json:"started_at"`
	ConfigAppliedAt string `json:"config_applied_at"`
	ConfigVersion   uint64 `json:"config_version"`
	ConfigErrSince  uint64 `json:"config_err_since"`

	startedAt, appliedAt time.Time // as read
}

func limitadorStatusOf(t *testing.T, p *admitProcess) limitadorStatus {
	t.Helper()
	var st limitadorStatus
	limitadorGet(t, p, "/status", &st)
	var err1, err2 error
	// Limitador's times are chrono's NaiveDateTime: UTC, no zone.
	st.startedAt, err1 = time.Parse("2006-01-02T15:04:05.999999999", st.StartedAt)
	st.appliedAt, err2 = time.Parse("2006-01-02T15:04:05.999999999", st.ConfigAppliedAt)
	if err := errors.Join(err1, err2); err != nil {
		t.Fatalf("GET /status: %+v: %v", st, err)
	}
	return st
}

// limitadorScenario is one of Limitador's tests as behaviour: limits (YAML
// list items, {ns} standing for the scenario's namespace) and what a
// client sees of them.
type limitadorScenario struct {
	name   string
	limits string
	// only names the one API the scenario is about ("rls" or "http"), if
	// it is about one.
	only string
	// zero says a limit has max_value 0: such scenarios are served apart,
	// so that a store refusing them fails them alone.
	zero bool
	run  func(t *testing.T, s *limitadorSession)
}

// getLimit is the limit most of Limitador's tests use: max_value a
// minute for each app_id, of GET requests.
func getLimit(maxValue int) string {
	return fmt.Sprintf(`
- namespace: {ns}
  max_value: %d
  seconds: 60
  conditions: ["descriptors[0]['req_method'] == 'GET'"]
  variables: ["descriptors[0]['app_id']"]
`, maxValue)
}

var limitadorScenarios = []limitadorScenario{
	{
		// rate_limited: three checks, each reported, then the check refuses.
		name: "rate_limited", limits: getLimit(3),
		run: func(t *testing.T, s *limitadorSession) {
			get := vals("req_method", "GET", "app_id", "test_app_id")
			for i := range 3 {
				if !s.checks(t, get) {
					t.Fatalf("check %d refused; want admitted", i+1)
				}
				s.reports(t, get, 1)
			}
			if s.checks(t, get) {
				t.Fatal("a check after 3 reported hits of 3 admitted; want refused")
			}
			s.wantRefused(t, get, 1)
		},
	},
	{
		// rate_limited_id_counter: the same, for a limit with an id.
		name: "rate_limited_id_counter",
		limits: `
- id: test-{ns}
  namespace: {ns}
  max_value: 3
  seconds: 60
  conditions: ["descriptors[0]['req_method'] == 'GET'"]
  variables: ["descriptors[0]['app_id']"]
`,
		run: func(t *testing.T, s *limitadorSession) {
			wantLimits(t, s.p, s.ns, limitadorLimit{ID: strp("test-" + s.ns), Namespace: s.ns, MaxValue: 3, Seconds: 60,
				Conditions: []string{"descriptors[0]['req_method'] == 'GET'"}, Variables: []string{"descriptors[0]['app_id']"}})
			get := vals("req_method", "GET", "app_id", "test_app_id")
			for i := range 3 {
				if !s.checks(t, get) {
					t.Fatalf("check %d refused; want admitted", i+1)
				}
				s.reports(t, get, 1)
			}
			if s.checks(t, get) {
				t.Fatal("a check after 3 reported hits of 3 admitted; want refused")
			}
		},
	},
	{
		// check_rate_limited_and_update: three admitted, the fourth refused.
		name: "check_and_update", limits: getLimit(3),
		run: func(t *testing.T, s *limitadorSession) {
			get := vals("req_method", "GET", "app_id", "test_app_id")
			s.wantAdmitted(t, get, 1, 3)
			s.wantRefused(t, get, 1)
		},
	},
	{
		// takes_into_account_only_vars_of_the_limits, and each value of a
		// variable its own counter; a request without the variable's entry
		// is not counted by the limit (Limit::applies).
		name: "counters_per_variable", limits: getLimit(3),
		run: func(t *testing.T, s *limitadorSession) {
			for i := range 3 {
				// An entry no variable reads does not make another counter.
				s.wantAdmitted(t, vals("req_method", "GET", "app_id", "a", "does_not_apply", strconv.Itoa(i)), 1, 1)
			}
			s.wantRefused(t, vals("req_method", "GET", "app_id", "a"), 1)
			s.wantAdmitted(t, vals("req_method", "GET", "app_id", "b"), 1, 3)
			s.wantRefused(t, vals("req_method", "GET", "app_id", "b"), 1)
			s.wantAdmitted(t, vals("req_method", "GET"), 1, 5)
		},
	},
	{
		// is_rate_limited_returns_false_when_no_matching_limits,
		// check_rate_limited_and_update_returns_true_if_no_limits_apply, and a
		// condition on an entry the request lacks (CEL's no such key: the
		// condition is false), over a limit of max_value 0.
		name: "conditions", limits: getLimit(0), zero: true,
		run: func(t *testing.T, s *limitadorSession) {
			post := vals("req_method", "POST", "app_id", "test_app_id")
			if !s.checks(t, post) {
				t.Fatal("check of a POST refused; the limit is of GETs")
			}
			for range 3 {
				a := s.answer(t, post, 1)
				if !a.admitted || len(a.headers) > 0 {
					t.Fatalf("a POST: %+v; want admitted without headers (no limit applies)", a)
				}
			}
			s.wantAdmitted(t, vals("app_id", "test_app_id"), 1, 3)
			if s.checks(t, vals("req_method", "GET", "app_id", "test_app_id")) {
				t.Fatal("check of a GET admitted; the limit of GETs has max_value 0")
			}
			s.wantRefused(t, vals("req_method", "GET", "app_id", "test_app_id"), 1)
		},
	},
	{
		// is_rate_limited_applies_limit_if_its_unconditional,
		// check_rate_limited_and_update_applies_limit_if_its_unconditional,
		// Kuadrant's test_returns_overlimit_correctly; and a limit with
		// neither conditions nor variables counts every request of its
		// namespace.
		name: "unconditional", zero: true,
		limits: `
- namespace: {ns}
  max_value: 0
  seconds: 60
  conditions: []
  variables: ["descriptors[0]['app_id']"]
- namespace: {ns}-all
  max_value: 2
  seconds: 60
  conditions:
  variables:
`,
		run: func(t *testing.T, s *limitadorSession) {
			app := vals("app_id", "test_app_id")
			if s.checks(t, app) {
				t.Fatal("check admitted; the unconditional limit has max_value 0")
			}
			s.wantRefused(t, app, 1)
			all := s.in(s.ns + "-all")
			all.wantAdmitted(t, vals("req_method", "GET"), 1, 1)
			all.wantAdmitted(t, vals("anything", "else"), 1, 1)
			all.wantRefused(t, vals(), 1)
		},
	},
	{
		// The conditions scenario with a limit that counts (max_value 2):
		// a request the condition does not hold for, or that lacks the
		// entry it reads, is never counted; a GET is.
		name: "conditions_counted", limits: getLimit(2),
		run: func(t *testing.T, s *limitadorSession) {
			s.wantAdmitted(t, vals("req_method", "POST", "app_id", "a"), 1, 4)
			s.wantAdmitted(t, vals("app_id", "a"), 1, 4)
			s.wantAdmitted(t, vals("req_method", "GET", "app_id", "a"), 1, 2)
			s.wantRefused(t, vals("req_method", "GET", "app_id", "a"), 1)
			s.wantAdmitted(t, vals("req_method", "POST", "app_id", "a"), 1, 1)
		},
	},
	{
		// The unconditional scenario with limits that count: conditions: []
		// applies to every request with the variable's entry; a limit with
		// neither conditions nor variables (both left null) counts every
		// request of its namespace.
		name: "unconditional_counted",
		limits: `
- namespace: {ns}
  max_value: 2
  seconds: 60
  conditions: []
  variables: ["descriptors[0]['app_id']"]
- namespace: {ns}-all
  max_value: 2
  seconds: 60
  conditions:
  variables:
`,
		run: func(t *testing.T, s *limitadorSession) {
			s.wantAdmitted(t, vals("req_method", "GET", "app_id", "a"), 1, 1)
			s.wantAdmitted(t, vals("req_method", "POST", "app_id", "a"), 1, 1)
			s.wantRefused(t, vals("app_id", "a"), 1)
			s.wantAdmitted(t, vals("req_method", "GET"), 1, 3)
			all := s.in(s.ns + "-all")
			all.wantAdmitted(t, vals("req_method", "GET"), 1, 1)
			all.wantAdmitted(t, vals("anything", "else"), 1, 1)
			all.wantRefused(t, vals("req_method", "POST"), 1)
		},
	},
	{
		// multiple_limits_rate_limited: a limit of GETs and one of POSTs,
		// each counting its own.
		name: "multiple_limits",
		limits: getLimit(3) + `
- namespace: {ns}
  max_value: 4
  seconds: 60
  conditions: ["descriptors[0]['req_method'] == 'POST'"]
  variables: ["descriptors[0]['app_id']"]
`,
		run: func(t *testing.T, s *limitadorSession) {
			get := vals("req_method", "GET", "app_id", "test_app_id")
			post := vals("req_method", "POST", "app_id", "test_app_id")
			for i := range 3 {
				if !s.checks(t, get) || !s.checks(t, post) {
					t.Fatalf("check %d refused; want admitted", i+1)
				}
				s.wantAdmitted(t, get, 1, 1)
				s.wantAdmitted(t, post, 1, 1)
			}
			if s.checks(t, get) {
				t.Fatal("a 4th GET: check admitted; want refused")
			}
			if !s.checks(t, post) {
				t.Fatal("a 4th POST: check refused; want admitted")
			}
		},
	},
	{
		// The most restrictive limit decides, and a refused request counts
		// on none of the limits (in_memory.rs check_and_update updates the
		// counters only once every one is within its limit).
		name: "all_or_nothing",
		limits: getLimit(2) + `
- namespace: {ns}
  max_value: 5
  seconds: 60
  conditions: []
  variables: ["descriptors[0]['app_id']"]
`,
		run: func(t *testing.T, s *limitadorSession) {
			get := vals("req_method", "GET", "app_id", "a")
			s.wantAdmitted(t, get, 1, 2)
			for range 4 {
				s.wantRefused(t, get, 1)
			}
			// The unconditional limit has counted the 2 admitted GETs only.
			post := vals("req_method", "POST", "app_id", "a")
			s.wantAdmitted(t, post, 1, 3)
			s.wantRefused(t, post, 1)
		},
	},
	{
		// rate_limited_with_delta_higher_than_one: 5 and 5 more of 10, and
		// then one more is refused.
		name: "delta_higher_than_one", limits: getLimit(10),
		run: func(t *testing.T, s *limitadorSession) {
			get := vals("req_method", "GET", "app_id", "test_app_id")
			s.wantAdmitted(t, get, 5, 1)
			s.reports(t, get, 5)
			if s.checks(t, get) {
				t.Fatal("a check after 10 of 10 admitted; want refused")
			}
			s.wantRefused(t, get, 1)
		},
	},
	{
		// rate_limited_with_delta_higher_than_max: 11 at once of 10 is
		// refused, and counts nothing: 10 at once is admitted after it.
		name: "delta_higher_than_max", limits: getLimit(10),
		run: func(t *testing.T, s *limitadorSession) {
			get := vals("req_method", "GET", "app_id", "test_app_id")
			s.wantRefused(t, get, 11)
			s.wantAdmitted(t, get, 10, 1)
			s.wantRefused(t, get, 1)
		},
	},
	{
		// Namespaces are apart (get_namespaces, and
		// delete_limits_does_not_delete_limits_from_other_namespaces: each
		// has its own limits and counters), and a namespace without limits
		// admits (is_rate_limited_returns_false_when_no_limits_in_namespace,
		// the RLS's test_returns_ok_when_no_limits_apply).
		name: "namespaces",
		limits: `
- namespace: {ns}-1
  max_value: 2
  seconds: 60
  conditions: ["descriptors[0]['x'] == '10'"]
  variables: ["descriptors[0]['z']"]
- namespace: {ns}-2
  max_value: 2
  seconds: 60
  conditions: ["descriptors[0]['x'] == '10'"]
  variables: ["descriptors[0]['z']"]
`,
		run: func(t *testing.T, s *limitadorSession) {
			v := vals("x", "10", "z", "1")
			first, second := s.in(s.ns+"-1"), s.in(s.ns+"-2")
			first.wantAdmitted(t, v, 1, 2)
			first.wantRefused(t, v, 1)
			second.wantAdmitted(t, v, 1, 2)
			second.wantRefused(t, v, 1)
			none := s.without(s.ns + "-none")
			if !none.checks(t, v) {
				t.Fatal("check in a namespace without limits refused; want admitted")
			}
			for range 3 {
				if a := none.answer(t, v, 1); !a.admitted || len(a.headers) > 0 {
					t.Fatalf("a namespace without limits: %+v; want admitted without headers", a)
				}
			}
			wantLimits(t, s.p, s.ns+"-none")
		},
	},
	{
		// http_api's test_check_and_report_endpoints_separately, Kuadrant's
		// check_rate_limit test_returns_ok_correctly: a check counts nothing;
		// a report counts, past the limit too, and is always OK.
		name: "check_and_report_apart", limits: getLimit(1),
		run: func(t *testing.T, s *limitadorSession) {
			get := vals("req_method", "GET", "app_id", "1")
			for i := range 5 {
				if !s.checks(t, get) {
					t.Fatalf("check %d of a limit of 1 refused; a check counts nothing", i+1)
				}
			}
			s.reports(t, get, 1)
			if s.checks(t, get) {
				t.Fatal("check after a report of 1 of 1 admitted; want refused")
			}
			s.reports(t, get, 3) // past the limit: still OK
			s.wantRefused(t, get, 1)
			// A report counts on a counter it is the first to hit.
			other := vals("req_method", "GET", "app_id", "2")
			s.reports(t, other, 4)
			if s.checks(t, other) {
				t.Fatal("check after a report of 4 of 1 admitted; want refused")
			}
		},
	},
	{
		// check_rate_limited_and_update_load_counters, and the RLS's
		// test_returns_ok_and_overlimit_correctly and http_api's
		// test_check_and_report_with_draftversion03_response_headers: draft
		// 03's headers name every counter (the named one by ;name="…"), the
		// least remaining first, and what it has left; a refused request's
		// are the same, and counted nothing.
		name: "named",
		limits: `
- namespace: {ns}
  name: per-app
  max_value: 2
  seconds: 60
  conditions: ["descriptors[0]['req_method'] == 'GET'"]
  variables: ["descriptors[0]['app_id']"]
- namespace: {ns}
  max_value: 10
  seconds: 60
  conditions:
  variables:
- namespace: {ns}-quoted
  name: 'the "gold" plan'
  max_value: 1
  seconds: 60
  conditions: []
  variables: []
`,
		run: func(t *testing.T, s *limitadorSession) {
			get := vals("req_method", "GET", "app_id", "a")
			const both = `2, 2;w=60;name="per-app", 10;w=60`
			for i, want := range []struct {
				admitted  bool
				limit     string
				remaining string
			}{{true, both, "1"}, {true, both, "0"}, {false, both, "0"}, {false, both, "0"}} {
				a := s.answer(t, get, 1)
				if a.admitted != want.admitted || a.headers["X-RateLimit-Limit"] != want.limit || a.headers["X-RateLimit-Remaining"] != want.remaining {
					t.Fatalf("GET %d: admitted %v, headers %v; want admitted %v, X-RateLimit-Limit %s, X-RateLimit-Remaining %s",
						i+1, a.admitted, a.headers, want.admitted, want.limit, want.remaining)
				}
				limitadorReset(t, a, 60)
			}
			// Only the unnamed limit counts a POST; it has counted the 2
			// admitted GETs.
			a := s.answer(t, vals("req_method", "POST", "app_id", "a"), 1)
			if !a.admitted || a.headers["X-RateLimit-Limit"] != "10, 10;w=60" || a.headers["X-RateLimit-Remaining"] != "7" {
				t.Fatalf("a POST: %+v; want admitted, X-RateLimit-Limit 10, 10;w=60, X-RateLimit-Remaining 7", a)
			}
			// A name's quotes are written as apostrophes.
			a = s.in(s.ns+"-quoted").answer(t, vals(), 1)
			if want := `1, 1;w=60;name="the 'gold' plan"`; !a.admitted || a.headers["X-RateLimit-Limit"] != want {
				t.Fatalf("the quoted name: %+v; want X-RateLimit-Limit %s", a, want)
			}
		},
	},
	{
		// get_counters, get_counters_returns_empty_when_no_counters_in_namespace,
		// get_counters_returns_empty_when_no_limits_in_namespace, and the
		// limits listed (add_a_limit, add_limit_without_vars,
		// get_limits_returns_empty_if_no_limits_in_namespace).
		name: "counters",
		limits: getLimit(10) + `
- namespace: {ns}-simple
  max_value: 4
  seconds: 60
  conditions: []
  variables: []
- namespace: {ns}-unused
  max_value: 4
  seconds: 60
  conditions: []
  variables: []
`,
		run: func(t *testing.T, s *limitadorSession) {
			limit := limitadorLimit{Namespace: s.ns, MaxValue: 10, Seconds: 60,
				Conditions: []string{"descriptors[0]['req_method'] == 'GET'"}, Variables: []string{"descriptors[0]['app_id']"}}
			simple := limitadorLimit{Namespace: s.ns + "-simple", MaxValue: 4, Seconds: 60}
			wantLimits(t, s.p, s.ns, limit)
			wantLimits(t, s.p, s.ns+"-simple", simple)
			wantLimits(t, s.p, s.ns+"-none")
			if cs := limitadorCounters(t, s.p, s.ns); len(cs) != 0 {
				t.Fatalf("counters before any hit: %+v; want none", cs)
			}
			s.reports(t, vals("req_method", "GET", "app_id", "1"), 1)
			s.reports(t, vals("req_method", "GET", "app_id", "2"), 5)
			s.in(s.ns+"-simple").wantAdmitted(t, vals(), 1, 1)
			want := map[string]int64{"1": 9, "2": 5}
			cs := limitadorCounters(t, s.p, s.ns)
			if len(cs) != 2 {
				t.Fatalf("GET /counters/%s: %s; want the counters of app_id 1 and 2", s.ns, limitadorJSON(cs))
			}
			for _, c := range cs {
				app := c.SetVariables["descriptors[0]['app_id']"]
				c.Limit.Conditions, c.Limit.Variables = slices.Sorted(slices.Values(c.Limit.Conditions)), slices.Sorted(slices.Values(c.Limit.Variables))
				if len(c.SetVariables) != 1 || c.Remaining == nil || *c.Remaining != want[app] || !reflect.DeepEqual(c.Limit, limit) {
					t.Fatalf("counter %s; want app_id %q remaining %d of %s", limitadorJSON(c), app, want[app], limitadorJSON(limit))
				}
				limitadorExpiresIn(t, c, 60)
			}
			cs = limitadorCounters(t, s.p, s.ns+"-simple")
			simple.Conditions, simple.Variables = []string{}, []string{}
			if len(cs) != 1 || len(cs[0].SetVariables) != 0 || cs[0].SetVariables == nil || cs[0].Remaining == nil || *cs[0].Remaining != 3 || !reflect.DeepEqual(cs[0].Limit, simple) {
				t.Fatalf("GET /counters/%s-simple: %s; want one counter, set_variables {}, remaining 3", s.ns, limitadorJSON(cs))
			}
			limitadorExpiresIn(t, cs[0], 60)
			for _, ns := range []string{s.ns + "-unused", s.ns + "-none"} {
				if cs := limitadorCounters(t, s.p, ns); len(cs) != 0 {
					t.Fatalf("GET /counters/%s: %s; want []", ns, limitadorJSON(cs))
				}
			}
		},
	},
	{
		// A window is fixed and starts at its counter's first hit
		// (AtomicExpiringValue::update starts one at the first hit after the
		// last expired); when it has passed the counter admits again and is
		// no longer listed (get_counters_does_not_return_expired_ones).
		name: "expiry",
		limits: `
- namespace: {ns}
  max_value: 2
  seconds: 1
  conditions: []
  variables: ["descriptors[0]['app_id']"]
`,
		run: func(t *testing.T, s *limitadorSession) {
			for attempt := 1; ; attempt++ {
				if limitadorExpiry(t, s, vals("app_id", "app-"+strconv.Itoa(attempt))) {
					return
				}
				if attempt == 3 {
					t.Fatal("3 attempts each took the whole 1 s window to make 3 requests")
				}
			}
		},
	},
	{
		// The RLS's test_0_hits_addend_is_converted_to_1, and Kuadrant's
		// Report of hits_addend 0 counts 1 as well.
		name: "hits_addend_zero", only: "rls",
		limits: `
- namespace: {ns}
  max_value: 1
  seconds: 60
  conditions: ["descriptors[0].x == '1'"]
  variables: ["descriptors[0].y"]
`,
		run: func(t *testing.T, s *limitadorSession) {
			v := vals("x", "1", "y", "2")
			a := s.answer(t, v, 0)
			if !a.admitted || a.headers["X-RateLimit-Limit"] != "1, 1;w=60" || a.headers["X-RateLimit-Remaining"] != "0" {
				t.Fatalf("hits_addend 0: %+v; want OK, X-RateLimit-Limit 1, 1;w=60, X-RateLimit-Remaining 0", a)
			}
			limitadorReset(t, a, 60)
			if a = s.answer(t, v, 0); a.admitted || a.headers["X-RateLimit-Remaining"] != "0" {
				t.Fatalf("hits_addend 0 again: %+v; want OVER_LIMIT (it counted 1)", a)
			}
			other := vals("x", "1", "y", "3")
			s.reports(t, other, 0)
			if s.checks(t, other) {
				t.Fatal("CheckRateLimit after a Report of hits_addend 0 of a limit of 1 admitted; want refused (the report counts 1)")
			}
		},
	},
	{
		// The RLS's and Kuadrant's test_takes_into_account_all_the_descriptors:
		// a condition may read any descriptor.
		name: "all_descriptors", only: "rls", zero: true,
		limits: `
- namespace: {ns}
  max_value: 10
  seconds: 60
  conditions: ["descriptors[0].x == '1'"]
  variables: ["descriptors[0].z"]
- namespace: {ns}
  max_value: 0
  seconds: 60
  conditions: ["descriptors[0].x == '1'", "descriptors[1].y == '2'"]
  variables: ["descriptors[0].z"]
`,
		run: func(t *testing.T, s *limitadorSession) {
			r := s.api.(*limitadorRLS)
			a, err := r.shouldRateLimit(s.ns, 1, vals("x", "1", "z", "1"), vals("y", "2"))
			if err != nil {
				t.Fatal(err)
			}
			if a.admitted || len(a.statuses) > 0 || a.headers["X-RateLimit-Limit"] != "0, 0;w=60, 10;w=60" || a.headers["X-RateLimit-Remaining"] != "0" {
				t.Fatalf("two descriptors: %+v; want OVER_LIMIT, X-RateLimit-Limit 0, 0;w=60, 10;w=60, X-RateLimit-Remaining 0", a)
			}
			limitadorReset(t, a, 60)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			resp, err := r.kuadrant.CheckRateLimit(ctx, limitadorRequest(s.ns, 1, vals("x", "1", "z", "1"), vals("y", "2")))
			if err != nil || resp.GetOverallCode() != rlsv3.RateLimitResponse_OVER_LIMIT || len(resp.GetStatuses()) > 0 {
				t.Fatalf("CheckRateLimit of two descriptors: %v %v; want OVER_LIMIT", resp, err)
			}
		},
	},
	{
		// all_descriptors with a second limit that counts (max_value 1):
		// both limits count the first request, the second is over.
		name: "all_descriptors_counted", only: "rls",
		limits: `
- namespace: {ns}
  max_value: 10
  seconds: 60
  conditions: ["descriptors[0].x == '1'"]
  variables: ["descriptors[0].z"]
- namespace: {ns}
  max_value: 1
  seconds: 60
  conditions: ["descriptors[0].x == '1'", "descriptors[1].y == '2'"]
  variables: ["descriptors[0].z"]
`,
		run: func(t *testing.T, s *limitadorSession) {
			r := s.api.(*limitadorRLS)
			for i, want := range []struct {
				admitted  bool
				remaining string
			}{{true, "0"}, {false, "0"}} {
				a, err := r.shouldRateLimit(s.ns, 1, vals("x", "1", "z", "1"), vals("y", "2"))
				if err != nil {
					t.Fatal(err)
				}
				if a.admitted != want.admitted || len(a.statuses) > 0 || a.headers["X-RateLimit-Limit"] != "1, 1;w=60, 10;w=60" || a.headers["X-RateLimit-Remaining"] != want.remaining {
					t.Fatalf("request %d of two descriptors: %+v; want admitted %v, X-RateLimit-Limit 1, 1;w=60, 10;w=60, X-RateLimit-Remaining %s", i+1, a, want.admitted, want.remaining)
				}
			}
			// Each limit counted the one admitted request only. (A request
			// of one descriptor is not asked: descriptors[1] would be out of
			// bounds, an error of the condition, not a missing entry.)
			got := map[int64]int64{}
			for _, c := range limitadorCounters(t, s.p, s.ns) {
				if c.Remaining != nil {
					got[c.Limit.MaxValue] = *c.Remaining
				}
			}
			if want := map[int64]int64{10: 9, 1: 0}; !reflect.DeepEqual(got, want) {
				t.Fatalf("GET /counters/%s: remaining by max_value %v; want %v", s.ns, got, want)
			}
		},
	},
	{
		// The RLS's and Kuadrant's test_returns_unknown_when_domain_is_empty.
		name: "empty_domain", only: "rls",
		run: func(t *testing.T, s *limitadorSession) {
			r := s.api.(*limitadorRLS)
			req := limitadorRequest("", 1, vals("req.method", "GET"))
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			for name, rpc := range map[string]func(context.Context, *rlsv3.RateLimitRequest, ...grpc.CallOption) (*rlsv3.RateLimitResponse, error){
				"ShouldRateLimit": r.envoy.ShouldRateLimit, "CheckRateLimit": r.kuadrant.CheckRateLimit, "Report": r.kuadrant.Report,
			} {
				resp, err := rpc(ctx, req)
				if err != nil || resp.GetOverallCode() != rlsv3.RateLimitResponse_UNKNOWN || len(resp.GetResponseHeadersToAdd()) > 0 {
					t.Errorf("%s without a domain: %v %v; want UNKNOWN without headers", name, resp, err)
				}
			}
		},
	},
	{
		// rate_limited_with_delta_higher_than_one and _than_max as
		// Limitador's HTTP API asks them: POST /check of delta 5, and of 11
		// of 10.
		name: "check_delta", only: "http", limits: getLimit(10),
		run: func(t *testing.T, s *limitadorSession) {
			h := s.api.(limitadorHTTP)
			get := vals("req_method", "GET", "app_id", "test_app_id")
			for range 2 {
				if ok, err := h.checkDelta(s.ns, get, 5); err != nil || !ok {
					t.Fatalf("POST /check of 5: %v %v; want 200", ok, err)
				}
				s.reports(t, get, 5)
			}
			if ok, err := h.checkDelta(s.ns, get, 1); err != nil || ok {
				t.Fatalf("POST /check of 1 after 10 of 10: %v %v; want 429", ok, err)
			}
			fresh := vals("req_method", "GET", "app_id", "fresh")
			if ok, err := h.checkDelta(s.ns, fresh, 11); err != nil || ok {
				t.Fatalf("POST /check of 11 of 10: %v %v; want 429", ok, err)
			}
			if ok, err := h.checkDelta(s.ns, fresh, 10); err != nil || !ok {
				t.Fatalf("POST /check of 10 of 10: %v %v; want 200", ok, err)
			}
		},
	},
}

// limitadorReset checks that an answer's X-RateLimit-Reset is whole
// seconds, at most window.
func limitadorReset(t *testing.T, a limitadorAnswer, window int64) {
	t.Helper()
	if r, err := strconv.ParseInt(a.headers["X-RateLimit-Reset"], 10, 64); err != nil || r < 0 || r > window {
		t.Fatalf("X-RateLimit-Reset %q; want whole seconds to the window's end, at most %d", a.headers["X-RateLimit-Reset"], window)
	}
}

// limitadorExpiresIn checks that a listed counter expires within window
// seconds, and is not over.
func limitadorExpiresIn(t *testing.T, c limitadorCounter, window int64) {
	t.Helper()
	if c.ExpiresInSeconds == nil || *c.ExpiresInSeconds < 0 || *c.ExpiresInSeconds > window {
		t.Fatalf("counter %s: expires_in_seconds; want whole seconds, at most %d", limitadorJSON(c), window)
	}
}

// limitadorExpiry runs the expiry scenario once on values, a counter of 2
// per second no one hit before: the first hit 0.4 s past a second of the
// clock (so that a window aligned to the clock's seconds would end 0.6 s
// later), two admitted, the third refused; then checks until admitted
// again, which must be no earlier than a second after the first hit was
// sent. It returns false, having proved nothing, when the three requests
// took the whole window.
func limitadorExpiry(t *testing.T, s *limitadorSession, values map[string]string) bool {
	t.Helper()
	wait := 400*time.Millisecond - time.Duration(time.Now().UnixNano()%int64(time.Second))
	if wait < 0 {
		wait += time.Second
	}
	time.Sleep(wait)
	sent := time.Now()
	s.wantAdmitted(t, values, 1, 2)
	if s.admits(t, values, 1) {
		if time.Since(sent) < time.Second {
			t.Fatalf("a third hit within %v of the first admitted; the window admits 2", time.Since(sent))
		}
		return false
	}
	var again time.Duration
	for {
		if s.checks(t, values) {
			again = time.Since(sent)
			break
		}
		if time.Since(sent) > 10*time.Second {
			t.Fatalf("still refused %v after the first hit; its window is 1 s", time.Since(sent))
		}
		time.Sleep(10 * time.Millisecond)
	}
	if again < time.Second {
		t.Fatalf("admitted again %v after the first hit; a window lasts 1 s from its first hit", again)
	}
	t.Logf("%s: admitted again %v after the first hit", s.api, again.Round(time.Millisecond))
	// The counter is over: not listed, and the next hit starts a new
	// window of 2.
	waitFor(t, 5*time.Second, "the expired counter gone from GET /counters/"+s.ns, func() bool {
		for _, c := range limitadorCounters(t, s.p, s.ns) {
			if c.SetVariables["descriptors[0]['app_id']"] == values["app_id"] {
				return false
			}
		}
		return true
	})
	s.wantAdmitted(t, values, 1, 2)
	s.wantRefused(t, values, 1)
	return true
}

// TestLimitadorScenarios runs each scenario over the RLS and over the HTTP
// API, on the memory store and on Redis: one server per store (and
// another for the scenarios with a limit of max_value 0), each scenario
// and API in a namespace of its own (scenario.api), run in parallel.
func TestLimitadorScenarios(t *testing.T) {
	apis := []string{"rls", "http"}
	each := func(zero bool, f func(sc limitadorScenario, api string)) {
		for _, sc := range limitadorScenarios {
			for _, api := range apis {
				if sc.zero == zero && (sc.only == "" || sc.only == api) {
					f(sc, api)
				}
			}
		}
	}
	for _, store := range limitadorStores {
		t.Run(store.name, func(t *testing.T) {
			for _, zero := range []bool{false, true} {
				group := "main"
				if zero {
					group = "max_value_0"
				}
				t.Run(group, func(t *testing.T) {
					var file strings.Builder
					file.WriteString("---\n")
					each(zero, func(sc limitadorScenario, api string) {
						file.WriteString(strings.ReplaceAll(sc.limits, "{ns}", sc.name+"."+api))
					})
					p, _ := serveLimitador(t, file.String(), store.flags(t)...)
					byName := map[string]limitadorAPI{"rls": newLimitadorRLS(t, p), "http": limitadorHTTP{p.url}}
					each(zero, func(sc limitadorScenario, api string) {
						t.Run(api+"/"+sc.name, func(t *testing.T) {
							t.Parallel()
							sc.run(t, &limitadorSession{api: byName[api], ns: sc.name + "." + api, p: p})
						})
					})
				})
			}
		})
	}
}

// writeAtomically replaces file by text as a deployment does (a
// ConfigMap's symlink swap): written aside, then renamed over it, so that
// no reload reads it half-written.
func writeAtomically(t *testing.T, file, text string) {
	t.Helper()
	tmp := file + ".new"
	writeTestFile(t, tmp, text)
	if err := os.Rename(tmp, file); err != nil {
		t.Fatal(err)
	}
}

// awaitStatus polls GET /status until done holds of it, at most 10 s.
func awaitStatus(t *testing.T, p *admitProcess, what string, done func(limitadorStatus) bool) limitadorStatus {
	t.Helper()
	var st limitadorStatus
	waitFor(t, 10*time.Second, what, func() bool {
		st = limitadorStatusOf(t, p)
		return done(st)
	})
	return st
}

// The limits files of TestLimitadorReload: a counts GETs and POSTs of
// namespace reload, and reload-gone's every request; b raises the GETs'
// max_value and names them (the same limit: its counters stay), drops
// the POSTs' limit and namespace reload-gone, and adds reload-new; broken
// is b with a condition that is not CEL; c lowers the GETs' max_value
// below what they counted.
const (
	reloadLimitsA = `---
- namespace: reload
  max_value: 3
  seconds: 60
  conditions: ["descriptors[0]['req_method'] == 'GET'"]
  variables: ["descriptors[0]['app_id']"]
- namespace: reload
  max_value: 5
  seconds: 60
  conditions: ["descriptors[0]['req_method'] == 'POST'"]
  variables: ["descriptors[0]['app_id']"]
- namespace: reload-gone
  max_value: 1
  seconds: 60
  conditions: []
  variables: []
`
	reloadLimitsB = `---
- namespace: reload
  name: raised
  max_value: 5
  seconds: 60
  conditions: ["descriptors[0]['req_method'] == 'GET'"]
  variables: ["descriptors[0]['app_id']"]
- namespace: reload-new
  max_value: 1
  seconds: 60
  conditions: []
  variables: []
`
	reloadLimitsBroken = reloadLimitsB + `- namespace: reload
  max_value: 1
  seconds: 60
  conditions: ["descriptors[0]['req_method'] =="]
  variables: []
`
	reloadLimitsC = `---
- namespace: reload
  max_value: 2
  seconds: 60
  conditions: ["descriptors[0]['req_method'] == 'GET'"]
  variables: ["descriptors[0]['app_id']"]
`
)

// TestLimitadorReload restates configure_with_keeps_the_given_limits_and_counters_if_they_exist,
// configure_with_updates_the_limits, configure_with_creates_the_given_limits,
// configure_with_deletes_all_except_the_limits_given,
// delete_limit_also_deletes_associated_counters and
// get_namespaces_doesnt_return_the_ones_that_no_longer_have_limits as a
// limits file changed under a running server, on each store, with
// limitador-server's /status: config_version counts the reloads,
// config_err_since the refused ones since the last that loaded; a refused
// file keeps the limits in force.
func TestLimitadorReload(t *testing.T) {
	for _, store := range limitadorStores {
		t.Run(store.name, func(t *testing.T) {
			p, file := serveLimitador(t, reloadLimitsA, store.flags(t)...)
			apis := []limitadorAPI{limitadorHTTP{p.url}, newLimitadorRLS(t, p)}
			on := func(api limitadorAPI, ns string) *limitadorSession { return &limitadorSession{api: api, ns: ns, p: p} }
			off := func(api limitadorAPI, ns string) *limitadorSession { return on(api, ns).without(ns) }
			get, post := vals("req_method", "GET", "app_id", "x"), vals("req_method", "POST", "app_id", "x")
			// A descriptor has an entry at least (rls.proto's min_items).
			page := vals("path", "/")
			st0 := limitadorStatusOf(t, p)
			if st0.ConfigVersion != 0 || st0.ConfigErrSince != 0 {
				t.Fatalf("GET /status at start: %+v; want config_version 0, config_err_since 0", st0)
			}
			for i, api := range apis {
				on(api, "reload").wantAdmitted(t, get, 1, 1)
				on(api, "reload").wantAdmitted(t, post, 1, 1)
				if i == 0 {
					on(api, "reload").wantAdmitted(t, get, 1, 1)
					on(api, "reload-gone").wantAdmitted(t, page, 1, 1)
				}
			}
			on(apis[1], "reload").wantRefused(t, get, 1)
			on(apis[0], "reload-gone").wantRefused(t, page, 1)

			// b: the GETs' counter keeps its 3; the POSTs' limit and
			// reload-gone are gone, reload-new is in force.
			time.Sleep(10 * time.Millisecond) // config_applied_at moves on
			writeAtomically(t, file, reloadLimitsB)
			st1 := awaitStatus(t, p, "config_version 1 after a reload", func(st limitadorStatus) bool { return st.ConfigVersion >= 1 })
			if st1.ConfigVersion != 1 || st1.ConfigErrSince != 0 || !st1.startedAt.Equal(st0.startedAt) || !st1.appliedAt.After(st0.appliedAt) {
				t.Fatalf("GET /status after a reload: %+v (at start %+v); want config_version 1, config_err_since 0, config_applied_at later", st1, st0)
			}
			wantLimits(t, p, "reload", limitadorLimit{Namespace: "reload", Name: strp("raised"), MaxValue: 5, Seconds: 60,
				Conditions: []string{"descriptors[0]['req_method'] == 'GET'"}, Variables: []string{"descriptors[0]['app_id']"}})
			wantLimits(t, p, "reload-gone")
			wantLimits(t, p, "reload-new", limitadorLimit{Namespace: "reload-new", MaxValue: 1, Seconds: 60})
			cs := limitadorCounters(t, p, "reload")
			if len(cs) != 1 || cs[0].Remaining == nil || *cs[0].Remaining != 2 || cs[0].Limit.MaxValue != 5 {
				t.Fatalf("GET /counters/reload after the reload: %s; want the GETs' counter only, 2 of 5 left", limitadorJSON(cs))
			}
			on(apis[0], "reload").wantAdmitted(t, get, 1, 1)
			on(apis[1], "reload").wantAdmitted(t, get, 1, 1)
			on(apis[0], "reload").wantRefused(t, get, 1)
			for _, api := range apis {
				on(api, "reload").wantAdmitted(t, post, 1, 6) // no limit of POSTs
				off(api, "reload-gone").wantAdmitted(t, page, 1, 2)
			}
			on(apis[1], "reload-new").wantAdmitted(t, page, 1, 1)
			on(apis[0], "reload-new").wantRefused(t, page, 1)

			// broken: refused, and counted; the limits of b stay.
			writeAtomically(t, file, reloadLimitsBroken)
			st2 := awaitStatus(t, p, "config_err_since 1 after a refused reload", func(st limitadorStatus) bool { return st.ConfigErrSince >= 1 })
			if st2.ConfigVersion != 1 || st2.ConfigErrSince != 1 || !st2.appliedAt.Equal(st1.appliedAt) {
				t.Fatalf("GET /status after a refused reload: %+v (before %+v); want config_version 1, config_err_since 1, config_applied_at as before", st2, st1)
			}
			writeAtomically(t, file, reloadLimitsBroken+"  # another broken edit\n")
			awaitStatus(t, p, "config_err_since 2 after a second refused reload", func(st limitadorStatus) bool { return st.ConfigErrSince >= 2 })
			for _, api := range apis {
				on(api, "reload").wantRefused(t, get, 1)
				on(api, "reload-new").wantRefused(t, page, 1)
			}
			wantLimits(t, p, "reload", limitadorLimit{Namespace: "reload", Name: strp("raised"), MaxValue: 5, Seconds: 60,
				Conditions: []string{"descriptors[0]['req_method'] == 'GET'"}, Variables: []string{"descriptors[0]['app_id']"}})

			// c: loads, clears config_err_since; the counter's 5 are over its
			// new max_value of 2, and another app_id has its own 2.
			writeAtomically(t, file, reloadLimitsC)
			st3 := awaitStatus(t, p, "config_version 2", func(st limitadorStatus) bool { return st.ConfigVersion >= 2 })
			if st3.ConfigVersion != 2 || st3.ConfigErrSince != 0 {
				t.Fatalf("GET /status after the file was mended: %+v; want config_version 2, config_err_since 0", st3)
			}
			for _, api := range apis {
				on(api, "reload").wantRefused(t, get, 1)
				off(api, "reload-new").wantAdmitted(t, page, 1, 2)
			}
			y := vals("req_method", "GET", "app_id", "y")
			on(apis[1], "reload").wantAdmitted(t, y, 1, 2)
			on(apis[0], "reload").wantRefused(t, y, 1)
		})
	}
}

// TestLimitadorSharedRedis restates distributed_rate_limited: two `admit
// serve` on one Redis count one counter, over either API, to the exact
// bound; and, as Limitador's Redis store lists the counters every
// instance wrote (get_counters reads the counters of a limit from Redis),
// each server lists the other's counters.
func TestLimitadorSharedRedis(t *testing.T) {
	redis := redistest.Start(t)
	limits := `---
- namespace: shared-seq
  max_value: 3
  seconds: 60
  conditions: ["descriptors[0]['req_method'] == 'GET'"]
  variables: ["descriptors[0]['app_id']"]
- namespace: shared
  max_value: 50
  seconds: 60
  conditions: []
  variables: ["descriptors[0]['app_id']"]
- namespace: shared-list
  max_value: 10
  seconds: 60
  conditions: []
  variables: ["descriptors[0]['app_id']"]
`
	a, _ := serveLimitador(t, limits, "--store", "redis://"+redis.Addr)
	b, _ := serveLimitador(t, limits, "--store", "redis://"+redis.Addr)
	clients := []limitadorAPI{limitadorHTTP{a.url}, newLimitadorRLS(t, b), newLimitadorRLS(t, a), limitadorHTTP{b.url}}

	t.Run("alternating", func(t *testing.T) {
		get := vals("req_method", "GET", "app_id", "test_app_id")
		for i := range 3 {
			s := &limitadorSession{api: clients[i%len(clients)], ns: "shared-seq"}
			if !s.checks(t, get) {
				t.Fatalf("check %d on %s refused; want admitted", i+1, s.api)
			}
			s.reports(t, get, 1)
		}
		// Limitador's test waits for its cached store to flush; Admit's
		// servers decide in Redis, so both refuse at once.
		for _, api := range clients {
			if (&limitadorSession{api: api, ns: "shared-seq"}).checks(t, get) {
				t.Fatalf("check on %s after 3 of 3 counted on both servers admitted; want refused", api)
			}
		}
	})

	t.Run("concurrent", func(t *testing.T) {
		const perClient, hits = 5, 8 // 4 clients: 160 hits of a limit of 50
		app := vals("app_id", "busy")
		var admitted atomic.Int64
		var mu sync.Mutex
		var errs []error
		var wg sync.WaitGroup
		for _, api := range clients {
			for range perClient {
				wg.Go(func() {
					for range hits {
						ans, err := api.checkAndReport("shared", app, 1, false)
						if err != nil {
							mu.Lock()
							errs = append(errs, fmt.Errorf("%s: %w", api, err))
							mu.Unlock()
							return
						}
						if ans.admitted {
							admitted.Add(1)
						}
					}
				})
			}
		}
		wg.Wait()
		if err := errors.Join(errs...); err != nil {
			t.Fatal(err)
		}
		if got := admitted.Load(); got != 50 {
			t.Fatalf("%d hits over two servers admitted %d; want exactly the limit, 50", len(clients)*perClient*hits, got)
		}
		for _, api := range clients {
			(&limitadorSession{api: api, ns: "shared"}).wantRefused(t, app, 1)
		}
	})

	t.Run("counters_listed_on_every_server", func(t *testing.T) {
		(&limitadorSession{api: limitadorHTTP{a.url}, ns: "shared-list"}).reports(t, vals("app_id", "x"), 2)
		(&limitadorSession{api: limitadorHTTP{b.url}, ns: "shared-list"}).reports(t, vals("app_id", "y"), 1)
		for _, p := range []*admitProcess{a, b} {
			got := map[string]int64{}
			for _, c := range limitadorCounters(t, p, "shared-list") {
				if c.Remaining != nil {
					got[c.SetVariables["descriptors[0]['app_id']"]] = *c.Remaining
				}
			}
			if want := map[string]int64{"x": 8, "y": 9}; !reflect.DeepEqual(got, want) {
				t.Errorf("GET /counters/shared-list on %s: remaining by app_id %v; want %v (Limitador lists every counter in Redis, whichever instance counted it)", p.url, got, want)
			}
		}
	})
}

// limitadorExample is a limits file of testdata/limitador, written with
// the constructs of the limits files in Limitador's repository, the
// limits GET /limits lists of it, and a few requests it decides.
type limitadorExample struct {
	file   string
	limits []limitadorLimit
	run    func(t *testing.T, s *limitadorSession)
}

var limitadorExamples = []limitadorExample{
	{
		// limitador-server/examples/limits.yaml: a leading ---, conditions:
		// and variables: left empty (null), a quoted condition, an unquoted
		// variable, two limits in one namespace.
		file: "limits.yaml",
		limits: []limitadorLimit{
			{Namespace: "shop", MaxValue: 100000, Seconds: 60},
			{Namespace: "shop", MaxValue: 4, Seconds: 60, Conditions: []string{"descriptors[0]['req.method'] == 'POST'"}, Variables: []string{"descriptors[0]['user_id']"}},
		},
		run: func(t *testing.T, s *limitadorSession) {
			s = s.in("shop")
			post := vals("req.method", "POST", "user_id", "ann")
			s.wantAdmitted(t, post, 1, 4)
			s.wantRefused(t, post, 1)
			s.wantAdmitted(t, vals("req.method", "POST", "user_id", "bob"), 1, 1)
			s.wantAdmitted(t, vals("req.method", "GET", "user_id", "ann"), 1, 3)
		},
	},
	{
		// limitador-server/sandbox/limits.yaml: variables: [], two
		// conditions each (== and !=), three limits in one namespace.
		file: "sandbox.yaml",
		limits: []limitadorLimit{
			{Namespace: "storefront", MaxValue: 8, Seconds: 60, Conditions: []string{"descriptors[0]['req.method'] == 'GET'", "descriptors[0]['req.path'] != '/json'"}},
			{Namespace: "storefront", MaxValue: 3, Seconds: 60, Conditions: []string{"descriptors[0]['req.method'] == 'POST'", "descriptors[0]['req.path'] != '/json'"}},
			{Namespace: "storefront", MaxValue: 20000, Seconds: 10, Conditions: []string{"descriptors[0]['req.method'] == 'GET'", "descriptors[0]['req.path'] == '/json'"}},
		},
		run: func(t *testing.T, s *limitadorSession) {
			s = s.in("storefront")
			s.wantAdmitted(t, vals("req.method", "POST", "req.path", "/cart"), 1, 2)
			s.wantAdmitted(t, vals("req.method", "POST", "req.path", "/checkout"), 1, 1)
			s.wantRefused(t, vals("req.method", "POST", "req.path", "/cart"), 1)
			s.wantAdmitted(t, vals("req.method", "GET", "req.path", "/json"), 1, 10)
		},
	},
	{
		// limitador-server/kubernetes/limitador-config-configmap.yaml and
		// e2e/file-watcher/configmap.yaml: a limit opened by a lone -,
		// conditions: [], a one-second window, variables in flow style, and
		// a variable that is a bare name (no descriptor: the limit never
		// applies, as Limit::applies finds it unset).
		file: "configmap.yaml",
		limits: []limitadorLimit{
			{Namespace: "gateway", MaxValue: 2, Seconds: 1, Variables: []string{"per_hostname_per_second_burst"}},
			{Namespace: "files", MaxValue: 2, Seconds: 1, Variables: []string{"descriptors[0]['user_id']"}},
		},
		run: func(t *testing.T, s *limitadorSession) {
			s.in("gateway").wantAdmitted(t, vals("per_hostname_per_second_burst", "h"), 1, 5)
			// One second is long enough for 3 requests, but do not count
			// on it: a third refused, or admitted a second later.
			files := s.in("files")
			user := vals("user_id", "u1")
			sent := time.Now()
			files.wantAdmitted(t, user, 1, 2)
			if files.admits(t, user, 1) && time.Since(sent) < time.Second {
				t.Fatal("a third request within a second admitted; files allows 2 a second")
			}
		},
	},
	{
		// Limitador keeps a namespace's limits as a set of its own
		// (Storage::add_limit inserts into the namespace's): two namespaces
		// may each have a limit of one id, and each is in force.
		file: "ids.yaml",
		limits: []limitadorLimit{
			{ID: strp("per-user"), Namespace: "north", MaxValue: 2, Seconds: 60, Variables: []string{"descriptors[0]['user_id']"}},
			{ID: strp("per-user"), Namespace: "south", MaxValue: 3, Seconds: 60, Variables: []string{"descriptors[0]['user_id']"}},
		},
		run: func(t *testing.T, s *limitadorSession) {
			user := vals("user_id", "ann")
			s.in("north").wantAdmitted(t, user, 1, 2)
			s.in("north").wantRefused(t, user, 1)
			s.in("south").wantAdmitted(t, user, 1, 3)
			s.in("south").wantRefused(t, user, 1)
		},
	},
	{
		// add_limit_only_adds_if_not_present: a limit given twice (the same
		// namespace, seconds, conditions and variables; another max_value
		// and a name) is the first.
		file:   "duplicates.yaml",
		limits: []limitadorLimit{{Namespace: "dup", MaxValue: 10, Seconds: 60, Conditions: []string{"descriptors[0]['req.method'] == 'GET'"}, Variables: []string{"descriptors[0]['app_id']"}}},
		run: func(t *testing.T, s *limitadorSession) {
			get := vals("req.method", "GET", "app_id", "a")
			s.in("dup").wantAdmitted(t, get, 1, 10)
			s.in("dup").wantRefused(t, get, 1)
		},
	},
}

// TestLimitadorExampleFiles: limits files written as Limitador's
// repository writes them load unchanged in `admit serve`, which lists
// their limits and decides them; and `admit config validate` accepts
// them, as `limitador-server --validate` does.
func TestLimitadorExampleFiles(t *testing.T) {
	for _, ex := range limitadorExamples {
		t.Run(strings.TrimSuffix(ex.file, ".yaml"), func(t *testing.T) {
			data, err := os.ReadFile(filepath.Join("testdata", "limitador", ex.file))
			if err != nil {
				t.Fatal(err)
			}
			p, _ := serveLimitador(t, string(data))
			byNS := map[string][]limitadorLimit{}
			for _, l := range ex.limits {
				byNS[l.Namespace] = append(byNS[l.Namespace], l)
			}
			for ns, ls := range byNS {
				wantLimits(t, p, ns, ls...)
			}
			ex.run(t, &limitadorSession{api: limitadorHTTP{p.url}, p: p})
			st := limitadorStatusOf(t, p)
			if st.ConfigVersion != 0 || st.ConfigErrSince != 0 {
				t.Fatalf("GET /status: %+v; want the file loaded at start, no reload", st)
			}
		})
	}
	t.Run("validate", func(t *testing.T) {
		for _, ex := range limitadorExamples {
			file := filepath.Join("testdata", "limitador", ex.file)
			out, err := exec.Command(admitBinary(t), "config", "validate", file).CombinedOutput()
			if err != nil {
				t.Errorf("admit config validate %s: %v\n%s(limitador-server --validate accepts it)", file, err, out)
			}
		}
	})
}
