// Command rlqsbench measures what a fleet of Envoys costs `admit serve`
// when it limits them through the quota service (RLQS), against what the
// same limits cost through the rate limit service (RLS), one request a
// call: the server's CPU (utime + stime from /proc) and, with -store
// redis, redis-server's, per decision.
//
//	cd bench && go run ./rlqsbench -duration 5s -rounds 3
//	cd bench && go run ./rlqsbench -store redis -duration 5s -rounds 3
//
// Both paths decide the same catalog: 100 tenants, each limited to 1000/s
// (burst 1000) on action read. RLS: -callers callers over -conns
// connections ask ShouldRateLimit for a tenant's request as fast as the
// server answers. RLQS: -envoys streams, each holding a bucket of every
// tenant, report all their buckets every -every (far more often than
// Envoy's 5 s, to measure the cost of a report) and read the answers.
// An Envoy decides its requests itself; what the server spends is per
// report, so the decisions a fleet sustains per server CPU second are
// the decisions between two reports (Envoy's 5 s at the request rate of
// a bucket, -rate) over the CPU of one bucket's report. The rounds of
// the two alternate. Everything listens on 127.0.0.1; processes started
// here are stopped by PID.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/admitdev/admit/bench/procs"
	rlext "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
)

const tenants = 100

func main() {
	callers := flag.Int("callers", 64, "RLS: concurrent callers")
	conns := flag.Int("conns", 4, "RLS: gRPC connections the callers share")
	envoys := flag.Int("envoys", 50, "RLQS: streams, each with a bucket of every tenant")
	every := flag.Duration("every", 200*time.Millisecond, "RLQS: interval between an Envoy's reports")
	rate := flag.Float64("rate", 100, "requests a second an Envoy's bucket decides, for the decisions a report stands for")
	duration := flag.Duration("duration", 5*time.Second, "length of one measured round")
	rounds := flag.Int("rounds", 3, "rounds of each path, alternating")
	storeName := flag.String("store", "memory", "memory, or redis (a redis-server started here)")
	flag.Parse()
	if err := run(*callers, *conns, *envoys, *every, *rate, *duration, *rounds, *storeName); err != nil {
		fmt.Fprintln(os.Stderr, "rlqsbench:", err)
		os.Exit(1)
	}
}

