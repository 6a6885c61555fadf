package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/admitdev/admit/proctest"
)

// lockedBuffer collects a command's output; it is safe for concurrent use.
type lockedBuffer = proctest.Buffer

// running is an `admit serve` started in-process on a free loopback port.
type running struct {
	url    string
	grpc   string // serve's gRPC address
	stderr *lockedBuffer
	reload chan struct{}
	// reloadEnvoy reloads serve's --envoy-config files.
	reloadEnvoy chan struct{}
	stop        func() int
}

func startServe(t *testing.T, args ...string) *running {
	t.Helper()
	// A data directory of its own (a later --data-dir wins): the memory
	// store keeps a lock and the usage records there.
	return startCmd(t, append([]string{"serve", "--http", "127.0.0.1:0", "--grpc", "127.0.0.1:0", "--data-dir", t.TempDir()}, args...)...)
}

// startCmd runs a serving command (serve, proxy) in process until the test
// ends.
func startCmd(t *testing.T, args ...string) *running {
	t.Helper()
	return startCmdEnv(t, nil, args...)
}

// startCmdEnv is startCmd with the environment variables of environ.
func startCmdEnv(t *testing.T, environ map[string]string, args ...string) *running {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	addr := make(chan string, 1)
	r := &running{stderr: &lockedBuffer{}, reload: make(chan struct{}), reloadEnvoy: make(chan struct{})}
	getenv := func(k string) string {
		if v, ok := environ[k]; ok || k != "ADMIT_ADMIN_TOKEN" {
			return v
		}
		return testAdminToken // the admin API is closed without one
	}
	e := &env{stdout: io.Discard, stderr: r.stderr, getenv: getenv,
		listening: func(a string) { addr <- a }, reload: r.reload, reloadEnvoy: r.reloadEnvoy,
		listeningGRPC: func(a string) { r.grpc = a }} // before listening: read after it
	done := make(chan int, 1)
	go func() { done <- run(ctx, args, e) }()
	select {
	case a := <-addr:
		r.url = "http://" + a
	case code := <-done:
		cancel()
		t.Fatalf("%s exited with %d: %s", args[0], code, r.stderr)
	case <-time.After(10 * time.Second):
		t.Fatalf("%s did not start", args[0])
	}
	var once sync.Once
	code := 0
	r.stop = func() int {
		once.Do(func() { cancel(); code = <-done })
		return code
	}
	t.Cleanup(func() { r.stop() })
	return r
}

// testAdminToken is the admin token of the servers tests start, unless
// they set ADMIT_ADMIN_TOKEN themselves.
const testAdminToken = "test-admin-token"

// call makes a request and decodes its JSON answer. Admin API requests
// carry testAdminToken, as JSON.
func call(t *testing.T, method, url, body string) (int, map[string]any) {
	t.Helper()
	req, _ := http.NewRequest(method, url, strings.NewReader(body))
	asAdmin(req)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var m map[string]any
	raw, _ := io.ReadAll(resp.Body)
	_ = json.Unmarshal(raw, &m)
	return resp.StatusCode, m
}

// asAdmin gives an admin API request the test servers' admin token, and
// /readyz, which tells the admin alone why a reload was refused.
func asAdmin(req *http.Request) {
	if strings.HasPrefix(req.URL.Path, "/v1/admin/") || req.URL.Path == "/readyz" {
		req.Header.Set("Authorization", "Bearer "+testAdminToken)
		if req.Method != http.MethodGet {
			req.Header.Set("Content-Type", "application/json")
		}
	}
}

const smallConfig = `version: 1
tiers:
  basic:
    rules:
      - name: tenant-requests
        scope: tenant
        algorithm: token_bucket
        rate: 1/h
        burst: BURST
tenants:
  t1: {tier: basic}
`

func writeConfig(t *testing.T, path, burst string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(strings.Replace(smallConfig, "BURST", burst, 1)), 0o600); err != nil {
		t.Fatal(err)
	}
}

