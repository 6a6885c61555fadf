package fault

import (
	"cmp"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	rlext "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/admitdev/admit/policy"
	"github.com/admitdev/admit/proctest"
	"github.com/admitdev/admit/redistest"
)

// redisTimeout is store.redis.timeout in the suite's configuration: the
// answers during a fault must come within 2 × redisTimeout + 50 ms (their
// median; the slowest within 5 s).
const redisTimeout = 100 * time.Millisecond

// admitBin is the admit binary TestMain builds.
var admitBin string

func TestMain(m *testing.M) { proctest.Main(m, &admitBin) }

// config is the suite's configuration: tenant open (no API keys) and acme
// (API key acme-key) of tier t: a user bucket of 4 that refills in an
// hour (so a fifth request is refused), a roomy tenant bucket, exports
// limited to 2 leases, a roomy gateway. instances 2: on_error local gives
// each server half of every limit.
func config(t *testing.T, mode string) string {
	cfg := `version: 1
server:
  trusted_proxies: ["127.0.0.1/32"]
store:
  redis:
    timeout: ` + redisTimeout.String() + `
  on_error: ` + mode + `
  instances: 2
http:
  actions:
    - match: "GET /echo"
      action: echo
tiers:
  t:
    rules:
      - name: per-user
        scope: user
        algorithm: token_bucket
        rate: 1/h
        burst: 4
      - name: per-tenant
        scope: tenant
        algorithm: token_bucket
        rate: 1000/s
        burst: 1000
      - name: exports
        scope: tenant
        actions: [export]
        algorithm: concurrency
        max: 2
        lease_ttl: 10s
    gateway:
      tenant_connections: 1000
      connections_per_session: 1000
      tenant_per_minute: 100000
      session_per_minute: 100000
      messages_per_minute: 100000
tenants:
  open: {tier: t}
  acme:
    tier: t
    api_keys_sha256: ["` + policy.HashKey("acme-key") + `"]
`
	path := filepath.Join(t.TempDir(), "admit.yaml")
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// adminToken is the admin token of the admit processes the tests start.
const adminToken = "fault-admin-token"

// proc is an admit process a test started.
type proc = proctest.Proc

// startAdmit runs the admit binary with args and waits until it answers
// HTTP on listen.
func startAdmit(t *testing.T, listen string, args ...string) *proc {
	t.Helper()
	return proctest.Start(t, admitBin, listen, []string{"ADMIT_ADMIN_TOKEN=" + adminToken}, args...)
}

var (
	freeAddr = proctest.FreeAddr
	waitFor  = proctest.WaitFor
	client   = proctest.Client
)

// deployment is one admit serve and one admit proxy on one Redis.
type deployment struct {
	t       *testing.T
	serve   *proc
	proxy   *proc
	rls     rlsv3.RateLimitServiceClient
	session string // a gateway session of tenant open
	seq     int    // numbers fresh users
}

func deploy(t *testing.T, store, mode string, running bool) *deployment {
	t.Helper()
	cfg := config(t, mode)
	d := &deployment{t: t}
	grpcAddr, httpAddr := freeAddr(t), freeAddr(t)
	d.serve = startAdmit(t, httpAddr, "serve", "--config", cfg, "--store", store, "--data-dir", t.TempDir(),
		"--grpc", grpcAddr, "--http", httpAddr)
	d.serve.GRPC = grpcAddr
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, "upstream")
	}))
	t.Cleanup(upstream.Close)
	proxyAddr := freeAddr(t)
	d.proxy = startAdmit(t, proxyAddr, "proxy", "--config", cfg, "--store", store, "--data-dir", t.TempDir(),
		"--upstream", upstream.URL, "--listen", proxyAddr)
	conn, err := grpc.NewClient(grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	d.rls = rlsv3.NewRateLimitServiceClient(conn)
	if running {
		code, body := d.post("/v1/sessions", "PUT", `{"tenant":"open"}`, "")
		if code != 201 {
			t.Fatalf("creating a session: %d %s", code, body)
		}
		var s struct {
			ID string `json:"session_id"`
		}
		_ = json.Unmarshal([]byte(body), &s)
		d.session = s.ID
	}
	return d
}