func run(callers, conns, envoys int, every time.Duration, rate float64, duration time.Duration, rounds int, storeName string) error {
	dir, err := os.MkdirTemp("", "rlqsbench")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	bin := filepath.Join(dir, "admit")
	b := exec.Command("go", "build", "-o", bin, "./cmd/admit")
	b.Dir = ".."
	if out, err := b.CombinedOutput(); err != nil {
		return fmt.Errorf("building admit: %v: %s", err, out)
	}
	cfg := filepath.Join(dir, "admit.yaml")
	var conf strings.Builder
	conf.WriteString("version: 1\nstore:\n  redis: {timeout: 2s}\ntiers:\n  pro:\n    rules:\n      - {name: reads, scope: tenant, actions: [read], algorithm: token_bucket, rate: 1000/s, burst: 1000}\ntenants:\n")
	for i := range tenants {
		fmt.Fprintf(&conf, "  t%d: {tier: pro}\n", i)
	}
	if err := os.WriteFile(cfg, []byte(conf.String()), 0o644); err != nil {
		return err
	}
	args := []string{"serve", "--config", cfg, "--http", "127.0.0.1:0", "--grpc", "127.0.0.1:0", "--data-dir", filepath.Join(dir, "data")}
	var redis *procs.Proc
	if storeName == "redis" {
		port, err := procs.FreePort()
		if err != nil {
			return err
		}
		redis, err = procs.Start("redis", nil, "redis-server", "--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no")
		if err != nil {
			return err
		}
		defer redis.Stop()
		time.Sleep(300 * time.Millisecond)
		args = append(args, "--store", "redis://127.0.0.1:"+strconv.Itoa(port))
	}
	admit, err := procs.Start("admit", nil, bin, args...)
	if err != nil {
		return err
	}
	defer admit.Stop()
	addr, err := grpcAddr(admit, 10*time.Second)
	if err != nil {
		return err
	}

	fl, err := startFleet(addr, envoys, every)
	if err != nil {
		return err
	}
	defer fl.stop()
	time.Sleep(2 * every) // every bucket subscribed
	rls := func() (int64, error) { return runRLS(addr, callers, conns, duration) }
	rlqs := func() (int64, error) { return fl.run(duration) }
	type sample struct{ server, redis float64 } // µs of CPU per unit
	var rlsS, rlqsS []sample
	measure := func(f func() (int64, error)) (sample, int64, error) {
		c0, err := admit.CPU()
		r0 := time.Duration(0)
		if redis != nil {
			r0, _ = redis.CPU()
		}
		if err != nil {
			return sample{}, 0, err
		}
		n, err := f()
		if err != nil {
			return sample{}, 0, err
		}
		c1, _ := admit.CPU()
		s := sample{server: float64((c1 - c0).Microseconds()) / float64(max(n, 1))}
		if redis != nil {
			r1, _ := redis.CPU()
			s.redis = float64((r1 - r0).Microseconds()) / float64(max(n, 1))
		}
		return s, n, nil
	}
	for r := range rounds {
		s, n, err := measure(rls)
		if err != nil {
			return err
		}
		rlsS = append(rlsS, s)
		fmt.Printf("round %d RLS:  %d decisions, %.1f µs server CPU each, %.1f µs redis\n", r+1, n, s.server, s.redis)
		s, n, err = measure(rlqs)
		if err != nil {
			return err
		}
		rlqsS = append(rlqsS, s)
		fmt.Printf("round %d RLQS: %d bucket reports, %.1f µs server CPU each, %.1f µs redis\n", r+1, n, s.server, s.redis)
	}
	med := func(ss []sample, f func(sample) float64) float64 {
		v := make([]float64, len(ss))
		for i, s := range ss {
			v[i] = f(s)
		}
		slices.Sort(v)
		return v[len(v)/2]
	}
	server := func(s sample) float64 { return s.server }
	rd := func(s sample) float64 { return s.redis }
	rlsCPU, rlqsCPU := med(rlsS, server), med(rlqsS, server)
	perReport := rate * 5 // decisions between two of Envoy's reports
	fmt.Printf("\nstore %s, medians of %d rounds:\n", storeName, rounds)
	fmt.Printf("RLS:  %.1f µs server CPU per decision: %.0f decisions per server CPU second\n", rlsCPU, 1e6/rlsCPU)
	fmt.Printf("RLQS: %.1f µs server CPU per bucket report; at %g requests/s a bucket and a report every 5 s, %.0f decisions per server CPU second (%.0f× RLS)\n",
		rlqsCPU, rate, perReport*1e6/rlqsCPU, perReport*rlsCPU/rlqsCPU)
	if redis != nil {
		rlsR, rlqsR := med(rlsS, rd), med(rlqsS, rd)
		fmt.Printf("redis-server: %.1f µs per RLS decision, %.1f µs per RLQS bucket report (%.0f× fewer per decision)\n", rlsR, rlqsR, perReport*rlsR/max(rlqsR, 0.001))
	}
	return nil
}

