// Command wsbench measures the WebSocket gateway of a real `admit serve`
// process (built from ../cmd/admit, memory store) over loopback:
//
//   - connection admissions per second: clients dial, are admitted (the
//     authorizer, one decision over the four connection limits, the
//     upgrade) and close, as fast as they can;
//
//   - memory per idle connection: the server's Go heap and stacks (from its
//     /metrics) and its resident set, before and after opening -idle
//     connections that then sit still, in a fresh server;
//
//   - echo messages per second on each route: -clients connections, each
//     in a session of its own over 16 tenants, each keeping -window
//     messages in flight.
//
//     cd bench && go run ./wsbench -duration 3s -rounds 3
//
// The server runs on 127.0.0.1 with limits no benchmark reaches; it is
// stopped by its PID at the end of each phase. Each phase stops by itself.
package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coder/websocket"
)

const config = `version: 1
tiers:
  bench:
    gateway:
      tenant_connections: 100000
      connections_per_session: 100000
      tenant_per_minute: 4000000000
      session_per_minute: 4000000000
      messages_per_minute: 4000000000
      session_ttl: 1h
tenants:
`

func main() {
	d := flag.Duration("duration", 3*time.Second, "length of each measured run")
	rounds := flag.Int("rounds", 3, "runs of each measurement (the median is reported)")
	clients := flag.Int("clients", 32, "concurrent clients for admissions and echoes")
	window := flag.Int("window", 8, "messages each echo client keeps in flight")
	idle := flag.Int("idle", 5000, "idle connections for the memory measurement")
	flag.Parse()

	dir, err := os.MkdirTemp("", "wsbench")
	check(err)
	defer os.RemoveAll(dir)
	bin := filepath.Join(dir, "admit")
	build := exec.Command("go", "build", "-o", bin, "../cmd/admit")
	build.Stderr = os.Stderr
	check(build.Run())
	cfg := config
	for i := range 16 {
		cfg += fmt.Sprintf("  b%d: {tier: bench}\n", i)
	}
	cfgFile := filepath.Join(dir, "admit.yaml")
	check(os.WriteFile(cfgFile, []byte(cfg), 0o600))

	fmt.Printf("admit serve (memory store) on 127.0.0.1, GOMAXPROCS=%s, %v per run, medians of %d runs\n\n", os.Getenv("GOMAXPROCS"), *d, *rounds)

	srv := start(bin, cfgFile, dir)
	var adm []float64
	for range *rounds {
		adm = append(adm, admissions(srv.url, *clients, *d))
	}
	fmt.Printf("connection admissions/s (%d clients, dial + admit + upgrade + close): %s → median %.0f\n", *clients, list(adm), median(adm))
	for _, route := range []string{"silo", "pool"} {
		var rates []float64
		for range *rounds {
			rates = append(rates, echoes(srv.url, route, *clients, *window, *d))
		}
		fmt.Printf("echo messages/s, %s route (%d clients × %d in flight): %s → median %.0f\n", route, *clients, *window, list(rates), median(rates))
	}
	srv.stop()

	var heap, rss []float64
	for range *rounds {
		s := start(bin, cfgFile, dir)
		h, r := idleMemory(s.url, *idle)
		s.stop()
		heap, rss = append(heap, h), append(rss, r)
	}
	fmt.Printf("memory per idle connection (%d connections), Go heap + stacks: %s B → median %.0f B; resident set: %s B → median %.0f B\n",
		*idle, list(heap), median(heap), list(rss), median(rss))
}

type server struct {
	url string
	cmd *exec.Cmd
}

func start(bin, cfg, dir string) *server {
	cmd := exec.Command(bin, "serve", "--config", cfg, "--http", "127.0.0.1:0", "--grpc", "127.0.0.1:0", "--data-dir", filepath.Join(dir, "data"))
	stderr, err := cmd.StderrPipe()
	check(err)
	check(cmd.Start())
	re := regexp.MustCompile(`msg="admit serving" http=(http://127\.0\.0\.1:\d+)`)
	found := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			if m := re.FindStringSubmatch(sc.Text()); m != nil {
				found <- m[1]
			}
		}
	}()
	select {
	case u := <-found:
		return &server{url: u, cmd: cmd}
	case <-time.After(30 * time.Second):
		_ = cmd.Process.Kill()
		check(fmt.Errorf("admit serve did not start"))
		return nil
	}
}

func (s *server) stop() {
	_ = s.cmd.Process.Kill()
	_ = s.cmd.Wait()
}