func TestServeRestartKeepsCatalogChanges(t *testing.T) {
	dir := t.TempDir()
	data := filepath.Join(dir, "data")
	s := startServe(t, "--data-dir", data)
	if code, _ := call(t, "POST", s.url+"/v1/check", `{"tenant":"t1234","action":"schedule-email"}`); code != 200 {
		t.Fatalf("demo tenant t1234: %d", code)
	}
	if code, _ := call(t, "PUT", s.url+"/v1/admin/tenants/newco", `{"tier":"premium"}`); code != 200 {
		t.Fatalf("create tenant: %d", code)
	}
	if code, _ := call(t, "PUT", s.url+"/v1/admin/tenants/t1234", `{"tier":"standard"}`); code != 200 {
		t.Fatalf("switch tier: %d", code)
	}
	if code := s.stop(); code != 0 {
		t.Fatalf("serve exited with %d: %s", code, s.stderr)
	}
	s = startServe(t, "--data-dir", data)
	if _, m := call(t, "GET", s.url+"/v1/admin/tenants/newco", ""); m["tier"] != "premium" {
		t.Errorf("after restart newco is %v", m)
	}
	if _, m := call(t, "GET", s.url+"/v1/admin/tenants/t1234", ""); m["tier"] != "standard" {
		t.Errorf("after restart t1234 is %v", m)
	}
}

func TestServeHotReload(t *testing.T) {
	dir := t.TempDir()
	cfg := filepath.Join(dir, "admit.yaml")
	writeConfig(t, cfg, "1")
	s := startServe(t, "--config", cfg, "--data-dir", filepath.Join(dir, "data"), "--reload-interval", "1h")
	limit := func() float64 {
		_, m := call(t, "POST", s.url+"/v1/check", `{"tenant":"t1","cost":0}`)
		return m["limit"].(float64)
	}
	if got := limit(); got != 1 {
		t.Fatalf("limit %v, want 1", got)
	}
	version := func() string {
		_, m := call(t, "GET", s.url+"/v1/admin/dashboard", "")
		return m["config"].(map[string]any)["version"].(string)
	}
	first := version()
	writeConfig(t, cfg, "5")
	s.reload <- struct{}{}
	waitFor(t, func() bool { return limit() == 5 }, "the good edit to apply")
	data, _ := os.ReadFile(cfg)
	if v := version(); v == first || v != configVersion(data) {
		t.Errorf("dashboard's config version %s after the edit (was %s), want %s", v, first, configVersion(data))
	}

	writeConfig(t, cfg, "many")
	s.reload <- struct{}{}
	waitFor(t, func() bool {
		_, m := call(t, "GET", s.url+"/readyz", "")
		e, _ := m["config_error"].(string)
		return strings.Contains(e, "admit.yaml:9:16: tiers.basic.rules[0].burst: want an integer")
	}, "/readyz to show the bad edit")
	if got := limit(); got != 5 {
		t.Errorf("after a bad edit the limit is %v, want the running 5", got)
	}
	// Without the admin token, /readyz says a reload was refused, not
	// what the file holds.
	if resp, err := http.Get(s.url + "/readyz"); err != nil {
		t.Fatal(err)
	} else {
		var m map[string]any
		_ = json.NewDecoder(resp.Body).Decode(&m)
		resp.Body.Close()
		if e, _ := m["config_error"].(string); !strings.Contains(e, "refused") || strings.Contains(e, "admit.yaml") {
			t.Errorf("/readyz without the admin token: config_error %q; want the refusal without the file's words", e)
		}
	}
	if !strings.Contains(s.stderr.String(), "configuration reload refused") {
		t.Error("the refused reload was not logged")
	}
	writeConfig(t, cfg, "3")
	s.reload <- struct{}{}
	waitFor(t, func() bool {
		_, m := call(t, "GET", s.url+"/readyz", "")
		return m["config_error"] == nil && limit() == 3
	}, "a fixed file to clear the error")
}