// runRLS asks ShouldRateLimit for duration and returns the calls answered.
func runRLS(addr string, callers, conns int, duration time.Duration) (int64, error) {
	cs := make([]rlsv3.RateLimitServiceClient, conns)
	for i := range cs {
		c, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			return 0, err
		}
		defer c.Close()
		cs[i] = rlsv3.NewRateLimitServiceClient(c)
	}
	ctx, cancel := context.WithTimeout(context.Background(), duration)
	defer cancel()
	var n atomic.Int64
	var failed atomic.Pointer[error]
	var wg sync.WaitGroup
	for i := range callers {
		wg.Go(func() {
			c := cs[i%conns]
			for k := i; ctx.Err() == nil; k += callers {
				req := &rlsv3.RateLimitRequest{Domain: "admit", Descriptors: []*rlext.RateLimitDescriptor{{Entries: []*rlext.RateLimitDescriptor_Entry{
					{Key: "tenant", Value: "t" + strconv.Itoa(k%tenants)}, {Key: "action", Value: "read"}}}}}
				if _, err := c.ShouldRateLimit(ctx, req); err != nil {
					// The round's end may reach a call before ctx says so.
					if ctx.Err() == nil && status.Code(err) != codes.DeadlineExceeded {
						failed.Store(&err)
					}
					return
				}
				n.Add(1)
			}
		})
	}
	wg.Wait()
	if e := failed.Load(); e != nil {
		return 0, *e
	}
	return n.Load(), nil
}

// fleet is envoys streams, each holding a bucket of every tenant, kept
// open across rounds (each new stream would be new holders of every
// limit), reporting every interval while on.
type fleet struct {
	on   atomic.Bool
	sent atomic.Int64
	stop func()
}

func startFleet(addr string, envoys int, every time.Duration) (*fleet, error) {
	// A connection holds 8 quota streams at most.
	var conns []*grpc.ClientConn
	for range (envoys + 7) / 8 {
		c, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			return nil, err
		}
		conns = append(conns, c)
	}
	ctx, cancel := context.WithCancel(context.Background())
	f := &fleet{}
	var wg sync.WaitGroup
	f.stop = func() {
		cancel()
		wg.Wait()
		for _, c := range conns {
			c.Close()
		}
	}
	for e := range envoys {
		s, err := rlqsv3.NewRateLimitQuotaServiceClient(conns[e/8]).StreamRateLimitQuotas(ctx)
		if err != nil {
			f.stop()
			return nil, err
		}
		// Answers are read apart: a bucket waiting for its share is
		// answered nothing.
		wg.Go(func() {
			for {
				if _, err := s.Recv(); err != nil {
					return
				}
			}
		})
		wg.Go(func() {
			tick := time.NewTicker(every)
			defer tick.Stop()
			for subscribed := false; ; {
				select {
				case <-tick.C:
				case <-ctx.Done():
					return
				}
				if !f.on.Load() && subscribed {
					continue
				}
				m := &rlqsv3.RateLimitQuotaUsageReports{Domain: "web"}
				for t := range tenants {
					m.BucketQuotaUsages = append(m.BucketQuotaUsages, &rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{
						BucketId:    &rlqsv3.BucketId{Bucket: map[string]string{"tenant": "t" + strconv.Itoa(t), "action": "read"}},
						TimeElapsed: durationpb.New(every.Truncate(time.Second)), NumRequestsAllowed: uint64(10 + e%7), NumRequestsDenied: uint64(e % 3),
					})
				}
				if err := s.Send(m); err != nil {
					return
				}
				if f.on.Load() {
					f.sent.Add(tenants)
				}
				subscribed = true
			}
		})
	}
	return f, nil
}

// run reports for duration and returns the bucket reports sent.
func (f *fleet) run(duration time.Duration) (int64, error) {
	n0 := f.sent.Load()
	f.on.Store(true)
	time.Sleep(duration)
	f.on.Store(false)
	return f.sent.Load() - n0, nil
}

// grpcAddr waits for admit serve to log the address it serves gRPC on.
func grpcAddr(p *procs.Proc, wait time.Duration) (string, error) {
	re := regexp.MustCompile(`grpc=(127\.0\.0\.1:\d+)`)
	deadline := time.Now().Add(wait)
	for time.Now().Before(deadline) {
		b, _ := os.ReadFile(p.Log)
		if m := re.FindSubmatch(b); m != nil {
			return string(m[1]), nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	b, _ := os.ReadFile(p.Log)
	return "", fmt.Errorf("admit serve did not start: %s", b)
}
