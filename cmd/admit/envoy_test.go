package main

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	rlext "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// ratelimitClient is envoyproxy/ratelimit's own gRPC client command, at a
// pinned version (the project tags no releases; this is its main branch of
// 2026-01-22).
const ratelimitClient = "github.com/envoyproxy/ratelimit/src/client_cmd@v1.4.1-0.20260122083618-3fb702589d36"

func writeFile(t *testing.T, path, data string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(data), 0o600); err != nil {
		t.Fatal(err)
	}
}

func rlsClient(t *testing.T, addr string) rlsv3.RateLimitServiceClient {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return rlsv3.NewRateLimitServiceClient(conn)
}

func shouldRateLimit(t *testing.T, c rlsv3.RateLimitServiceClient, domain string, kv ...string) *rlsv3.RateLimitResponse {
	t.Helper()
	d := &rlext.RateLimitDescriptor{}
	for i := 0; i+1 < len(kv); i += 2 {
		d.Entries = append(d.Entries, &rlext.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
	}
	resp, err := c.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: domain, Descriptors: []*rlext.RateLimitDescriptor{d}})
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

// TestEnvoyClientCommand runs envoyproxy/ratelimit's own client against
// admit serve --envoy-config: OK, then OVER_LIMIT.
func TestEnvoyClientCommand(t *testing.T) {
	bin := t.TempDir()
	install := exec.Command("go", "install", ratelimitClient)
	install.Env = append(os.Environ(), "GOBIN="+bin, "GOFLAGS=-buildvcs=false")
	if out, err := install.CombinedOutput(); err != nil {
		t.Fatalf("go install %s: %v\n%s", ratelimitClient, err, out)
	}
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "config.yaml"), "domain: rl\ndescriptors:\n  - key: foo\n    value: bar\n    rate_limit:\n      unit: day\n      requests_per_unit: 1\n")
	r := startServe(t, "--envoy-config", dir)
	overall := regexp.MustCompile(`overall_code:\s*(\w+)`)
	for _, want := range []string{"OK", "OVER_LIMIT"} {
		var out bytes.Buffer
		cmd := exec.Command(filepath.Join(bin, "client_cmd"), "-dial_string", r.grpc, "-domain", "rl", "-descriptors", "foo=bar")
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Run(); err != nil {
			t.Fatalf("client_cmd: %v\n%s", err, out.String())
		}
		m := overall.FindStringSubmatch(out.String())
		if m == nil || m[1] != want {
			t.Fatalf("client_cmd printed\n%s\nwant overall_code %s", out.String(), want)
		}
	}
}

// TestEnvoyConfigReload: an edited file applies without a restart, a bad
// edit is refused with its position, the running configuration is kept,
// and /readyz says so.
func TestEnvoyConfigReload(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "a.yaml")
	writeFile(t, file, "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: day, requests_per_unit: 1}\n")
	r := startServe(t, "--envoy-config", dir, "--reload-interval", "1h")
	c := rlsClient(t, r.grpc)
	if got := shouldRateLimit(t, c, "d", "k", "x"); got.Statuses[0].CurrentLimit.GetRequestsPerUnit() != 1 {
		t.Fatalf("before: %v", got)
	}
	writeFile(t, file, "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: day, requests_per_unit: 5}\n")
	r.reloadEnvoy <- struct{}{}
	waitFor(t, func() bool {
		return shouldRateLimit(t, c, "d", "k", "peek-"+time.Now().String()).Statuses[0].CurrentLimit.GetRequestsPerUnit() == 5
	}, "the edited limit")
	writeFile(t, file, "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: fortnight, requests_per_unit: 9}\n")
	r.reloadEnvoy <- struct{}{}
	waitFor(t, func() bool { return strings.Contains(r.stderr.String(), "envoy configuration reload refused") }, "the refusal")
	if !strings.Contains(r.stderr.String(), "a.yaml:4:24: invalid rate limit unit 'fortnight'") {
		t.Fatalf("log: %s", r.stderr)
	}
	if got := shouldRateLimit(t, c, "d", "k", "y"); got.Statuses[0].CurrentLimit.GetRequestsPerUnit() != 5 {
		t.Fatalf("after a bad edit: %v", got)
	}
	code, body := call(t, "GET", r.url+"/readyz", "")
	if code != 200 || !strings.Contains(body["envoy_config_error"].(string), "invalid rate limit unit") {
		t.Fatalf("readyz: %d %v", code, body)
	}
	if m := metricsText(t, r.url); !strings.Contains(m, `admit_envoy_config_reloads_total{result="error"} 1`) ||
		!strings.Contains(m, `admit_envoy_config_reloads_total{result="ok"} 1`) {
		t.Fatalf("reload metrics:\n%s", m)
	}
}

