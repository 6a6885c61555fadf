package e2e

import (
	"fmt"
	"math"
	"os"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/admitdev/admit/redistest"
)

// TestBenchRegions measures limits held across regions, for
// docs/benchmarks.md: `make bench-regions` runs it (ADMIT_BENCH_REGIONS=1).
// Three regions, one `admit serve` each, 40 ms ± 5 ms each way to the
// home through Toxiproxy; one tenant's bucket of 400/s, burst 200; load
// paced at 1.5× the rate. It reports, per scenario, what the regions
// admitted against what one exact bucket admits of the same arrivals
// (replayed in the order they were sent), the worst over-admission from the
// start and within any second, calls to the home per decision, and the
// answers' p50 and p99 against one region deciding from leased allowances
// without a home.
func TestBenchRegions(t *testing.T) {
	if os.Getenv("ADMIT_BENCH_REGIONS") == "" {
		t.Skip("a benchmark: make bench-regions")
	}
	secs := 30 * time.Second
	if s, err := time.ParseDuration(os.Getenv("ADMIT_BENCH_SCENARIO")); err == nil {
		secs = s
	}
	if r, err := strconv.Atoi(os.Getenv("ADMIT_BENCH_RATE")); err == nil && r > 0 {
		defer func(was float64) { regionsRate = was }(regionsRate)
		regionsRate = float64(r)
	}
	var rows []string
	row := func(name string, r benchResult) {
		rows = append(rows, fmt.Sprintf("| %s | %d | %d | %.1f %% | %.1f %% | %+.0f | %d (%.0f) | %.4f | %.1f / %.1f ms |",
			name, r.admitted, r.exact, 100*float64(r.admitted)/float64(r.exact), 100*float64(r.split)/float64(r.exact), r.overStart, r.worstSecond, r.secondBound,
			r.homePerDecision, r.p50, r.p99))
	}
	total := 1.5 * regionsRate

	base := benchBaseline(t, total, secs)
	rows = append(rows, fmt.Sprintf("| one region, leased, no home | %d | %d | %.1f %% | | | | | %.1f / %.1f ms |",
		base.admitted, base.exact, 100*float64(base.admitted)/float64(base.exact), base.p50, base.p99))

	d := benchDeploy(t)
	l := startLoad(d, []float64{0.7 * total, 0.2 * total, 0.1 * total})
	time.Sleep(secs)
	row("skew 70/20/10 at 1.5×", measure(t, d, l.finish()))

	d = benchDeploy(t)
	shares := [][]float64{{0.7, 0.2, 0.1}, {0.1, 0.7, 0.2}, {0.2, 0.1, 0.7}}
	l = startLoad(d, scale(shares[0], total))
	var shifts []time.Duration
	for i := 1; i < 3; i++ {
		time.Sleep(secs / 3)
		shifts = append(shifts, time.Since(l.start))
		l.setRates(scale(shares[i], total))
	}
	time.Sleep(secs / 3)
	out := l.finish()
	row("hot region moving every 10 s", measure(t, d, out))
	// How long the new hot region takes to reach 90 % of its max-min
	// share (demands 420, 120 and 60 a second of 400: 220), over 200 ms.
	var reach []string
	for i, at := range shifts {
		hot := i + 1
		got := time.Duration(-1)
		for from := at; from < at+5*time.Second && got < 0; from += 20 * time.Millisecond {
			if n := admittedBetween(out, 3, from, from+200*time.Millisecond)[hot]; float64(n) >= 0.9*220*0.2 {
				got = from + 200*time.Millisecond - at
			}
		}
		reach = append(reach, fmt.Sprintf("%.2f s", got.Seconds()))
	}

	d = benchDeploy(t)
	l = startLoad(d, []float64{total / 3, total / 3, total / 3})
	time.Sleep(secs / 3)
	cutAt := time.Since(l.start)
	if err := d.regions[2].link.Disable(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(secs / 3)
	healAt := time.Since(l.start)
	if err := d.regions[2].link.Enable(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(secs / 3)
	out = l.finish()
	row("uniform, c cut for 10 s", measure(t, d, out))
	spent := time.Duration(0)
	healed := time.Duration(-1)
	for _, o := range out {
		if o.region == 2 && o.status == 200 {
			if o.done > cutAt && o.done < healAt {
				spent = max(spent, o.done-cutAt)
			}
			if o.done > healAt && healed < 0 {
				healed = o.done - healAt
			}
		}
	}
	cut := admittedBetween(out, 3, cutAt+2*time.Second, healAt)
	cutSecs := (healAt - cutAt - 2*time.Second).Seconds()

	fmt.Printf("\n`cd e2e && ADMIT_BENCH_REGIONS=1 go test -run TestBenchRegions -v -timeout 30m .` (%s each)\n\n", secs)
	fmt.Println("| scenario | admitted | exact bucket | of exact | static split, of exact | worst over b + r·t | most in 1 s (bound b + r·2.25 s) | home calls / decision | p50 / p99 after 3 s |")
	fmt.Println("|---|---|---|---|---|---|---|---|---|")
	for _, r := range rows {
		fmt.Println(r)
	}
	fmt.Printf("\nMoving: the new hot region reached 90 %% of its share (220/s over 200 ms) %s after each move (2 × (round trip + 300 ms) = 0.76 s).\n", strings.Join(reach, " and "))
	fmt.Printf("\nCut: c admitted its last unit %.2f s after the cut; from 2 s after it to the heal, a and b admitted %d of the %.0f the rate allows (%.1f %%), c %d; c admitted again %.2f s after the heal.\n",
		spent.Seconds(), cut[0]+cut[1], regionsRate*cutSecs, 100*float64(cut[0]+cut[1])/(regionsRate*cutSecs), cut[2], healed.Seconds())
}

// benchWarm is how long a scenario runs before its answers' latency is
// counted: a region's first decision of a key, and a server's first, wait
// for the home.
const benchWarm = 3 * time.Second

// benchDeploy deploys three regions and waits until the home has been up
// long enough that it starts a bucket full (see homeScript).
func benchDeploy(t *testing.T) *regionsDeployment {
	d := deployRegions(t, []string{"a", "b", "c"}, 40)
	time.Sleep(2 * time.Second)
	return d
}

func scale(xs []float64, f float64) []float64 {
	out := make([]float64, len(xs))
	for i, x := range xs {
		out[i] = x * f
	}
	return out
}

// benchResult is what one scenario measured.
type benchResult struct {
	admitted, exact, split int
	overStart              float64 // admitted - (burst + rate·t) at its worst
	worstSecond            int
	secondBound            float64
	homePerDecision        float64
	p50, p99               float64 // ms
}

// measure sums up out, and reads the servers' metrics.
func measure(t *testing.T, d *regionsDeployment, out []outcome) benchResult {
	t.Helper()
	var r benchResult
	r.exact = exactAdmits(out)
	r.split = splitAdmits(out)
	r.overStart = math.Inf(-1)
	var lat []float64
	var admitted []outcome
	for _, o := range out {
		if o.sent >= benchWarm {
			lat = append(lat, float64(o.done-o.sent)/float64(time.Millisecond))
		}
		if o.status != 200 {
			continue
		}
		r.admitted++
		r.overStart = max(r.overStart, float64(r.admitted)-(regionsBurst+regionsRate*o.done.Seconds()))
		admitted = append(admitted, o)
	}
	sort.Slice(admitted, func(i, j int) bool { return admitted[i].sent < admitted[j].sent })
	for i, a := range admitted {
		c := 0
		for _, b := range admitted[i:] {
			if b.sent >= a.sent+time.Second {
				break
			}
			if b.done <= a.sent+time.Second {
				c++
			}
		}
		r.worstSecond = max(r.worstSecond, c)
	}
	r.secondBound = regionsBurst + regionsRate*(time.Second+regionBoundSlack).Seconds()
	sort.Float64s(lat)
	r.p50, r.p99 = lat[len(lat)/2], lat[len(lat)*99/100]
	var calls, decisions float64
	for _, rg := range d.regions {
		for _, s := range rg.servers {
			calls += metric(t, s.url, "admit_region_home_calls_total")
			decisions += metric(t, s.url, "admit_store_decisions_total")
		}
	}
	r.homePerDecision = calls / decisions
	return r
}

// exactAdmits replays the requests of out, in the order they were sent,
// through one exact bucket (GCRA) of the regions' limit.
func exactAdmits(out []outcome) int {
	return bucketAdmits(out, -1, regionsRate, regionsBurst)
}

// splitAdmits replays each region's requests through a bucket of its
// own, a third of the limit: the static split that needs no home.
func splitAdmits(out []outcome) int {
	n := 0
	for r := range 3 {
		n += bucketAdmits(out, r, regionsRate/3.0, regionsBurst/3.0)
	}
	return n
}

// bucketAdmits replays the requests of out from region (-1: all), in the
// order they were sent, through a GCRA bucket of rate a second and burst.
func bucketAdmits(out []outcome, region int, rate, burst float64) int {
	var sent []time.Duration
	for _, o := range out {
		if region < 0 || o.region == region {
			sent = append(sent, o.sent)
		}
	}
	sort.Slice(sent, func(i, j int) bool { return sent[i] < sent[j] })
	T := float64(time.Second) / rate
	tau := burst * T
	tat := 0.0
	n := 0
	for _, s := range sent {
		now := float64(s)
		if tat < now {
			tat = now
		}
		if tat+T-tau <= now {
			tat += T
			n++
		}
	}
	return n
}

// benchBaseline runs the same load, uniform, on one region without a
// home: one `admit serve` deciding the bucket from leased allowances.
func benchBaseline(t *testing.T, total float64, secs time.Duration) benchResult {
	t.Helper()
	redis := redistest.Start(t)
	cfg := strings.NewReplacer("RATE", fmt.Sprint(regionsRate), "BURST", fmt.Sprint(regionsBurst),
		"algorithm: token_bucket,", "algorithm: token_bucket, distribution: leased,").Replace(regionsConfig)
	path := t.TempDir() + "/admit.yaml"
	if err := os.WriteFile(path, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	r := &regionProcs{name: "one", redis: redis}
	r.servers = []*admitProcess{startAdmit(t, "--config", path, "--store", "redis://"+redis.Addr)}
	d := &regionsDeployment{t: t, regions: []*regionProcs{r}}
	l := startLoad(d, []float64{total})
	time.Sleep(secs)
	out := l.finish()
	var res benchResult
	res.exact = exactAdmits(out)
	var lat []float64
	for _, o := range out {
		if o.sent >= benchWarm {
			lat = append(lat, float64(o.done-o.sent)/float64(time.Millisecond))
		}
		if o.status == 200 {
			res.admitted++
		}
	}
	sort.Float64s(lat)
	res.p50, res.p99 = lat[len(lat)/2], lat[len(lat)*99/100]
	return res
}
