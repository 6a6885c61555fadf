package e2e

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/admitdev/admit/redistest"
)

// ruleChangeConfig is tier free's one rule, calls, a token bucket of
// tenant acme (which has no API keys, so the decision API needs none).
// The store's timeout is 2 s and its failure mode closed: this test
// counts admissions, and a Redis call timing out on a loaded machine
// must show as a 503, never as an admission made open.
const ruleChangeConfig = `version: 1
store:
  on_error: closed
  redis:
    timeout: 2s
tiers:
  free:
    rules:
      - name: calls
        scope: tenant
        algorithm: token_bucket
        rate: "RATE"
        burst: BURST
tenants:
  acme: {tier: free}
`

// ruleChangeServer is one `admit serve` this test started, and its
// configuration file.
type ruleChangeServer struct {
	*admitProcess
	name   string
	config string
}

var (
	ruleChangeReloaded = regexp.MustCompile(`msg="configuration reloaded"`)
	ruleChangeRefused  = regexp.MustCompile(`msg="configuration reload refused`)
)

// writeRuleChangeConfig writes the configuration with rule calls at rate
// and burst to path, by renaming a complete file over it (never seen
// half-written).
func writeRuleChangeConfig(t *testing.T, path, rate string, burst int) {
	t.Helper()
	cfg := strings.NewReplacer("RATE", rate, "BURST", fmt.Sprint(burst)).Replace(ruleChangeConfig)
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

// startRuleChangeServer runs `admit serve` on free loopback ports with
// its own copy of the configuration, on the Redis at store, with more
// flags if any. The file is reloaded only on SIGHUP (the watcher's
// interval is an hour), so every reload the test sees is one it asked
// for.
func startRuleChangeServer(t *testing.T, name, store, rate string, burst int, flags ...string) *ruleChangeServer {
	t.Helper()
	cfg := filepath.Join(t.TempDir(), "admit.yaml")
	writeRuleChangeConfig(t, cfg, rate, burst)
	p := startAdmit(t, append([]string{"--config", cfg, "--store", store, "--reload-interval", "1h"}, flags...)...)
	return &ruleChangeServer{admitProcess: p, name: name, config: cfg}
}

// reloadRuleChange rewrites every server's configuration to rate and
// burst, sends each SIGHUP and waits until each has logged that it
// reloaded (a refused reload fails the test).
func reloadRuleChange(t *testing.T, servers []*ruleChangeServer, rate string, burst int) {
	t.Helper()
	before := make([]int, len(servers))
	for i, s := range servers {
		before[i] = len(s.log.matching(ruleChangeReloaded))
		writeRuleChangeConfig(t, s.config, rate, burst)
	}
	for _, s := range servers {
		if err := s.cmd.Process.Signal(syscall.SIGHUP); err != nil {
			t.Fatalf("SIGHUP to %s: %v", s.name, err)
		}
	}
	for i, s := range servers {
		s.log.await(t, 10*time.Second, fmt.Sprintf("%s logging \"configuration reloaded\" after SIGHUP", s.name), func() bool {
			if refused := s.log.matching(ruleChangeRefused); len(refused) > 0 {
				t.Fatalf("%s refused the reload to %s burst %d: %s", s.name, rate, burst, refused[len(refused)-1])
			}
			return len(s.log.matching(ruleChangeReloaded)) > before[i]
		})
	}
}

// ruleChangeAnswer is what /v1/check answers.
type ruleChangeAnswer struct {
	Status       int    `json:"-"`
	Allowed      bool   `json:"allowed"`
	Limit        int64  `json:"limit"`
	Remaining    int64  `json:"remaining"`
	ResetAfterMS int64  `json:"reset_after_ms"`
	RetryAfterMS int64  `json:"retry_after_ms"`
	DeniedBy     string `json:"denied_by"`
	Failover     string `json:"failover"`
	Tier         string `json:"tier"`
	Raw          string `json:"-"`
}

var ruleChangeClient = &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 16}}

