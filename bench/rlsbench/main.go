// Command rlsbench measures Admit's Envoy rate limit service against a
// do-nothing RateLimitService on the same gRPC stack (the ceiling): in one
// run, in alternating rounds, driven by the same callers over the same
// connections. Each request carries two descriptors, the way Envoy
// configurations usually limit a tenant and its users: (tenant) and
// (tenant, user), over 10,000 users in 100 tenants, decided against an
// envoyproxy/ratelimit YAML configuration (or, with -mode catalog, against
// Admit's own tenants: global, tenant and user buckets).
//
//	cd bench && go run ./rlsbench -callers 64 -duration 3s -rounds 3
//	cd bench && go run ./rlsbench -store redis -callers 64 -duration 3s -rounds 3
//
// With -store redis it starts its own redis-server on a free loopback port
// and stops it by PID at the end. Everything listens on 127.0.0.1 only; the
// run stops by itself after rounds × 2 × duration.
package main

import (
	"context"
	"flag"
	"fmt"
	"net"
	"os"
	"os/exec"
	"runtime/pprof"
	"strconv"
	"sync/atomic"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/admitdev/admit"
	"github.com/admitdev/admit/bench/load"
	"github.com/admitdev/admit/envoyrls"
	"github.com/admitdev/admit/memstore"
	"github.com/admitdev/admit/policy"
	"github.com/admitdev/admit/policy/catalog"
	"github.com/admitdev/admit/redisstore"
)

func main() {
	callers := flag.Int("callers", 64, "concurrent callers")
	conns := flag.Int("conns", 4, "gRPC connections the callers share (Envoy keeps one per worker)")
	duration := flag.Duration("duration", 3*time.Second, "length of one measured round")
	rounds := flag.Int("rounds", 3, "rounds of each target, alternating")
	storeName := flag.String("store", "memory", "memory, or redis (a redis-server started here)")
	mode := flag.String("mode", "yaml", "yaml (an envoyproxy/ratelimit configuration) or catalog (Admit's tenants and rules)")
	cpuprofile := flag.String("cpuprofile", "", "write a CPU profile of the whole run to this file")
	flag.Parse()
	if *cpuprofile != "" {
		f, err := os.Create(*cpuprofile)
		if err == nil {
			err = pprof.StartCPUProfile(f)
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "rlsbench:", err)
			os.Exit(1)
		}
		defer pprof.StopCPUProfile()
	}
	if err := run(*callers, *conns, *duration, *rounds, *storeName, *mode); err != nil {
		fmt.Fprintln(os.Stderr, "rlsbench:", err)
		pprof.StopCPUProfile()
		os.Exit(1)
	}
}

// nothing answers OK to every descriptor without looking: the ceiling.
type nothing struct {
	rlsv3.UnimplementedRateLimitServiceServer
}

func (nothing) ShouldRateLimit(_ context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	resp := &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK}
	for range req.Descriptors {
		resp.Statuses = append(resp.Statuses, &rlsv3.RateLimitResponse_DescriptorStatus{Code: rlsv3.RateLimitResponse_OK})
	}
	return resp, nil
}

func serve(register func(*grpc.Server)) (string, func(), error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, err
	}
	g := grpc.NewServer(envoyrls.ServerOptions()...)
	register(g)
	go func() { _ = g.Serve(ln) }()
	return ln.Addr().String(), g.Stop, nil
}

func openStore(name string) (admit.Store, func(), error) {
	if name == "memory" {
		m := memstore.New(nil)
		return m, func() { m.Close() }, nil
	}
	if name != "redis" {
		return nil, nil, fmt.Errorf("-store %q: want memory or redis", name)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, nil, err
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	cmd := exec.Command("redis-server", "--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no")
	if err := cmd.Start(); err != nil {
		return nil, nil, fmt.Errorf("redis-server: %w", err)
	}
	kill := func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }
	addr := "127.0.0.1:" + strconv.Itoa(port)
	var st *redisstore.Store
	for deadline := time.Now().Add(10 * time.Second); ; {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		st, err = redisstore.Dial(ctx, redisstore.Config{Mode: redisstore.Standalone, Addrs: []string{addr}}, &redisstore.Options{Timeout: time.Second})
		cancel()
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			kill()
			return nil, nil, err
		}
		time.Sleep(50 * time.Millisecond)
	}
	return st, func() { st.Close(); kill() }, nil
}

func run(callers, conns int, d time.Duration, rounds int, storeName, mode string) error {
	store, closeStore, err := openStore(storeName)
	if err != nil {
		return err
	}
	defer closeStore()
	cfg, err := envoyrls.Parse(envoyrls.File{Name: "bench.yaml", Data: []byte(load.RLSConfig)})
	if err != nil {
		return err
	}
	cat, err := catalog.New(context.Background(), load.Spec(load.RLSTenants, nil), nil)
	if err != nil {
		return err
	}
	dec := policy.NewDecider(store, 1)
	defer dec.Close()
	svc, err := envoyrls.New(envoyrls.Options{Decider: dec, Policy: cat.Policy, Config: cfg})
	if err != nil {
		return err
	}
	admitAddr, stopAdmit, err := serve(func(g *grpc.Server) { rlsv3.RegisterRateLimitServiceServer(g, svc) })
	if err != nil {
		return err
	}
	defer stopAdmit()
	ceilAddr, stopCeil, err := serve(func(g *grpc.Server) { rlsv3.RegisterRateLimitServiceServer(g, nothing{}) })
	if err != nil {
		return err
	}
	defer stopCeil()

	domain := "bench"
	if mode == "catalog" {
		domain = envoyrls.DefaultCatalogDomain
	}
	reqs := load.RLSRequests(domain, mode == "catalog")

	target := func(name, addr string) (load.Target, func(), error) {
		clients := make([]rlsv3.RateLimitServiceClient, conns)
		var closers []func()
		for i := range clients {
			cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
			if err != nil {
				return load.Target{}, nil, err
			}
			closers = append(closers, func() { cc.Close() })
			clients[i] = rlsv3.NewRateLimitServiceClient(cc)
		}
		closeAll := func() {
			for _, c := range closers {
				c()
			}
		}
		return load.Target{Name: name, Run: func() load.HTTPResult {
			var okN, over, failed atomic.Int64
			res := load.Run(callers, d, func(i int) bool {
				resp, err := clients[i%conns].ShouldRateLimit(context.Background(), reqs[i%len(reqs)])
				switch {
				case err != nil:
					failed.Add(1)
					return false
				case resp.OverallCode == rlsv3.RateLimitResponse_OK:
					okN.Add(1)
				default:
					over.Add(1)
				}
				return true
			})
			return load.HTTPResult{Result: res, OK: okN.Load(), Refused: over.Load(), Failed: failed.Load()}
		}}, closeAll, nil
	}
	ta, closeA, err := target("admit", admitAddr)
	if err != nil {
		return err
	}
	defer closeA()
	tc, closeC, err := target("do-nothing", ceilAddr)
	if err != nil {
		return err
	}
	defer closeC()
	fmt.Printf("rlsbench: %d callers over %d connections, %d tenants, %d users, store %s, mode %s, %d rounds of %v\n",
		callers, conns, load.RLSTenants, load.RLSUsers, storeName, mode, rounds, d)
	med := load.Rounds(rounds, []load.Target{tc, ta})
	fmt.Printf("median requests/s: admit %.0f, do-nothing %.0f: ratio %.2f\n", med["admit"], med["do-nothing"], med["admit"]/med["do-nothing"])
	return nil
}