func metricsText(t *testing.T, url string) string {
	t.Helper()
	resp, err := http.Get(url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

// TestEnvoyCatalogDomain: the "admit" domain decides against the demo
// configuration's tenants and rules.
func TestEnvoyCatalogDomain(t *testing.T) {
	r := startServe(t)
	c := rlsClient(t, r.grpc)
	got := shouldRateLimit(t, c, "admit", "tenant", "t1234", "user", "alice")
	if got.OverallCode != rlsv3.RateLimitResponse_OK || got.Statuses[0].CurrentLimit == nil {
		t.Fatalf("catalog: %v", got)
	}
	if m := metricsText(t, r.url); !strings.Contains(m, `admit_requests_total{endpoint="grpc",result="allowed"} 1`) {
		t.Fatalf("metrics lack the gRPC call:\n%s", m)
	}
}

func TestEnvoyConfigRefusedAtStart(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "bad.yaml"), "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: day, requests_per_unit: 1, bogus: 2}\n")
	var stderr bytes.Buffer
	code := run(context.Background(), []string{"serve", "--http", "127.0.0.1:0", "--grpc", "127.0.0.1:0", "--data-dir", t.TempDir(), "--envoy-config", dir},
		&env{stdout: io.Discard, stderr: &stderr, getenv: os.Getenv})
	if code != 2 || !strings.Contains(stderr.String(), "bad.yaml:4:51: config error, unknown key 'bogus'") {
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
}

// TestEnvoyReloadKeepsCounts: an envoyproxy/ratelimit file whose limits
// change keeps what its counters hold: a window of 3 a day, spent and
// raised to 5, admits 2 more; a token bucket drained at 100/s and
// lowered to 1000/day stays drained (read under the new rule as it was,
// it came back nearly full).
func TestEnvoyReloadKeepsCounts(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "a.yaml")
	conf := func(window, bucket string) string {
		return "domain: d\ndescriptors:\n  - key: w\n    rate_limit: {" + window + "}\n  - key: b\n    rate_limit: {" + bucket + ", algorithm: token_bucket}\n"
	}
	writeFile(t, file, conf("unit: day, requests_per_unit: 3", "unit: second, requests_per_unit: 100"))
	r := startServe(t, "--envoy-config", dir, "--reload-interval", "1h")
	c := rlsClient(t, r.grpc)
	count := func(key string, n int) int {
		ok := 0
		for range n {
			if shouldRateLimit(t, c, "d", key, "x").OverallCode == rlsv3.RateLimitResponse_OK {
				ok++
			}
		}
		return ok
	}
	if got := count("w", 5); got != 3 {
		t.Fatalf("a window of 3: %d of 5 admitted", got)
	}
	drainStart := time.Now()
	if got := count("b", 150); got < 100 || float64(got) > 101+100*time.Since(drainStart).Seconds() {
		t.Fatalf("a bucket of 100 at 100/s: %d of 150 admitted in %v", got, time.Since(drainStart))
	}
	drained := time.Now()
	writeFile(t, file, conf("unit: day, requests_per_unit: 5", "unit: day, requests_per_unit: 1000"))
	r.reloadEnvoy <- struct{}{}
	waitFor(t, func() bool {
		return shouldRateLimit(t, c, "d", "w", "peek-"+time.Now().String()).Statuses[0].CurrentLimit.GetRequestsPerUnit() == 5
	}, "the edited limits")
	if got := count("w", 5); got != 2 {
		t.Errorf("the window's limit raised from 3 to 5 when spent: %d of 5 admitted, want 2", got)
	}
	// What 100/s refilled until the first check under the new rule, no
	// more.
	refilled := 2 + 100*time.Since(drained).Seconds()
	if got := count("b", 50); float64(got) > refilled {
		t.Errorf("the drained bucket lowered from 100/s to 1000/day: %d of 50 admitted, want it drained (at most the %.0f 100/s refilled)", got, refilled)
	}
}