// TestSettling: a change is applied once the same content has been read
// for the whole period; content that changes again starts the period
// over; a period of 0 applies at once.
func TestSettling(t *testing.T) {
	t0 := time.Unix(1_000_000, 0)
	a, b := sha256.Sum256([]byte("half")), sha256.Sum256([]byte("whole"))
	w := settling{period: time.Second}
	for i, step := range []struct {
		d             [sha256.Size]byte
		at            time.Duration
		ok, firstRead bool
	}{
		{a, 0, false, true},
		{a, 500 * time.Millisecond, false, false},
		{b, 900 * time.Millisecond, false, true}, // written on: the period starts over
		{b, 1800 * time.Millisecond, false, false},
		{b, 1900 * time.Millisecond, true, false},
	} {
		if ok, first := w.stable(step.d, t0.Add(step.at)); ok != step.ok || first != step.firstRead {
			t.Errorf("step %d: stable %v, first %v; want %v, %v", i, ok, first, step.ok, step.firstRead)
		}
	}
	w.reset()
	if ok, first := w.stable(b, t0.Add(2*time.Second)); ok || !first {
		t.Errorf("after reset: stable %v, first %v", ok, first)
	}
	if ok, _ := (&settling{}).stable(a, t0); !ok {
		t.Error("a period of 0 held a change back")
	}
}

func waitFor(t *testing.T, cond func() bool, what string) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if cond() {
			return
		}
	}
	t.Fatalf("timed out waiting for %s", what)
}

func TestServeRefusesBadConfig(t *testing.T) {
	var stderr bytes.Buffer
	code := run(context.Background(), []string{"serve", "--config", "testdata/invalid/bad_rate.yaml"}, &env{stdout: io.Discard, stderr: &stderr, getenv: os.Getenv})
	if code != 2 || !strings.Contains(stderr.String(), "bad_rate.yaml:8:15") {
		t.Errorf("exit %d, stderr %s", code, stderr.String())
	}
}

func TestCheckCommand(t *testing.T) {
	dir := t.TempDir()
	cfg := filepath.Join(dir, "admit.yaml")
	writeConfig(t, cfg, "1")
	s := startServe(t, "--config", cfg, "--data-dir", filepath.Join(dir, "data"))
	cmd := func(args ...string) (int, string) {
		var out, errb bytes.Buffer
		code := run(context.Background(), args, &env{stdout: &out, stderr: &errb, getenv: os.Getenv})
		return code, out.String() + errb.String()
	}
	if code, out := cmd("check", "--server", s.url, "--tenant", "t1"); code != 0 || !strings.Contains(out, "ADMITTED") {
		t.Errorf("first check: exit %d: %s", code, out)
	}
	if code, out := cmd("check", "--server", s.url, "--tenant", "t1"); code != 1 || !strings.Contains(out, "REFUSED by tenant-requests") {
		t.Errorf("second check: exit %d: %s", code, out)
	}
	if code, out := cmd("check", "--server", s.url, "--tenant", "ghost"); code != 2 || !strings.Contains(out, "403") {
		t.Errorf("unknown tenant: exit %d: %s", code, out)
	}
	if code, _ := cmd("check", "--server", "http://127.0.0.1:1", "--tenant", "t1"); code != 2 {
		t.Errorf("no server: exit %d", code)
	}
	// Locally, on the configuration, with JSON output.
	code, out := cmd("check", "--config", cfg, "--tenant", "t1", "--json")
	var m map[string]any
	if code != 0 || json.Unmarshal([]byte(out), &m) != nil || m["limit"] != float64(1) {
		t.Errorf("local check: exit %d: %s", code, out)
	}
	if code, _ := cmd("check", "--config", cfg, "--tenant", "t1", "--cost", "2"); code != 2 {
		t.Errorf("cost over the burst: exit %d", code)
	}

	// The demo's login limit counts client addresses across tenants: a
	// check without a token does not charge it the --ip it names, one with
	// a service token does, and a local check (whoever has the file) does.
	demo := startCmdEnv(t, map[string]string{"ADMIT_SERVICE_TOKEN": "check-backend"}, "serve", "--http", "127.0.0.1:0", "--grpc", "127.0.0.1:0", "--data-dir", t.TempDir())
	login := []string{"check", "--server", demo.url, "--tenant", "acme", "--action", "login", "--ip", "203.0.113.9"}
	if _, out := cmd(login...); strings.Contains(out, "logins-per-ip") {
		t.Errorf("a check without a token charged logins-per-ip: %s", out)
	}
	if _, out := cmd(append(login, "--token", "check-backend")...); !strings.Contains(out, "logins-per-ip") {
		t.Errorf("a check with the service token did not charge logins-per-ip: %s", out)
	}
	if _, out := cmd("check", "--tenant", "acme", "--action", "login", "--ip", "203.0.113.9"); !strings.Contains(out, "logins-per-ip") {
		t.Errorf("a local check did not charge logins-per-ip: %s", out)
	}
}

