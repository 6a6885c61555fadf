package e2e

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/anthropics/anthropic-sdk-go"
	aoption "github.com/anthropics/anthropic-sdk-go/option"
	"github.com/chromedp/chromedp"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/responses"
	"google.golang.org/genai"

	"github.com/admitdev/admit/llm"
	"github.com/admitdev/admit/llm/llmtest"
	"github.com/admitdev/admit/memstore"
	"github.com/admitdev/admit/policy"
)

// startLLMProxy runs `admit proxy --config examples/llm/admit.yaml` as
// its README does, every provider's base URL pointed at a stand-in, and
// returns its URL once it serves.
func startLLMProxy(t *testing.T) (string, *llmtest.Upstream) {
	t.Helper()
	u, up, _ := startLLMProxyArgs(t)
	return u, up
}

// startLLMProxyArgs is startLLMProxy with more flags; it also returns
// the metrics address when --metrics is among them.
func startLLMProxyArgs(t *testing.T, args ...string) (string, *llmtest.Upstream, string) {
	t.Helper()
	up := &llmtest.Upstream{Output: 40}
	srv := httptest.NewServer(up)
	t.Cleanup(srv.Close)
	cmd := exec.Command(admitBinary(t), append([]string{"proxy", "--config", "../examples/llm/admit.yaml", "--listen", "127.0.0.1:0"}, args...)...)
	cmd.Env = append(os.Environ(),
		"OPENAI_BASE_URL="+srv.URL+"/v1", "OPENAI_API_KEY=sk-platform",
		"ANTHROPIC_BASE_URL="+srv.URL, "ANTHROPIC_API_KEY=sk-ant-platform",
		"GOOGLE_GEMINI_BASE_URL="+srv.URL, "GEMINI_API_KEY=platform-gemini")
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	serving := regexp.MustCompile(`msg="admit proxy serving" listen=(http://127\.0\.0\.1:\d+)`)
	metrics := regexp.MustCompile(`msg="serving metrics" listen=(http://127\.0\.0\.1:\d+)`)
	found := make(chan string, 1)
	var metricsURL string
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			if m := metrics.FindStringSubmatch(sc.Text()); m != nil {
				metricsURL = m[1] // logged before the proxy serves
			}
			if m := serving.FindStringSubmatch(sc.Text()); m != nil {
				found <- m[1]
			}
		}
	}()
	select {
	case u := <-found:
		return u, up, metricsURL
	case <-time.After(30 * time.Second):
		t.Fatal("admit proxy did not start within 30s")
		return "", nil, ""
	}
}

