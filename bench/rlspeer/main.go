// Command rlspeer measures `admit serve`'s Envoy rate limit service against
// envoyproxy/ratelimit itself, side by side: both built here as programs
// (the peer from the Go module proxy at a pinned version), both run as
// processes on the same redis-server with the same YAML configuration,
// driven by the same callers in alternating rounds. Each request carries
// two descriptors, (tenant) and (tenant, user), over 10,000 users in 100
// tenants: two fixed-window counters per request.
//
// For every round it reports decisions/s, p50 and p99, and the CPU each
// server process and redis-server spent per decision (utime + stime from
// /proc over the round), which do not depend on how many cores the machine
// has.
//
//	cd bench && go run ./rlspeer -callers 64 -duration 3s -rounds 3
//
// With -memory N it measures instead what a live key costs Redis: for
// each target in turn, on an emptied redis-server, N requests of N
// distinct users (hourly windows, so that none expires meanwhile), then
// redis-server's used_memory (INFO memory) grown, per key it holds.
//
//	cd bench && go run ./rlspeer -memory 1000000
//
// With -three it measures three targets in one run, each as its users run
// it: envoyproxy/ratelimit, admit ratelimit (run by envoyproxy/ratelimit's
// environment, counting each hit as it does) and admit serve (all or
// nothing), and with -memory N their memory per live counter after the
// rounds, in a domain of hourly windows of its own.
//
//	cd bench && go run ./rlspeer -three -rounds 5 -memory 300000
//
// Everything listens on 127.0.0.1; the processes it starts are stopped by
// PID when it ends, and it ends by itself after rounds × 3 × duration.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/admitdev/admit/bench/procs"

	rlext "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/admitdev/admit/bench/load"
)

// peer is envoyproxy/ratelimit's service command at the version the rest
// of the project tests against (its main branch of 2026-01-22; it tags no
// releases).
const peer = "github.com/envoyproxy/ratelimit/src/service_cmd@v1.4.1-0.20260122083618-3fb702589d36"

func main() {
	callers := flag.Int("callers", 64, "concurrent callers")
	conns := flag.Int("conns", 4, "gRPC connections per target the callers share (Envoy keeps one per worker)")
	duration := flag.Duration("duration", 3*time.Second, "length of one measured round")
	rounds := flag.Int("rounds", 3, "rounds of each target, alternating")
	charge := flag.String("charge", "all", "Admit's charging mode for the domain: all (its default) or each (envoyproxy/ratelimit's); ignored with -three")
	three := flag.Bool("three", false, "measure three targets in one run: envoyproxy/ratelimit, admit ratelimit (its defaults: charge each) and admit serve (charge all); with -memory N, the memory per live counter of each too, after the rounds")
	distribution := flag.String("distribution", "exact", "Admit's distribution of both limits: exact (its default) or leased (allowances)")
	users := flag.Int("users", load.RLSUsers, "users the requests spread over (at most 10,000): fewer make hotter keys")
	memory := flag.Int("memory", 0, "measure Redis memory per live key over this many distinct users instead")
	flag.Parse()
	if *distribution != "exact" && *distribution != "leased" {
		fmt.Fprintln(os.Stderr, "rlspeer: -distribution: want exact or leased")
		os.Exit(2)
	}
	if *users < 1 || *users > load.RLSUsers {
		fmt.Fprintln(os.Stderr, "rlspeer: -users: want 1 to 10000")
		os.Exit(2)
	}
	if *charge != "all" && *charge != "each" {
		fmt.Fprintln(os.Stderr, "rlspeer: -charge: want all or each")
		os.Exit(2)
	}
	if *memory < 0 || *memory > 10_000_000 {
		fmt.Fprintln(os.Stderr, "rlspeer: -memory: want 0 to 10000000")
		os.Exit(2)
	}
	if err := run(*callers, *conns, *duration, *rounds, *charge, *distribution, *users, *memory, *three); err != nil {
		fmt.Fprintln(os.Stderr, "rlspeer:", err)
		os.Exit(1)
	}
}

