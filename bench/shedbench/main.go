// Command shedbench shows load shedding under overload: an upstream of a
// fixed pool of workers (whose latency grows with its concurrency once the
// workers are busy) is offered three times its capacity through
// `admit proxy`, in three runs of the same load: no shedding, a fixed
// concurrency limit, and the adaptive one. Requests are 10 % critical
// (X-Priority from a trusted proxy), 60 % default and 30 % sheddable, sent
// open-loop (at a fixed rate, whatever the answers), each given up after
// a client timeout.
//
//	cd bench && go run ./shedbench -workers 10 -work 20ms -duration 10s
//
// It reports goodput (answers 200 within the timeout, per second) against
// the upstream's capacity, the p99 of admitted requests against the
// unloaded p99, and what each class got. Everything listens on 127.0.0.1;
// the proxies it starts are stopped by PID, and it ends after 3 runs.
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

func main() {
	workers := flag.Int("workers", 10, "the upstream's workers")
	work := flag.Duration("work", 20*time.Millisecond, "the time a worker takes per request")
	overload := flag.Float64("overload", 3, "offered load, in multiples of the upstream's capacity")
	duration := flag.Duration("duration", 10*time.Second, "length of each run")
	timeout := flag.Duration("timeout", 2*time.Second, "the client's timeout")
	flag.Parse()
	if err := run(*workers, *work, *overload, *duration, *timeout); err != nil {
		fmt.Fprintln(os.Stderr, "shedbench:", err)
		os.Exit(1)
	}
}

// upstream serves with a fixed pool of workers: a request waits for one,
// then holds it for work.
func upstream(workers int, work time.Duration) (string, func(), error) {
	pool := make(chan struct{}, workers)
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case pool <- struct{}{}:
		case <-r.Context().Done():
			return
		}
		time.Sleep(work)
		<-pool
		_, _ = io.WriteString(w, "ok")
	})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, err
	}
	hs := &http.Server{Handler: h}
	go func() { _ = hs.Serve(ln) }()
	return "http://" + ln.Addr().String(), func() { _ = hs.Close() }, nil
}

const baseConfig = `version: 1
server:
  trusted_proxies: ["127.0.0.1/32"]
store:
  backend: memory
global:
  - {name: everything, scope: global, algorithm: token_bucket, rate: 1000000/s, burst: 1000000}
`

// shedding configurations, by run.
var runs = []struct{ name, shedding string }{
	{"no shedding", ""},
	{"fixed limit", `shedding:
  - name: upstream
    algorithm: aimd
    initial_limit: WORKERS
    min_limit: WORKERS
    max_limit: WORKERS
    classes: {header: X-Priority}
`},
	{"adaptive", `shedding:
  - name: upstream
    classes: {header: X-Priority}
`},
}