func session(base, tenant string) string {
	req, _ := http.NewRequest("PUT", base+"/v1/sessions", strings.NewReader(`{"tenant":"`+tenant+`"}`))
	resp, err := http.DefaultClient.Do(req)
	check(err)
	defer resp.Body.Close()
	var s struct {
		SessionID string `json:"session_id"`
	}
	check(json.NewDecoder(resp.Body).Decode(&s))
	return s.SessionID
}

func wsURL(base, tenant, sess string) string {
	return "ws" + strings.TrimPrefix(base, "http") + "/v1/ws?tenant=" + tenant + "&session=" + sess
}

// admissions returns connections admitted per second.
func admissions(base string, clients int, d time.Duration) float64 {
	var n, failed atomic.Int64
	var wg sync.WaitGroup
	deadline := time.Now().Add(d)
	begin := time.Now()
	for i := range clients {
		t := fmt.Sprintf("b%d", i%16)
		u := wsURL(base, t, session(base, t))
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(deadline) {
				c, _, err := websocket.Dial(context.Background(), u, nil)
				if err != nil {
					failed.Add(1)
					continue
				}
				n.Add(1)
				c.CloseNow()
			}
		}()
	}
	wg.Wait()
	if failed.Load() > 0 {
		fmt.Printf("  (%d connections failed)\n", failed.Load())
	}
	return float64(n.Load()) / time.Since(begin).Seconds()
}

// echoes returns echo frames received per second.
func echoes(base, route string, clients, window int, d time.Duration) float64 {
	var n atomic.Int64
	var wg sync.WaitGroup
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	conns := make([]*websocket.Conn, clients)
	for i := range conns {
		t := fmt.Sprintf("b%d", i%16)
		c, _, err := websocket.Dial(context.Background(), wsURL(base, t, session(base, t)), nil)
		check(err)
		conns[i] = c
	}
	begin := time.Now()
	for _, c := range conns {
		slots := make(chan struct{}, window)
		msg := []byte(`{"route":"` + route + `","id":"e","data":{"n":1}}`)
		wg.Add(2)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				select {
				case slots <- struct{}{}:
				case <-ctx.Done():
					return
				}
				if c.Write(ctx, websocket.MessageText, msg) != nil {
					return
				}
			}
		}()
		go func() {
			defer wg.Done()
			for {
				_, data, err := c.Read(ctx)
				if err != nil {
					return
				}
				if bytes.Contains(data, []byte(`"echo"`)) {
					n.Add(1)
				}
				<-slots
			}
		}()
	}
	wg.Wait()
	took := time.Since(begin)
	for _, c := range conns {
		c.CloseNow()
	}
	return float64(n.Load()) / took.Seconds()
}

// idleMemory opens n idle connections and returns the server's growth per
// connection: Go heap in use + stacks, and resident set.
func idleMemory(base string, n int) (heap, rss float64) {
	time.Sleep(500 * time.Millisecond)
	h0, r0 := memory(base)
	conns := make([]*websocket.Conn, 0, n)
	var sess string
	for i := range n {
		if i%1000 == 0 {
			sess = session(base, "b0")
		}
		c, _, err := websocket.Dial(context.Background(), wsURL(base, "b0", sess), nil)
		check(err)
		conns = append(conns, c)
	}
	time.Sleep(2 * time.Second)
	h1, r1 := memory(base)
	for _, c := range conns {
		c.CloseNow()
	}
	return (h1 - h0) / float64(n), (r1 - r0) / float64(n)
}

func memory(base string) (heap, rss float64) {
	resp, err := http.Get(base + "/metrics")
	check(err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	check(err)
	val := func(name string) float64 {
		for _, line := range strings.Split(string(body), "\n") {
			if rest, ok := strings.CutPrefix(line, name+" "); ok {
				v, err := strconv.ParseFloat(rest, 64)
				check(err)
				return v
			}
		}
		check(fmt.Errorf("no %s in /metrics", name))
		return 0
	}
	return val("go_memstats_heap_inuse_bytes") + val("go_memstats_stack_inuse_bytes"), val("process_resident_memory_bytes")
}

func median(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	return s[len(s)/2]
}

func list(v []float64) string {
	out := make([]string, len(v))
	for i, x := range v {
		out[i] = strconv.FormatFloat(x, 'f', 0, 64)
	}
	return strings.Join(out, ", ")
}

func check(err error) {
	if err != nil {
		fmt.Fprintln(os.Stderr, "wsbench:", err)
		os.Exit(1)
	}
}
