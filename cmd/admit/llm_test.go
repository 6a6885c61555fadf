package main

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/admitdev/admit/llm"
	"github.com/admitdev/admit/llm/llmtest"
	"github.com/admitdev/admit/redistest"
	"github.com/admitdev/admit/units"
)

// llmProxy starts admit proxy on examples/llm/admit.yaml (or config) with
// every provider pointed at one stand-in.
func llmProxy(t *testing.T, config string, args ...string) (*running, *llmtest.Upstream) {
	t.Helper()
	up := &llmtest.Upstream{Output: 50}
	srv := httptest.NewServer(up)
	t.Cleanup(srv.Close)
	t.Setenv("OPENAI_BASE_URL", srv.URL+"/v1")
	t.Setenv("OPENAI_API_KEY", "sk-platform-openai")
	t.Setenv("ANTHROPIC_BASE_URL", srv.URL)
	t.Setenv("ANTHROPIC_API_KEY", "sk-platform-anthropic")
	t.Setenv("GOOGLE_GEMINI_BASE_URL", srv.URL)
	t.Setenv("GEMINI_API_KEY", "platform-gemini")
	return startCmd(t, append([]string{"proxy", "--config", config, "--listen", "127.0.0.1:0"}, args...)...), up
}

func llmCall(t *testing.T, method, url string, header map[string]string, body string) (*http.Response, string) {
	t.Helper()
	req, _ := http.NewRequest(method, url, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	for k, v := range header {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	return resp, string(b)
}

// TestLLMProxyExample runs the example of examples/llm as its README does:
// each provider's calls, credentials swapped, refusals in each format.
func TestLLMProxyExample(t *testing.T) {
	p, up := llmProxy(t, "../../examples/llm/admit.yaml", "--metrics", "127.0.0.1:0")
	chat := `{"model":"gpt-4o-mini","messages":[{"role":"user","content":"hello"}],"max_tokens":100}`
	for _, c := range []struct {
		name, path, body string
		header           map[string]string
		sees, seen       string // the upstream's credential header and value
	}{
		{"openai", "/v1/chat/completions", chat, map[string]string{"Authorization": "Bearer acme-key", "OpenAI-Organization": "org-other"}, "Authorization", "Bearer sk-platform-openai"},
		{"anthropic", "/v1/messages", `{"model":"claude-haiku-4-5","max_tokens":100,"messages":[{"role":"user","content":"hello"}]}`,
			map[string]string{"x-api-key": "acme-key", "anthropic-version": "2023-06-01"}, "X-Api-Key", "sk-platform-anthropic"},
		{"gemini", "/v1beta/models/gemini-2.5-flash:generateContent", `{"contents":[{"parts":[{"text":"hello"}]}]}`,
			map[string]string{"x-goog-api-key": "acme-key"}, "X-Goog-Api-Key", "platform-gemini"},
		{"gemini_query_key", "/v1beta/models/gemini-2.5-flash:generateContent?key=acme-key", `{"contents":[{"parts":[{"text":"hello"}]}]}`,
			nil, "X-Goog-Api-Key", "platform-gemini"},
		{"gemini_other_spellings", "/v1beta/models/gemini-2.5-flash:generateContent?Key=acme-key&API_KEY=acme-key&access_token=acme-key", `{"contents":[{"parts":[{"text":"hello"}]}]}`,
			map[string]string{"x-goog-api-key": "acme-key", "Cookie": "session=acme-key"}, "X-Goog-Api-Key", "platform-gemini"},
	} {
		resp, body := llmCall(t, "POST", p.url+c.path, c.header, c.body)
		if resp.StatusCode != 200 {
			t.Fatalf("%s: %d %s", c.name, resp.StatusCode, body)
		}
		seen, _ := up.Last()
		if got := seen.Header.Get(c.sees); got != c.seen {
			t.Errorf("%s: the provider saw %s %q, want the platform's key", c.name, c.sees, got)
		}
		for _, h := range []string{"Authorization", "X-Api-Key", "X-Goog-Api-Key"} {
			if h != c.sees && seen.Header.Get(h) != "" {
				t.Errorf("%s: the provider saw %s %q", c.name, h, seen.Header.Get(h))
			}
		}
		if strings.Contains(seen.URL.RawQuery, "acme-key") || seen.Header.Get("Cookie") != "" || seen.Header.Get("OpenAI-Organization") != "" {
			t.Errorf("%s: a caller's key or organization reached the provider: %v %v", c.name, seen.URL, seen.Header)
		}
		if resp.Header.Get("X-Ratelimit-Limit-Tokens") != "1000" || resp.Header.Get("X-Ratelimit-Remaining-Tokens") == "" {
			t.Errorf("%s: headers %v", c.name, resp.Header)
		}
	}

	// Unknown keys: 401 in each provider's format, never forwarded.
	calls := up.Calls()
	for _, c := range []struct{ path, header, value, want string }{
		{"/v1/chat/completions", "Authorization", "Bearer nope", `"error":{"code":"invalid_api_key"`},
		{"/v1/messages", "x-api-key", "nope", `"type":"authentication_error"`},
		{"/v1beta/models/g:generateContent", "x-goog-api-key", "nope", `"status":"UNAUTHENTICATED"`},
	} {
		resp, body := llmCall(t, "POST", p.url+c.path, map[string]string{c.header: c.value}, chat)
		if resp.StatusCode != 401 || !strings.Contains(body, c.want) {
			t.Errorf("%s with an unknown key: %d %s", c.path, resp.StatusCode, body)
		}
	}
	// Other provider endpoints are never forwarded with the platform's key.
	if resp, _ := llmCall(t, "GET", p.url+"/v1/files", map[string]string{"Authorization": "Bearer acme-key"}, ""); resp.StatusCode != 404 {
		t.Errorf("GET /v1/files: %d", resp.StatusCode)
	}
	// Broken JSON: a clear error in the provider's format.
	if resp, body := llmCall(t, "POST", p.url+"/v1/messages", map[string]string{"x-api-key": "acme-key"}, `{"model":`); resp.StatusCode != 400 || !strings.Contains(body, `"invalid_request_error"`) {
		t.Errorf("broken JSON: %d %s", resp.StatusCode, body)
	}
	if up.Calls() != calls {
		t.Errorf("refused calls reached the provider: %d → %d", calls, up.Calls())
	}

	// frugal's 0.01 USD a day: spent, then refused as insufficient
	// quota, not to be retried today.
	up.Output = 4000
	var last *http.Response
	var lastBody string
	for range 20 {
		last, lastBody = llmCall(t, "POST", p.url+"/v1/chat/completions", map[string]string{"Authorization": "Bearer frugal-key"},
			`{"model":"gpt-4o-mini","messages":[{"role":"user","content":"write"}],"max_tokens":4000}`)
		if last.StatusCode != 200 {
			break
		}
	}
	if last.StatusCode != 429 || !strings.Contains(lastBody, `"code":"insufficient_quota"`) || last.Header.Get("X-Should-Retry") != "false" {
		t.Fatalf("frugal past its budget: %d %s %v", last.StatusCode, lastBody, last.Header)
	}
	// Spent until the day ends (UTC): retry then, not before.
	now := time.Now().UTC()
	toMidnight := now.Truncate(24 * time.Hour).Add(24 * time.Hour).Sub(now)
	if secs, err := strconv.ParseInt(last.Header.Get("Retry-After"), 10, 64); err != nil || secs < int64(toMidnight/time.Second)-5 || secs > int64(toMidnight/time.Second)+5 {
		t.Errorf("frugal's spent budget: Retry-After %q, want the %v to the day's end", last.Header.Get("Retry-After"), toMidnight.Round(time.Second))
	}
	// The usage API and metrics say what each tenant used.
	metrics := strings.TrimPrefix(p.stderr.String(), "")
	addr := metricsAddr(t, metrics)
	// Only the platform reads usage: the admin token (ADMIT_ADMIN_TOKEN).
	for _, h := range []map[string]string{nil, {"Authorization": "Bearer acme-key"}} {
		if resp, body := llmCall(t, "GET", "http://"+addr+"/v1/llm/usage?tenant=frugal", h, ""); resp.StatusCode != 401 {
			t.Errorf("the usage API with %v: %d %s, want 401", h, resp.StatusCode, body)
		}
	}
	resp, body := llmCall(t, "GET", "http://"+addr+"/v1/llm/usage?tenant=frugal", adminAuth, "")
	var usage struct {
		Currency string `json:"currency"`
		Usage    []struct {
			Model, Cost string
			Tokens      map[string]int64
		} `json:"usage"`
	}
	if resp.StatusCode != 200 || json.Unmarshal([]byte(body), &usage) != nil || len(usage.Usage) != 1 || usage.Currency != "USD" {
		t.Fatalf("usage API: %d %s", resp.StatusCode, body)
	}
	if u := usage.Usage[0]; u.Model != "gpt-4o-mini" || u.Tokens["output"] == 0 || u.Cost == "0" {
		t.Errorf("frugal's usage %+v", u)
	}
	_, body = llmCall(t, "GET", "http://"+addr+"/metrics", nil, "")
	if !strings.Contains(body, `admit_llm_tokens_total{kind="output",model="gpt-4o-mini",tenant="frugal"}`) || !strings.Contains(body, `admit_llm_cost_total{currency="USD"`) {
		t.Errorf("metrics:\n%s", body)
	}
}

// adminAuth presents the admin token the tests' commands run with.
var adminAuth = map[string]string{"Authorization": "Bearer " + testAdminToken}

// metricsAddr finds the metrics address in a proxy's log.
func metricsAddr(t *testing.T, log string) string {
	t.Helper()
	for _, line := range strings.Split(log, "\n") {
		if strings.Contains(line, "serving metrics") {
			i := strings.Index(line, "http://")
			rest := line[i+len("http://"):]
			return rest[:strings.IndexByte(rest, '/')]
		}
	}
	t.Fatalf("no metrics address in:\n%s", log)
	return ""
}

// TestLLMProxiesShareRedis: two proxies on one Redis hold one budget in
// tokens together, exactly: calls through both never use more than it
// holds. With Redis down, a rule that fails closed refuses in the
// provider's format; one that fails open lets calls through.
func TestLLMProxiesShareRedis(t *testing.T) {
	srv := redistest.Start(t)
	cfg := `version: 1
store:
  backend: redis
  redis:
    addrs: ["` + srv.Addr + `"]
llm:
  providers:
    anthropic:
      base_url: ${ANTHROPIC_BASE_URL}
      api_key: ${ANTHROPIC_API_KEY}
tiers:
  t:
    rules:
      - name: tokens
        scope: tenant
        unit: tokens
        algorithm: token_bucket
        rate: 100/d
        burst: 4000
        on_error: closed
tenants:
  acme:
    tier: t
    api_keys_sha256: ["afacab3575137afa4e00d9cbcafcb14c9ae25f779d964eb0ea5b2c4eb5dfd163"]
`
	a, b, up, _ := twoLLMProxies(t, cfg)
	up.Output = 90
	var wg sync.WaitGroup
	var mu sync.Mutex
	admitted := 0
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p := a
			if g%2 == 1 {
				p = b
			}
			for i := range 12 {
				body := `{"model":"claude-haiku-4-5","max_tokens":` + []string{"100", "150", "200"}[i%3] + `,"stream":` + []string{"true", "false"}[g%2] + `,"messages":[{"role":"user","content":"go"}]}`
				req, _ := http.NewRequest("POST", p.url+"/v1/messages", strings.NewReader(body))
				req.Header.Set("x-api-key", "acme-key")
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					t.Error(err)
					return
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode == 200 {
					mu.Lock()
					admitted++
					mu.Unlock()
				}
			}
		}()
	}
	wg.Wait()
	// Every admitted call used its input and 90 output tokens. The bucket
	// refills a token every 864 s: at most one during the test. At the
	// end, each of the 8 callers may have been refused while others held
	// reservations later refunded: at most 8 calls' worth left unused.
	_, sent := up.Last()
	perCall := llmtest.InputTokens(sent) + 90
	if used := int64(admitted) * perCall; used > 4001 || used < 4000-8*(perCall+200) {
		t.Fatalf("%d calls admitted through two proxies used %d tokens of a 4000-token budget", admitted, used)
	}
	t.Logf("%d calls admitted, %d tokens each", admitted, perCall)

	// Both proxies' calls add up in Redis, by day: what a's usage API
	// says once b has stored its calls (b stores them within a second).
	addr := metricsAddr(t, a.stderr.String())
	var day string
	waitFor(t, func() bool {
		_, body := llmCall(t, "GET", "http://"+addr+"/v1/llm/usage?tenant=acme", adminAuth, "")
		var u struct {
			Usage []struct {
				Day      string
				Requests int64
				Tokens   map[string]int64
			}
		}
		if json.Unmarshal([]byte(body), &u) != nil || len(u.Usage) != 1 {
			return false
		}
		day = u.Usage[0].Day
		return u.Usage[0].Requests == int64(admitted) && u.Usage[0].Tokens["output"] == int64(admitted)*90
	}, "the usage of both proxies' calls in Redis")
	if resp, _ := llmCall(t, "GET", "http://"+addr+"/v1/llm/usage?tenant=acme&from="+day+"&to=2020-01-01", adminAuth, ""); resp.StatusCode != 400 {
		t.Errorf("a range that ends before it starts: %d", resp.StatusCode)
	}

	// A proxy refuses a tenant whose budget holds nothing for up to a
	// second without asking the store: past it, the store is asked.
	time.Sleep(1100 * time.Millisecond)
	srv.Kill()
	resp, body := llmCall(t, "POST", a.url+"/v1/messages", map[string]string{"x-api-key": "acme-key"}, `{"model":"claude-haiku-4-5","max_tokens":10,"messages":[]}`)
	if resp.StatusCode != 503 || !strings.Contains(body, `"type":"overloaded_error"`) || resp.Header.Get("Retry-After") == "" {
		t.Fatalf("Redis down, on_error closed: %d %s", resp.StatusCode, body)
	}
}