// proxy starts `admit proxy` with a shedding section in front of up.
func proxy(bin, dir, up, shedding string, workers int) (string, func(), error) {
	cfg := filepath.Join(dir, "admit-"+strconv.Itoa(len(shedding))+".yaml")
	shedding = strings.ReplaceAll(shedding, "WORKERS", strconv.Itoa(workers))
	if err := os.WriteFile(cfg, []byte(baseConfig+shedding), 0o644); err != nil {
		return "", nil, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, err
	}
	addr := ln.Addr().String()
	ln.Close()
	cmd := exec.Command(bin, "proxy", "--upstream", up, "--listen", addr, "--config", cfg, "--keys-optional", "--data-dir", dir)
	cmd.Stderr = io.Discard
	if err := cmd.Start(); err != nil {
		return "", nil, err
	}
	stop := func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }
	for deadline := time.Now().Add(20 * time.Second); ; {
		if resp, err := http.Get("http://" + addr + "/ready-check"); err == nil {
			resp.Body.Close()
			return "http://" + addr, stop, nil
		}
		if time.Now().After(deadline) {
			stop()
			return "", nil, errors.New("admit proxy did not start")
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// outcome is one run's result.
type outcome struct {
	ok, shed, timedOut, other [3]int64
	lat                       []time.Duration
	elapsed                   time.Duration
}

var classNames = [3]string{"critical", "default", "sheddable"}

// classOf spreads the classes: 10 % critical, 60 % default, 30 % sheddable.
func classOf(i int) int {
	switch i % 10 {
	case 0:
		return 0
	case 1, 2, 3:
		return 2
	}
	return 1
}

// load sends rate requests a second for d, open-loop.
func load(url string, rate float64, d, timeout time.Duration) *outcome {
	client := &http.Client{Timeout: timeout, Transport: &http.Transport{MaxIdleConnsPerHost: 4096, MaxConnsPerHost: 0}}
	o := &outcome{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	gap := time.Duration(float64(time.Second) / rate)
	start := time.Now()
	for i := 0; ; i++ {
		at := start.Add(time.Duration(i) * gap)
		if at.Sub(start) >= d {
			break
		}
		time.Sleep(time.Until(at))
		c := classOf(i)
		wg.Add(1)
		go func() {
			defer wg.Done()
			req, _ := http.NewRequest("GET", url+"/work", nil)
			req.Header.Set("X-Priority", classNames[c])
			t0 := time.Now()
			resp, err := client.Do(req)
			took := time.Since(t0)
			var ne net.Error
			switch {
			case err != nil && errors.As(err, &ne) && ne.Timeout():
				atomic.AddInt64(&o.timedOut[c], 1)
				return
			case err != nil:
				atomic.AddInt64(&o.other[c], 1)
				return
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			switch resp.StatusCode {
			case http.StatusOK:
				atomic.AddInt64(&o.ok[c], 1)
				mu.Lock()
				o.lat = append(o.lat, took)
				mu.Unlock()
			case http.StatusServiceUnavailable:
				atomic.AddInt64(&o.shed[c], 1)
			default:
				atomic.AddInt64(&o.other[c], 1)
			}
		}()
	}
	wg.Wait()
	o.elapsed = d
	slices.Sort(o.lat)
	return o
}

func (o *outcome) p(q float64) time.Duration {
	if len(o.lat) == 0 {
		return 0
	}
	return o.lat[int(float64(len(o.lat)-1)*q)]
}

func run(workers int, work time.Duration, overload float64, d, timeout time.Duration) error {
	dir, err := os.MkdirTemp("", "shedbench-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	bin := filepath.Join(dir, "admit")
	build := exec.Command("go", "build", "-o", bin, "./cmd/admit")
	build.Dir = ".." // the command's own module, whose go.sum has its dependencies
	if out, err := build.CombinedOutput(); err != nil {
		return fmt.Errorf("building admit: %v: %s", err, out)
	}
	up, stopUp, err := upstream(workers, work)
	if err != nil {
		return err
	}
	defer stopUp()
	capacity := float64(workers) / work.Seconds()
	fmt.Printf("shedbench: upstream of %d workers × %v = %.0f requests/s; offered %.1f× (%.0f/s) for %v; client timeout %v\n",
		workers, work, capacity, overload, overload*capacity, d, timeout)

	// Unloaded: a tenth of capacity through the proxy without shedding.
	p0, stop0, err := proxy(bin, dir, up, "", workers)
	if err != nil {
		return err
	}
	unloaded := load(p0, capacity/10, d/2, timeout)
	stop0()
	fmt.Printf("unloaded (%.0f/s): p50 %v, p99 %v\n\n", capacity/10, unloaded.p(0.5).Round(time.Microsecond), unloaded.p(0.99).Round(time.Microsecond))

	fmt.Printf("%-12s %10s %9s %10s %10s %9s %10s %10s %10s\n", "run", "goodput/s", "of cap", "p50", "p99", "p99÷unl", "critical", "default", "sheddable")
	for _, r := range runs {
		url, stop, err := proxy(bin, dir, up, r.shedding, workers)
		if err != nil {
			return err
		}
		o := load(url, overload*capacity, d, timeout)
		stop()
		good := float64(o.ok[0]+o.ok[1]+o.ok[2]) / d.Seconds()
		share := func(c int) string {
			all := o.ok[c] + o.shed[c] + o.timedOut[c] + o.other[c]
			return fmt.Sprintf("%.1f%%", 100*float64(o.ok[c])/float64(max(all, 1)))
		}
		fmt.Printf("%-12s %10.0f %8.0f%% %10v %10v %9.2f %10s %10s %10s\n", r.name, good, 100*good/capacity,
			o.p(0.5).Round(time.Millisecond), o.p(0.99).Round(time.Millisecond), float64(o.p(0.99))/float64(unloaded.p(0.99)),
			share(0), share(1), share(2))
		fmt.Printf("%-12s shed %v, timed out %v, other %v (critical, default, sheddable)\n", "", o.shed, o.timedOut, o.other)
	}
	fmt.Println("\ncolumns critical/default/sheddable: the share of each class answered 200 within the timeout")
	return nil
}
