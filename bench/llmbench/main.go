// Command llmbench measures admit proxy's LLM metering against plain
// admit proxy, side by side in one run, both as processes forwarding to
// the same stand-in upstream (llmtest) on loopback:
//
//   - small non-streamed chat completions, closed loop: each proxy's CPU
//     time per call (utime + stime from /proc), and calls per second;
//   - streamed chunks: the delay each chunk gains between the upstream
//     writing it and the client reading it, p50 and p99;
//   - one 100 MB stream: the proxy's peak resident memory above what it
//     held before.
//
// Plain admit proxy decides one request rule per call; the LLM proxy
// decides the same request rule and a rule in tokens, reserving before
// and settling after, and reads every answer's usage.
//
//	cd bench && go run ./llmbench -callers 32 -duration 3s -rounds 3
package main

import (
	"bufio"
	"errors"
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
	"time"

	"github.com/admitdev/admit/bench/load"
	"github.com/admitdev/admit/llm/llmtest"
	"github.com/admitdev/admit/policy"
)

func main() {
	callers := flag.Int("callers", 32, "concurrent callers of the small calls")
	duration := flag.Duration("duration", 3*time.Second, "length of one round of small calls")
	rounds := flag.Int("rounds", 3, "rounds of each proxy, alternating")
	streamMB := flag.Int("stream-mb", 100, "size of the large stream, in MB")
	flag.Parse()
	if err := run(*callers, *duration, *rounds, *streamMB); err != nil {
		fmt.Fprintln(os.Stderr, "llmbench:", err)
		os.Exit(1)
	}
}

const key = "ak_llmbench"

func config(llmOn bool, upstream string) string {
	c := `version: 1
store:
  backend: memory
tiers:
  t:
    rules:
      - name: requests
        scope: tenant
        algorithm: token_bucket
        rate: 1000000/s
        burst: 1000000
`
	if llmOn {
		c += `      - name: tokens
        scope: tenant
        unit: tokens
        algorithm: token_bucket
        rate: 100000000/s
        burst: 100000000
llm:
  providers:
    openai:
      base_url: ` + upstream + `/v1
      api_key: sk-bench
    anthropic:
      base_url: ` + upstream + `
      api_key: sk-bench
`
	}
	return c + `tenants:
  acme:
    tier: t
    api_keys_sha256: ["` + policy.HashKey(key) + `"]
`
}

type proc struct {
	name, url string
	cmd       *exec.Cmd
}

func start(bin, dir, name, cfg string, args ...string) (*proc, error) {
	path := filepath.Join(dir, name+".yaml")
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, append([]string{"proxy", "--config", path, "--listen", "127.0.0.1:0", "--data-dir", filepath.Join(dir, name)}, args...)...)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	re := regexp.MustCompile(`listen=(http://127\.0\.0\.1:\d+)`)
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
		return &proc{name: name, url: u, cmd: cmd}, nil
	case <-time.After(30 * time.Second):
		_ = cmd.Process.Kill()
		return nil, fmt.Errorf("%s did not start", name)
	}
}

func (p *proc) stop() { _ = p.cmd.Process.Kill(); _ = p.cmd.Wait() }

// stat reads the process's CPU time and resident memory.
func (p *proc) cpu() time.Duration {
	b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/stat", p.cmd.Process.Pid))
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
	ut, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(ut+st) * 10 * time.Millisecond
}

func (p *proc) rssKB() int64 {
	b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/status", p.cmd.Process.Pid))
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			n, _ := strconv.ParseInt(strings.Fields(v)[0], 10, 64)
			return n
		}
	}
	return 0
}