// twoLLMProxies starts two admit proxy processes on config cfg (a with
// its metrics listener), every provider pointed at one stand-in; and the
// config's path.
func twoLLMProxies(t *testing.T, cfg string) (a, b *running, up *llmtest.Upstream, path string) {
	t.Helper()
	path = filepath.Join(t.TempDir(), "admit.yaml")
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	a, up = llmProxy(t, path, "--data-dir", t.TempDir(), "--metrics", "127.0.0.1:0")
	b = startCmd(t, "proxy", "--config", path, "--listen", "127.0.0.1:0", "--data-dir", t.TempDir())
	return a, b, up, path
}

// TestLLMConfigErrors: a wrong llm section or rule in tokens or money is
// refused with its file, line and field.
func TestLLMConfigErrors(t *testing.T) {
	for _, c := range []struct{ yaml, want string }{
		{"llm:\n  providers:\n    openai:\n      api_key: \"\"\n", "llm.providers.openai.api_key"},
		{"llm:\n  providers:\n    grok: {api_key: k}\n", "unknown provider"},
		{"llm:\n  providers:\n    openai: {base_url: \"ftp://x\", api_key: k}\n", "llm.providers.openai.base_url"},
		{"llm:\n  prices:\n    m: {input: \"abc\", output: \"1\"}\n", "llm.prices.m.input"},
		{"llm:\n  prices:\n    m: {input: \"1\"}\n", "llm.prices.m.output"},
		{"llm:\n  drain_on_disconnect: forever\n", "llm.drain_on_disconnect"},
		{"tiers:\n  t:\n    rules:\n      - {name: r, scope: tenant, unit: money, algorithm: quota, period: day, limit: 5}\n", "budget"},
		{"tiers:\n  t:\n    rules:\n      - {name: r, scope: tenant, unit: money, algorithm: quota, period: day, budget: \"0.0000001\"}\n", "budget"},
		{"tiers:\n  t:\n    rules:\n      - {name: r, scope: tenant, unit: tokens, algorithm: sliding_log, limit: 5, window: 1m}\n", ".unit"},
		{"tiers:\n  t:\n    rules:\n      - {name: r, scope: tenant, unit: tokens, weights: {inptu: \"1\"}, algorithm: fixed_window, limit: 5, window: 1m}\n", "unknown token kind"},
		{"tiers:\n  t:\n    rules:\n      - {name: r, scope: tenant, unit: coins, algorithm: fixed_window, limit: 5, window: 1m}\n", "unknown unit"},
	} {
		_, err := ParseConfig("x.yaml", []byte("version: 1\n"+c.yaml))
		if err == nil || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), "x.yaml:") {
			t.Errorf("%s: %v, want an error about %s with its position", c.yaml, err, c.want)
		}
	}
}

