package e2e

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/admitdev/admit/redistest"
)

// peerModule is envoyproxy/ratelimit's service command at the version the
// project pins (its main branch of 2026-01-22; the module proxy these tests
// use lists no tagged version of it and refuses later commits).
const peerModule = "github.com/envoyproxy/ratelimit/src/service_cmd@v1.4.1-0.20260122083618-3fb702589d36"

// quotaConfig is an envoyproxy/ratelimit file of regular and quota-mode
// limits, one key per scenario so that none shares a counter.
const quotaConfig = `domain: quota-domain
descriptors:
  - {key: mixed_regular, value: limit, rate_limit: {unit: minute, requests_per_unit: 5}}
  - {key: mixed_quota, value: limit, quota_mode: true, rate_limit: {unit: minute, requests_per_unit: 3}}
  - {key: all_q1, value: limit, quota_mode: true, rate_limit: {unit: minute, requests_per_unit: 1}}
  - {key: all_q2, value: limit, quota_mode: true, rate_limit: {unit: minute, requests_per_unit: 2}}
  - {key: some_q1, value: limit, quota_mode: true, rate_limit: {unit: minute, requests_per_unit: 1}}
  - {key: some_q2, value: limit, quota_mode: true, rate_limit: {unit: minute, requests_per_unit: 5}}
  - {key: token_quota, value: limit, quota_mode: true, rate_limit: {unit: minute, requests_per_unit: 2}}
`