// checkAcme asks s to admit one call of tenant acme. Anything but a 200
// or 429 the store decided (no failover) is an error.
func checkAcme(s *ruleChangeServer) (ruleChangeAnswer, error) {
	var a ruleChangeAnswer
	resp, err := ruleChangeClient.Post(s.url+"/v1/check", "application/json", strings.NewReader(`{"tenant":"acme"}`))
	if err != nil {
		return a, fmt.Errorf("%s: %v", s.name, err)
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		return a, fmt.Errorf("%s: %v", s.name, err)
	}
	a.Status, a.Raw = resp.StatusCode, strings.TrimSpace(string(body))
	if resp.StatusCode != 200 && resp.StatusCode != 429 {
		return a, fmt.Errorf("%s answered %d: %s", s.name, resp.StatusCode, a.Raw)
	}
	if err := json.Unmarshal(body, &a); err != nil {
		return a, fmt.Errorf("%s: %v: %s", s.name, err, a.Raw)
	}
	if a.Allowed != (resp.StatusCode == 200) {
		return a, fmt.Errorf("%s answered %d with allowed %v: %s", s.name, resp.StatusCode, a.Allowed, a.Raw)
	}
	if a.Failover != "" {
		return a, fmt.Errorf("%s decided without the store (failover %q): %s", s.name, a.Failover, a.Raw)
	}
	return a, nil
}

// checksOf checks acme n times on servers in turn, each answer of a rule
// whose limit is limit, and returns the answers.
func checksOf(t *testing.T, servers []*ruleChangeServer, n int, limit int64) []ruleChangeAnswer {
	t.Helper()
	out := make([]ruleChangeAnswer, n)
	for i := range out {
		a := mustCheckAcme(t, servers[i%len(servers)])
		if a.Limit != limit {
			t.Fatalf("check %d was not decided by the rule of limit %d: %d %s", i+1, limit, a.Status, a.Raw)
		}
		out[i] = a
	}
	return out
}

// drainAcme checks acme on servers in turn, at least n times and on
// until one is refused (at most 10n), and returns how many it admitted
// of how many sent, and the last (refused) answer.
func drainAcme(t *testing.T, servers []*ruleChangeServer, n int) (admitted, sent int, last ruleChangeAnswer) {
	t.Helper()
	for sent < n || last.Allowed {
		if sent >= 10*n {
			t.Fatalf("%d checks at once never drained the bucket: %s", sent, last.Raw)
		}
		last = mustCheckAcme(t, servers[sent%len(servers)])
		sent++
		if last.Allowed {
			admitted++
		}
	}
	return admitted, sent, last
}

