package redisstore_test

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/admitdev/admit"
	"github.com/admitdev/admit/redisstore"
	"github.com/admitdev/admit/redistest"
	"github.com/admitdev/admit/storetest"
)

// TestRedisOutage kills redis-server under load and starts it again: no
// panic; while it is down every decision is answered — with an
// unavailable error — within about twice the timeout (the breaker answers
// at once); once it is back, decisions succeed again within a second.
func TestRedisOutage(t *testing.T) {
	srv := redistest.Start(t)
	const timeout = 100 * time.Millisecond
	s, err := redisstore.Open(context.Background(), "redis://"+srv.Addr, &redisstore.Options{
		Timeout: timeout, BreakerFailures: 3, BreakerCooldown: 200 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	rule := &admit.Rule{Name: "r", Algorithm: admit.TokenBucket, Rate: admit.PerSecond(1_000_000), Burst: 1000}
	charges := []admit.Charge{{Key: admit.Key{Scope: "tenant", Tenant: "t", Rule: "r"}.String(), Rule: rule, Cost: 1}}

	var (
		phase      atomic.Int32 // 0 up, 1 down, 2 back
		mu         sync.Mutex
		slowest    [3]time.Duration
		ok, failed [3]atomic.Int64
		wrongErr   atomic.Value
		backOKAt   atomic.Int64
	)
	restarted := make(chan time.Time, 1)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var d admit.Decision
			for {
				select {
				case <-stop:
					return
				default:
				}
				p := phase.Load()
				start := time.Now()
				err := s.Decide(context.Background(), charges, &d)
				took := time.Since(start)
				mu.Lock()
				slowest[p] = max(slowest[p], took)
				mu.Unlock()
				if err == nil {
					ok[p].Add(1)
					if p == 2 {
						backOKAt.CompareAndSwap(0, time.Now().UnixNano())
					}
					continue
				}
				failed[p].Add(1)
				if admit.ErrorCode(err) != admit.CodeUnavailable {
					wrongErr.Store(err)
				}
				time.Sleep(time.Millisecond)
			}
		}()
	}
	time.Sleep(300 * time.Millisecond)
	phase.Store(1)
	srv.Kill()
	time.Sleep(time.Second)
	srv.Restart(t)
	phase.Store(2)
	restarted <- time.Now()
	time.Sleep(1500 * time.Millisecond)
	close(stop)
	wg.Wait()

	at := <-restarted
	t.Logf("up: %d ok; down: %d failed, %d ok, slowest %v; back: %d ok, %d failed, first ok %v after restart",
		ok[0].Load(), failed[1].Load(), ok[1].Load(), slowest[1], ok[2].Load(), failed[2].Load(), time.Duration(backOKAt.Load()-at.UnixNano()))
	if err, _ := wrongErr.Load().(error); err != nil {
		t.Errorf("a failure was not CodeUnavailable: %v", err)
	}
	if ok[0].Load() == 0 || failed[1].Load() == 0 {
		t.Fatalf("the load did not run through the outage")
	}
	// Calls already in flight when the server died may wait up to the
	// timeout; reconnecting adds a dial; allow twice the timeout and a margin
	// for this noisy machine's scheduler.
	if slowest[1] > 2*timeout+150*time.Millisecond {
		t.Errorf("a decision took %v while Redis was down; want about 2 × %v at most", slowest[1], timeout)
	}
	if backOKAt.Load() == 0 || time.Duration(backOKAt.Load()-at.UnixNano()) > time.Second {
		t.Errorf("decisions did not succeed within 1s of Redis coming back")
	}
	if h := s.Health(); h.Breaker != "closed" || h.Failures == 0 {
		t.Errorf("health after recovery %+v, want a closed breaker and counted failures", h)
	}
}

