// Command redis shares one limit between two processes through Redis: a
// token bucket of 200 requests a second (bursts of 100) for tenant acme,
// hammered by both processes at once for two seconds. Together they never
// admit more than the bucket holds, burst + rate × elapsed, however their
// requests interleave: every decision is made in Redis, atomically.
//
//	redis-server --port 6379 &
//	go run ./examples/redis -redis redis://127.0.0.1:6379
//
// The only line that differs from a program on the memory store is the
// one that opens the store.
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/admitdev/admit"
	"github.com/admitdev/admit/redisstore"
)

const (
	rate, burst = 200, 100
	duration    = 2 * time.Second
)

func main() {
	url := flag.String("redis", "redis://127.0.0.1:6379", "the Redis both processes share")
	worker := flag.Bool("worker", false, "be one of the two processes (the command starts them)")
	flag.Parse()
	if *worker {
		n, err := hammer(*url)
		if err != nil {
			log.Fatal(err)
		}
		fmt.Println(n)
		return
	}
	if _, err := run(*url, os.Args[0]); err != nil {
		log.Fatal(err)
	}
}

// run starts two workers, self with -worker, reports what they admitted
// together against the bound, and returns what each admitted.
func run(url, self string) ([2]int, error) {
	start := time.Now()
	var per [2]int
	outs := make([][]byte, 2)
	errs := make([]error, 2)
	var wg sync.WaitGroup
	for i := range outs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			outs[i], errs[i] = exec.Command(self, "-worker", "-redis", url).Output()
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	total := 0
	for i, out := range outs {
		if errs[i] != nil {
			var stderr []byte
			if e, ok := errs[i].(*exec.ExitError); ok {
				stderr = e.Stderr
			}
			return per, fmt.Errorf("worker %d: %v: %s", i+1, errs[i], stderr)
		}
		n, err := strconv.Atoi(strings.TrimSpace(string(out)))
		if err != nil {
			return per, fmt.Errorf("worker %d said %q", i+1, out)
		}
		fmt.Printf("process %d admitted %d\n", i+1, n)
		per[i] = n
		total += n
	}
	bound := burst + int(rate*elapsed/time.Second)
	fmt.Printf("together %d in %v; the bucket holds at most %d\n", total, elapsed.Round(time.Millisecond), bound)
	if total > bound {
		return per, fmt.Errorf("admitted %d, more than %d", total, bound)
	}
	return per, nil
}

// hammer asks for the tenant's requests from 8 goroutines for duration,
// and returns how many were admitted. A decision the store could not make
// in time (a loaded machine, Redis away) admits nothing: it is counted on
// stderr, and the hammering goes on.
func hammer(url string) (int64, error) {
	ctx := context.Background()
	store, err := redisstore.Open(ctx, url, nil) // memstore.New(nil) for one process
	if err != nil {
		return 0, err
	}
	defer store.Close()
	limiter, err := admit.NewLimiter(store, admit.Bucket("api", admit.PerSecond(rate), burst).Per(admit.PerTenant))
	if err != nil {
		return 0, err
	}
	var admitted, failed atomic.Int64
	deadline := time.Now().Add(duration)
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var d admit.Decision
			for time.Now().Before(deadline) {
				if err := limiter.Decide(ctx, admit.Who{Tenant: "acme"}, 1, &d); err != nil {
					failed.Add(1)
					continue
				}
				if d.Allowed {
					admitted.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	if n := failed.Load(); n > 0 {
		fmt.Fprintf(os.Stderr, "%d decisions failed\n", n)
	}
	return admitted.Load(), nil
}
