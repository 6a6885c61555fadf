package attack

import (
	"bufio"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"

	"github.com/admitdev/admit/llm/llmtest"
	"github.com/admitdev/admit/policy"
	"github.com/admitdev/admit/proctest"
)

const platformKey = "sk-platform-secret-do-not-leak"

// llmProxy starts admit proxy as an LLM gateway in front of a stand-in:
// tenants acme (the attacker) and victim, 20,000 tokens each; and its
// metrics address.
func llmProxy(t *testing.T) (p *proctest.Proc, up *llmtest.Upstream, metrics string) {
	t.Helper()
	up = &llmtest.Upstream{Output: 10}
	srv := httptest.NewServer(up)
	t.Cleanup(srv.Close)
	cfg := `version: 1
llm:
  providers:
    openai: {base_url: "` + srv.URL + `/v1", api_key: ` + platformKey + `}
    anthropic: {base_url: "` + srv.URL + `", api_key: ` + platformKey + `}
    gemini: {base_url: "` + srv.URL + `", api_key: ` + platformKey + `}
tiers:
  t:
    rules:
      - {name: tokens, scope: tenant, unit: tokens, algorithm: token_bucket, rate: 1/h, burst: 20000}
tenants:
  acme: {tier: t, api_keys_sha256: ["` + policy.HashKey("acme-key") + `"]}
  victim: {tier: t, api_keys_sha256: ["` + policy.HashKey("victim-key") + `"]}
`
	listen, metrics := proctest.FreeAddr(t), proctest.FreeAddr(t)
	p = proctest.Start(t, admitBin, listen, nil, "proxy", "--listen", listen, "--metrics", metrics,
		"--data-dir", t.TempDir(), "--config", writeFile(t, "admit.yaml", cfg))
	return p, up, "http://" + metrics
}

func post(t *testing.T, url, body string, headers ...string) (int, string) {
	t.Helper()
	return send(t, "POST", url, body, headers...)
}

// send makes a request and reads its answer, failing the test if the
// platform's key is in any header of it.
func send(t *testing.T, method, url, body string, headers ...string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest(method, url, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	resp, err := proctest.Client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var b strings.Builder
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		b.WriteString(sc.Text() + "\n")
	}
	for k, v := range resp.Header {
		if strings.Contains(strings.Join(v, ","), platformKey) {
			t.Errorf("the platform's key in the answer's %s header", k)
		}
	}
	return resp.StatusCode, b.String()
}

var acmeBearer = []string{"Authorization", "Bearer acme-key"}

// TestLLMUsageCannotBeHidden: a tenant that streams and says it wants no
// usage report (include_usage: false) is charged all the same: the proxy
// asks for the report and keeps it from the tenant.
func TestLLMUsageCannotBeHidden(t *testing.T) {
	p, up, metrics := llmProxy(t)
	for _, opts := range []string{``, `,"stream_options":{"include_usage":false}`} {
		code, body := post(t, p.URL+"/v1/chat/completions", `{"model":"gpt-4o-mini","stream":true,"messages":[{"role":"user","content":"hi"}],"max_tokens":10`+opts+`}`, acmeBearer...)
		if code != 200 || strings.Contains(body, `"usage":{`) {
			t.Fatalf("%d %s", code, body)
		}
		if _, sent := up.Last(); !strings.Contains(string(sent), `"include_usage":true`) {
			t.Fatalf("the provider was not asked for usage: %s", sent)
		}
	}
	_, usage := send(t, "GET", metrics+"/v1/llm/usage?tenant=acme", "")
	report(t, "acme's usage after two streams that asked for no report", usage)
	if !strings.Contains(usage, `"output":20`) || !strings.Contains(usage, `"unreported":0`) {
		t.Fatalf("usage %s: want both streams' 10 output tokens, reported", usage)
	}
}