func run(callers int, d time.Duration, rounds, streamMB int) error {
	dir, err := os.MkdirTemp("", "llmbench")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	bin := filepath.Join(dir, "admit")
	build := exec.Command("go", "build", "-o", bin, "./cmd/admit")
	build.Dir = ".." // the main module: its go.sum, not the bench module's
	if out, err := build.CombinedOutput(); err != nil {
		return fmt.Errorf("go build: %v: %s", err, out)
	}
	up := &llmtest.Upstream{Output: 5}
	upURL, stopUp, err := load.Serve(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.Contains(r.URL.Path, "/timed/") {
			timedStream(w, r)
			return
		}
		up.ServeHTTP(w, r)
	}))
	if err != nil {
		return err
	}
	defer stopUp()
	plain, err := start(bin, dir, "plain", config(false, upURL), "--upstream", upURL)
	if err != nil {
		return err
	}
	defer plain.stop()
	metered, err := start(bin, dir, "llm", config(true, upURL), "--upstream", upURL)
	if err != nil {
		return err
	}
	defer metered.stop()
	procs := []*proc{plain, metered}

	body := `{"model":"gpt-4o-mini","messages":[{"role":"user","content":"Say hello in five words."}],"max_tokens":5}`
	fmt.Printf("small non-streamed calls: %d callers, %v rounds × %d\n", callers, d, rounds)
	cpu := map[string][]float64{}
	rate := map[string][]float64{}
	for range rounds {
		for _, p := range procs {
			before := p.cpu()
			res := load.HTTP(callers, d, func(int) *http.Request {
				req, _ := http.NewRequest("POST", p.url+"/v1/chat/completions", strings.NewReader(body))
				req.Header.Set("Authorization", "Bearer "+key)
				req.Header.Set("Content-Type", "application/json")
				return req
			})
			if res.Failed > 0 || res.OK == 0 {
				return fmt.Errorf("%s: %d failed, %d ok", p.name, res.Failed, res.OK)
			}
			used := p.cpu() - before
			cpu[p.name] = append(cpu[p.name], float64(used.Microseconds())/float64(res.OK))
			rate[p.name] = append(rate[p.name], res.Rate())
		}
	}
	for _, p := range procs {
		fmt.Printf("  %-6s CPU µs per call %v (median %.1f), calls/s %v (median %.0f)\n", p.name, round(cpu[p.name]), median(cpu[p.name]), round(rate[p.name]), median(rate[p.name]))
	}
	fmt.Printf("  LLM ÷ plain: CPU per call %.2f×, calls/s %.2f×\n", median(cpu["llm"])/median(cpu["plain"]), median(rate["llm"])/median(rate["plain"]))

	fmt.Println("streamed chunks (200 per stream, 20 streams, one every 2 ms): the delay the client sees after the upstream wrote each")
	lat := map[string][]time.Duration{}
	for range 20 {
		for _, p := range procs {
			ds, err := streamDelays(p.url + "/v1/timed/chat/completions")
			if err != nil {
				return fmt.Errorf("%s: %w", p.name, err)
			}
			lat[p.name] = append(lat[p.name], ds...)
		}
	}
	for _, p := range procs {
		l := lat[p.name]
		slices.Sort(l)
		fmt.Printf("  %-6s %d chunks: p50 %v, p99 %v, max %v\n", p.name, len(l), l[len(l)/2], l[len(l)*99/100], l[len(l)-1])
	}
	fmt.Printf("  LLM − plain: p99 %v per chunk\n", pct(lat["llm"], 99)-pct(lat["plain"], 99))

	fmt.Printf("one %d MB stream (Anthropic messages, 16 KB events): the proxy's peak resident memory above its start\n", streamMB)
	up.Padding = 16 << 10
	up.Output = int64(streamMB<<20) / int64(up.Padding)
	for _, p := range procs {
		base := p.rssKB()
		peak, n, err := bigStream(p, `{"model":"claude-haiku-4-5","max_tokens":`+strconv.FormatInt(up.Output, 10)+`,"stream":true,"messages":[{"role":"user","content":"go"}]}`)
		if err != nil {
			return fmt.Errorf("%s: %w", p.name, err)
		}
		fmt.Printf("  %-6s %d MB relayed; RSS %d KB before, peak %d KB: +%d KB\n", p.name, n>>20, base, peak, peak-base)
	}
	return nil
}

// timedStream streams 200 chunks, 2 ms apart, each carrying the time it
// was written, in OpenAI's chunk format.
func timedStream(w http.ResponseWriter, r *http.Request) {
	_, _ = io.Copy(io.Discard, r.Body)
	w.Header().Set("Content-Type", "text/event-stream")
	f := w.(http.Flusher)
	for range 200 {
		if _, err := fmt.Fprintf(w, "data: {\"id\":\"x\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"%d\"}}]}\n\n", time.Now().UnixNano()); err != nil {
			fmt.Fprintln(os.Stderr, "timed stream:", err)
			return
		}
		f.Flush()
		time.Sleep(2 * time.Millisecond)
	}
	fmt.Fprintf(w, "data: {\"id\":\"x\",\"object\":\"chat.completion.chunk\",\"choices\":[],\"usage\":{\"prompt_tokens\":10,\"completion_tokens\":200,\"total_tokens\":210}}\n\ndata: [DONE]\n\n")
}

var stamp = regexp.MustCompile(`"content":"(\d+)"`)

func streamDelays(url string) ([]time.Duration, error) {
	req, _ := http.NewRequest("POST", url, strings.NewReader(`{"model":"gpt-4o-mini","stream":true,"messages":[{"role":"user","content":"go"}],"max_tokens":300}`))
	req.Header.Set("Authorization", "Bearer "+key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		return nil, fmt.Errorf("status %d", resp.StatusCode)
	}
	var out []time.Duration
	br := bufio.NewReader(resp.Body)
	for {
		line, err := br.ReadString('\n')
		if m := stamp.FindStringSubmatch(line); m != nil {
			ns, _ := strconv.ParseInt(m[1], 10, 64)
			out = append(out, time.Duration(time.Now().UnixNano()-ns))
		}
		if err != nil {
			if errors.Is(err, io.EOF) {
				return out, nil
			}
			return out, err
		}
	}
}

// bigStream reads one large stream through p, sampling p's resident
// memory meanwhile.
func bigStream(p *proc, body string) (peakKB, n int64, err error) {
	req, _ := http.NewRequest("POST", p.url+"/v1/messages", strings.NewReader(body))
	req.Header.Set("X-Api-Key", key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		return 0, 0, fmt.Errorf("status %d", resp.StatusCode)
	}
	buf := make([]byte, 64<<10)
	next := int64(0)
	for {
		k, err := resp.Body.Read(buf)
		n += int64(k)
		if n >= next {
			peakKB = max(peakKB, p.rssKB())
			next = n + 1<<20
		}
		if err != nil {
			if errors.Is(err, io.EOF) {
				return max(peakKB, p.rssKB()), n, nil
			}
			return peakKB, n, err
		}
	}
}

func median(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	return s[len(s)/2]
}

func round(v []float64) []float64 {
	out := make([]float64, len(v))
	for i, x := range v {
		out[i] = float64(int64(x*10)) / 10
	}
	return out
}

func pct(l []time.Duration, p int) time.Duration {
	s := slices.Clone(l)
	slices.Sort(s)
	return s[len(s)*p/100]
}
