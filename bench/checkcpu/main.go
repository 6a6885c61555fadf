// Command checkcpu measures the server CPU each POST /v1/check costs in
// running `admit serve` processes, side by side: it drives each in turn,
// in alternating rounds, with keep-alive callers checking the demo
// configuration's tenant t1234, and reports the medians of each one's CPU
// per decision (utime and stime from /proc) and of its decisions per
// second. Give it URL=PID pairs of servers it did not start, for one
// build against another:
//
//	cd bench && go run ./checkcpu -callers 32 -duration 4s -rounds 5 \
//	  http://127.0.0.1:18301=PID1 http://127.0.0.1:18303=PID2
package main

import (
	"bytes"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// cpu returns the CPU time process pid has used, in clock ticks of 10 ms.
func cpu(pid string) time.Duration {
	b, _ := os.ReadFile("/proc/" + pid + "/stat")
	f := strings.Fields(string(b)[strings.LastIndexByte(string(b), ')')+2:])
	u, _ := strconv.ParseInt(f[11], 10, 64)
	s, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(u+s) * 10 * time.Millisecond
}

func main() {
	callers := flag.Int("callers", 32, "concurrent callers, each with its own keep-alive connection")
	dur := flag.Duration("duration", 4*time.Second, "length of one round against one server")
	rounds := flag.Int("rounds", 5, "rounds of each server, alternating")
	flag.Parse()
	targets := flag.Args()
	res := map[string][]float64{}
	rates := map[string][]float64{}
	for r := 0; r < *rounds; r++ {
		for _, t := range targets {
			url, pid, _ := strings.Cut(t, "=")
			tr := &http.Transport{MaxIdleConnsPerHost: *callers}
			cl := &http.Client{Transport: tr}
			var n atomic.Int64
			stop := time.Now().Add(*dur)
			c0 := cpu(pid)
			var wg sync.WaitGroup
			for i := 0; i < *callers; i++ {
				wg.Add(1)
				go func(i int) {
					defer wg.Done()
					for j := 0; time.Now().Before(stop); j++ {
						body := fmt.Sprintf(`{"tenant":"t1234","user":"u%d","action":"search"}`, (i*7919+j)%5000)
						resp, err := cl.Post(url+"/v1/check", "application/json", bytes.NewBufferString(body))
						if err != nil {
							continue
						}
						io.Copy(io.Discard, resp.Body)
						resp.Body.Close()
						n.Add(1)
					}
				}(i)
			}
			wg.Wait()
			c1 := cpu(pid)
			us := float64((c1 - c0).Microseconds()) / float64(n.Load())
			res[t] = append(res[t], us)
			rates[t] = append(rates[t], float64(n.Load())/dur.Seconds())
			tr.CloseIdleConnections()
		}
	}
	for _, t := range targets {
		a := res[t]
		sort.Float64s(a)
		b := rates[t]
		sort.Float64s(b)
		fmt.Printf("%s: server CPU per decision median %.1f µs (all %v), decisions/s median %.0f\n", t, a[len(a)/2], a, b[len(b)/2])
	}
}