// TestLLMClientsWhoLeaveArePaidFor: a tenant's clients leave their
// non-streamed calls once the provider has them (the provider finishes
// and bills each: once refunded as if it had not happened). The proxy
// reads each answer to its end after its client left, and the budget is
// charged what the provider billed.
func TestLLMClientsWhoLeaveArePaidFor(t *testing.T) {
	p, up := llmProxy(t, "../../examples/llm/admit.yaml", "--metrics", "127.0.0.1:0")
	up.Output = 60
	up.HoldAnswer = make(chan struct{})
	body := `{"model":"gpt-4o-mini","messages":[{"role":"user","content":"write"}],"max_tokens":60}`
	const calls = 5
	start := time.Now()
	var wg sync.WaitGroup
	for i := range calls {
		ctx, cancel := context.WithCancel(context.Background())
		req, _ := http.NewRequestWithContext(ctx, "POST", p.url+"/v1/chat/completions", strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer acme-key")
		wg.Add(1)
		go func() {
			defer wg.Done()
			if resp, err := http.DefaultClient.Do(req); err == nil {
				resp.Body.Close()
			}
		}()
		for up.Calls() <= int64(i) {
			time.Sleep(time.Millisecond) // until the provider has the call
		}
		cancel() // the client leaves
	}
	wg.Wait()
	close(up.HoldAnswer) // the provider finishes every call
	// Each call's handler bills once let go, on its own goroutine.
	want := calls * (llmtest.InputTokens([]byte(body)) + 60)
	waitFor(t, func() bool { return up.Billed() >= want }, "the stand-in to bill every call")
	billed := up.Billed()
	if billed != want {
		t.Fatalf("the stand-in billed %d, want %d", billed, want)
	}
	addr := metricsAddr(t, p.stderr.String())
	var used int64
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		_, out := llmCall(t, "GET", "http://"+addr+"/v1/llm/usage?tenant=acme", adminAuth, "")
		var usage struct {
			Usage []struct{ Tokens map[string]int64 } `json:"usage"`
		}
		_ = json.Unmarshal([]byte(out), &usage)
		used = 0
		for _, u := range usage.Usage {
			for _, n := range u.Tokens {
				used += n
			}
		}
		if used >= billed {
			break
		}
	}
	if used != billed {
		t.Fatalf("the tenant's usage is %d tokens for %d calls its clients left, which the provider billed %d", used, calls, billed)
	}
	resp, _ := llmCall(t, "POST", p.url+"/v1/chat/completions", map[string]string{"Authorization": "Bearer acme-key"},
		`{"model":"gpt-4o-mini","messages":[{"role":"user","content":"hi"}],"max_tokens":1}`)
	// What came back since the calls, at 1,000 a minute, is all the
	// bucket may hold beyond what they left.
	refill := int64(time.Since(start)*1000/time.Minute) + 1
	if left, _ := strconv.ParseInt(resp.Header.Get("X-Ratelimit-Remaining-Tokens"), 10, 64); left > 1000-billed+refill {
		t.Errorf("the budget holds %d of 1000 after calls billed %d", left, billed)
	}
}