// admitLimits is the benchmark's configuration as Admit reads it: with
// distribution leased, both limits say so (Admit's extension).
func admitLimits(conf, distribution string) string {
	if distribution == "exact" {
		return conf
	}
	return strings.ReplaceAll(conf, "}", ", distribution: leased}")
}

// build makes both servers' programs in dir.
func build(dir string) (admitBin, peerBin string, err error) {
	admitBin = filepath.Join(dir, "admit")
	// Built in its own module (the parent directory), whose go.sum has
	// the command's dependencies.
	b := exec.Command("go", "build", "-o", admitBin, "./cmd/admit")
	b.Dir = ".."
	out, err := b.CombinedOutput()
	if err != nil {
		return "", "", fmt.Errorf("building admit: %v: %s", err, out)
	}
	install := exec.Command("go", "install", peer)
	install.Env = append(os.Environ(), "GOBIN="+dir, "GOFLAGS=-mod=mod")
	if out, err := install.CombinedOutput(); err != nil {
		return "", "", fmt.Errorf("building envoyproxy/ratelimit: %v: %s", err, out)
	}
	return admitBin, filepath.Join(dir, "service_cmd"), nil
}

// ready waits until a rate limit service answers at addr.
func ready(addr string, p *procs.Proc) error {
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer cc.Close()
	c := rlsv3.NewRateLimitServiceClient(cc)
	req := &rlsv3.RateLimitRequest{Domain: "bench", Descriptors: []*rlext.RateLimitDescriptor{{Entries: []*rlext.RateLimitDescriptor_Entry{{Key: "tenant", Value: "warm"}}}}}
	for deadline := time.Now().Add(20 * time.Second); ; {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_, err = c.ShouldRateLimit(ctx, req)
		cancel()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s does not answer at %s: %v (log: %s)", p.Name, addr, err, p.Log)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// row is one target's round.
type row struct {
	rate, serverUS, redisUS float64
	// Redis's commands per decision and their time (INFO commandstats);
	// a function's commands count in its FCALL's.
	calls, commandUS float64
	p50, p99         time.Duration
	failed           int64
}

func run(callers, conns int, d time.Duration, rounds int, charge, distribution string, users, memory int, three bool) error {
	dir, err := os.MkdirTemp("", "rlspeer-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	admitBin, peerBin, err := build(dir)
	if err != nil {
		return err
	}
	confDir := filepath.Join(dir, "runtime", "ratelimit", "config")
	if err := os.MkdirAll(confDir, 0o755); err != nil {
		return err
	}
	conf := load.RLSConfig
	if memory > 0 && !three {
		conf = strings.ReplaceAll(conf, "unit: second", "unit: hour")
	}
	// With -three, the memory phase counts in a domain of hourly windows
	// of its own, so that the servers of the rounds serve it too.
	memConf := strings.ReplaceAll(strings.ReplaceAll(load.RLSConfig, "unit: second", "unit: hour"), "domain: bench", "domain: "+memDomain)
	if err := os.WriteFile(filepath.Join(confDir, "bench.yaml"), []byte(conf), 0o644); err != nil {
		return err
	}
	if three {
		if err := os.WriteFile(filepath.Join(confDir, "benchmem.yaml"), []byte(memConf), 0o644); err != nil {
			return err
		}
	}
	// Admit reads the same file, but for its charge: line, which the
	// peer would refuse.
	admitConf := filepath.Join(dir, "admit-config")
	if err := os.MkdirAll(admitConf, 0o755); err != nil {
		return err
	}
	if three {
		charge = "all"
		if err := os.WriteFile(filepath.Join(admitConf, "benchmem.yaml"), []byte("charge: all\n"+admitLimits(memConf, distribution)), 0o644); err != nil {
			return err
		}
	}
	if err := os.WriteFile(filepath.Join(admitConf, "bench.yaml"), []byte("charge: "+charge+"\n"+admitLimits(conf, distribution)), 0o644); err != nil {
		return err
	}

	var ports [8]int
	for i := range ports {
		if ports[i], err = procs.FreePort(); err != nil {
			return err
		}
	}
	redisAddr := "127.0.0.1:" + strconv.Itoa(ports[0])
	redis, err := procs.Start("redis", nil, "redis-server", "--port", strconv.Itoa(ports[0]), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no")
	if err != nil {
		return err
	}
	defer redis.Stop()
	// envoyproxy/ratelimit exits when Redis does not answer at start.
	for deadline := time.Now().Add(10 * time.Second); ; {
		c, err := net.DialTimeout("tcp", redisAddr, time.Second)
		if err == nil {
			c.Close()
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("redis-server: %w", err)
		}
		time.Sleep(20 * time.Millisecond)
	}

	upstream, err := procs.Start("envoyproxy-ratelimit", []string{
		"USE_STATSD=false", "LOG_LEVEL=error", "BACKEND_TYPE=redis", "REDIS_SOCKET_TYPE=tcp", "REDIS_URL=" + redisAddr,
		"RUNTIME_ROOT=" + filepath.Join(dir, "runtime"), "RUNTIME_SUBDIRECTORY=ratelimit", "RUNTIME_WATCH_ROOT=false",
		"HOST=127.0.0.1", "PORT=" + strconv.Itoa(ports[1]), "GRPC_HOST=127.0.0.1", "GRPC_PORT=" + strconv.Itoa(ports[2]),
		"DEBUG_HOST=127.0.0.1", "DEBUG_PORT=" + strconv.Itoa(ports[3]),
	}, peerBin)
	if err != nil {
		return err
	}
	defer upstream.Stop()
	upstreamAddr := "127.0.0.1:" + strconv.Itoa(ports[2])

	admit, err := procs.Start("admit", []string{"ADMIT_ADMIN_TOKEN=rlspeer"}, admitBin, "serve",
		"--store", "redis://"+redisAddr, "--envoy-config", admitConf, "--data-dir", filepath.Join(dir, "data"),
		"--http", "127.0.0.1:"+strconv.Itoa(ports[4]), "--grpc", "127.0.0.1:"+strconv.Itoa(ports[5]))
	if err != nil {
		return err
	}
	defer admit.Stop()
	admitAddr := "127.0.0.1:" + strconv.Itoa(ports[5])
	if err := errors.Join(ready(upstreamAddr, upstream), ready(admitAddr, admit)); err != nil {
		return err
	}

	targets := []target{{"envoyproxy/ratelimit", upstream, upstreamAddr}, {"admit", admit, admitAddr}}
	if three {
		// admit ratelimit, run as envoyproxy/ratelimit is run: its
		// environment, its runtime directory, its defaults.
		rl, err := procs.Start("admit-ratelimit", []string{
			"USE_STATSD=false", "LOG_LEVEL=error", "REDIS_URL=" + redisAddr, "ADMIT_DATA_DIR=" + filepath.Join(dir, "data-rl"),
			"RUNTIME_ROOT=" + filepath.Join(dir, "runtime"), "RUNTIME_SUBDIRECTORY=ratelimit",
			"HOST=127.0.0.1", "PORT=" + strconv.Itoa(ports[6]), "GRPC_HOST=127.0.0.1", "GRPC_PORT=" + strconv.Itoa(ports[7]),
		}, admitBin, "ratelimit")
		if err != nil {
			return err
		}
		defer rl.Stop()
		rlAddr := "127.0.0.1:" + strconv.Itoa(ports[7])
		if err := ready(rlAddr, rl); err != nil {
			return err
		}
		targets = []target{targets[0], {"admit ratelimit", rl, rlAddr}, {"admit serve", admit, admitAddr}}
	}
	if memory > 0 && !three {
		return measureMemory(redisAddr, "bench", targets, memory, callers)
	}
	reqs := load.RLSRequests("bench", false)[:users]
	measure := func(p *procs.Proc, addr string) (row, error) {
		clients := make([]rlsv3.RateLimitServiceClient, conns)
		for i := range clients {
			cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
			if err != nil {
				return row{}, err
			}
			defer cc.Close()
			clients[i] = rlsv3.NewRateLimitServiceClient(cc)
		}
		s0, err1 := p.CPU()
		r0, err2 := redis.CPU()
		cs0, err5 := commandStats(redisAddr)
		var failed atomic.Int64
		res := load.Run(callers, d, func(i int) bool {
			resp, err := clients[i%conns].ShouldRateLimit(context.Background(), reqs[i%len(reqs)])
			if err != nil || resp.OverallCode != rlsv3.RateLimitResponse_OK {
				failed.Add(1)
				return false
			}
			return true
		})
		s1, err3 := p.CPU()
		r1, err4 := redis.CPU()
		cs1, err6 := commandStats(redisAddr)
		if err := errors.Join(err1, err2, err3, err4, err5, err6); err != nil {
			return row{}, err
		}
		n := float64(len(res.Lat))
		calls, usec := commandsRun(cs0, cs1)
		return row{
			rate: res.Rate(), p50: res.Pct(0.50), p99: res.Pct(0.99), failed: failed.Load(),
			serverUS: float64((s1 - s0).Microseconds()) / n, redisUS: float64((r1 - r0).Microseconds()) / n,
			calls: float64(calls) / n, commandUS: float64(usec) / n,
		}, nil
	}

	mode := "Admit's charge: " + charge
	if three {
		mode = "admit ratelimit's charge: each, admit serve's: all"
	}
	fmt.Printf("rlspeer: %d callers over %d connections per target, %d tenants, %d users, 2 descriptors per request, %s, distribution: %s, %d rounds of %v, one redis-server\n",
		callers, conns, min(load.RLSTenants, users), users, mode, distribution, rounds, d)
	fmt.Printf("%-6s %-22s %12s %10s %10s %14s %14s %12s %12s %7s\n", "round", "target", "decisions/s", "p50", "p99", "server µs/dec", "redis µs/dec", "cmd µs/dec", "cmds/dec", "errors")
	all := map[string][]row{}
	for i := range rounds {
		for _, t := range targets {
			r, err := measure(t.p, t.addr)
			if err != nil {
				return err
			}
			all[t.name] = append(all[t.name], r)
			fmt.Printf("%-6d %-22s %12.0f %10v %10v %14.1f %14.1f %12.2f %12.3f %7d\n", i+1, t.name, r.rate,
				r.p50.Round(time.Microsecond), r.p99.Round(time.Microsecond), r.serverUS, r.redisUS, r.commandUS, r.calls, r.failed)
		}
	}
	median := func(name string, f func(row) float64) float64 {
		v := make([]float64, 0, rounds)
		for _, r := range all[name] {
			v = append(v, f(r))
		}
		slices.Sort(v)
		return v[len(v)/2]
	}
	fmt.Println("medians, and each ÷ envoyproxy/ratelimit's:")
	for _, m := range []struct {
		what string
		f    func(row) float64
	}{
		{"decisions/s", func(r row) float64 { return r.rate }},
		{"p50 µs", func(r row) float64 { return float64(r.p50.Microseconds()) }},
		{"p99 µs", func(r row) float64 { return float64(r.p99.Microseconds()) }},
		{"server CPU µs/decision", func(r row) float64 { return r.serverUS }},
		{"redis CPU µs/decision", func(r row) float64 { return r.redisUS }},
		{"redis command µs/dec.", func(r row) float64 { return r.commandUS }},
		{"redis commands/dec.", func(r row) float64 { return r.calls }},
	} {
		u := median("envoyproxy/ratelimit", m.f)
		line := fmt.Sprintf("  %-24s envoyproxy/ratelimit %10.1f", m.what, u)
		for _, t := range targets[1:] {
			a := median(t.name, m.f)
			line += fmt.Sprintf("  %s %10.1f (%.2f)", t.name, a, a/u)
		}
		fmt.Println(line)
	}
	if memory > 0 {
		fmt.Println()
		return measureMemory(redisAddr, memDomain, targets, memory, callers)
	}
	return nil
}

// memDomain is the domain of hourly windows -three's memory phase counts
// in.
const memDomain = "benchmem"

// target is a rate limit service measured.
type target struct {
	name string
	p    *procs.Proc
	addr string
}
