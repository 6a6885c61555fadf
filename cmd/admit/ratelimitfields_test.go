package main

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/admitdev/admit/internal/sftest"
	"github.com/admitdev/admit/llm/llmtest"
)

// wantParams checks that p has the parameters of want, with these
// values (nil: present, of any value), and no other but those of also.
func wantParams(t *testing.T, what string, p sftest.Params, want map[string]any, also ...string) {
	t.Helper()
	for k, v := range want {
		got, ok := p.Get(k)
		if !ok {
			t.Errorf("%s: no %s in %v", what, k, p)
		} else if v != nil && !reflect.DeepEqual(got, v) {
			t.Errorf("%s: %s=%v, want %v", what, k, got, v)
		}
	}
	for _, kv := range p {
		if _, ok := want[kv.Key]; !ok && !strings.Contains(strings.Join(also, " "), kv.Key) {
			t.Errorf("%s: a parameter %s=%v", what, kv.Key, kv.Value)
		}
	}
	if pk, ok := p.Get("pk"); ok {
		if b, _ := pk.([]byte); len(b) == 0 {
			t.Errorf("%s: pk %v is not a Byte Sequence", what, pk)
		}
	}
}

// quotaExceeded decodes a 429's body as a quota-exceeded problem and
// returns its violated policies.
func quotaExceeded(t *testing.T, what string, resp *http.Response, body string) []string {
	t.Helper()
	var p struct {
		Type         string   `json:"type"`
		Status       int      `json:"status"`
		Violated     []string `json:"violated-policies"`
		DeniedBy     string   `json:"denied_by"`
		RetryAfterMS *int64   `json:"retry_after_ms"`
	}
	if err := json.Unmarshal([]byte(body), &p); err != nil {
		t.Fatalf("%s: %v: %s", what, err, body)
	}
	if resp.StatusCode != 429 || resp.Header.Get("Content-Type") != "application/problem+json" ||
		p.Type != "https://iana.org/assignments/http-problem-types#quota-exceeded" || p.Status != 429 ||
		p.DeniedBy == "" || p.RetryAfterMS == nil {
		t.Errorf("%s: %d %s %s, want a quota-exceeded problem", what, resp.StatusCode, resp.Header.Get("Content-Type"), body)
	}
	return p.Violated
}