func TestBreakerOpensAndCloses(t *testing.T) {
	srv := redistest.Start(t)
	s, err := redisstore.Open(context.Background(), "redis://"+srv.Addr, &redisstore.Options{
		Timeout: 50 * time.Millisecond, BreakerFailures: 2, BreakerCooldown: 300 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	rule := &admit.Rule{Name: "r", Algorithm: admit.GCRA, Rate: admit.PerSecond(100), Burst: 10}
	c := admit.Charge{Key: "k", Rule: rule, Cost: 1}
	ctx := context.Background()
	srv.Kill()
	for range 2 {
		if _, err := storetest.Check(ctx, s, c); admit.ErrorCode(err) != admit.CodeUnavailable {
			t.Fatalf("with Redis down: %v", err)
		}
	}
	if h := s.Health(); h.Breaker != "open" {
		t.Fatalf("breaker %s after 2 failures, want open", h.Breaker)
	}
	// An open breaker answers without calling Redis.
	calls := s.Health().Calls
	if _, err = storetest.Check(ctx, s, c); admit.ErrorCode(err) != admit.CodeUnavailable || s.Health().Calls != calls {
		t.Fatalf("an open breaker: %v, %d calls made (want none)", err, s.Health().Calls-calls)
	}
	// Redis returns: the breaker's probe closes it with no decision made.
	srv.Restart(t)
	deadline := time.Now().Add(5 * time.Second)
	for s.Health().Breaker != "closed" {
		if time.Now().After(deadline) {
			t.Fatalf("breaker still %s 5s after Redis came back", s.Health().Breaker)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if s.Health().Calls != calls {
		t.Fatalf("%d decisions were sent to close the breaker; the probe should have", s.Health().Calls-calls)
	}
	// The restarted server has no library; loading it is not what the
	// 50 ms timeout of this test's decisions is for (the store loads it
	// by itself, within the decision's timeout, on a machine less busy).
	if err := s.LoadFunctions(ctx); err != nil {
		t.Fatal(err)
	}
	// The first call on a connection the restart broke may fail, as a
	// call during the outage did (the store makes it again): one failure
	// leaves the breaker closed, and the next call is Redis's.
	if _, err := storetest.Check(ctx, s, c); err != nil {
		if _, err := storetest.Check(ctx, s, c); err != nil {
			t.Fatalf("after the breaker closed, twice: %v", err)
		}
	}
	if h := s.Health(); h.Breaker != "closed" {
		t.Fatalf("breaker %s after a success, want closed", h.Breaker)
	}
}

// TestDialLazyTopology: a Sentinel or Cluster store dialed before its
// deployment runs fails its calls as unavailable (and has no client), then
// decides once the deployment answers; a store closed before that leaves
// nothing running.
func TestDialLazyTopology(t *testing.T) {
	rule := &admit.Rule{Name: "r", Algorithm: admit.TokenBucket, Rate: admit.PerSecond(1), Burst: 2}
	charges := []admit.Charge{{Key: admit.Key{Scope: "tenant", Tenant: "t", Rule: "r"}.String(), Rule: rule, Cost: 1}}
	for _, topology := range []string{"sentinel", "cluster"} {
		t.Run(topology, func(t *testing.T) {
			t.Parallel()
			var cfg redisstore.Config
			var start func()
			switch topology {
			case "sentinel":
				master := redistest.Start(t)
				sentinels := redistest.UnstartedSentinels(t, master, "m", 1)
				cfg = redisstore.Config{Mode: redisstore.Sentinel, MasterName: "m", Addrs: []string{sentinels[0].Addr}}
				start = func() { sentinels[0].Restart(t) }
			case "cluster":
				nodes := redistest.UnstartedCluster(t, 3)
				cfg = redisstore.Config{Mode: redisstore.Cluster, Addrs: []string{nodes[0].Addr, nodes[1].Addr}}
				start = func() { redistest.StartNodes(t, nodes) }
			}
			abandoned, err := redisstore.DialLazy(cfg, nil)
			if err != nil {
				t.Fatal(err)
			}
			abandoned.Close()
			s, err := redisstore.DialLazy(cfg, &redisstore.Options{Timeout: time.Second})
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			ctx := context.Background()
			var d admit.Decision
			if err := s.Decide(ctx, charges, &d); admit.ErrorCode(err) != admit.CodeUnavailable {
				t.Fatalf("deciding before the deployment runs: %v, want unavailable", err)
			}
			if err := s.Ping(ctx); admit.ErrorCode(err) != admit.CodeUnavailable {
				t.Fatalf("ping before the deployment runs: %v, want unavailable", err)
			}
			if s.Client() != nil {
				t.Fatal("a client before the deployment runs")
			}
			if got := s.String(); got != "redis ("+topology+")" {
				t.Errorf("String() = %q", got)
			}
			start()
			deadline := time.Now().Add(5 * time.Second)
			for s.Ping(ctx) != nil {
				if time.Now().After(deadline) {
					t.Fatal("not connected 5s after the deployment started")
				}
				time.Sleep(20 * time.Millisecond)
			}
			var admitted []bool
			for range 3 {
				if err := s.Decide(ctx, charges, &d); err != nil {
					t.Fatal(err) // one failure before: the breaker is closed
				}
				admitted = append(admitted, d.Allowed)
			}
			if !slices.Equal(admitted, []bool{true, true, false}) {
				t.Errorf("decisions once connected: %v, want the burst of 2 then a refusal", admitted)
			}
		})
	}
}