// TestQuotaModeAsThePeer runs envoyproxy/ratelimit itself, built from the
// module proxy at the pinned version, and admit ratelimit side by side,
// each on a redis-server of its own, with the same file and the same
// environment (the peer's README way: RUNTIME_ROOT, RUNTIME_SUBDIRECTORY
// and the file under config/, a real directory), and asks both the quota
// scenarios of upstream's tests and integration scripts: a regular limit
// beside a quota over its limit; two quotas, both over; two quotas, one
// over; a check (hits 0) then a debit (hits 1) per request on a quota of
// 2 a minute. Every answer — overall code, each status's code, limit,
// remaining and reset — must be the same. The peer's first answer names
// the file's limit, which proves it loaded the file (a peer without it
// answers a bare OK).
//
// At this version the peer answers a quota over its limit OK, with its
// limit, nothing remaining and no reset, and never refuses a request for
// its quotas: admit ratelimit answers so with ADMIT_QUOTA_ANSWERS=reported
// (its default answers as upstream's later main does). The dynamic
// metadata (RESPONSE_DYNAMIC_METADATA) must be the same too.
func TestQuotaModeAsThePeer(t *testing.T) {
	if testing.Short() {
		t.Skip("builds envoyproxy/ratelimit")
	}
	dir := t.TempDir()
	install := exec.Command("go", "install", peerModule)
	install.Env = append(os.Environ(), "GOBIN="+dir, "GOFLAGS=-mod=mod")
	if out, err := install.CombinedOutput(); err != nil {
		t.Fatalf("go install %s: %v\n%s", peerModule, err, out)
	}
	conf := filepath.Join(dir, "runtime", "ratelimit", "config")
	if err := os.MkdirAll(conf, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(conf, "quota.yaml"), []byte(quotaConfig), 0o644); err != nil {
		t.Fatal(err)
	}
	serve := func(bin string, args ...string) rlsv3.RateLimitServiceClient {
		redis := redistest.Start(t)
		grpcPort := freePort(t, "127.0.0.1")
		env := []string{
			"USE_STATSD=false", "LOG_LEVEL=warn", "BACKEND_TYPE=redis", "REDIS_SOCKET_TYPE=tcp", "REDIS_URL=" + redis.Addr,
			"RUNTIME_ROOT=" + filepath.Join(dir, "runtime"), "RUNTIME_SUBDIRECTORY=ratelimit", "RUNTIME_WATCH_ROOT=false",
			"HOST=127.0.0.1", "PORT=" + freePort(t, "127.0.0.1"), "GRPC_HOST=127.0.0.1", "GRPC_PORT=" + grpcPort,
			"DEBUG_HOST=127.0.0.1", "DEBUG_PORT=" + freePort(t, "127.0.0.1"),
			"RESPONSE_DYNAMIC_METADATA=true",
			// Quota answers of the peer's version (admit ratelimit's
			// default answers as upstream's later main does).
			"ADMIT_QUOTA_ANSWERS=reported",
		}
		startProcess(t, "127.0.0.1:"+grpcPort, env, bin, args...)
		conn, err := grpc.NewClient("127.0.0.1:"+grpcPort, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		return rlsv3.NewRateLimitServiceClient(conn)
	}
	// startProcess finds its programs on PATH.
	t.Setenv("PATH", dir+string(os.PathListSeparator)+filepath.Dir(admitBinary(t))+string(os.PathListSeparator)+os.Getenv("PATH"))
	peer := serve("service_cmd")
	admit := serve("admit", "ratelimit")

	type step struct {
		keys []string
		hits uint32 // 0: a check
	}
	repeat := func(n int, s step) []step {
		out := make([]step, n)
		for i := range out {
			out[i] = s
		}
		return out
	}
	var tokenQuota []step
	for range 5 {
		tokenQuota = append(tokenQuota, step{[]string{"token_quota"}, 0}, step{[]string{"token_quota"}, 1})
	}
	scenarios := []struct {
		name  string
		steps []step
	}{
		{"a regular limit beside a quota over its limit", repeat(5, step{[]string{"mixed_regular", "mixed_quota"}, 1})},
		{"two quotas, both over", repeat(4, step{[]string{"all_q1", "all_q2"}, 1})},
		{"two quotas, one over", repeat(3, step{[]string{"some_q1", "some_q2"}, 1})},
		{"a check, then a debit, per request", tokenQuota},
	}
	ask := func(c rlsv3.RateLimitServiceClient, s step) *rlsv3.RateLimitResponse {
		req := &rlsv3.RateLimitRequest{Domain: "quota-domain", HitsAddend: s.hits}
		for _, k := range s.keys {
			req.Descriptors = append(req.Descriptors, &rlv3.RateLimitDescriptor{Entries: []*rlv3.RateLimitDescriptor_Entry{{Key: k, Value: "limit"}}})
		}
		if s.hits == 0 {
			// A hits_addend of 0 in the request reads as 1; each
			// descriptor's own says 0.
			for _, d := range req.Descriptors {
				d.HitsAddend = wrapperspb.UInt64(0)
			}
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		r, err := c.ShouldRateLimit(ctx, req)
		if err != nil {
			t.Fatalf("ShouldRateLimit: %v", err)
		}
		return r
	}
	for _, sc := range scenarios {
		// Every step of a scenario in one minute: both count by the
		// wall clock's minute, and a boundary between the two answers
		// of a step would part them.
		if s := time.Now().Second(); s >= 50 {
			time.Sleep(time.Duration(61-s) * time.Second)
		}
		for i, s := range sc.steps {
			p, a := ask(peer, s), ask(admit, s)
			if i == 0 && sc.name == scenarios[0].name {
				if st := p.GetStatuses(); len(st) != 2 || st[0].GetCurrentLimit().GetRequestsPerUnit() != 5 || st[1].GetCurrentLimit().GetRequestsPerUnit() != 3 {
					t.Fatalf("the peer's first answer does not name the file's limits (5 and 3 a minute): did it load the file? %v", p)
				}
			}
			t.Logf("%s, step %d: %s", sc.name, i+1, describeRLS(p))
			if got, want := describeRLS(a), describeRLS(p); got != want && got != describeRLS(p, 1) && got != describeRLS(p, -1) {
				t.Errorf("%s, step %d (hits %d):\nadmit ratelimit      %s\nenvoyproxy/ratelimit %s", sc.name, i+1, s.hits, got, want)
			}
			if !proto.Equal(a.GetDynamicMetadata(), p.GetDynamicMetadata()) {
				t.Errorf("%s, step %d: dynamic metadata\nadmit ratelimit      %v\nenvoyproxy/ratelimit %v", sc.name, i+1, a.GetDynamicMetadata(), p.GetDynamicMetadata())
			}
		}
	}
}

// describeRLS is what TestQuotaModeAsThePeer compares of an answer: the
// overall code and each status's code, limit, remaining and reset, in
// whole seconds, moved by skew (both count the same minute, but the two
// answers of a step may fall either side of a second's end).
func describeRLS(r *rlsv3.RateLimitResponse, skew ...int64) string {
	var b strings.Builder
	b.WriteString(r.GetOverallCode().String())
	for _, s := range r.GetStatuses() {
		b.WriteString(" [" + s.GetCode().String())
		if l := s.GetCurrentLimit(); l != nil {
			b.WriteString(" " + strings.TrimSpace(l.String()))
		}
		b.WriteString(" remaining=" + strconv.FormatUint(uint64(s.GetLimitRemaining()), 10))
		if d := s.GetDurationUntilReset(); d != nil {
			sec := d.GetSeconds()
			for _, k := range skew {
				sec += k
			}
			b.WriteString(" reset=" + strconv.FormatInt(sec, 10))
		}
		b.WriteString("]")
	}
	return b.String()
}