// TestLLMSDKs drives admit proxy with the providers' official Go SDKs:
// calls and streams admitted and metered, and refusals the SDKs read as
// their own providers' errors, not retried when the budget is spent.
func TestLLMSDKs(t *testing.T) {
	proxy, up := startLLMProxy(t)
	ctx := context.Background()

	oa := openai.NewClient(option.WithBaseURL(proxy+"/v1/"), option.WithAPIKey("acme-key"), option.WithMaxRetries(0))
	chat := openai.ChatCompletionNewParams{Model: "gpt-4o-mini", Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hello")}, MaxCompletionTokens: openai.Int(40)}
	cc, err := oa.Chat.Completions.New(ctx, chat)
	if err != nil || cc.Usage.CompletionTokens != 40 {
		t.Fatalf("openai chat: %v %+v", err, cc)
	}
	// A stream that did not ask for usage sees no usage chunk, though
	// the proxy asked for it.
	st := oa.Chat.Completions.NewStreaming(ctx, chat)
	chunks := 0
	for st.Next() {
		if c := st.Current(); len(c.Choices) == 0 || c.Usage.TotalTokens != 0 {
			t.Fatalf("the SDK saw a usage chunk it did not ask for: %+v", c)
		}
		chunks++
	}
	if st.Err() != nil || chunks != 41 {
		t.Fatalf("openai stream: %d chunks, %v", chunks, st.Err())
	}
	if _, body := up.Last(); !strings.Contains(string(body), `"include_usage":true`) {
		t.Fatalf("the provider was not asked for the stream's usage: %s", body)
	}
	rs, err := oa.Responses.New(ctx, responses.ResponseNewParams{Model: "gpt-4o-mini", Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("hi")}, MaxOutputTokens: openai.Int(30)})
	if err != nil || rs.Usage.OutputTokens != 30 {
		t.Fatalf("openai responses: %v %+v", err, rs)
	}

	an := anthropic.NewClient(aoption.WithBaseURL(proxy), aoption.WithAPIKey("acme-key"), aoption.WithMaxRetries(0))
	msgParams := anthropic.MessageNewParams{Model: "claude-haiku-4-5", MaxTokens: 40, Messages: []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("hello"))}}
	msg, err := an.Messages.New(ctx, msgParams)
	if err != nil || msg.Usage.OutputTokens != 40 {
		t.Fatalf("anthropic: %v %+v", err, msg)
	}
	as := an.Messages.NewStreaming(ctx, msgParams)
	var acc anthropic.Message
	for as.Next() {
		if err := acc.Accumulate(as.Current()); err != nil {
			t.Fatal(err)
		}
	}
	if as.Err() != nil || acc.Usage.OutputTokens != 40 {
		t.Fatalf("anthropic stream: %v, usage %+v", as.Err(), acc.Usage)
	}

	gm, err := genai.NewClient(ctx, &genai.ClientConfig{APIKey: "acme-key", Backend: genai.BackendGeminiAPI, HTTPOptions: genai.HTTPOptions{BaseURL: proxy + "/"}})
	if err != nil {
		t.Fatal(err)
	}
	gr, err := gm.Models.GenerateContent(ctx, "gemini-2.5-flash", genai.Text("hello"), &genai.GenerateContentConfig{MaxOutputTokens: 40})
	if err != nil || gr.UsageMetadata == nil || gr.UsageMetadata.CandidatesTokenCount != 40 {
		t.Fatalf("gemini: %v %+v", err, gr)
	}
	parts := 0
	for r, err := range gm.Models.GenerateContentStream(ctx, "gemini-2.5-flash", genai.Text("hello"), &genai.GenerateContentConfig{MaxOutputTokens: 20}) {
		if err != nil {
			t.Fatalf("gemini stream: %v", err)
		}
		parts += len(r.Candidates)
	}
	if parts != 20 {
		t.Fatalf("gemini stream: %d chunks", parts)
	}

	// Calls without a maximum get what acme's 1,000 tokens a minute
	// leave, and the stand-in uses it all. Then calls that may use 900
	// tokens get a 429 in each SDK's own provider's format: the bucket
	// regains 900 in no less than 54 s.
	up.Output = 1000
	for range 2 {
		if _, err := oa.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{Model: "gpt-4o-mini", Messages: chat.Messages}); err != nil {
			break
		}
	}
	chat.MaxCompletionTokens = openai.Int(900)
	msgParams.MaxTokens = 900
	calls := up.Calls()
	_, err = oa.Chat.Completions.New(ctx, chat)
	var oe *openai.Error
	if !errors.As(err, &oe) || oe.StatusCode != 429 || oe.Code != "rate_limit_exceeded" || oe.Response.Header.Get("Retry-After-Ms") == "" {
		t.Fatalf("openai refusal: %v", err)
	}
	_, err = an.Messages.New(ctx, msgParams)
	var ae *anthropic.Error
	if !errors.As(err, &ae) || ae.StatusCode != 429 || !strings.Contains(ae.RawJSON(), `"rate_limit_error"`) {
		t.Fatalf("anthropic refusal: %v", err)
	}
	_, err = gm.Models.GenerateContent(ctx, "gemini-2.5-flash", genai.Text("hello"), &genai.GenerateContentConfig{MaxOutputTokens: 900})
	var ge genai.APIError
	if !errors.As(err, &ge) || ge.Code != 429 || ge.Status != "RESOURCE_EXHAUSTED" {
		t.Fatalf("gemini refusal: %v", err)
	}
	if up.Calls() != calls {
		t.Fatalf("refused calls reached the provider")
	}

	// frugal's daily budget: once spent, the SDK with its default
	// retries does not retry (x-should-retry: false), and says
	// insufficient quota.
	attempts := 0
	count := func(r *http.Request, next option.MiddlewareNext) (*http.Response, error) {
		attempts++
		return next(r)
	}
	fr := openai.NewClient(option.WithBaseURL(proxy+"/v1/"), option.WithAPIKey("frugal-key"), option.WithMiddleware(count))
	up.Output = 4000
	frugal := openai.ChatCompletionNewParams{Model: "gpt-4o-mini", Messages: chat.Messages, MaxCompletionTokens: openai.Int(4000)}
	for i := 0; i < 20; i++ {
		if _, err = fr.Chat.Completions.New(ctx, frugal); err != nil {
			break
		}
	}
	attempts = 0
	_, err = fr.Chat.Completions.New(ctx, frugal)
	if !errors.As(err, &oe) || oe.StatusCode != 429 || oe.Code != "insufficient_quota" || oe.Response.Header.Get("X-Should-Retry") != "false" {
		t.Fatalf("frugal past its budget: %v", err)
	}
	if attempts != 1 {
		t.Fatalf("the SDK tried a spent budget %d times; x-should-retry: false says once", attempts)
	}
}