// post sends an HTTP request to admit serve and returns its status and body.
func (d *deployment) post(path, method, body, key string) (int, string) {
	req, _ := http.NewRequest(method, d.serve.URL+path, strings.NewReader(body))
	if key != "" {
		req.Header.Set("X-API-Key", key)
	}
	if strings.HasPrefix(path, "/v1/admin/") {
		req.Header.Set("Authorization", "Bearer "+adminToken)
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := client.Do(req)
	if err != nil {
		d.t.Fatalf("%s %s: %v (status 000: the server dropped the connection)", method, path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func (d *deployment) user() string {
	d.seq++
	return "u" + strconv.Itoa(d.seq)
}

// A frontEnd asks one front end once and names its answer: "admitted",
// "refused" (429, OVER_LIMIT), "unavailable" (503, UNAVAILABLE) or
// anything else as it came.
type frontEnd struct {
	name string
	ask  func(d *deployment) string
}

func httpOutcome(code int) string {
	switch {
	case code/100 == 2 || code == 101:
		return "admitted"
	case code == 429:
		return "refused"
	case code == 503:
		return "unavailable"
	}
	return "status " + strconv.Itoa(code)
}

var frontEnds = []frontEnd{
	{"POST /v1/check", func(d *deployment) string {
		code, _ := d.post("/v1/check", "POST", `{"tenant":"open","user":"`+d.user()+`"}`, "")
		return httpOutcome(code)
	}},
	{"POST /v1/acquire", func(d *deployment) string {
		code, _ := d.post("/v1/acquire", "POST", `{"tenant":"open","user":"`+d.user()+`","max_wait_ms":0}`, "")
		return httpOutcome(code)
	}},
	{"POST /v1/leases", func(d *deployment) string {
		code, body := d.post("/v1/leases", "POST", `{"tenant":"open","resource":"export","ttl_ms":5000}`, "")
		if code == 201 {
			var l struct {
				ID string `json:"lease_id"`
			}
			_ = json.Unmarshal([]byte(body), &l)
			// Released at once; while the store is down the release may
			// be refused (503), and the store reclaims the slot at its TTL.
			d.post("/v1/leases/"+l.ID, "DELETE", "", "")
		}
		return httpOutcome(code)
	}},
	{"GET /v1/authz", func(d *deployment) string {
		req, _ := http.NewRequest("GET", d.serve.URL+"/v1/authz/echo", nil)
		req.Header.Set("X-API-Key", "acme-key")
		req.Header.Set("X-User-Id", d.user())
		return do(d.t, req)
	}},
	{"admit proxy", func(d *deployment) string {
		req, _ := http.NewRequest("GET", d.proxy.URL+"/echo", nil)
		req.Header.Set("X-API-Key", "acme-key")
		return do(d.t, req)
	}},
	{"gRPC ShouldRateLimit", func(d *deployment) string {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		desc := &rlext.RateLimitDescriptor{Entries: []*rlext.RateLimitDescriptor_Entry{
			{Key: "tenant", Value: "open"}, {Key: "user", Value: d.user()},
		}}
		resp, err := d.rls.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "admit", Descriptors: []*rlext.RateLimitDescriptor{desc}})
		switch status.Code(err) {
		case codes.OK:
			if resp.OverallCode == rlsv3.RateLimitResponse_OVER_LIMIT {
				return "refused"
			}
			return "admitted"
		case codes.Unavailable:
			return "unavailable"
		}
		return "gRPC " + status.Code(err).String()
	}},
	{"WebSocket", func(d *deployment) string {
		if d.session == "" {
			// Redis was not there when the deployment started: make
			// the session now, if it can be made.
			code, body := d.post("/v1/sessions", "PUT", `{"tenant":"open"}`, "")
			if code != 201 {
				return httpOutcome(code)
			}
			var s struct {
				ID string `json:"session_id"`
			}
			_ = json.Unmarshal([]byte(body), &s)
			d.session = s.ID
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		url := "ws" + strings.TrimPrefix(d.serve.URL, "http") + "/v1/ws?tenant=open&session=" + d.session
		c, resp, err := websocket.Dial(ctx, url, nil)
		if err != nil {
			if resp == nil {
				d.t.Fatalf("WebSocket: %v", err)
			}
			return httpOutcome(resp.StatusCode)
		}
		defer c.CloseNow()
		if err := c.Write(ctx, websocket.MessageText, []byte(`{"route":"silo","id":"m","data":1}`)); err != nil {
			return "write failed: " + err.Error()
		}
		_, msg, err := c.Read(ctx)
		if err != nil {
			return "read failed: " + err.Error()
		}
		var f struct {
			Type string `json:"type"`
		}
		_ = json.Unmarshal(msg, &f)
		c.Close(websocket.StatusNormalClosure, "")
		if f.Type != "echo" {
			return "frame " + string(msg)
		}
		return "admitted"
	}},
}

func do(t *testing.T, req *http.Request) string {
	resp, err := client.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v (status 000)", req.Method, req.URL, err)
	}
	resp.Body.Close()
	return httpOutcome(resp.StatusCode)
}

// A fault is done to the deployment's Redis and undone.
type fault struct {
	name string
	// before is whether Redis runs when admit starts.
	before     bool
	begin, end func(t *testing.T, r *redistest.Server)
	// lost is whether the store's state is lost across the fault.
	lost bool
	// up is whether Redis answers while the fault lasts (it came back
	// empty at once): the store decides, in every mode.
	up bool
	// slowest bounds the slowest answer during the fault (5 s when 0).
	slowest time.Duration
}

var standaloneFaults = []fault{
	{name: "killed", before: true, lost: true,
		begin: func(t *testing.T, r *redistest.Server) { r.Kill() },
		end:   func(t *testing.T, r *redistest.Server) { r.Restart(t) }},
	{name: "restarted empty", before: true, lost: true, up: true,
		begin: func(t *testing.T, r *redistest.Server) { r.Kill(); r.Restart(t) },
		end:   func(t *testing.T, r *redistest.Server) {}},
	{name: "frozen", before: true,
		begin: func(t *testing.T, r *redistest.Server) { r.Freeze() },
		end:   func(t *testing.T, r *redistest.Server) { r.Thaw() }},
	// Frozen longer than the store keeps an unanswered connection (5 s):
	// the connection is made again and again while Redis is frozen, and
	// a call that waits for one, made by whichever caller asked first
	// (the catalog's poll, of a 2 s context), waits at most the dial's
	// bound (200 ms), not that caller's context.
	{name: "frozen past its connections' write timeout", before: true, slowest: time.Second,
		begin: func(t *testing.T, r *redistest.Server) { r.Freeze(); time.Sleep(6 * time.Second) },
		end:   func(t *testing.T, r *redistest.Server) { r.Thaw() }},
	{name: "unreachable at start", before: false, lost: true,
		begin: func(t *testing.T, r *redistest.Server) {},
		end:   func(t *testing.T, r *redistest.Server) { r.Restart(t) }},
	{name: "maxmemory", before: true,
		begin: func(t *testing.T, r *redistest.Server) { redisCmd(t, r, "CONFIG", "SET", "maxmemory", "1") },
		end:   func(t *testing.T, r *redistest.Server) { redisCmd(t, r, "CONFIG", "SET", "maxmemory", "0") }},
}

func redisCmd(t *testing.T, r *redistest.Server, args ...string) {
	t.Helper()
	if _, err := redistest.Command(r.Addr, args...); err != nil {
		t.Fatalf("%v: %v", args, err)
	}
}

// allowed lists the answers a front end may give during a fault under each
// mode. The WebSocket upgrade also needs its session, which lives in Redis
// and is a credential: while Redis is down it is 503 in every mode.
func allowed(mode, frontEnd string) []string {
	var out []string
	switch mode {
	case "open":
		out = []string{"admitted"}
	case "closed":
		out = []string{"unavailable"}
	case "local":
		out = []string{"admitted", "refused"}
	}
	if frontEnd == "WebSocket" {
		out = append(out, "unavailable")
	}
	return out
}

// TestStandaloneFaults runs every standalone fault under every on_error
// mode through every front end.
func TestStandaloneFaults(t *testing.T) {
	for _, f := range standaloneFaults {
		for _, mode := range []string{"open", "closed", "local"} {
			t.Run(f.name+"/"+mode, func(t *testing.T) { runCell(t, f, mode) })
		}
	}
}

// faultAnswers is what a front end may answer during a fault under mode:
// up is whether Redis answers meanwhile, lost whether its state is gone.
func faultAnswers(mode string, up, lost bool) func(frontEnd string) []string {
	return func(fe string) []string {
		w := allowed(mode, fe)
		if up {
			// The store decides, but the first call on a connection
			// the restart broke fails as an outage would.
			w = append(w, "admitted", "refused")
		}
		if lost && fe == "WebSocket" {
			w = append(w, "status 404") // the session went with the store's state
		}
		return w
	}
}

// runCell runs one fault under one mode: no answer but what the mode
// promises, the answers within the bound (their median; the slowest
// within 5 s) while the fault lasts,
// decisions the store's again within 1s of its return, limits enforced
// again, no lease or connection slot leaked, the catalog kept.
func runCell(t *testing.T, f fault, mode string) {
	var redis *redistest.Server
	if f.before {
		redis = redistest.Start(t)
	} else {
		redis = redistest.Unstarted(t)
	}
	d := deploy(t, "redis://"+redis.Addr, mode, f.before)
	if f.before {
		d.prepare()
	}
	f.begin(t, redis)
	d.duringFault(faultAnswers(mode, f.up, f.lost), cmp.Or(f.slowest, 5*time.Second))
	if !f.up {
		d.readiness(mode)
	}
	if mode == "local" && !f.up {
		d.localLimits()
	}
	f.end(t, redis)
	d.recovered(time.Now(), time.Second)
	d.afterFault(f.before, f.lost, func(key string) (string, error) { return redistest.Command(redis.Addr, "GET", key) })
}

// prepare makes what must outlive a fault: an admin change to the shared
// catalog, and a user who spends their burst.
func (d *deployment) prepare() {
	t := d.t
	t.Helper()
	if code, body := d.post("/v1/admin/tenants/newco", "PUT", `{"tier":"t"}`, ""); code != 200 {
		t.Fatalf("creating tenant newco: %d %s", code, body)
	}
	for i := range 4 {
		if code, _ := d.post("/v1/check", "POST", `{"tenant":"open","user":"spent"}`, ""); code != 200 {
			t.Fatalf("spending: check %d: %d", i, code)
		}
	}
	for _, fe := range frontEnds {
		if got := fe.ask(d); got != "admitted" {
			t.Fatalf("%s before the fault: %s", fe.name, got)
		}
	}
}

// duringFault asks every front end 20 times: each answer one of want's,
// the median within 2 × timeout + 50 ms, and the slowest within slowest
// (a store call held until the frozen store returned would take the
// whole fault). The median, not the p99: on a shared 2-core machine a busy
// scheduler can hold one answer a second or two.
func (d *deployment) duringFault(want func(frontEnd string) []string, slowest time.Duration) {
	t := d.t
	t.Helper()
	bound := 2*redisTimeout + 50*time.Millisecond
	for _, fe := range frontEnds {
		var took []time.Duration
		w := want(fe.name)
		for range 20 {
			start := time.Now()
			got := fe.ask(d)
			took = append(took, time.Since(start))
			if !slices.Contains(w, got) {
				t.Errorf("%s during the fault: %s, want one of %v", fe.name, got, w)
				break
			}
		}
		slices.Sort(took)
		p50, p99 := took[len(took)/2], took[(len(took)*99+99)/100-1]
		t.Logf("%s: median %v, p99 %v over %d answers during the fault", fe.name, p50.Round(time.Millisecond), p99.Round(time.Millisecond), len(took))
		report(t, fe.name, p99)
		if p50 > bound || p99 > slowest {
			t.Errorf("%s: median %v, slowest %v during the fault; the bounds are 2 × timeout + 50ms = %v and %v", fe.name, p50, p99, bound, slowest)
		}
	}
}

// readiness: while the store cannot decide (down, frozen, or refusing
// writes at its maxmemory though it answers PING), /readyz is 503 when a
// rule fails closed and 200 otherwise, the store's state in its body.
func (d *deployment) readiness(mode string) {
	d.t.Helper()
	code, body := d.post("/readyz", "GET", "", "")
	want := 200
	if mode == "closed" {
		want = 503
	}
	if code != want || strings.Contains(body, `"store":"ok"`) {
		d.t.Errorf("/readyz during the fault, on_error %s: %d %s; want %d, the store not ok", mode, code, body, want)
	}
}

// localLimits: with on_error local and the store down, the local limiter
// really limits, to half of the user bucket's 4 (instances: 2).
func (d *deployment) localLimits() {
	u := d.user()
	var got []int
	for range 3 {
		code, _ := d.post("/v1/check", "POST", `{"tenant":"open","user":"`+u+`"}`, "")
		got = append(got, code)
	}
	if !slices.Equal(got, []int{200, 200, 429}) {
		d.t.Errorf("local, a fresh user: %v, want [200 200 429] (burst 4 ÷ 2 instances)", got)
	}
}

// recovered waits until decisions are the store's again, at most within
// after since, and returns how long it took.
func (d *deployment) recovered(since time.Time, within time.Duration) time.Duration {
	t := d.t
	t.Helper()
	for {
		code, body := d.post("/v1/check", "POST", `{"tenant":"open","user":"`+d.user()+`"}`, "")
		if code == 200 && !strings.Contains(body, `"failover"`) {
			break
		}
		if time.Since(since) > within {
			t.Fatalf("decisions not the store's %v after it returned: %d %s", within, code, body)
		}
		time.Sleep(10 * time.Millisecond)
	}
	took := time.Since(since)
	t.Logf("decisions are the store's again %v after it returned", took.Round(time.Millisecond))
	report(t, "recovery", took)
	return took
}

// afterFault checks what must hold once the store is back: limits, leases,
// connections, the catalog (get reads a Redis key), no panic, one log
// line for the outage.
func (d *deployment) afterFault(prepared, lost bool, get func(key string) (string, error)) {
	t := d.t
	t.Helper()
	// Limits hold again: a fresh user gets exactly its burst.
	u := d.user()
	var got []int
	for range 5 {
		code, _ := d.post("/v1/check", "POST", `{"tenant":"open","user":"`+u+`"}`, "")
		got = append(got, code)
	}
	if !slices.Equal(got, []int{200, 200, 200, 200, 429}) {
		t.Errorf("after the fault, a fresh user: %v, want 4 × 200 then 429", got)
	}
	// The user who spent their burst before: refused, unless the store
	// lost its state, when they get at most one burst again.
	if prepared {
		admitted := 0
		for range 5 {
			if code, _ := d.post("/v1/check", "POST", `{"tenant":"open","user":"spent"}`, ""); code == 200 {
				admitted++
			}
		}
		t.Logf("the spent user after the fault: %d admitted (state lost: %v)", admitted, lost)
		report(t, "over-admitted", admitted)
		if !lost && admitted != 0 || admitted > 4 {
			t.Errorf("the spent user got %d after the fault", admitted)
		}
	}
	// No lease leaked: both export slots can be taken, and no third.
	var leases []string
	for i := range 3 {
		code, body := d.post("/v1/leases", "POST", `{"tenant":"open","resource":"export","ttl_ms":5000}`, "")
		want := 201
		if i == 2 {
			want = 429
		}
		if code != want {
			t.Errorf("lease %d after the fault: %d %s, want %d (a slot leaked)", i+1, code, body, want)
		}
		var l struct {
			ID string `json:"lease_id"`
		}
		if json.Unmarshal([]byte(body), &l) == nil && l.ID != "" {
			leases = append(leases, l.ID)
		}
	}
	for _, id := range leases {
		d.post("/v1/leases/"+id, "DELETE", "", "")
	}
	// No connection slot held: every WebSocket closed.
	if !waitFor(2*time.Second, func() bool { return strings.Contains(d.serve.Metrics(t), "\nadmit_gateway_connections 0\n") }) {
		t.Error("admit_gateway_connections is not 0 after the fault")
	}
	// The catalog is kept: the admin change made before the fault holds,
	// and a Redis that lost it has it back.
	if prepared {
		if code, body := d.post("/v1/check", "POST", `{"tenant":"newco","user":"x"}`, ""); code != 200 {
			t.Errorf("tenant newco after the fault: %d %s", code, body)
		}
		if !waitFor(2*time.Second, func() bool {
			v, err := get("admit:{catalog}changes")
			return err == nil && strings.Contains(v, "newco")
		}) {
			t.Error("Redis does not hold the catalog with tenant newco 2s after the fault")
		}
	}
	// Nothing panicked, and the outage was logged once each way.
	for _, p := range []*proc{d.serve, d.proxy} {
		out := p.Output.String()
		if strings.Contains(out, "panic") {
			t.Errorf("a panic:\n%s", proctest.LastLines(out, 40))
		}
	}
	out := d.serve.Output.String()
	if n := strings.Count(out, "the store is unavailable"); n > 1 {
		t.Errorf("the outage was logged %d times", n)
	}
}

// report logs one figure of a cell for docs/reliability.md, in a line
// fault/report.sh collects: "report <cell> <what> <value>".
func report(t *testing.T, what string, v any) {
	if d, ok := v.(time.Duration); ok {
		v = d.Round(time.Millisecond)
	}
	t.Logf("report\t%s\t%s\t%v", t.Name(), what, v)
}
