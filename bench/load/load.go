// Package load runs closed-loop loads for the benchmarks: a number of
// callers, each making calls back to back until the time is up.
package load

import (
	"slices"
	"sync"
	"time"
)

// Result is a load's outcome: the latency of every call that counted,
// sorted, and the time the load took.
type Result struct {
	Lat     []time.Duration
	Elapsed time.Duration
}

// Rate returns the counted calls per second.
func (r Result) Rate() float64 { return float64(len(r.Lat)) / r.Elapsed.Seconds() }

// Pct returns the latency at fraction p (0.5 for the median).
func (r Result) Pct(p float64) time.Duration {
	if len(r.Lat) == 0 {
		return 0
	}
	return r.Lat[int(float64(len(r.Lat)-1)*p)]
}

// Run runs callers goroutines for d; caller g makes calls i = g, g+callers,
// g+2·callers… with op, which reports whether the call counts (a failed
// one does not).
func Run(callers int, d time.Duration, op func(i int) bool) Result {
	var wg sync.WaitGroup
	lats := make([][]time.Duration, callers)
	start := time.Now()
	deadline := start.Add(d)
	for g := range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			lat := make([]time.Duration, 0, 1<<14)
			for i := g; time.Now().Before(deadline); i += callers {
				t0 := time.Now()
				if op(i) {
					lat = append(lat, time.Since(t0))
				}
			}
			lats[g] = lat
		}()
	}
	wg.Wait()
	r := Result{Elapsed: time.Since(start)}
	for _, l := range lats {
		r.Lat = append(r.Lat, l...)
	}
	slices.Sort(r.Lat)
	return r
}