// TestLLMSDKMiddleware: a Go program that calls a provider's SDK itself
// puts the same reserve and settle in the SDK's middleware, on its own
// store and rules.
func TestLLMSDKMiddleware(t *testing.T) {
	up := &llmtest.Upstream{Output: 100}
	srv := httptest.NewServer(up)
	t.Cleanup(srv.Close)
	burst := int64(1000)
	pol, err := policy.Compile(&policy.Spec{
		Tiers: map[string]policy.TierSpec{"t": {Rules: []policy.RuleSpec{{
			Name: "tokens", Scope: "tenant", Unit: "tokens", Algorithm: "token_bucket", Rate: "1000/d", Burst: &burst,
		}}}},
		Tenants: map[string]policy.TenantSpec{"acme": {Tier: "t"}},
	})
	if err != nil {
		t.Fatal(err)
	}
	store := memstore.New(nil)
	defer store.Close()
	var mu sync.Mutex
	var used int64
	gate, err := llm.NewGate(llm.GateOptions{
		Decider: policy.NewDecider(store, 1), Policy: func() *policy.Policy { return pol },
		Record: func(r *llm.Record) { mu.Lock(); used += r.Usage.Sum(); mu.Unlock() },
	})
	if err != nil {
		t.Fatal(err)
	}
	tr := &llm.Transport{Gate: gate, Who: func(*http.Request) (policy.Request, error) {
		return policy.Request{Tenant: "acme", Cost: 1}, nil
	}}
	client := openai.NewClient(option.WithBaseURL(srv.URL+"/v1/"), option.WithAPIKey("sk-own"), option.WithMiddleware(tr.Middleware()), option.WithMaxRetries(0))
	admitted := 0
	for range 20 {
		_, err := client.Chat.Completions.New(context.Background(), openai.ChatCompletionNewParams{
			Model: "gpt-4o-mini", Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hello")}, MaxCompletionTokens: openai.Int(300),
		})
		var oe *openai.Error
		if errors.As(err, &oe) && oe.StatusCode == 429 {
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		admitted++
	}
	mu.Lock()
	defer mu.Unlock()
	// Each call reserves its input and 300 output tokens and settles to
	// 100: about 8 of 1,000 tokens' calls fit, never more than the
	// budget.
	if admitted < 5 || used > 1000 || int64(admitted)*100 > used {
		t.Fatalf("%d calls admitted, %d tokens used of 1000", admitted, used)
	}
	if up.Calls() != int64(admitted) {
		t.Fatalf("the provider saw %d calls, %d admitted", up.Calls(), admitted)
	}
}

// readmeExample is the SDK example of examples/llm/README.md, which
// TestLLMReadme checks is quoted there verbatim.
func readmeExample(ctx context.Context, proxy string) (string, error) {
	client := openai.NewClient(
		option.WithBaseURL(proxy+"/v1/"), // admit proxy, not api.openai.com
		option.WithAPIKey("acme-key"),    // the tenant's Admit key
	)
	answer, err := client.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{
		Model:    "gpt-4o-mini",
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("Say hello")},
	})
	var refused *openai.Error
	if errors.As(err, &refused) && refused.StatusCode == http.StatusTooManyRequests {
		return "", fmt.Errorf("over budget (%s): retry after %s ms", refused.Code, refused.Response.Header.Get("Retry-After-Ms"))
	}
	if err != nil {
		return "", err
	}
	return answer.Choices[0].Message.Content, nil
}

