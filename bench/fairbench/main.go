// Command fairbench measures how `admit serve` divides the limits every
// tenant shares, through the binary as a platform runs it: a redis-server
// and two admit serve processes on it, ten tenants of equal weight sending
// HTTP requests for -duration per scenario, in real time.
//
//   - bucket: a global token bucket of 1,000/s (burst 1,000); one tenant
//     offering 100× its share (10,000 checks/s), or the anonymous callers
//     (from 50 addresses, named by a trusted proxy) at 100×, the nine others
//     at half theirs (50/s each); then all ten at twice theirs (200/s).
//   - acquire: the same with /v1/acquire waiters (max_wait_ms 1000).
//   - concurrency: a global limit of 100 slots, each lease held 500 ms; one
//     tenant wanting 1,000 slots, the nine others 5; then all ten 20.
//
// Each scenario reports what every tenant was offered and got, and checks
// the promise of docs/security.md ("Shared limits"): the light tenants get
// at least 95 % of what they ask, the limit is used to at least 95 %, all
// over their share get their share within 10 %, and nothing passes the
// limit. Requests alternate between the two servers.
//
//	cd bench && go run ./fairbench -duration 60s
//
// Everything listens on 127.0.0.1; the processes it starts are stopped by
// PID when it ends.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/admitdev/admit/bench/procs"
)

const config = `version: 1
server:
  service_tokens: ["bench-service"]
  trusted_proxies: ["127.0.0.1/32"]
store:
  on_error: closed
defaults:
  unknown_tenant: deny
  anonymous_weight: 1
global:
  - {name: global-requests, scope: global, actions: [request], algorithm: token_bucket, rate: 1000/s, burst: 1000}
  - {name: global-slots, scope: global, actions: [export], algorithm: concurrency, max: 100, lease_ttl: 30s}
tiers:
  t: {weight: 1}
tenants:
`

func main() {
	duration := flag.Duration("duration", 60*time.Second, "length of each scenario")
	only := flag.String("only", "", "run the scenarios whose names contain this")
	flag.Parse()
	if err := run(*duration, *only); err != nil {
		fmt.Fprintln(os.Stderr, "fairbench:", err)
		os.Exit(1)
	}
}

// client holds enough connections for acquire's waiters: each holds one
// for up to max_wait_ms (the file limit here is 20,000).
var client = &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 4000, MaxConnsPerHost: 4000}, Timeout: 10 * time.Second}

func run(d time.Duration, only string) error {
	dir, err := os.MkdirTemp("", "fairbench-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	bin := filepath.Join(dir, "admit")
	build := exec.Command("go", "build", "-o", bin, "./cmd/admit")
	build.Dir = ".." // the main module, with its own go.sum
	if out, err := build.CombinedOutput(); err != nil {
		return fmt.Errorf("building admit: %v: %s", err, out)
	}
	cfg := config
	for i := range 10 {
		cfg += fmt.Sprintf("  tenant-%d: {tier: t}\n", i)
	}
	cfgFile := filepath.Join(dir, "admit.yaml")
	if err := os.WriteFile(cfgFile, []byte(cfg), 0o644); err != nil {
		return err
	}
	rport, err := procs.FreePort()
	if err != nil {
		return err
	}
	redis, err := procs.Start("redis", nil, "redis-server", "--port", strconv.Itoa(rport), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no")
	if err != nil {
		return err
	}
	defer redis.Stop()
	var servers []string
	for i := range 2 {
		hp, _ := procs.FreePort()
		gp, _ := procs.FreePort()
		p, err := procs.Start(fmt.Sprintf("serve%d", i), nil, bin, "serve", "--config", cfgFile, "--store", fmt.Sprintf("redis://127.0.0.1:%d", rport),
			"--http", fmt.Sprintf("127.0.0.1:%d", hp), "--grpc", fmt.Sprintf("127.0.0.1:%d", gp), "--data-dir", filepath.Join(dir, fmt.Sprint("data", i)))
		if err != nil {
			return err
		}
		defer p.Stop()
		url := fmt.Sprintf("http://127.0.0.1:%d", hp)
		if err := ready(url, p); err != nil {
			return err
		}
		servers = append(servers, url)
	}
	fmt.Printf("fairbench: two admit serve on one redis-server, %v a scenario, %s\n", d, time.Now().UTC().Format(time.RFC3339))
	failed := 0
	for _, sc := range scenarios() {
		if only != "" && !strings.Contains(sc.name, only) {
			continue
		}
		r := sc.run(servers, d)
		fmt.Println(r.text)
		if !r.ok {
			failed++
		}
		time.Sleep(2 * time.Second) // the shared limits' epochs pass: the next scenario starts afresh
	}
	if failed > 0 {
		return fmt.Errorf("%d scenarios missed their targets", failed)
	}
	return nil
}

func ready(url string, p *procs.Proc) error {
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		if resp, err := client.Get(url + "/readyz"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return nil
			}
		}
	}
	return fmt.Errorf("%s does not answer at %s (log: %s)", p.Name, url, p.Log)
}