func TestConfigCommandsAndHelp(t *testing.T) {
	cmd := func(args ...string) (int, string) {
		var out bytes.Buffer
		code := run(context.Background(), args, &env{stdout: &out, stderr: &out, getenv: os.Getenv})
		return code, out.String()
	}
	code, example := cmd("config", "example")
	if code != 0 || !strings.Contains(example, "t1234") {
		t.Fatalf("config example: %d", code)
	}
	file := filepath.Join(t.TempDir(), "example.yaml")
	if err := os.WriteFile(file, []byte(example), 0o600); err != nil {
		t.Fatal(err)
	}
	if code, out := cmd("config", "validate", file); code != 0 || !strings.Contains(out, "ok") {
		t.Errorf("validate the example: %d %s", code, out)
	}
	if code, out := cmd("config", "validate", file, "testdata/invalid/unknown_tier.yaml"); code != 1 || !strings.Contains(out, "unknown_tier.yaml:11:16") {
		t.Errorf("validate a bad file: %d %s", code, out)
	}
	if code, out := cmd("config", "validate", "testdata/invalid/duplicate_tenant.yaml"); code != 1 || !strings.Contains(out, `duplicate_tenant.yaml:10:3: duplicate key "acme"`) {
		t.Errorf("validate a file that names a tenant twice: %d %s", code, out)
	}
	if code, _ := cmd("config", "validate"); code != 2 {
		t.Errorf("validate without files: %d", code)
	}
	// An envoyproxy/ratelimit file whose domain is misspelt is read as one.
	typo := filepath.Join(t.TempDir(), "edge.yaml")
	if err := os.WriteFile(typo, []byte("domian: edge\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 5}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if code, out := cmd("config", "validate", typo); code != 1 || !strings.Contains(out, "edge.yaml:1:1: config error, unknown key 'domian'") || strings.Contains(out, "version") {
		t.Errorf("validate an envoyproxy/ratelimit file with its domain misspelt: %d %s", code, out)
	}
	for _, args := range [][]string{{"help"}, {"--help"}, {"serve", "--help"}, {"check", "--help"}, {"config", "--help"}, {"config", "validate", "--help"}, {"config", "example", "--help"}} {
		if code, out := cmd(args...); code != 0 || !strings.Contains(out, "Usage") && !strings.Contains(out, "t1234") {
			t.Errorf("%v: exit %d: %.80s", args, code, out)
		}
	}
	if code, _ := cmd("frobnicate"); code != 2 {
		t.Errorf("unknown command: %d", code)
	}
	if code, _ := cmd("serve", "--bogus"); code != 2 {
		t.Errorf("unknown flag: %d", code)
	}
}