// TestLLMPricesScale: a long context or a tier that sets some kinds
// scales the kinds it leaves unset as the kinds they default to.
func TestLLMPricesScale(t *testing.T) {
	c := LLMConfig{Prices: map[string]LLMPriceConfig{"m": {
		LLMRatesConfig: LLMRatesConfig{Input: "2", CachedInput: "0.2", AudioInput: "40", Output: "10", CacheWrite1h: "4", WebSearch: "10"},
		LongContext:    &LLMLongContextConfig{Above: 100, LLMRatesConfig: LLMRatesConfig{Input: "4", Output: "15"}},
		ServiceTiers:   map[string]LLMTierConfig{"priority": {LLMRatesConfig: LLMRatesConfig{Input: "3"}}},
	}}}
	prices, err := c.prices()
	if err != nil {
		t.Fatal(err)
	}
	p := prices["m"]
	want := llm.Rates{units.Input: 2e6, units.CachedInput: 2e5, units.CacheWrite: 2e6, units.CacheWriteLong: 4e6, units.Output: 10e6,
		units.Reasoning: 10e6, units.AudioInput: 40e6, units.AudioOutput: 10e6, units.WebSearch: 10e9}
	if p.Rates != want {
		t.Errorf("rates %v, want %v", p.Rates, want)
	}
	long := llm.Rates{units.Input: 4e6, units.CachedInput: 4e5, units.CacheWrite: 4e6, units.CacheWriteLong: 8e6, units.Output: 15e6,
		units.Reasoning: 15e6, units.AudioInput: 80e6, units.AudioOutput: 15e6, units.WebSearch: 10e9}
	if p.LongContextAbove != 100 || p.LongContext != long {
		t.Errorf("long context above %d: %v, want %v", p.LongContextAbove, p.LongContext, long)
	}
	pr := p.Tiers["priority"]
	if pr.Rates[units.Input] != 3e6 || pr.Rates[units.CachedInput] != 3e5 || pr.Rates[units.Output] != 10e6 || pr.Rates[units.AudioInput] != 60e6 {
		t.Errorf("priority %v", pr.Rates)
	}
	// The tier has no long context of its own: the higher of its rates
	// and the model's long-context ones.
	if pr.LongContextAbove != 100 || pr.LongContext[units.Input] != 4e6 || pr.LongContext[units.AudioInput] != 80e6 {
		t.Errorf("priority's long context %d %v", pr.LongContextAbove, pr.LongContext)
	}
}