// load is one tenant's offered load.
type load struct {
	tenant string // "" for the anonymous callers
	rate   float64
	hold   int
	greedy bool
}

type scenario struct {
	name  string
	kind  string // check, acquire, slots
	loads []load
}

func scenarios() []scenario {
	// ten returns ten loads of light (rate or slots) each, the first
	// greedy (at greedy) when greedy is set, and the anonymous callers'
	// when anon is.
	ten := func(light, greedy float64, anon bool) []load {
		ls := make([]load, 10)
		for i := range ls {
			ls[i] = load{tenant: fmt.Sprintf("tenant-%d", i), rate: light, hold: int(light)}
		}
		if greedy > 0 {
			ls[0].rate, ls[0].hold, ls[0].greedy = greedy, int(greedy), true
		}
		if anon {
			ls[0].tenant = ""
		}
		return ls
	}
	return []scenario{
		{"bucket/one_at_100x", "check", ten(50, 10000, false)},
		{"bucket/anonymous_at_100x", "check", ten(50, 10000, true)},
		{"bucket/all_at_2x", "check", ten(200, 0, false)},
		{"acquire/one_at_100x", "acquire", ten(50, 10000, false)},
		{"acquire/all_at_2x", "acquire", ten(200, 0, false)},
		{"concurrency/one_at_100x", "slots", ten(5, 1000, false)},
		{"concurrency/anonymous_at_100x", "slots", ten(5, 1000, true)},
		{"concurrency/all_at_2x", "slots", ten(20, 0, false)},
	}
}

type result struct {
	text string
	ok   bool
}