// TestLLMOnlyMeteredPaths: only the providers' own metered paths are
// forwarded with the platform's key; crafted paths that end like one, other
// endpoints (files, models, batches) and escapes never reach the provider.
func TestLLMOnlyMeteredPaths(t *testing.T) {
	p, up, _ := llmProxy(t)
	for _, path := range []string{
		"/v1/files", "/v1/models", "/v1/batches", "/v1/files/file-1/content",
		"/v1/files/x/../../chat/completions", "/v1/threads/chat/completions", "/x/v1/messages",
		"/v1/messages/batches", "/v1beta/models/../../files:generateContent", "/v1beta/models/a%2Fb:generateContent",
		"/v1beta/cachedContents", "/v1%2Fchat/completions",
	} {
		code, body := post(t, p.URL+path, `{"model":"gpt-4o-mini","messages":[]}`, acmeBearer...)
		if code != http.StatusNotFound {
			t.Errorf("POST %s: %d %.100s", path, code, body)
		}
	}
	report(t, "crafted paths that reached the provider", up.Calls())
	if up.Calls() != 0 {
		t.Fatalf("%d crafted calls reached the provider", up.Calls())
	}
	// A proper call: the provider sees the platform's key, the tenant's
	// answer never shows it (post checks the headers).
	if code, body := post(t, p.URL+"/v1/chat/completions", `{"model":"gpt-4o-mini","messages":[{"role":"user","content":"hi"}],"max_tokens":5}`, acmeBearer...); code != 200 || strings.Contains(body, platformKey) {
		t.Fatalf("%d %s", code, body)
	}
}

// TestLLMTrueBoundReserved: every way a request can make the provider
// bill more than it seems to ask for is in its reservation, against
// acme's 20,000 tokens: answers multiplied by best_of and a list of
// prompts, the larger of two maximums, Gemini's snake_case fields, token
// ids; one field spelled two ways is refused as ambiguous.
func TestLLMTrueBoundReserved(t *testing.T) {
	p, up, _ := llmProxy(t)
	ids := strings.Repeat("1,", 7999) + "1"
	one := "[" + ids + "]"
	for _, c := range []struct {
		path, body string
		code       int
	}{
		// 20 prompts × best_of 20: past the bound of 128 answers.
		{"/v1/completions", `{"model":"gpt-3.5-turbo-instruct","prompt":["p"` + strings.Repeat(`,"p"`, 19) + `],"best_of":20,"max_tokens":40}`, 400},
		// 8 prompts × best_of 16 × 200 tokens: 25,600.
		{"/v1/completions", `{"model":"gpt-3.5-turbo-instruct","prompt":["p","p","p","p","p","p","p","p"],"best_of":16,"max_tokens":200}`, 429},
		{"/v1/chat/completions", `{"model":"gpt-4o-mini","messages":[{"role":"user","content":"hi"}],"max_completion_tokens":1,"max_tokens":50000}`, 429},
		{"/v1beta/models/gemini-2.5-flash:generateContent", `{"contents":[{"parts":[{"text":"hi"}]}],"generation_config":{"candidate_count":100,"max_output_tokens":500}}`, 429},
		{"/v1beta/models/gemini-2.5-flash:generateContent", `{"contents":[{"parts":[{"text":"hi"}]}],"generationConfig":{"maxOutputTokens":1},"generation_config":{"max_output_tokens":50000}}`, 400},
		// 4 × 8,000 token ids: 32,000 input tokens.
		{"/v1/embeddings", `{"model":"text-embedding-3-small","input":[` + one + "," + one + "," + one + "," + one + `]}`, 429},
	} {
		if code, body := post(t, p.URL+c.path, c.body, acmeBearer...); code != c.code {
			t.Errorf("%s %.100s…: %d %s, want %d", c.path, c.body, code, body, c.code)
		}
	}
	if up.Calls() != 0 {
		t.Fatalf("%d calls reached the provider", up.Calls())
	}
}

// TestLLMChoicesAndModelsBounded: asking for many answers multiplies the
// reservation (never a way around the budget), and a tenant inventing
// model names cannot grow the usage table or the metrics past their
// bound.
func TestLLMChoicesAndModelsBounded(t *testing.T) {
	p, up, metrics := llmProxy(t)
	code, body := post(t, p.URL+"/v1/chat/completions", `{"model":"gpt-4o-mini","n":100,"messages":[{"role":"user","content":"hi"}],"max_tokens":500}`, acmeBearer...)
	if code != http.StatusTooManyRequests || up.Calls() != 0 {
		t.Fatalf("100 choices of 500 tokens against a 20,000-token budget: %d %s (provider calls %d)", code, body, up.Calls())
	}
	const models = 1100
	for i := range models {
		if code, body := post(t, p.URL+"/v1/chat/completions", `{"model":"m-`+strconv.Itoa(i)+`","messages":[{"role":"user","content":"x"}],"max_tokens":1}`, acmeBearer...); code != 200 {
			t.Fatalf("model %d: %d %s", i, code, body)
		}
	}
	_, text := send(t, "GET", metrics+"/metrics", "")
	series := strings.Count(text, "\nadmit_llm_requests_total{")
	report(t, "admit_llm_requests_total series after 1,100 model names", series)
	if series > 1000 {
		t.Fatalf("%d series of admit_llm_requests_total: the bound is 1,000", series)
	}
}