func mustCheckAcme(t *testing.T, s *ruleChangeServer) ruleChangeAnswer {
	t.Helper()
	a, err := checkAcme(s)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// TestRuleChangeKeepsTokens: two `admit serve` on one Redis, tenant acme
// of tier free whose rule calls is a token bucket. A bucket keeps its
// tokens when its rule changes by a reload (SIGHUP): drained under
// 1000/day burst 10 and reloaded to 100/s burst 100, it admits again
// within milliseconds (it once refused for 14 minutes, the old time read
// under the new rate) and no faster than the new rate; drained under
// 100/s and reloaded to 1000/day burst 1000, it stays drained, refusing
// for at most one token's time of the new rule (it once came back nearly
// full, 50 of 50 admitted).
func TestRuleChangeKeepsTokens(t *testing.T) {
	start := time.Now()
	redis := redistest.Start(t)
	store := "redis://" + redis.Addr
	servers := []*ruleChangeServer{
		startRuleChangeServer(t, "server A", store, "1000/d", 10),
		startRuleChangeServer(t, "server B", store, "1000/d", 10),
	}
	for _, s := range servers {
		t.Logf("%s: %s (pid %d), config %s", s.name, s.url, s.cmd.Process.Pid, s.config)
	}
	t.Logf("Redis %s and both servers started in %v", redis.Addr, time.Since(start).Round(time.Millisecond))
	checks := time.Now()

	// 1000/day, burst 10: ten calls drain the bucket, the eleventh waits
	// for a token, 86.4 s.
	for i := range 10 {
		a := mustCheckAcme(t, servers[i%2])
		if !a.Allowed || a.Limit != 10 {
			t.Fatalf("check %d of a full bucket of 10 (%s): %d %s", i+1, servers[i%2].name, a.Status, a.Raw)
		}
	}
	a := mustCheckAcme(t, servers[0])
	if a.Allowed || a.DeniedBy != "calls" || a.Limit != 10 || a.RetryAfterMS < 60_000 || a.RetryAfterMS > 86_400 {
		t.Fatalf("the 11th check of a bucket of 10 at 1000/d: %d %s, want refused by calls, retry within 60–86.4 s", a.Status, a.Raw)
	}
	t.Logf("1000/d burst 10: 10 admitted, the 11th refused, retry_after_ms %d", a.RetryAfterMS)

	// Reloaded to 100/s, burst 100: the drained bucket keeps its (no)
	// tokens and refills at the new rate at once.
	reloadRuleChange(t, servers, "100/s", 100)
	t0 := time.Now()
	first := mustCheckAcme(t, servers[1])
	if first.Limit != 100 {
		t.Fatalf("the first check after the reload to 100/s burst 100 was not decided by it: %d %s", first.Status, first.Raw)
	}
	if !first.Allowed && first.RetryAfterMS > 10 {
		t.Fatalf("the first check after the reload to 100/s burst 100 was refused with retry_after_ms %d (more than one token of 10 ms): %d %s",
			first.RetryAfterMS, first.Status, first.Raw)
	}
	t.Logf("100/s burst 100, first check after the reload: %d allowed=%v remaining=%d retry_after_ms=%d", first.Status, first.Allowed, first.Remaining, first.RetryAfterMS)

	// Four callers alternate the servers until a second of the new rate
	// (100) is admitted, within 15 s however slow the machine: the bucket
	// admits again, at its new rate and never more than its burst plus
	// its rate times the time elapsed (plus slack for the old rule's
	// tokens); having kept its empty state, not even its burst at once.
	const want, deadline = 100, 15 * time.Second
	var (
		admitted, refused   atomic.Int64
		firstAdmit          atomic.Int64 // ns after t0
		mu                  sync.Mutex
		overBound, overKept string
		maxRetry            int64
		maxRetryRaw         string
		loopErr             error
	)
	if first.Allowed {
		admitted.Add(1)
		firstAdmit.Store(int64(time.Since(t0)))
	} else {
		refused.Add(1)
		maxRetry, maxRetryRaw = first.RetryAfterMS, first.Raw
	}
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				if admitted.Load() >= want || time.Since(t0) >= deadline {
					return
				}
				a, err := checkAcme(servers[(w+i)%2])
				elapsed := time.Since(t0)
				mu.Lock()
				if err != nil {
					if loopErr == nil {
						loopErr = err
					}
					mu.Unlock()
					return
				}
				switch {
				case a.Limit != 100:
					if loopErr == nil {
						loopErr = fmt.Errorf("an answer after the reload to 100/s burst 100 not decided by it: %s", a.Raw)
					}
				case a.Allowed:
					n := admitted.Add(1)
					firstAdmit.CompareAndSwap(0, int64(elapsed))
					secs := elapsed.Seconds()
					if float64(n) > 100+100*secs+10 && overBound == "" {
						overBound = fmt.Sprintf("%d admitted %v after the reload, more than 100 + 100/s × %.3f s + 10 = %.0f", n, elapsed.Round(time.Millisecond), secs, 100+100*secs+10)
					}
					if float64(n) > 100*secs+10 && overKept == "" {
						overKept = fmt.Sprintf("%d admitted %v after the reload of a drained bucket, more than 100/s × %.3f s + 10 = %.0f: it did not keep its empty state", n, elapsed.Round(time.Millisecond), secs, 100*secs+10)
					}
				default:
					refused.Add(1)
					if a.RetryAfterMS > maxRetry {
						maxRetry, maxRetryRaw = a.RetryAfterMS, a.Raw
					}
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	loop := time.Since(t0)
	if loopErr != nil {
		t.Fatal(loopErr)
	}
	n := admitted.Load()
	t.Logf("100/s burst 100 for %v after the reload: %d admitted (the first %v after it), %d refused, the longest retry_after_ms %d",
		loop.Round(time.Millisecond), n, time.Duration(firstAdmit.Load()).Round(time.Millisecond), refused.Load(), maxRetry)
	if n < want {
		t.Fatalf("%d checks admitted within %v of the reload to 100/s burst 100, want %d (%d refused; the longest retry_after_ms %d: %s)", n, loop, want, refused.Load(), maxRetry, maxRetryRaw)
	}
	if maxRetry > 10 {
		t.Errorf("a check after the reload to 100/s was refused with retry_after_ms %d, more than one token of 10 ms: %s", maxRetry, maxRetryRaw)
	}
	if overBound != "" {
		t.Errorf("%s", overBound)
	}
	if overKept != "" {
		t.Errorf("%s", overKept)
	}

	// Drained again under 100/s: ~150 checks at once, then on until one
	// is refused, so the bucket holds less than a token.
	drainStart := time.Now()
	drainAdmitted, drainSent, last := drainAcme(t, servers, 150)
	drained := time.Now()
	t.Logf("100/s burst 100, drained again: %d of %d checks admitted in %v, the last refused (retry_after_ms %d)",
		drainAdmitted, drainSent, drained.Sub(drainStart).Round(time.Millisecond), last.RetryAfterMS)
	if bound := 100*drained.Sub(drainStart).Seconds() + 10; float64(drainAdmitted) > bound {
		t.Errorf("drained bucket of 100/s admitted %d of %d in %v, more than 100/s × that + 10 = %.0f", drainAdmitted, drainSent, drained.Sub(drainStart), bound)
	}

	// Lowered to 1000/day, burst 1000: the bucket keeps what it held, less
	// than a token (and what 100/s refilled while the servers reloaded),
	// and refuses for at most one token's time of the new rule, 86.4 s.
	reloadRuleChange(t, servers, "1000/d", 1000)
	gap := time.Since(drained)
	lowAdmitted := 0
	var refusals []ruleChangeAnswer
	var admits []string
	for _, a := range checksOf(t, servers, 50, 1000) {
		if a.Allowed {
			lowAdmitted++
			admits = append(admits, a.Raw)
		} else {
			refusals = append(refusals, a)
		}
	}
	t.Logf("1000/d burst 1000, %v after the last refusal under 100/s: %d of 50 immediate checks admitted", gap.Round(time.Microsecond), lowAdmitted)
	if len(refusals) > 0 {
		t.Logf("first refusal: %s", refusals[0].Raw)
	}
	// The bucket refilled at 100/s until the new rule first read it: one
	// token per 10 ms of the gap, however slow the machine, and no more.
	if most := 2 + int(gap/(10*time.Millisecond)); lowAdmitted > most {
		t.Errorf("%d of 50 checks admitted right after a drained 100/s bucket was lowered to 1000/d burst 1000 (%v after it was drained), want at most %d; admitted: %s",
			lowAdmitted, gap, most, strings.Join(admits, " | "))
	}
	const oneToken = 86_400 // ms: one token of 1000/day
	for _, r := range refusals {
		if r.DeniedBy != "calls" || r.RetryAfterMS <= 0 || r.RetryAfterMS > oneToken+100 {
			t.Errorf("a refusal after the reload to 1000/d: retry_after_ms %d (want 1–%d, one token of 1000/day), %s", r.RetryAfterMS, oneToken+100, r.Raw)
			break
		}
	}
	t.Logf("from the first check to the last: %v; with the processes' start: %v", time.Since(checks).Round(time.Millisecond), time.Since(start).Round(time.Millisecond))
}

// TestRegionsRuleChangeKeepsTokens: tenant acme's bucket held across two
// regions (`admit serve --home --region` in each, on its own Redis) keeps
// its tokens when a reload changes the rule, as one Redis's bucket does:
// drained under 100/s burst 100 and lowered to 1000/day burst 1000, it
// stays drained (the home read its timeline under the new rule as nearly
// full); raised back to 100/s, it admits again at once, at 100/s (the
// regions had been told the home had nothing for a day's token).
func TestRegionsRuleChangeKeepsTokens(t *testing.T) {
	home := redistest.Start(t)
	servers := []*ruleChangeServer{
		startRuleChangeServer(t, "region a", "redis://"+redistest.Start(t).Addr, "100/s", 100, "--home", "redis://"+home.Addr, "--region", "a"),
		startRuleChangeServer(t, "region b", "redis://"+redistest.Start(t).Addr, "100/s", 100, "--home", "redis://"+home.Addr, "--region", "b"),
	}
	// A new home fences a new bucket for its burst's time and the
	// lookahead (1.25 s): wait until the regions admit.
	for deadline := time.Now().Add(15 * time.Second); !mustCheckAcme(t, servers[0]).Allowed; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("region a admitted nothing in 15 s of 100/s burst 100")
		}
	}
	// Drained: on until 300 are sent and one is refused.
	drainStart := time.Now()
	admitted, sent, _ := drainAcme(t, servers, 300)
	drained := time.Now()
	t.Logf("100/s burst 100 across two regions: %d of %d admitted in %v, the last refused", admitted, sent, drained.Sub(drainStart).Round(time.Millisecond))

	// Lowered to 1000/d burst 1000: what the key held is kept, and what
	// 100/s refilled until the home first read it under the new rule, and
	// what the regions held of the old rule's grants.
	// A region refuses at once while its refill is out (the regions ask
	// for more than the limit), so each is asked once, given time for the
	// refill its ask starts, then asked 300 times.
	reloadRuleChange(t, servers, "1000/d", 1000)
	gap := time.Since(drained)
	low := 0
	for _, s := range servers {
		if mustCheckAcme(t, s).Allowed {
			low++
		}
	}
	time.Sleep(time.Second)
	for _, a := range checksOf(t, servers, 300, 1000) {
		if a.Allowed {
			low++
		}
	}
	// What the regions were granted under the old rule before the home
	// took up the change (the drain refuses when a server's allowance is
	// out, not the home) is spent as granted: at most the old rule's
	// 100/s over the home's lookahead and a pool's hold (1.25 s).
	most := 2 + int(gap/(10*time.Millisecond)) + 125
	t.Logf("1000/d burst 1000, %v after the drain: %d of 302 checks admitted (at most %d)", gap.Round(time.Millisecond), low, most)
	if low > most {
		t.Errorf("%d of 302 checks admitted after a drained 100/s bucket across regions was lowered to 1000/d burst 1000 (%v after it was drained), want at most %d", low, gap, most)
	}

	// Raised back to 100/s burst 100: it admits again within a second,
	// and 100 within 15 s however slow the machine, never faster than
	// the burst and 100/s from the reload.
	reloadRuleChange(t, servers, "100/s", 100)
	t0 := time.Now()
	n := 0
	for i := 0; n < 100; i++ {
		if time.Since(t0) > 15*time.Second {
			t.Fatalf("%d admitted in 15 s after the reload back to 100/s burst 100, want 100", n)
		}
		a := mustCheckAcme(t, servers[i%2])
		if !a.Allowed {
			time.Sleep(5 * time.Millisecond)
			continue
		}
		n++
		if bound := 100 + 100*time.Since(t0).Seconds() + 2*25; float64(n) > bound {
			t.Fatalf("%d admitted %v after the reload to 100/s burst 100, more than 100 + 100/s × that + 50", n, time.Since(t0))
		}
	}
	t.Logf("100/s burst 100 again: 100 admitted in %v", time.Since(t0).Round(time.Millisecond))
}
