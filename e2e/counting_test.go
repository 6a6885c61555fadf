package e2e

import (
	"context"
	"os"
	"path/filepath"
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
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/admitdev/admit/redistest"
)

// TestRatelimitCountsAcrossProcesses: two admit ratelimit processes on one
// redis-server, counting as envoyproxy/ratelimit counts (its default),
// are hammered on one descriptor at once: exactly the limit's requests
// are admitted, every hit is counted, and Redis ran plain commands only —
// no function call, an INCRBY per hit at most (hits that meet in a
// pipeline are added together), and one PEXPIRE per process for the
// window's one key, which lives no longer than its window.
func TestRatelimitCountsAcrossProcesses(t *testing.T) {
	const limit, perProcess, callers = 300, 400, 8
	redis := redistest.Start(t)
	dir := hitsDomain(t, limit)
	var clients []rlsv3.RateLimitServiceClient
	for range 2 {
		clients = append(clients, startRatelimit(t, dir, redis.Addr))
	}
	ask := func(c rlsv3.RateLimitServiceClient, hits uint64) *rlsv3.RateLimitResponse { return askHits(t, c, hits) }
	notLastMinute()
	admitted := hitAll(t, clients, callers, perProcess)
	if t.Failed() {
		return
	}
	if got := admitted[0] + admitted[1]; got != limit {
		t.Errorf("admitted %d of %d hits on a limit of %d: want exactly the limit", got, 2*perProcess, limit)
	}
	if r := ask(clients[0], 0); r.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT || r.Statuses[0].LimitRemaining != 0 {
		t.Errorf("a check after %d hits: %v", 2*perProcess, r)
	}
	stats := commandStats(t, redis.Addr)
	t.Logf("Redis ran, for %d hits: %v", 2*perProcess, stats)
	if stats["fcall"] != 0 || stats["incrby"] == 0 || stats["incrby"] > 2*perProcess || stats["pexpire"] < 1 || stats["pexpire"] > 4 {
		t.Errorf("Redis ran %v for %d hits on one key from two processes: want no fcall, at most one incrby per hit, a pexpire per process (twice when its pipelines cross)", stats, 2*perProcess)
	}
	n, err := redistest.Command(redis.Addr, "DBSIZE")
	if err != nil {
		t.Fatal(err)
	}
	key, err := redistest.Command(redis.Addr, "RANDOMKEY")
	if err != nil || n != "1" || !strings.HasPrefix(key, "admit:#") || len(key) != len("admit:#")+22 {
		t.Fatalf("%s keys, one of them %q (%v): want one counted key, admit:# and 22 characters", n, key, err)
	}
	ttl, err := redistest.Command(redis.Addr, "PTTL", key)
	if ms, _ := strconv.ParseInt(strings.TrimSpace(ttl), 10, 64); err != nil || ms <= 0 || ms > int64((time.Hour+2*time.Second)/time.Millisecond) {
		t.Errorf("the key's PTTL is %q (%v): want at most the window and 2 s", ttl, err)
	}
}

// hitsDomain writes envoyproxy/ratelimit's runtime directory for domain
// hits, whose descriptor user admits limit hits an hour, puts admit first
// in PATH, and returns the directory (RUNTIME_ROOT is its runtime, with
// RUNTIME_SUBDIRECTORY ratelimit).
func hitsDomain(t *testing.T, limit int) string {
	t.Helper()
	dir := t.TempDir()
	conf := filepath.Join(dir, "runtime", "ratelimit", "config")
	if err := os.MkdirAll(conf, 0o755); err != nil {
		t.Fatal(err)
	}
	file := "domain: hits\ndescriptors:\n  - {key: user, rate_limit: {unit: hour, requests_per_unit: " + strconv.Itoa(limit) + "}}\n"
	if err := os.WriteFile(filepath.Join(conf, "hits.yaml"), []byte(file), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", filepath.Dir(admitBinary(t))+string(os.PathListSeparator)+os.Getenv("PATH"))
	return dir
}

// startRatelimit runs `admit ratelimit` on the runtime directory dir (see
// hitsDomain) and the Redis at addr, with env added, and returns a client
// of its gRPC service.
func startRatelimit(t *testing.T, dir, addr string, env ...string) rlsv3.RateLimitServiceClient {
	t.Helper()
	port := freePort(t, "127.0.0.1")
	startProcess(t, "127.0.0.1:"+port, append([]string{
		"USE_STATSD=false", "LOG_LEVEL=warn", "REDIS_URL=" + addr,
		"RUNTIME_ROOT=" + filepath.Join(dir, "runtime"), "RUNTIME_SUBDIRECTORY=ratelimit",
		"HOST=127.0.0.1", "PORT=" + freePort(t, "127.0.0.1"), "GRPC_HOST=127.0.0.1", "GRPC_PORT=" + port,
	}, env...), "admit", "ratelimit")
	conn, err := grpc.NewClient("127.0.0.1:"+port, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return rlsv3.NewRateLimitServiceClient(conn)
}

// askHits asks c for hits on domain hits, user u1; nil (the test failed)
// if the call does.
func askHits(t *testing.T, c rlsv3.RateLimitServiceClient, hits uint64) *rlsv3.RateLimitResponse {
	d := &rlv3.RateLimitDescriptor{Entries: []*rlv3.RateLimitDescriptor_Entry{{Key: "user", Value: "u1"}}, HitsAddend: wrapperspb.UInt64(hits)}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	r, err := c.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "hits", Descriptors: []*rlv3.RateLimitDescriptor{d}})
	if err != nil {
		t.Error(err)
		return nil
	}
	return r
}

// hitAll has callers goroutines per client each send a share of hits
// hits of 1 (askHits) at once, and returns how many each client answered
// OK.
func hitAll(t *testing.T, clients []rlsv3.RateLimitServiceClient, callers, hits int) []int64 {
	ok := make([]atomic.Int64, len(clients))
	var wg sync.WaitGroup
	for i, c := range clients {
		for range callers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range hits / callers {
					if r := askHits(t, c, 1); r != nil && r.OverallCode == rlsv3.RateLimitResponse_OK {
						ok[i].Add(1)
					}
				}
			}()
		}
	}
	wg.Wait()
	out := make([]int64, len(clients))
	for i := range ok {
		out[i] = ok[i].Load()
	}
	return out
}

// notLastMinute waits out the hour's last minute, so that a test counting
// in an hour's window does not cross into the next.
func notLastMinute() {
	if left := time.Hour - time.Duration(time.Now().UnixNano())%time.Hour; left < time.Minute {
		time.Sleep(left + 100*time.Millisecond)
	}
}

// commandStats returns how many times the Redis at addr ran each command.
func commandStats(t *testing.T, addr string) map[string]int64 {
	t.Helper()
	calls, err := redistest.CommandCalls(addr)
	if err != nil {
		t.Fatal(err)
	}
	return calls
}