// call sends one request as tenant's caller (through the service token
// for a tenant, as an anonymous client of address addr behind the trusted
// proxy otherwise) and returns its status and body.
func call(method, url, tenant, addr, body string) (int, []byte) {
	req, _ := http.NewRequest(method, url, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	if tenant != "" {
		req.Header.Set("Authorization", "Bearer bench-service")
	} else {
		req.Header.Set("X-Forwarded-For", addr)
	}
	resp, err := client.Do(req)
	if err != nil {
		return 0, nil
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}

func (sc scenario) run(servers []string, d time.Duration) result {
	n := len(sc.loads)
	offered := make([]atomic.Int64, n)
	admitted := make([]atomic.Int64, n)
	dropped := make([]atomic.Int64, n)
	errs := atomic.Int64{}
	var turn atomic.Uint64
	server := func() string { return servers[turn.Add(1)%uint64(len(servers))] }
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	start := time.Now()
	var wg sync.WaitGroup
	var heldSum []atomic.Int64
	var held []atomic.Int64
	var samples atomic.Int64
	switch sc.kind {
	case "check", "acquire":
		for i, l := range sc.loads {
			// Open loop: requests at the load's rate, whatever the
			// answers; a request that finds no free worker is dropped and
			// counted as not offered.
			workers := min(int(l.rate/10)+8, 400)
			if sc.kind == "acquire" {
				// A waiter holds a worker for up to a second.
				workers = min(int(l.rate*1.5)+8, 6000)
			}
			jobs := make(chan int, workers)
			for range workers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for k := range jobs {
						if ctx.Err() != nil {
							dropped[i].Add(1) // queued past the end: not sent
							continue
						}
						body := fmt.Sprintf(`{"tenant":%q,"action":"request"}`, l.tenant)
						path := "/v1/check"
						if sc.kind == "acquire" {
							body = fmt.Sprintf(`{"tenant":%q,"action":"request","max_wait_ms":1000}`, l.tenant)
							path = "/v1/acquire"
						}
						addr := fmt.Sprintf("203.0.113.%d", k%50)
						code, _ := call("POST", server()+path, l.tenant, addr, body)
						switch code {
						case 200:
							admitted[i].Add(1)
						case 429:
						default:
							errs.Add(1)
						}
					}
				}()
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer close(jobs)
				period := time.Duration(float64(time.Second) / l.rate)
				t := time.NewTicker(min(period, 10*time.Millisecond))
				defer t.Stop()
				due := 0.0
				last := time.Now()
				for k := 0; ; {
					select {
					case <-ctx.Done():
						return
					case now := <-t.C:
						due += now.Sub(last).Seconds() * l.rate
						last = now
						for ; due >= 1; due-- {
							offered[i].Add(1)
							select {
							case jobs <- k:
							default:
								dropped[i].Add(1)
							}
							k++
						}
					}
				}
			}()
		}
	case "slots":
		held = make([]atomic.Int64, n)
		heldSum = make([]atomic.Int64, n)
		for i, l := range sc.loads {
			// A tenant keeps asking while it holds fewer than it wants;
			// each slot it gets it holds 500 ms, then releases.
			for w := range min(l.hold, 80) {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for ctx.Err() == nil {
						if int(held[i].Load()) >= l.hold {
							time.Sleep(5 * time.Millisecond)
							continue
						}
						srv := server()
						offered[i].Add(1)
						code, body := call("POST", srv+"/v1/leases", l.tenant, fmt.Sprintf("203.0.113.%d", w), fmt.Sprintf(`{"tenant":%q,"resource":"export","ttl_ms":30000}`, l.tenant))
						if code != 201 {
							if code != 429 {
								errs.Add(1)
							}
							time.Sleep(10 * time.Millisecond)
							continue
						}
						admitted[i].Add(1)
						var a struct {
							ID string `json:"lease_id"`
						}
						_ = json.Unmarshal(body, &a)
						held[i].Add(1)
						time.Sleep(500 * time.Millisecond)
						held[i].Add(-1)
						call("DELETE", srv+"/v1/leases/"+a.ID, l.tenant, fmt.Sprintf("203.0.113.%d", w), "")
					}
				}()
			}
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			t := time.NewTicker(10 * time.Millisecond)
			defer t.Stop()
			for {
				select {
				case <-ctx.Done():
					return
				case <-t.C:
					if time.Since(start) < 2*time.Second {
						continue // the tenants get there
					}
					for i := range held {
						heldSum[i].Add(held[i].Load())
					}
					samples.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	var b strings.Builder
	fmt.Fprintf(&b, "\n%s (%v)\n", sc.name, elapsed.Round(time.Millisecond))
	ok := errs.Load() == 0
	total := int64(0)
	greedy := sc.loads[0].greedy
	for i, l := range sc.loads {
		name := l.tenant
		if name == "" {
			name = "anonymous"
		}
		o, a, dr := offered[i].Load()-dropped[i].Load(), admitted[i].Load(), dropped[i].Load()
		total += a
		line := fmt.Sprintf("  %-10s offered %7d (%6.0f/s; %d not sent) admitted %7d (%5.1f %%)", name, o, float64(o)/elapsed.Seconds(), dr, a, 100*float64(a)/float64(max(o, 1)))
		if sc.kind == "slots" {
			mean := float64(heldSum[i].Load()) / float64(max(samples.Load(), 1))
			line = fmt.Sprintf("  %-10s wants %4d slots, held %6.2f on average (%d leases of %d asked)", name, l.hold, mean, a, o)
			switch {
			case greedy && i > 0 && mean < 0.95*float64(l.hold):
				line += "  << below 95 % of its demand"
				ok = false
			case !greedy && (mean < 9 || mean > 11):
				line += "  << not its share ±10 %"
				ok = false
			}
		} else {
			share := (1000*elapsed.Seconds() + 1000) / 10
			switch {
			case greedy && i > 0 && float64(a) < 0.95*float64(o):
				line += "  << below 95 % of its demand"
				ok = false
			case !greedy && (float64(a) < 0.9*share || float64(a) > 1.1*share):
				line += fmt.Sprintf("  << not its share (%.0f) ±10 %%", share)
				ok = false
			}
		}
		b.WriteString(line + "\n")
	}
	if sc.kind == "slots" {
		sum := 0.0
		for i := range heldSum {
			sum += float64(heldSum[i].Load()) / float64(max(samples.Load(), 1))
		}
		// The most the tenants may hold: the greedy one its share
		// ceiling (50, the default), the others what they want.
		most := 0.0
		for i, l := range sc.loads {
			if i == 0 && greedy {
				most += 50
			} else {
				most += float64(l.hold)
			}
		}
		most = min(most, 100)
		fmt.Fprintf(&b, "  slots held on average %.2f of 100; the ceiling lets %.0f be held (%.1f %%)", sum, most, 100*sum/most)
		if sum < 0.95*most {
			b.WriteString("  << below 95 %")
			ok = false
		}
	} else {
		bound := 1000*elapsed.Seconds() + 1000
		fmt.Fprintf(&b, "  admitted %d of the %.0f the limit allows (%.1f %%)", total, bound, 100*float64(total)/bound)
		if greedy && float64(total) < 0.95*bound {
			b.WriteString("  << below 95 %")
			ok = false
		}
		if float64(total) > bound+1000 { // the second's slack: elapsed counts from before the first request
			b.WriteString("  << past the limit")
			ok = false
		}
	}
	if e := errs.Load(); e > 0 {
		fmt.Fprintf(&b, "\n  %d answers were neither 200/201 nor 429", e)
	}
	return result{b.String(), ok}
}