// TestLLMReadme runs examples/llm/README.md as written: the block that
// starts the stand-in for the providers and the proxy (on free ports,
// the binaries built), its shell commands, each answering the status its
// "# →" comment says, and its SDK example, which must be quoted from
// readmeExample.
func TestLLMReadme(t *testing.T) {
	readme, err := os.ReadFile("../examples/llm/README.md")
	if err != nil {
		t.Fatal(err)
	}
	src, _ := os.ReadFile("llm_test.go")
	goBlock := regexp.MustCompile("(?s)```go\n(.*?)```").FindSubmatch(readme)
	if goBlock == nil || !strings.Contains(string(src), string(goBlock[1])) {
		t.Fatalf("the README's Go example is not readmeExample's code")
	}
	var start string
	for _, b := range regexp.MustCompile("(?s)```sh\n(.*?)```").FindAllSubmatch(readme, -1) {
		if strings.Contains(string(b[1]), "go run ./examples/llm/stub") {
			start = string(b[1])
		}
	}
	if start == "" {
		t.Fatal("no block of the README starts examples/llm/stub")
	}
	stub := filepath.Join(t.TempDir(), "stub")
	build := exec.Command("go", "build", "-o", stub, "./examples/llm/stub")
	build.Dir = ".."
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	stubAddr, proxyAddr := "127.0.0.1:"+freePort(t, "127.0.0.1"), "127.0.0.1:"+freePort(t, "127.0.0.1")
	start = strings.NewReplacer(
		"go run ./examples/llm/stub", stub,
		"go run ./cmd/admit", admitBinary(t),
		"examples/llm/admit.yaml", "../examples/llm/admit.yaml",
		"127.0.0.1:8099", stubAddr,
		"127.0.0.1:8090", proxyAddr,
	).Replace(start)
	if strings.Contains(start, "8099") || strings.Contains(start, "8090") || strings.Contains(start, "go run") {
		t.Fatalf("the block's addresses or commands changed; update the test:\n%s", start)
	}
	startProcess(t, proxyAddr, nil, "sh", "-c", start)
	proxy := "http://" + proxyAddr
	cmds := regexp.MustCompile(`(?m)^(curl .*?)\s+# → (\d+)$`).FindAllSubmatch(readme, -1)
	if len(cmds) < 4 {
		t.Fatalf("%d commands found in the README", len(cmds))
	}
	for _, c := range cmds {
		cmd := exec.Command("sh", "-c", string(c[1])+" -o /dev/null -w '%{http_code}'")
		cmd.Env = append(os.Environ(), "ADMIT="+proxy)
		out, err := cmd.Output()
		if err != nil || string(out) != string(c[2]) {
			t.Errorf("%s\n answered %s (%v), the README says %s", c[1], out, err, c[2])
		}
	}
	if text, err := readmeExample(context.Background(), proxy); err != nil || !strings.HasPrefix(text, "tok ") {
		t.Errorf("the SDK example: %q, %v", text, err)
	}
}

// TestLLMDashboard opens the proxy's LLM usage panel in Chromium after
// calls of two models, one named with markup by its caller: the panel
// shows each tenant and model's tokens and cost, and the name as text.
func TestLLMDashboard(t *testing.T) {
	proxy, _, metrics := startLLMProxyArgs(t, "--metrics", "127.0.0.1:0")
	if metrics == "" {
		t.Fatal("no metrics address logged")
	}
	for _, model := range []string{"gpt-4o-mini", "<img src=x onerror=document.title='owned'>"} {
		req, _ := http.NewRequest("POST", proxy+"/v1/chat/completions", strings.NewReader(`{"model":"`+strings.ReplaceAll(model, `"`, `\"`)+`","messages":[{"role":"user","content":"hi"}],"max_tokens":20}`))
		req.Header.Set("Authorization", "Bearer acme-key")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("%s: %d", model, resp.StatusCode)
		}
	}
	ctx := browser(t)
	for _, a := range []chromedp.Action[chromedp.Void]{
		chromedp.Navigate(metrics + "/dashboard"),
		poll(`[...document.querySelectorAll("tr.usage")].some(r => r.textContent.includes("acme") && r.textContent.includes("gpt-4o-mini"))`),
		poll(`[...document.querySelectorAll("tr.usage td")].some(td => td.textContent.startsWith("<img"))`),
		poll(`document.getElementById("calls").textContent === "2"`),
	} {
		if _, err := chromedp.Run(ctx, a); err != nil {
			t.Fatal(err)
		}
	}
	title, err := chromedp.Run(ctx, chromedp.Title())
	if err != nil || title == "owned" {
		t.Fatalf("title %q (%v): a model name ran as markup in the panel", title, err)
	}
	shot, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatal(err)
	}
	keep(t, "llm-dashboard.png", shot)
}
