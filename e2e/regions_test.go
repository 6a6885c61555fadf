package e2e

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	toxiproxy "github.com/Shopify/toxiproxy/v2/client"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/admitdev/admit/redistest"
)

// The regions suite: a home redis-server, three regions each with its own
// redis-server and `admit serve` processes, and Toxiproxy between every
// region and the home (40 ms each way, with jitter), as three regions
// around the world would be. One clock, the test's, times every request:
// an admission happened between its request's sending and its answer.

// regionsRate and regionsBurst are the limit the regions share
// (TestBenchRegions takes another rate from ADMIT_BENCH_RATE).
var regionsRate = 400.0

const regionsBurst = 200

const regionsConfig = `version: 1
store:
  backend: redis
  on_error: closed
  redis:
    timeout: 2s
tiers:
  plan:
    rules:
      - {name: plan, scope: tenant, algorithm: token_bucket, rate: RATE/s, burst: BURST}
tenants:
  acme: {tier: plan}
`

var (
	toxiOnce sync.Once
	toxiBin  string
	toxiErr  error
)

// toxiproxyServer builds Toxiproxy's server once (from the module proxy,
// github.com/Shopify/toxiproxy/v2) and runs it on a free loopback port.
func toxiproxyServer(t *testing.T) *toxiproxy.Client {
	t.Helper()
	toxiOnce.Do(func() {
		dir, err := os.MkdirTemp("", "toxiproxy")
		if err != nil {
			toxiErr = err
			return
		}
		toxiBin = filepath.Join(dir, "toxiproxy-server")
		out, err := exec.Command("go", "build", "-o", toxiBin, "github.com/Shopify/toxiproxy/v2/cmd/server").CombinedOutput()
		if err != nil {
			toxiErr = fmt.Errorf("go build toxiproxy: %v\n%s", err, out)
		}
	})
	if toxiErr != nil {
		t.Fatal(toxiErr)
	}
	port := freePort(t, "127.0.0.1")
	cmd := exec.Command(toxiBin, "-host", "127.0.0.1", "-port", port)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	addr := net.JoinHostPort("127.0.0.1", port)
	for deadline := time.Now().Add(10 * time.Second); ; {
		c, err := net.Dial("tcp", addr)
		if err == nil {
			c.Close()
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("toxiproxy did not listen on %s", addr)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return toxiproxy.NewClient(addr)
}

// regionsDeployment is the home, the regions and their links.
type regionsDeployment struct {
	t       *testing.T
	cfg     string
	home    *redistest.Server
	regions []*regionProcs
}

// regionProcs is one region: its Redis, its link to the home, and its
// servers.
type regionProcs struct {
	name    string
	redis   *redistest.Server
	link    *toxiproxy.Proxy
	mu      sync.Mutex
	servers []*admitProcess
}

// server returns the region's nth server, round robin.
func (r *regionProcs) server(n int) *admitProcess {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.servers[n%len(r.servers)]
}

// replace starts a new server in region r and then kills the first one,
// by its PID, as a rolling restart would.
func (d *regionsDeployment) replace(r *regionProcs) {
	s := d.startServer(r)
	r.mu.Lock()
	old := r.servers[0]
	r.servers = append(r.servers[1:], s)
	r.mu.Unlock()
	_ = old.cmd.Process.Kill()
}

// deployRegions starts the home, n regions of one server each, and links
// of latency (ms, each way) to the home.
func deployRegions(t *testing.T, names []string, latency int) *regionsDeployment {
	t.Helper()
	d := &regionsDeployment{t: t, home: redistest.Start(t)}
	d.cfg = filepath.Join(t.TempDir(), "admit.yaml")
	cfg := strings.NewReplacer("RATE", fmt.Sprint(regionsRate), "BURST", strconv.Itoa(regionsBurst)).Replace(regionsConfig)
	if err := os.WriteFile(d.cfg, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	toxi := toxiproxyServer(t)
	for _, name := range names {
		r := &regionProcs{name: name, redis: redistest.Start(t)}
		listen := net.JoinHostPort("127.0.0.1", freePort(t, "127.0.0.1"))
		p, err := toxi.CreateProxy(name, listen, d.home.Addr)
		if err != nil {
			t.Fatal(err)
		}
		for _, stream := range []string{"upstream", "downstream"} {
			if _, err := p.AddToxic("latency-"+stream, "latency", stream, 1, toxiproxy.Attributes{"latency": latency, "jitter": latency / 8}); err != nil {
				t.Fatal(err)
			}
		}
		r.link = p
		d.regions = append(d.regions, r)
		r.servers = append(r.servers, d.startServer(r))
	}
	return d
}

// startServer starts one more `admit serve` in region r.
func (d *regionsDeployment) startServer(r *regionProcs) *admitProcess {
	return startAdmit(d.t, "--config", d.cfg, "--store", "redis://"+r.redis.Addr, "--home", "redis://"+r.link.Listen, "--region", r.name)
}

// outcome is one request's: when it was sent and answered (since the
// start), its region and whether it was admitted.
type outcome struct {
	sent, done time.Duration
	region     int
	status     int
}

// load sends, from each region, requests at rates[i] a second (paced,
// not waiting for answers) until stop, and gathers what happened.
type load struct {
	start time.Time
	mu    sync.Mutex
	out   []outcome
	rates []float64 // per region; changed while running
	wg    sync.WaitGroup
	stop  chan struct{}
}

func startLoad(d *regionsDeployment, rates []float64) *load {
	l := &load{start: time.Now(), rates: slices.Clone(rates), stop: make(chan struct{})}
	for i, r := range d.regions {
		l.wg.Add(1)
		go l.region(i, r)
	}
	return l
}

func (l *load) setRates(rates []float64) {
	l.mu.Lock()
	copy(l.rates, rates)
	l.mu.Unlock()
}

func (l *load) region(i int, r *regionProcs) {
	defer l.wg.Done()
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 256}, Timeout: 10 * time.Second}
	jobs := make(chan time.Duration, 4096)
	var workers sync.WaitGroup
	for range 48 {
		workers.Add(1)
		go func() {
			defer workers.Done()
			n := 0
			for sent := range jobs {
				srv := r.server(n)
				n++
				status := 0
				resp, err := client.Post(srv.url+"/v1/check", "application/json", strings.NewReader(`{"tenant":"acme","user":"u"}`))
				if err == nil {
					_, _ = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					status = resp.StatusCode
				}
				done := time.Since(l.start)
				l.mu.Lock()
				l.out = append(l.out, outcome{sent, done, i, status})
				l.mu.Unlock()
			}
		}()
	}
	next := time.Duration(0)
	for {
		l.mu.Lock()
		rate := l.rates[i]
		l.mu.Unlock()
		if rate <= 0 {
			rate = 1
		}
		next += time.Duration(float64(time.Second) / rate)
		if wait := next - time.Since(l.start); wait > 0 {
			select {
			case <-l.stop:
				close(jobs)
				workers.Wait()
				return
			case <-time.After(wait):
			}
		}
		if l.rates[i] > 0 {
			select {
			case jobs <- next:
			default: // the workers are behind: the request is not sent
			}
		}
	}
}

// finish stops the load and returns every outcome, by answer time.
func (l *load) finish() []outcome {
	close(l.stop)
	l.wg.Wait()
	sort.Slice(l.out, func(i, j int) bool { return l.out[i].done < l.out[j].done })
	return l.out
}

// checkRegionBounds fails t if the regions together admitted more than the
// bucket allows: by any admission's answer, more than burst + rate × the
// time since the first request was sent (before the key existed); within
// any window of length w, more than burst + rate × (w + slack) among
// requests sent and answered within it.
func checkRegionBounds(t *testing.T, out []outcome, slack time.Duration) {
	t.Helper()
	n := 0
	var admitted []outcome
	for _, o := range out {
		if o.status != 200 {
			continue
		}
		n++
		bound := regionsBurst + regionsRate*o.done.Seconds()
		if float64(n) > bound {
			t.Fatalf("admission %d answered at %v: over burst + rate·t = %.1f", n, o.done, bound)
		}
		admitted = append(admitted, o)
	}
	sort.Slice(admitted, func(i, j int) bool { return admitted[i].sent < admitted[j].sent })
	for _, w := range []time.Duration{500 * time.Millisecond, time.Second, 3 * time.Second} {
		bound := regionsBurst + regionsRate*(w+slack).Seconds()
		worst := 0
		for i, a := range admitted {
			c := 0
			for _, b := range admitted[i:] {
				if b.sent >= a.sent+w {
					break
				}
				if b.done <= a.sent+w {
					c++
				}
			}
			worst = max(worst, c)
		}
		if float64(worst) > bound {
			t.Errorf("%d admitted within %v, over burst + rate·(%v + %v) = %.0f", worst, w, w, slack, bound)
		}
		t.Logf("most admitted within %v: %d (bound %.0f)", w, worst, bound)
	}
}

// admittedBetween counts, per region, admissions answered in [from, to).
func admittedBetween(out []outcome, regions int, from, to time.Duration) []int {
	return countAdmitted(out, regions, from, to, func(o outcome) time.Duration { return o.done })
}

// sentBetween counts, per region, admissions of requests sent in [from,
// to): decided in it, however long their answers took.
func sentBetween(out []outcome, regions int, from, to time.Duration) []int {
	return countAdmitted(out, regions, from, to, func(o outcome) time.Duration { return o.sent })
}

// countAdmitted counts, per region, admissions whose time at says is in
// [from, to).
func countAdmitted(out []outcome, regions int, from, to time.Duration, at func(outcome) time.Duration) []int {
	per := make([]int, regions)
	for _, o := range out {
		if t := at(o); o.status == 200 && t >= from && t < to {
			per[o.region]++
		}
	}
	return per
}

// statuses counts outcomes by status.
func statuses(out []outcome) map[int]int {
	m := map[int]int{}
	for _, o := range out {
		m[o.status]++
	}
	return m
}

func sum(xs []int) int {
	s := 0
	for _, x := range xs {
		s += x
	}
	return s
}

// TestRegionsHoldOneLimit runs one tenant's limit across three regions,
// 40 ms each way from the home, with its traffic skewed 70/20/10 at 1.5×
// the rate, then region c cut from the home for 4 s and healed: the
// regions together never admit more than the bucket would; a cut region
// spends what it holds and then refuses; once healed it admits again.
func TestRegionsHoldOneLimit(t *testing.T) {
	d := deployRegions(t, []string{"a", "b", "c"}, 40)
	total := 1.5 * regionsRate
	l := startLoad(d, []float64{0.7 * total, 0.2 * total, 0.1 * total})
	time.Sleep(6 * time.Second)
	// Cut c from the home: it keeps what it holds, then refuses.
	cutAt := time.Since(l.start)
	if err := d.regions[2].link.Disable(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(4 * time.Second)
	healAt := time.Since(l.start)
	if err := d.regions[2].link.Enable(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(4 * time.Second)
	out := l.finish()
	end := time.Since(l.start)

	t.Logf("statuses: %v", statuses(out))
	checkRegionBounds(t, out, regionBoundSlack)
	warm := admittedBetween(out, 3, 2*time.Second, cutAt)
	t.Logf("from 2s to the cut (%v): admitted %v = %d of %.0f (%.1f%%)", cutAt, warm, sum(warm),
		regionsRate*(cutAt-2*time.Second).Seconds(), 100*float64(sum(warm))/(regionsRate*(cutAt-2*time.Second).Seconds()))
	// What c may spend once cut: what it held, which lasts at most the
	// lookahead and the hold past its last grant.
	spent := cutAt + regionCutSpends
	during := sentBetween(out, 3, spent, healAt)
	t.Logf("cut from %v to %v: admitted after %v %v", cutAt, healAt, spent, during)
	if during[2] != 0 {
		t.Errorf("region c, cut from the home at %v, admitted %d after %v", cutAt, during[2], spent)
	}
	if during[0]+during[1] == 0 {
		t.Errorf("regions a and b admitted nothing while c was cut")
	}
	after := admittedBetween(out, 3, healAt+5*time.Second/2, end)
	t.Logf("healed at %v: admitted from %v %v", healAt, healAt+5*time.Second/2, after)
	if after[2] == 0 {
		t.Errorf("region c admitted nothing 2.5 s after its link to the home healed")
	}
	for _, r := range d.regions {
		t.Logf("region %s: home calls %.0f, granted %.0f, given back %.0f, decisions %.0f", r.name,
			metric(t, r.servers[0].url, "admit_region_home_calls_total"), metric(t, r.servers[0].url, "admit_region_granted_units_total"),
			metric(t, r.servers[0].url, "admit_region_given_back_units_total"), metric(t, r.servers[0].url, "admit_store_decisions_total"))
	}
}

// regionBoundSlack is how much later than its place in the timeline a
// unit may be spent: the home's lookahead and a pool's hold past it.
const regionBoundSlack = 250*time.Millisecond + time.Second

// regionCutSpends bounds how long a cut region lives on what it holds.
const regionCutSpends = 250*time.Millisecond + time.Second + 500*time.Millisecond

// TestRegionsRestarts: under load at 1.5× the rate, a region's server is
// replaced, another region's Redis restarts empty, and then the home
// restarts empty: the regions together never admit more than the bucket
// would, and every region admits again after each.
func TestRegionsRestarts(t *testing.T) {
	d := deployRegions(t, []string{"a", "b", "c"}, 40)
	total := 1.5 * regionsRate
	l := startLoad(d, []float64{total / 3, total / 3, total / 3})
	var marks []time.Duration
	step := func(what string, f func()) {
		time.Sleep(3 * time.Second)
		marks = append(marks, time.Since(l.start))
		t.Logf("%v: %s", marks[len(marks)-1], what)
		f()
	}
	step("region a's server replaced", func() { d.replace(d.regions[0]) })
	step("region b's Redis restarted empty", func() { d.regions[1].redis.Restart(t) })
	step("the home restarted empty", func() { d.home.Restart(t) })
	time.Sleep(4 * time.Second)
	out := l.finish()
	end := time.Since(l.start)
	t.Logf("statuses: %v", statuses(out))
	checkRegionBounds(t, out, regionBoundSlack)
	for i, from := range marks {
		to := end
		if i+1 < len(marks) {
			to = marks[i+1]
		}
		// Give the home's fence (τ + lookahead: 0.75 s) and a refill time.
		per := admittedBetween(out, 3, from+2*time.Second, to)
		t.Logf("from %v to %v: %v", from+2*time.Second, to, per)
		for r, n := range per {
			if n == 0 {
				t.Errorf("region %s admitted nothing from %v to %v", d.regions[r].name, from+2*time.Second, to)
			}
		}
	}
}

// TestRatelimitAcrossRegions: the Envoy drop-in across two regions, 40 ms
// from their home: `admit ratelimit` in each, counting as
// envoyproxy/ratelimit counts (every hit, past the limit too), hammered
// on one descriptor at once. Together they answer OK to no more hits
// than the limit, also counting one more hit in each afterwards.
func TestRatelimitAcrossRegions(t *testing.T) {
	const limit, perRegion, callers = 300, 400, 8
	home := redistest.Start(t)
	toxi := toxiproxyServer(t)
	dir := hitsDomain(t, limit)
	var clients []rlsv3.RateLimitServiceClient
	for _, name := range []string{"eu", "us"} {
		redis := redistest.Start(t)
		link, err := toxi.CreateProxy(name, "127.0.0.1:"+freePort(t, "127.0.0.1"), home.Addr)
		if err != nil {
			t.Fatal(err)
		}
		for _, stream := range []string{"upstream", "downstream"} {
			if _, err := link.AddToxic("latency-"+stream, "latency", stream, 1, toxiproxy.Attributes{"latency": 40, "jitter": 5}); err != nil {
				t.Fatal(err)
			}
		}
		clients = append(clients, startRatelimit(t, dir, redis.Addr, "ADMIT_REGION="+name, "ADMIT_HOME=redis://"+link.Listen))
	}
	ask := func(c rlsv3.RateLimitServiceClient, hits uint64) *rlsv3.RateLimitResponse { return askHits(t, c, hits) }
	// Proven loaded: the answer names the file's limit.
	if r := ask(clients[0], 0); r == nil || r.Statuses[0].GetCurrentLimit().GetRequestsPerUnit() != limit {
		t.Fatalf("a look before any hit: %v; want the file's limit of %d", r, limit)
	}
	notLastMinute()
	admitted := hitAll(t, clients, callers, perRegion)
	if t.Failed() {
		return
	}
	got := admitted[0] + admitted[1]
	t.Logf("OK answers: eu %d, us %d, of %d hits each on a limit of %d", admitted[0], admitted[1], perRegion, limit)
	if got > limit {
		t.Errorf("the regions answered OK to %d hits on a limit of %d", got, limit)
	}
	if got == 0 {
		t.Errorf("no hit admitted")
	}
	// Past the limit, a hit is answered OK only with a unit a region
	// still holds: never past the limit in all.
	for _, c := range clients {
		if r := ask(c, 1); r != nil && r.OverallCode == rlsv3.RateLimitResponse_OK {
			got++
		}
	}
	if got > limit {
		t.Errorf("after %d hits, one more in each region: %d answered OK in all; want at most %d", 2*perRegion, got, limit)
	}
}