// TestLLMPricedAsBilledOnRedis: two proxies on one Redis, priced as
// examples/llm/admit.yaml prices, charge each call what the provider's
// list prices bill for it: an hour's cache writes and web searches, a
// long prompt, a priority tier asked for and one served unasked, audio in
// and out. The usage both proxies store adds up to the list price, and
// the tenant's daily budget runs out at it.
func TestLLMPricedAsBilledOnRedis(t *testing.T) {
	example, err := os.ReadFile("../../examples/llm/admit.yaml")
	if err != nil {
		t.Fatal(err)
	}
	start := strings.Index(string(example), "  prices:\n")
	end := strings.Index(string(example), "\ntiers:")
	srv := redistest.Start(t)
	cfg := `version: 1
store:
  backend: redis
  redis:
    addrs: ["` + srv.Addr + `"]
llm:
  providers:
    openai: {base_url: "${OPENAI_BASE_URL}", api_key: "${OPENAI_API_KEY}"}
    anthropic: {base_url: "${ANTHROPIC_BASE_URL}", api_key: "${ANTHROPIC_API_KEY}"}
    gemini: {base_url: "${GOOGLE_GEMINI_BASE_URL}", api_key: "${GEMINI_API_KEY}"}
` + string(example[start:end]) + `
tiers:
  t:
    rules:
      - {name: spend, scope: tenant, unit: money, algorithm: quota, period: day, time_zone: UTC, budget: "3"}
tenants:
  acme:
    tier: t
    api_keys_sha256: ["afacab3575137afa4e00d9cbcafcb14c9ae25f779d964eb0ea5b2c4eb5dfd163"]
`
	a, b, up, path := twoLLMProxies(t, cfg)
	prices := mustPrices(t, path)
	wav := llmtest.WAV(1)
	type kinds = map[units.TokenKind]int64
	var spent int64
	for i, call := range []struct {
		name, path, body string
		set              func(*llmtest.Upstream)
		extra            kinds
		tier             string
		long             bool
	}{
		{"an hour's cache writes and web searches", "/v1/messages",
			`{"model":"claude-sonnet-4-5","max_tokens":400,"system":[{"type":"text","text":"rules","cache_control":{"type":"ephemeral","ttl":"1h"}}],` +
				`"tools":[{"type":"web_search_20250305","name":"web_search","max_uses":3}],"messages":[{"role":"user","content":"news"}]}`,
			func(u *llmtest.Upstream) { u.Cached, u.CacheWrite, u.CacheWrite1h, u.WebSearches = 500, 1000, 2000, 3 },
			kinds{units.CachedInput: 500, units.CacheWrite: 1000, units.CacheWriteLong: 2000, units.WebSearch: 3}, "standard", false},
		{"a long prompt", "/v1/messages",
			`{"model":"claude-sonnet-4-5","max_tokens":400,"stream":true,"messages":[{"role":"user","content":"the rest"}]}`,
			func(u *llmtest.Upstream) { u.Cached = 250_000 }, kinds{units.CachedInput: 250_000}, "standard", true},
		{"priority asked for", "/v1/chat/completions",
			`{"model":"gpt-5","service_tier":"priority","max_completion_tokens":300,"messages":[{"role":"user","content":"fast"}]}`,
			func(*llmtest.Upstream) {}, nil, "priority", false},
		{"priority served unasked", "/v1/chat/completions",
			`{"model":"gpt-5-2025-08-07","stream":true,"max_completion_tokens":300,"messages":[{"role":"user","content":"auto"}]}`,
			func(u *llmtest.Upstream) { u.ServiceTier = "priority" }, nil, "priority", false},
		{"audio in and out", "/v1/chat/completions",
			`{"model":"gpt-4o-audio-preview","modalities":["text","audio"],"audio":{"voice":"alloy","format":"wav"},"max_completion_tokens":500,` +
				`"messages":[{"role":"user","content":[{"type":"input_audio","input_audio":{"data":"` + wav + `","format":"wav"}}]}]}`,
			func(u *llmtest.Upstream) { u.AudioIn, u.AudioOut = 32, 300 }, kinds{units.AudioInput: 32, units.AudioOutput: 300}, "default", false},
		{"gemini audio", "/v1beta/models/gemini-2.5-flash:generateContent",
			`{"contents":[{"parts":[{"inline_data":{"mime_type":"audio/wav","data":"` + wav + `"}}]}],"generationConfig":{"maxOutputTokens":300}}`,
			func(u *llmtest.Upstream) { u.AudioIn = 32 }, kinds{units.AudioInput: 32}, "", false},
	} {
		up.Output, up.Cached, up.CacheWrite, up.CacheWrite1h, up.WebSearches, up.ServiceTier, up.AudioIn, up.AudioOut = 100, 0, 0, 0, 0, "", 0, 0
		call.set(up)
		p := a
		if i%2 == 1 {
			p = b
		}
		resp, body := llmCall(t, "POST", p.url+call.path, map[string]string{"Authorization": "Bearer acme-key", "x-api-key": "acme-key", "x-goog-api-key": "acme-key"}, call.body)
		if resp.StatusCode != 200 {
			t.Fatalf("%s: %d %s", call.name, resp.StatusCode, body)
		}
		_, sent := up.Last()
		var tok units.Tokens
		for k, n := range call.extra {
			tok[k] = n
		}
		tok[units.Input], tok[units.Output] = llmtest.InputTokens(sent), 100
		model := strings.TrimSuffix(strings.TrimPrefix(call.path, "/v1beta/models/"), ":generateContent")
		if !strings.HasPrefix(call.path, "/v1beta") {
			var m struct{ Model string }
			_ = json.Unmarshal([]byte(call.body), &m)
			model = strings.TrimSuffix(m.Model, "-2025-08-07")
		}
		pr := prices[model]
		cost := llmtest.ListCost(&pr, call.tier, call.long, tok)
		t.Logf("%s: %s at the list price", call.name, units.FormatDecimal(cost, 6))
		spent += cost
	}
	addr := metricsAddr(t, a.stderr.String())
	waitFor(t, func() bool {
		_, body := llmCall(t, "GET", "http://"+addr+"/v1/llm/usage?tenant=acme", adminAuth, "")
		var u struct{ Usage []struct{ Requests int64 } }
		if json.Unmarshal([]byte(body), &u) != nil {
			return false
		}
		n := int64(0)
		for _, row := range u.Usage {
			n += row.Requests
		}
		return n == 6
	}, "both proxies' calls in Redis")
	_, body := llmCall(t, "GET", "http://"+addr+"/v1/llm/usage?tenant=acme", adminAuth, "")
	var u struct{ Usage []struct{ Cost string } }
	if err := json.Unmarshal([]byte(body), &u); err != nil {
		t.Fatal(err)
	}
	var recorded int64
	for _, row := range u.Usage {
		n, err := units.ParseDecimal(row.Cost, 6)
		if err != nil {
			t.Fatalf("cost %q: %v", row.Cost, err)
		}
		recorded += n
	}
	if recorded != spent {
		t.Fatalf("the usage both proxies stored costs %s; the list prices bill %s (%s)", units.FormatDecimal(recorded, 6), units.FormatDecimal(spent, 6), body)
	}
	// The budget of 3 USD lost exactly that: a call that may cost what is
	// left and a millionth more is refused, one that may cost what is
	// left is not (gpt-5: 1.25 per million input, 10 per million output).
	left := 3_000_000 - spent
	t.Logf("spent %s of 3; %s left", units.FormatDecimal(spent, 6), units.FormatDecimal(left, 6))
	up.ServiceTier, up.Output = "", 1
	probe := func(maxOut int64) int {
		body := `{"model":"gpt-5","max_completion_tokens":` + strconv.FormatInt(maxOut, 10) + `,"messages":[{"role":"user","content":"x"}]}`
		resp, _ := llmCall(t, "POST", b.url+"/v1/chat/completions", map[string]string{"Authorization": "Bearer acme-key"}, body)
		return resp.StatusCode
	}
	if code := probe(left/10 + 1); code != 429 {
		t.Fatalf("a call that may cost more than the %d µUSD left: %d", left, code)
	}
	if code := probe(left/10 - 10); code != 200 {
		t.Fatalf("a call that may cost what is left (%d µUSD): %d", left, code)
	}
}

func mustPrices(t *testing.T, path string) map[string]llm.Price {
	t.Helper()
	cfg, err := LoadConfig(path)
	if err != nil {
		t.Fatal(err)
	}
	p, err := cfg.LLM.prices()
	if err != nil {
		t.Fatal(err)
	}
	return p
}
