package bench

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/go-redis/redis_rate/v10"
	goredis "github.com/redis/go-redis/v9"
	"github.com/redis/rueidis"

	"github.com/admitdev/admit"
	"github.com/admitdev/admit/bench/load"
	"github.com/admitdev/admit/internal/redishook"
	"github.com/admitdev/admit/redisstore"
	"github.com/admitdev/admit/redistest"
)

// TestRedisReport measures the Redis store against go-redis/redis_rate and
// against redis-benchmark running the same script (the ceiling), on one
// redis-server it starts, at 1, 16 and 64 callers, for 1-scope and 3-scope
// decisions; and the script through rueidis and through go-redis, which is
// how the client was chosen. It prints the tables docs/benchmarks.md holds.
// It runs only when asked: ADMIT_REDIS_BENCH=1 (make bench-redis).
func TestRedisReport(t *testing.T) {
	if os.Getenv("ADMIT_REDIS_BENCH") == "" {
		t.Skip("a measurement, not a test: run with ADMIT_REDIS_BENCH=1 (make bench-redis)")
	}
	d := 2 * time.Second
	if v := os.Getenv("ADMIT_REDIS_BENCH_DURATION"); v != "" {
		d, _ = time.ParseDuration(v)
	}
	rounds := 3
	srv := redistest.Start(t)
	ctx := context.Background()
	store, err := redisstore.Open(ctx, "redis://"+srv.Addr, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	gr := goredis.NewClient(&goredis.Options{Addr: srv.Addr, PoolSize: 128})
	defer gr.Close()
	limiter := redis_rate.NewLimiter(gr)

	user := &admit.Rule{Name: "user", Algorithm: admit.TokenBucket, Rate: admit.PerSecond(100), Burst: 100}
	tenant := &admit.Rule{Name: "tenant", Algorithm: admit.TokenBucket, Rate: admit.PerSecond(1_000_000), Burst: 100_000}
	global := &admit.Rule{Name: "global", Algorithm: admit.TokenBucket, Rate: admit.PerSecond(10_000_000), Burst: 1_000_000}
	const users, tenants = 10000, 100
	charges := func(u, scopes int) []admit.Charge {
		tn := "tenant-" + strconv.Itoa(u%tenants)
		c := []admit.Charge{{Key: admit.Key{Scope: "user", Tenant: tn, Subject: "user-" + strconv.Itoa(u), Rule: "user"}.String(), Rule: user, Cost: 1}}
		if scopes == 3 {
			c = append(c,
				admit.Charge{Key: admit.Key{Scope: "tenant", Tenant: tn, Rule: "tenant"}.String(), Rule: tenant, Cost: 1},
				admit.Charge{Key: admit.Key{Scope: "global", Rule: "global"}.String(), Rule: global, Cost: 1})
		}
		return c
	}
	perSec := redis_rate.PerSecond(100)
	contenders := map[string]func(u, scopes int) error{
		"admit": func(u, scopes int) error {
			var dec admit.Decision
			return store.Decide(ctx, charges(u, scopes), &dec)
		},
		"redis_rate": func(u, scopes int) error {
			// redis_rate has no multi-key decision: one call per scope,
			// three round trips, and no all-or-nothing.
			tn := "tenant-" + strconv.Itoa(u%tenants)
			keys := []string{"user:" + tn + ":" + strconv.Itoa(u), "tenant:" + tn, "global"}
			for _, k := range keys[:scopes] {
				if _, err := limiter.Allow(ctx, k, perSec); err != nil {
					return err
				}
			}
			return nil
		},
	}

	fmt.Printf("redis-server %s, GOMAXPROCS=%s, %v per run, %d rounds, medians\n\n", serverVersion(srv.Addr), os.Getenv("GOMAXPROCS"), d, rounds)
	fmt.Println("| scopes | callers | admit decisions/s | p50 | p99 | Redis µs/decision | decisions/call | redis_rate decisions/s | p50 | p99 | Redis µs/decision | admit ÷ redis_rate |")
	fmt.Println("|---|---|---|---|---|---|---|---|---|---|---|---|")
	for _, scopes := range []int{1, 3} {
		for _, callers := range []int{1, 16, 64} {
			runs := map[string][]measure{}
			for range rounds {
				for _, name := range []string{"admit", "redis_rate"} {
					runs[name] = append(runs[name], measureLoad(srv.Addr, callers, d, func(i int) error { return contenders[name](i%users, scopes) }))
				}
			}
			a, r := median(runs["admit"]), median(runs["redis_rate"])
			fmt.Printf("| %d | %d | %.0f | %v | %v | %.1f | %.1f | %.0f | %v | %v | %.1f | %.2f |\n", scopes, callers,
				a.rate, a.p50, a.p99, a.cpu, a.batch, r.rate, r.p50, r.p99, r.cpu, a.rate/r.rate)
		}
	}

	// The client: the same script call through rueidis (auto-pipelining)
	// and through go-redis (a connection per call in flight).
	// A decision through the store loads the function if it is missing.
	var first admit.Decision
	if err := store.Decide(ctx, charges(0, 1), &first); err != nil {
		t.Fatal(err)
	}
	rc, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{srv.Addr}, ForceSingleClient: true, DisableCache: true})
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	fmt.Println("\n| callers | rueidis calls/s | p99 | go-redis calls/s | p99 | rueidis ÷ go-redis |")
	fmt.Println("|---|---|---|---|---|---|")
	for _, callers := range []int{1, 16, 64} {
		runs := map[string][]measure{}
		for range rounds {
			runs["rueidis"] = append(runs["rueidis"], measureLoad(srv.Addr, callers, d, func(i int) error {
				keys, args := redishook.Command(store, charges(i%users, 1))
				return rc.Do(ctx, rc.B().Fcall().Function(redishook.FunctionName).Numkeys(int64(len(keys))).Key(keys...).Arg(args...).Build()).Error()
			}))
			runs["go-redis"] = append(runs["go-redis"], measureLoad(srv.Addr, callers, d, func(i int) error {
				keys, args := redishook.Command(store, charges(i%users, 1))
				a := make([]any, len(args))
				for j := range args {
					a[j] = args[j]
				}
				return gr.FCall(ctx, redishook.FunctionName, keys, a...).Err()
			}))
		}
		a, b := median(runs["rueidis"]), median(runs["go-redis"])
		fmt.Printf("| %d | %.0f | %v | %.0f | %v | %.2f |\n", callers, a.rate, a.p99, b.rate, b.p99, a.rate/b.rate)
	}

	// The ceiling: redis-benchmark's own FCALL rate, same function and
	// arguments, keys spread over 10,000 users.
	fmt.Println("\n| scopes | callers | redis-benchmark FCALL/s |")
	fmt.Println("|---|---|---|")
	for _, scopes := range []int{1, 3} {
		keys, args := redishook.Command(store, charges(7, scopes))
		keys[0] = "admit:{bench}user:__rand_int__"
		for _, callers := range []int{1, 16, 64} {
			cmd := append([]string{"-h", "127.0.0.1", "-p", strconv.Itoa(srv.Port), "-c", strconv.Itoa(callers), "-n", strconv.Itoa(min(20000*callers, 400000)), "-r", "10000", "-q",
				"FCALL", redishook.FunctionName, strconv.Itoa(len(keys))}, keys...)
			cmd = append(cmd, args...)
			var rates []float64
			for range rounds {
				out, err := exec.Command("redis-benchmark", cmd...).CombinedOutput()
				if err != nil {
					t.Fatalf("redis-benchmark: %v\n%s", err, out)
				}
				m := regexp.MustCompile(`([0-9.]+) requests per second`).FindStringSubmatch(string(out))
				if m == nil {
					t.Fatalf("redis-benchmark said %s", out)
				}
				r, _ := strconv.ParseFloat(m[1], 64)
				rates = append(rates, r)
			}
			slices.Sort(rates)
			fmt.Printf("| %d | %d | %.0f |\n", scopes, callers, rates[len(rates)/2])
		}
	}
}