func post(t *testing.T, url, body string) (*http.Response, string) {
	t.Helper()
	resp, err := http.Post(url, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, string(b)
}

// TestServeRateLimitFields: admit serve's decisions carry every rule
// that applied in RateLimit-Policy and RateLimit, as RFC 9651 parses
// them: a token bucket and a window of /v1/check, the concurrency rule of
// /v1/leases; shadow rules never. Refusals are quota-exceeded problems
// naming the rules that refused.
func TestServeRateLimitFields(t *testing.T) {
	cfg := `version: 1
tiers:
  basic:
    rules:
      - name: burst
        scope: user
        algorithm: token_bucket
        rate: 1/min
        burst: 2
      - name: hourly
        scope: tenant
        algorithm: fixed_window
        limit: 100
        window: 1h
      - name: watching
        scope: tenant
        algorithm: fixed_window
        limit: 1
        window: 1h
        shadow: true
      - name: exports
        scope: tenant
        actions: [export]
        algorithm: concurrency
        max: 1
tenants:
  acme: {tier: basic}
`
	path := filepath.Join(t.TempDir(), "admit.yaml")
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	srv := startCmd(t, "serve", "--config", path, "--http", "127.0.0.1:0", "--grpc", "127.0.0.1:0", "--data-dir", t.TempDir())
	check := `{"tenant":"acme","user":"alice","action":"read"}`
	var firstPK any
	for i := range 2 {
		resp, body := post(t, srv.url+"/v1/check", check)
		if resp.StatusCode != 200 {
			t.Fatalf("check %d: %d %s", i+1, resp.StatusCode, body)
		}
		policies, limits := sftest.RateLimitFields(t, resp.Header)
		if len(policies) != 2 {
			t.Fatalf("check %d: policies %v, want burst and hourly (not the shadow rule)", i+1, policies)
		}
		wantParams(t, "burst policy", policies["burst"], map[string]any{"q": int64(2), "w": int64(120), "pk": nil})
		wantParams(t, "hourly policy", policies["hourly"], map[string]any{"q": int64(100), "w": int64(3600), "pk": nil})
		wantParams(t, "burst limit", limits["burst"], map[string]any{"r": int64(1 - i), "t": nil, "pk": nil})
		wantParams(t, "hourly limit", limits["hourly"], map[string]any{"r": int64(99 - i), "t": nil, "pk": nil})
		pk, _ := policies["burst"].Get("pk")
		if lpk, _ := limits["burst"].Get("pk"); !reflect.DeepEqual(pk, lpk) {
			t.Errorf("burst: RateLimit-Policy's pk %v, RateLimit's %v", pk, lpk)
		}
		if i == 0 {
			firstPK = pk
		} else if !reflect.DeepEqual(pk, firstPK) {
			t.Errorf("one bucket, two partitions: %v, %v", firstPK, pk)
		}
	}
	// Another user: another bucket of burst, the same of hourly.
	resp, _ := post(t, srv.url+"/v1/check", `{"tenant":"acme","user":"bob","action":"read"}`)
	policies, _ := sftest.RateLimitFields(t, resp.Header)
	if pk, _ := policies["burst"].Get("pk"); reflect.DeepEqual(pk, firstPK) {
		t.Errorf("alice's and bob's buckets: one partition %v", pk)
	}
	resp, body := post(t, srv.url+"/v1/check", check)
	if v := quotaExceeded(t, "third check", resp, body); !reflect.DeepEqual(v, []string{"burst"}) {
		t.Errorf("violated-policies %q, want [burst]", v)
	}
	if _, limits := sftest.RateLimitFields(t, resp.Header); limits["burst"] == nil {
		t.Errorf("a refusal without its RateLimit field: %v", resp.Header)
	} else if r, _ := limits["burst"].Get("r"); r != int64(0) {
		t.Errorf("refused: burst r=%v, want 0", r)
	}

	// A concurrency rule: its slots, in concurrent requests, with no window.
	lease := `{"tenant":"acme","user":"alice","resource":"export","ttl_ms":60000}`
	resp, body = post(t, srv.url+"/v1/leases", lease)
	if resp.StatusCode != 201 {
		t.Fatalf("lease: %d %s", resp.StatusCode, body)
	}
	policies, limits := sftest.RateLimitFields(t, resp.Header)
	wantParams(t, "exports policy", policies["exports"], map[string]any{"q": int64(1), "qu": "concurrent-requests", "pk": nil})
	wantParams(t, "exports limit", limits["exports"], map[string]any{"r": int64(0), "pk": nil}, "t")
	resp, body = post(t, srv.url+"/v1/leases", lease)
	if v := quotaExceeded(t, "second lease", resp, body); !reflect.DeepEqual(v, []string{"exports"}) {
		t.Errorf("violated-policies %q, want [exports]", v)
	}
}

// TestProxyRateLimitFields: admit proxy's LLM calls name their rules in
// requests, in LLM tokens and in money, each with its unit; its HTTP
// refusals are quota-exceeded problems.
func TestProxyRateLimitFields(t *testing.T) {
	cfg := `version: 1
llm:
  providers:
    openai:
      base_url: ${OPENAI_BASE_URL}
      api_key: ${OPENAI_API_KEY}
  currency: USD
  prices:
    gpt-4o-mini: {input: "0.15", output: "0.60"}
tiers:
  metered:
    rules:
      - name: calls
        scope: tenant
        algorithm: token_bucket
        rate: 1/min
        burst: 2
      - name: tokens-per-minute
        scope: tenant
        unit: tokens
        algorithm: token_bucket
        rate: 100000/min
        burst: 100000
      - name: daily-spend
        scope: tenant
        unit: money
        algorithm: quota
        period: day
        time_zone: UTC
        budget: "5"
tenants:
  acme:
    tier: metered
    api_keys_sha256: ["afacab3575137afa4e00d9cbcafcb14c9ae25f779d964eb0ea5b2c4eb5dfd163"]
`
	path := filepath.Join(t.TempDir(), "admit.yaml")
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	up := &llmtest.Upstream{Output: 50}
	upSrv := httptest.NewServer(up)
	t.Cleanup(upSrv.Close)
	t.Setenv("OPENAI_BASE_URL", upSrv.URL+"/v1")
	t.Setenv("OPENAI_API_KEY", "sk-platform-openai")
	p := startCmd(t, "proxy", "--config", path, "--listen", "127.0.0.1:0", "--data-dir", t.TempDir())
	chat := `{"model":"gpt-4o-mini","messages":[{"role":"user","content":"hello"}],"max_tokens":100}`
	resp, body := llmCall(t, "POST", p.url+"/v1/chat/completions", map[string]string{"Authorization": "Bearer acme-key"}, chat)
	if resp.StatusCode != 200 {
		t.Fatalf("call: %d %s", resp.StatusCode, body)
	}
	policies, limits := sftest.RateLimitFields(t, resp.Header)
	wantParams(t, "calls policy", policies["calls"], map[string]any{"q": int64(2), "w": int64(120), "pk": nil})
	wantParams(t, "tokens policy", policies["tokens-per-minute"], map[string]any{"q": int64(100000), "qu": "admit-tokens", "w": int64(60), "pk": nil})
	wantParams(t, "spend policy", policies["daily-spend"], map[string]any{"q": int64(5_000_000), "qu": "admit-money", "w": int64(86400), "pk": nil})
	for name, l := range limits {
		wantParams(t, name+" limit", l, map[string]any{"r": nil, "t": nil, "pk": nil})
	}
	if len(policies) != 3 {
		t.Errorf("policies %v, want calls, tokens-per-minute and daily-spend", policies)
	}
	// The draft-03 fields OpenAI's clients read stay.
	if resp.Header.Get("X-Ratelimit-Limit-Tokens") == "" || resp.Header.Get("X-Ratelimit-Remaining-Requests") == "" {
		t.Errorf("OpenAI's x-ratelimit fields are gone: %v", resp.Header)
	}
	// A refusal is in the provider's format, for its SDKs, with the fields
	// of the decision that refused it.
	llmCall(t, "POST", p.url+"/v1/chat/completions", map[string]string{"Authorization": "Bearer acme-key"}, chat)
	resp, body = llmCall(t, "POST", p.url+"/v1/chat/completions", map[string]string{"Authorization": "Bearer acme-key"}, chat)
	if resp.StatusCode != 429 || !strings.Contains(body, `"rate_limit_exceeded"`) {
		t.Fatalf("third call: %d %s, want OpenAI's 429", resp.StatusCode, body)
	}
	policies, limits = sftest.RateLimitFields(t, resp.Header)
	if len(policies) != 3 {
		t.Errorf("refused: policies %v, want all three", policies)
	}
	wantParams(t, "refused calls limit", limits["calls"], map[string]any{"r": int64(0), "t": nil, "pk": nil})
}