type measure struct {
	rate     float64
	p50, p99 time.Duration
	cpu      float64 // Redis CPU µs per decision, from INFO commandstats
	batch    float64 // decisions per script call
}

func median(ms []measure) measure {
	slices.SortFunc(ms, func(a, b measure) int { return int(a.rate - b.rate) })
	return ms[len(ms)/2]
}

func measureLoad(addr string, callers int, d time.Duration, op func(i int) error) measure {
	_, _ = redistest.Command(addr, "CONFIG", "RESETSTAT")
	r := load.Run(callers, d, func(i int) bool {
		if err := op(i); err != nil {
			panic(err)
		}
		return true
	})
	m := measure{rate: r.Rate(), p50: r.Pct(0.5).Round(time.Microsecond), p99: r.Pct(0.99).Round(time.Microsecond)}
	if calls, usec, err := redistest.ScriptStats(addr); err == nil && len(r.Lat) > 0 && calls > 0 {
		m.cpu = usec / float64(len(r.Lat))
		m.batch = float64(len(r.Lat)) / float64(calls)
	}
	return m
}

func serverVersion(addr string) string {
	info, _ := redistest.Command(addr, "INFO", "server")
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(line, "redis_version:"); ok {
			return strings.TrimSpace(v)
		}
	}
	return "?"
}
