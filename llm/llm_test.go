package llm_test

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/admitdev/admit"
	"github.com/admitdev/admit/llm"
	"github.com/admitdev/admit/llm/llmtest"
	"github.com/admitdev/admit/memstore"
	"github.com/admitdev/admit/policy"
	"github.com/admitdev/admit/storetest"
	"github.com/admitdev/admit/units"
)

var epoch = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

// rig is a Gate over a memory store with a stopped clock, in front of the
// stand-in, for tenant acme.
type rig struct {
	t       *testing.T
	up      *llmtest.Upstream
	srv     *httptest.Server
	client  *http.Client
	store   admit.Store
	pol     *policy.Policy
	mu      sync.Mutex
	records []*llm.Record
}

func int64p(v int64) *int64 { return &v }

// tokenRule is acme's rule: 1,000 tokens a minute, burst 1,000.
func tokenRule() policy.RuleSpec {
	return policy.RuleSpec{Name: "tokens", Scope: "tenant", Unit: "tokens", Algorithm: "token_bucket", Rate: "1000/min", Burst: int64p(1000)}
}

func newRig(t *testing.T, rules []policy.RuleSpec, opts llm.GateOptions) *rig {
	return newRigDrain(t, rules, opts, 0)
}

func newRigDrain(t *testing.T, rules []policy.RuleSpec, opts llm.GateOptions, drain time.Duration) *rig {
	t.Helper()
	return newRigTier(t, policy.TierSpec{Rules: rules}, opts, drain)
}

// newRigTier is newRigDrain for acme in the tier tier.
func newRigTier(t *testing.T, tier policy.TierSpec, opts llm.GateOptions, drain time.Duration) *rig {
	t.Helper()
	pol, err := policy.Compile(&policy.Spec{
		Tiers:   map[string]policy.TierSpec{"t": tier},
		Tenants: map[string]policy.TenantSpec{"acme": {Tier: "t"}},
	})
	if err != nil {
		t.Fatal(err)
	}
	s := memstore.New(&memstore.Options{Clock: func() time.Time { return epoch }})
	t.Cleanup(func() { s.Close() })
	r := &rig{t: t, up: &llmtest.Upstream{Output: 50}, store: s, pol: pol}
	r.srv = httptest.NewServer(r.up)
	t.Cleanup(r.srv.Close)
	opts.Decider = policy.NewDecider(s, 1)
	opts.Policy = func() *policy.Policy { return pol }
	opts.Record = func(rec *llm.Record) { r.mu.Lock(); r.records = append(r.records, rec); r.mu.Unlock() }
	gate, err := llm.NewGate(opts)
	if err != nil {
		t.Fatal(err)
	}
	tr := &llm.Transport{Gate: gate, Drain: drain, Who: func(*http.Request) (policy.Request, error) {
		return policy.Request{Tenant: "acme", Cost: 1}, nil
	}}
	r.client = &http.Client{Transport: tr}
	return r
}

// remaining is what rule i of acme's tier holds now.
func (r *rig) remaining(name string) int64 {
	r.t.Helper()
	req := policy.Request{Tenant: "acme", Metered: true, Model: "m", Cost: 0}
	var res policy.Resolution
	if err := r.pol.Resolve(&req, &res); err != nil {
		r.t.Fatal(err)
	}
	d, err := storetest.Check(context.Background(), r.store, res.Charges...)
	if err != nil {
		r.t.Fatal(err)
	}
	for _, x := range d.Results {
		if x.Rule == name {
			return x.Remaining
		}
	}
	r.t.Fatalf("no rule %q", name)
	return 0
}

func (r *rig) post(path, body string) (*http.Response, string) {
	r.t.Helper()
	resp, err := r.client.Post(r.srv.URL+path, "application/json", strings.NewReader(body))
	if err != nil {
		r.t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	return resp, string(b)
}

// postCounting is post, saying also how many bytes of the body the
// transport read.
func (r *rig) postCounting(path, body string) (resp *http.Response, msg string, read int) {
	r.t.Helper()
	unread := &readCounter{r: strings.NewReader(body)}
	resp, err := r.client.Post(r.srv.URL+path, "application/json", unread)
	if err != nil {
		r.t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	return resp, string(b), unread.n
}

// Every API's answer, streamed or not, is settled to the usage it
// reports: what the bucket lost is exactly the reported tokens.
func TestSettlesToReportedUsage(t *testing.T) {
	for _, c := range []struct{ name, path, body string }{
		{"chat", "/v1/chat/completions", `{"model":"gpt-4o-mini","messages":[{"role":"user","content":"hello there"}],"max_completion_tokens":200}`},
		{"chat_stream", "/v1/chat/completions", `{"model":"gpt-4o-mini","stream":true,"messages":[{"role":"user","content":"hello there"}],"max_tokens":200}`},
		{"chat_stream_usage", "/v1/chat/completions", `{"model":"gpt-4o-mini","stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"hi"}]}`},
		{"completions", "/v1/completions", `{"model":"gpt-3.5-turbo-instruct","prompt":"say","max_tokens":100}`},
		{"responses", "/v1/responses", `{"model":"gpt-4o","input":"hello","max_output_tokens":300}`},
		{"responses_stream", "/v1/responses", `{"model":"gpt-4o","input":"hello","stream":true}`},
		{"embeddings", "/v1/embeddings", `{"model":"text-embedding-3-small","input":["a","b"]}`},
		{"messages", "/v1/messages", `{"model":"claude-sonnet-4-5","max_tokens":300,"messages":[{"role":"user","content":"hi"}]}`},
		{"messages_stream", "/v1/messages", `{"model":"claude-sonnet-4-5","max_tokens":300,"stream":true,"messages":[{"role":"user","content":"hi"}]}`},
		{"gemini", "/v1beta/models/gemini-2.5-flash:generateContent", `{"contents":[{"parts":[{"text":"hi"}]}],"generationConfig":{"maxOutputTokens":300}}`},
		{"gemini_stream", "/v1beta/models/gemini-2.5-flash:streamGenerateContent?alt=sse", `{"contents":[{"parts":[{"text":"hi"}]}]}`},
		{"gemini_stream_array", "/v1beta/models/gemini-2.5-flash:streamGenerateContent", `{"contents":[{"parts":[{"text":"hi"}]}]}`},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := newRig(t, []policy.RuleSpec{tokenRule()}, llm.GateOptions{})
			r.up.Cached, r.up.Reasoning = 3, 5
			resp, _ := r.post(c.path, c.body)
			if resp.StatusCode != 200 {
				t.Fatalf("status %d", resp.StatusCode)
			}
			_, sent := r.up.Last()
			if len(r.records) != 1 || !r.records[0].Reported {
				t.Fatalf("records %+v", r.records)
			}
			used := r.records[0].Usage.Sum()
			in := llmtest.InputTokens(sent)
			if c.name == "embeddings" {
				if used != in {
					t.Fatalf("embeddings: usage %v, want %d input tokens", r.records[0].Usage, in)
				}
			} else if r.records[0].Usage.Sum() < in+50 {
				t.Fatalf("usage %v: want the input %d and 50 output tokens", r.records[0].Usage, in)
			}
			if got := r.remaining("tokens"); got != 1000-used {
				t.Fatalf("the bucket holds %d after a call that used %d, want %d", got, used, 1000-used)
			}
		})
	}
}

// A streamed chat completion that did not ask for its usage gets it asked
// for, and the client never sees the extra chunk: its bytes are the ones
// it would have had.
func TestStreamUsageChunkHidden(t *testing.T) {
	r := newRig(t, []policy.RuleSpec{tokenRule()}, llm.GateOptions{})
	resp, body := r.post("/v1/chat/completions", `{"model":"gpt-4o-mini","stream":true,"messages":[{"role":"user","content":"hi"}],"max_tokens":10}`)
	if resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	_, sent := r.up.Last()
	if !strings.Contains(string(sent), `"include_usage":true`) {
		t.Fatalf("the upstream was not asked for usage: %s", sent)
	}
	if strings.Contains(body, `"usage":{`) {
		t.Fatalf("the client saw the usage chunk:\n%s", body)
	}
	// What the stand-in sends a client that did not ask: 10 chunks, the
	// finish chunk and [DONE], each an event.
	events := 0
	sc := bufio.NewScanner(strings.NewReader(body))
	for sc.Scan() {
		if strings.HasPrefix(sc.Text(), "data: ") {
			events++
		}
	}
	if events != 12 || !strings.HasSuffix(body, "data: [DONE]\n\n") {
		t.Fatalf("%d events:\n%s", events, body)
	}
	if r.records[0].Usage[units.Output] != 10 {
		t.Fatalf("usage %v", r.records[0].Usage)
	}
}

// A call without a maximum gets what its budget leaves, at most the
// default; one left less than the minimum is refused before the upstream.
func TestMaximumFromBudget(t *testing.T) {
	r := newRig(t, []policy.RuleSpec{tokenRule()}, llm.GateOptions{DefaultMaxOutput: 600, MinOutput: 100})
	r.up.Output = 10_000
	body := `{"model":"gpt-4o-mini","messages":[{"role":"user","content":"hi"}]}`
	resp, _ := r.post("/v1/chat/completions", body)
	_, sent := r.up.Last()
	var req struct {
		Max int64 `json:"max_completion_tokens"`
	}
	_ = json.Unmarshal(sent, &req)
	if resp.StatusCode != 200 || req.Max != 600 {
		t.Fatalf("status %d, maximum sent %d, want the default 600", resp.StatusCode, req.Max)
	}
	left := r.remaining("tokens") // 1000 − input − 600
	resp, _ = r.post("/v1/chat/completions", body)
	_ = json.Unmarshal(func() []byte { _, b := r.up.Last(); return b }(), &req)
	if resp.StatusCode != 200 || req.Max >= left || req.Max < 100 {
		t.Fatalf("status %d, maximum %d with %d left", resp.StatusCode, req.Max, left)
	}
	calls := r.up.Calls()
	resp, msg := r.post("/v1/chat/completions", body)
	if resp.StatusCode != 429 || r.up.Calls() != calls {
		t.Fatalf("an empty budget: status %d, upstream calls %d → %d", resp.StatusCode, calls, r.up.Calls())
	}
	if !strings.Contains(msg, `"code":"rate_limit_exceeded"`) || resp.Header.Get("Retry-After-Ms") == "" {
		t.Fatalf("refusal %s %v", msg, resp.Header)
	}
}

// A client that leaves mid-stream, without a drain, is charged its
// reservation, the input and the most output the call allowed: the
// provider may go on generating (reasoning included) what the client
// never sees. The upstream call is cancelled.
func TestClientLeavesMidStream(t *testing.T) {
	r := newRig(t, []policy.RuleSpec{tokenRule()}, llm.GateOptions{})
	r.up.Hold = make(chan struct{})
	r.up.Output = 500
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, "POST", r.srv.URL+"/v1/messages", strings.NewReader(
		`{"model":"claude-sonnet-4-5","max_tokens":800,"stream":true,"messages":[{"role":"user","content":"hi"}]}`))
	resp, err := r.client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		for range 5 { // five deltas, then the stream waits
			r.up.Hold <- struct{}{}
		}
	}()
	br := bufio.NewReader(resp.Body)
	for deltas := 0; deltas < 5; {
		line, err := br.ReadString('\n')
		if err != nil {
			t.Fatal(err)
		}
		if strings.HasPrefix(line, "data:") && strings.Contains(line, "content_block_delta") {
			deltas++
		}
	}
	cancel()
	resp.Body.Close()
	if len(r.records) != 1 {
		t.Fatalf("records %+v", r.records)
	}
	u := r.records[0].Usage
	if r.records[0].Reported {
		t.Fatal("a call cut short was recorded as reported")
	}
	if u[units.Output] != 800 {
		t.Fatalf("output charged %d for a call allowed 800 and cut after 5 deltas, want 800", u[units.Output])
	}
	if got, want := r.remaining("tokens"), 1000-u.Sum(); got != want {
		t.Fatalf("bucket %d, want %d", got, want)
	}
	if u.Sum() < r.up.Billed() {
		t.Errorf("charged %d for a call the provider may bill %d", u.Sum(), r.up.Billed())
	}
}

// An upstream error without usage refunds the reservation; an answer
// without usage keeps it charged.
func TestErrorRefundsAndSilenceCharges(t *testing.T) {
	body := `{"model":"claude-sonnet-4-5","max_tokens":300,"messages":[{"role":"user","content":"hi"}]}`
	r := newRig(t, []policy.RuleSpec{tokenRule()}, llm.GateOptions{})
	r.up.Fail = http.StatusInternalServerError
	if resp, _ := r.post("/v1/messages", body); resp.StatusCode != 500 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	if got := r.remaining("tokens"); got != 1000 {
		t.Fatalf("after an upstream error the bucket holds %d, want all 1000 back", got)
	}
	r.up.Fail, r.up.NoUsage = 0, true
	if resp, _ := r.post("/v1/messages", body); resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	rec := r.records[len(r.records)-1]
	if rec.Reported {
		t.Fatal("an answer without usage recorded as reported")
	}
	// The reservation: the input estimate (bytes/3 of "hi", 4 per
	// object) and the 300 the call allowed.
	if got := r.remaining("tokens"); got > 1000-300 || got < 1000-300-20 {
		t.Fatalf("after an answer without usage the bucket holds %d, want its reservation (300 output and the input) charged", got)
	}
}

// A compressed answer is read all the same, and the client gets it
// plain.
func TestCompressedAnswer(t *testing.T) {
	r := newRig(t, []policy.RuleSpec{tokenRule()}, llm.GateOptions{})
	r.up.Gzip = true
	req, _ := http.NewRequest("POST", r.srv.URL+"/v1/chat/completions", strings.NewReader(`{"model":"gpt-4o","messages":[{"role":"user","content":"hi"}],"max_tokens":40}`))
	req.Header.Set("Accept-Encoding", "gzip")
	resp, err := r.client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(b), `"usage"`) || len(r.records) != 1 || !r.records[0].Reported || r.records[0].Usage[units.Output] != 40 {
		t.Fatalf("body %.80q, records %+v", b, r.records)
	}
}

// A money budget: priced per million tokens exactly, refused as
// insufficient quota, not to be retried before the day ends; a model
// without a price is refused before the upstream.
func TestMoneyBudget(t *testing.T) {
	budget := policy.RuleSpec{Name: "spend", Scope: "tenant", Unit: "money", Algorithm: "quota", Period: "day", Budget: "0.0006"}
	r := newRig(t, []policy.RuleSpec{budget}, llm.GateOptions{
		Prices: map[string]llm.Price{"gpt-4o-mini": {Rates: llm.Rates{150_000, 75_000, 150_000, 600_000, 600_000}}},
	})
	r.up.Output = 500
	resp, msg := r.post("/v1/chat/completions", `{"model":"gpt-9","messages":[{"role":"user","content":"hi"}],"max_tokens":10}`)
	if resp.StatusCode != 400 || r.up.Calls() != 0 || !strings.Contains(msg, "no price") {
		t.Fatalf("unpriced model: %d %s (upstream calls %d)", resp.StatusCode, msg, r.up.Calls())
	}
	body := `{"model":"gpt-4o-mini","messages":[{"role":"user","content":"hi"}],"max_tokens":500}`
	spent := int64(0)
	for i := 0; ; i++ {
		resp, msg = r.post("/v1/chat/completions", body)
		if resp.StatusCode != 200 {
			break
		}
		rec := r.records[len(r.records)-1]
		// 0.15 per million input, 0.60 per million output, in µUSD,
		// rounded up once per call.
		want := (rec.Usage[units.Input]*150_000 + rec.Usage[units.Output]*600_000 + 999_999) / 1_000_000
		if rec.Cost != want {
			t.Fatalf("call %d cost %d µUSD for %v, want %d", i, rec.Cost, rec.Usage, want)
		}
		spent += rec.Cost
	}
	if resp.StatusCode != 429 || !strings.Contains(msg, `"insufficient_quota"`) || resp.Header.Get("X-Should-Retry") != "false" {
		t.Fatalf("spent budget: %d %s %v", resp.StatusCode, msg, resp.Header)
	}
	// Amounts in the currency, not its millionths as "money".
	if !strings.Contains(msg, "needs 0.000") || strings.Contains(msg, " money and") {
		t.Errorf("a spent budget's message: %s, want the amounts in the currency", msg)
	}
	if spent > 600 || r.remaining("spend") != 600-spent {
		t.Fatalf("spent %d µUSD of 600; the quota holds %d", spent, r.remaining("spend"))
	}
}

// Many calls at once never take more than the bucket holds: each reserves
// its bound before it goes out, and settles down to its usage after.
func TestNeverOverConcurrent(t *testing.T) {
	rule := policy.RuleSpec{Name: "tokens", Scope: "tenant", Unit: "tokens", Algorithm: "token_bucket", Rate: "1/h", Burst: int64p(5000)}
	r := newRig(t, []policy.RuleSpec{rule}, llm.GateOptions{})
	r.up.Output = 120
	done := make(chan int, 16)
	for g := range 16 {
		go func() {
			ok := 0
			for i := range 20 {
				max := 50 + (g*7+i*13)%250
				body := `{"model":"claude-haiku-4-5","max_tokens":` + strconv.Itoa(max) + `,"messages":[{"role":"user","content":"say something"}]}`
				resp, err := r.client.Post(r.srv.URL+"/v1/messages", "application/json", strings.NewReader(body))
				if err != nil {
					t.Error(err)
					break
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode == 200 {
					ok++
				}
			}
			done <- ok
		}()
	}
	admitted := 0
	for range 16 {
		admitted += <-done
	}
	used := int64(0)
	for _, rec := range r.records {
		used += rec.Usage.Sum()
	}
	if used > 5000 {
		t.Fatalf("%d calls admitted used %d tokens of a 5000-token bucket", admitted, used)
	}
	if got := r.remaining("tokens"); got != 5000-used {
		t.Fatalf("the bucket holds %d after %d tokens used, want %d", got, used, 5000-used)
	}
	// Each admitted call used about 130 tokens; however the callers
	// interleaved, more than a few of them fit.
	if admitted < 5 {
		t.Fatalf("only %d calls admitted", admitted)
	}
}

// With Drain, a stream whose client left is read to its end, within the
// limit, and settled to the provider's own report.
func TestDrainAfterClientLeft(t *testing.T) {
	r := newRigDrain(t, []policy.RuleSpec{tokenRule()}, llm.GateOptions{}, time.Minute)
	r.up.Output = 20
	r.up.Hold = make(chan struct{}, 100)
	for range 4 {
		r.up.Hold <- struct{}{}
	}
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, "POST", r.srv.URL+"/v1/chat/completions", strings.NewReader(
		`{"model":"gpt-4o","stream":true,"max_tokens":100,"messages":[{"role":"user","content":"hi"}]}`))
	resp, err := r.client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(resp.Body)
	for chunks := 0; chunks < 3; {
		line, err := br.ReadString('\n')
		if err != nil {
			t.Fatal(err)
		}
		if strings.HasPrefix(line, "data:") {
			chunks++
		}
	}
	cancel()
	resp.Body.Close()
	for range 30 {
		r.up.Hold <- struct{}{} // the rest of the stream, which the proxy reads alone
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		r.mu.Lock()
		n := len(r.records)
		r.mu.Unlock()
		if n > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the drained call was never settled")
		}
	}
	rec := r.records[0]
	if !rec.Reported || rec.Usage[units.Output] != 20 {
		t.Fatalf("drained call recorded %+v, want the provider's report of 20 output tokens", rec)
	}
	if got := r.remaining("tokens"); got != 1000-rec.Usage.Sum() {
		t.Fatalf("bucket %d, want %d", got, 1000-rec.Usage.Sum())
	}
}

// With the store down, a budget in tokens that names no on_error fails
// closed (a store made slow by load would otherwise let every call
// through unreserved); one that says on_error: open lets calls pass
// unreserved, recorded, settled without error to the caller.
func TestStoreDownFailsOpen(t *testing.T) {
	for _, onError := range []string{"", "open"} {
		rule := tokenRule()
		rule.OnError = onError
		pol, err := policy.Compile(&policy.Spec{
			Tiers:   map[string]policy.TierSpec{"t": {Rules: []policy.RuleSpec{rule}}},
			Tenants: map[string]policy.TenantSpec{"acme": {Tier: "t"}},
		})
		if err != nil {
			t.Fatal(err)
		}
		mem := memstore.New(nil)
		defer mem.Close()
		faulty := &storetest.Faulty{Store: mem}
		faulty.Down.Store(true)
		var records int
		gate, _ := llm.NewGate(llm.GateOptions{Decider: policy.NewDecider(faulty, 1), Policy: func() *policy.Policy { return pol },
			Record: func(*llm.Record) { records++ }})
		up := &llmtest.Upstream{Output: 30}
		srv := httptest.NewServer(up)
		defer srv.Close()
		client := &http.Client{Transport: &llm.Transport{Gate: gate, Who: func(*http.Request) (policy.Request, error) {
			return policy.Request{Tenant: "acme", Cost: 1}, nil
		}}}
		resp, err := client.Post(srv.URL+"/v1/messages", "application/json", strings.NewReader(`{"model":"claude-haiku-4-5","max_tokens":50,"messages":[]}`))
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		switch {
		case onError == "" && (resp.StatusCode != 503 || up.Calls() != 0 || !strings.Contains(string(body), `"overloaded_error"`)):
			t.Fatalf("store down, a budget in tokens naming no on_error: %d %s, upstream calls %d; want 503 before the provider", resp.StatusCode, body, up.Calls())
		case onError == "open" && (resp.StatusCode != 200 || up.Calls() != 1 || records != 1):
			t.Fatalf("store down, on_error open: status %d, upstream calls %d, records %d", resp.StatusCode, up.Calls(), records)
		}
	}
}

// LowerMaxOutput lowers a call's own maximum to what its budget leaves,
// where it would be refused.
func TestLowerMaxOutput(t *testing.T) {
	r := newRig(t, []policy.RuleSpec{tokenRule()}, llm.GateOptions{LowerMaxOutput: true, MinOutput: 10})
	r.up.Output = 10_000
	resp, _ := r.post("/v1/messages", `{"model":"claude-haiku-4-5","max_tokens":5000,"messages":[{"role":"user","content":"hi"}]}`)
	_, sent := r.up.Last()
	var m struct {
		MaxTokens int64 `json:"max_tokens"`
	}
	_ = json.Unmarshal(sent, &m)
	if resp.StatusCode != 200 || m.MaxTokens >= 1000 || m.MaxTokens < 900 {
		t.Fatalf("status %d, maximum sent %d: want it lowered to what 1000 tokens leave after the input", resp.StatusCode, m.MaxTokens)
	}
}

// A body past MaxBody is refused (413) in the provider's format, never
// forwarded.
func TestBodyBound(t *testing.T) {
	r := newRig(t, []policy.RuleSpec{tokenRule()}, llm.GateOptions{})
	r.client.Transport.(*llm.Transport).MaxBody = 100
	resp, msg := r.post("/v1/messages", `{"model":"claude-haiku-4-5","max_tokens":5,"messages":[{"role":"user","content":"`+strings.Repeat("a", 200)+`"}]}`)
	if resp.StatusCode != http.StatusRequestEntityTooLarge || !strings.Contains(msg, `"type":"request_too_large"`) || r.up.Calls() != 0 {
		t.Fatalf("%d %s (upstream calls %d)", resp.StatusCode, msg, r.up.Calls())
	}
}

// LegacyMaxTokens writes the maximum a chat completion is given as
// max_tokens, for servers that predate max_completion_tokens.
func TestLegacyMaxTokens(t *testing.T) {
	r := newRig(t, []policy.RuleSpec{tokenRule()}, llm.GateOptions{DefaultMaxOutput: 300})
	r.client.Transport.(*llm.Transport).LegacyMaxTokens = true
	if resp, _ := r.post("/v1/chat/completions", `{"model":"llama3","messages":[{"role":"user","content":"hi"}]}`); resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	_, sent := r.up.Last()
	if !strings.Contains(string(sent), `"max_tokens":300`) || strings.Contains(string(sent), "max_completion_tokens") {
		t.Fatalf("sent %s", sent)
	}
}

// A non-streamed call whose client leaves before the answer is finished
// by the provider and billed whole. Without a drain it is charged its
// reservation; with one, the proxy waits for the answer and settles to
// the provider's report.
func TestClientLeavesBeforeAnswer(t *testing.T) {
	body := `{"model":"gpt-4o","max_tokens":300,"n":2,"messages":[{"role":"user","content":"hi"}]}`
	for _, drain := range []time.Duration{0, time.Minute} {
		r := newRigDrain(t, []policy.RuleSpec{tokenRule()}, llm.GateOptions{}, drain)
		r.up.Output = 200
		r.up.HoldAnswer = make(chan struct{})
		ctx, cancel := context.WithCancel(context.Background())
		req, _ := http.NewRequestWithContext(ctx, "POST", r.srv.URL+"/v1/chat/completions", strings.NewReader(body))
		done := make(chan struct{})
		go func() {
			defer close(done)
			if resp, err := r.client.Do(req); err == nil {
				resp.Body.Close() // the client is gone: it reads nothing
			}
		}()
		for r.up.Calls() == 0 {
			time.Sleep(time.Millisecond) // until the provider has the call
		}
		cancel()
		if drain == 0 {
			<-done // the call ended with its client
		}
		close(r.up.HoldAnswer) // the provider finishes it, billing 2 × 200 and the input
		<-done
		rec := r.waitRecord(t)
		// The provider's handler bills once let go, on its own goroutine.
		want := llmtest.InputTokens([]byte(body)) + 2*200
		for deadline := time.Now().Add(5 * time.Second); r.up.Billed() < want && time.Now().Before(deadline); {
			time.Sleep(time.Millisecond)
		}
		billed := r.up.Billed()
		if billed != want {
			t.Fatalf("the stand-in billed %d, want %d", billed, want)
		}
		charged := 1000 - r.remaining("tokens")
		if charged < billed {
			t.Errorf("drain %v: charged %d tokens for a call the provider billed %d", drain, charged, billed)
		}
		switch {
		case drain == 0 && (rec.Reported || rec.Usage[units.Output] != 2*300):
			t.Errorf("no drain: recorded %+v, want the reservation (2 × 300 output), not reported", rec)
		case drain > 0 && (!rec.Reported || rec.Usage.Sum() != charged || charged != billed):
			t.Errorf("drain: recorded %+v and charged %d, want the provider's report, %d", rec, charged, billed)
		}
	}
}

// A call the provider received is not refunded when its connection breaks
// before an answer (it may have generated all it was allowed); one that
// never reached it is.
func TestBrokenCallKeepsReservation(t *testing.T) {
	body := `{"model":"gpt-4o","max_tokens":300,"messages":[{"role":"user","content":"hi"}]}`
	r := newRig(t, []policy.RuleSpec{tokenRule()}, llm.GateOptions{})
	cut := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		_, _ = io.ReadAll(req.Body)
		c, _, err := w.(http.Hijacker).Hijack()
		if err == nil {
			c.Close() // read, then gone without a word
		}
	}))
	defer cut.Close()
	if _, err := r.client.Post(cut.URL+"/v1/chat/completions", "application/json", strings.NewReader(body)); err == nil {
		t.Fatal("a cut connection answered")
	}
	if rec := r.waitRecord(t); rec.Reported || rec.Usage[units.Output] != 300 {
		t.Errorf("a call cut after it was sent recorded %+v, want its reservation", rec)
	}
	if got := r.remaining("tokens"); got > 1000-300 {
		t.Errorf("after a call cut once sent the bucket holds %d, want its reservation (300 and the input) charged", got)
	}

	r = newRig(t, []policy.RuleSpec{tokenRule()}, llm.GateOptions{})
	closed := httptest.NewServer(http.NotFoundHandler())
	closed.Close() // nothing listens there any more
	if _, err := r.client.Post(closed.URL+"/v1/chat/completions", "application/json", strings.NewReader(body)); err == nil {
		t.Fatal("a closed address answered")
	}
	r.waitRecord(t)
	if got := r.remaining("tokens"); got != 1000 {
		t.Errorf("after a call that never reached the provider the bucket holds %d, want all 1000", got)
	}
}

// waitRecord returns the first call's record once it is settled.
func (r *rig) waitRecord(t *testing.T) *llm.Record {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
		r.mu.Lock()
		n := len(r.records)
		r.mu.Unlock()
		if n > 0 {
			return r.records[0]
		}
		if time.Now().After(deadline) {
			t.Fatal("the call was never settled")
		}
	}
}

// What reaches a tenant is the platform's to choose: the provider's
// account headers (organization, project, its rate limits, cookies) are
// removed, and its error bodies are answered in words of our own, without
// the platform's key or account ids.
func TestProviderAccountHidden(t *testing.T) {
	r := newRig(t, []policy.RuleSpec{tokenRule()}, llm.GateOptions{})
	r.up.Header = http.Header{
		"Openai-Organization":              {"org-platform123"},
		"Openai-Project":                   {"proj_platform456"},
		"X-Ratelimit-Limit-Requests":       {"10000"},
		"Anthropic-Ratelimit-Tokens-Limit": {"400000"},
		"Set-Cookie":                       {"__cf_bm=platform; path=/"},
		"X-Goog-Project-Number":            {"987654321012"},
		"Anthropic-Api-Key-Hint":           {"platform"},
	}
	chat := `{"model":"gpt-4o","max_tokens":30,"messages":[{"role":"user","content":"hi"}]}`
	resp, _ := r.post("/v1/chat/completions", chat)
	for _, h := range []string{"Openai-Organization", "Openai-Project", "Anthropic-Ratelimit-Tokens-Limit", "Set-Cookie", "X-Goog-Project-Number", "Anthropic-Api-Key-Hint"} {
		if v := resp.Header.Get(h); v != "" {
			t.Errorf("the tenant sees %s: %q", h, v)
		}
	}
	if got := resp.Header.Get("X-Ratelimit-Limit-Requests"); got == "10000" {
		t.Errorf("the tenant sees the platform's account limit of requests: %q", got)
	}
	if got := resp.Header.Get("X-Ratelimit-Limit-Tokens"); got != "1000" {
		t.Errorf("X-Ratelimit-Limit-Tokens %q, want the tenant's rule's 1000", got)
	}

	for _, c := range []struct {
		status int
		body   string
		keep   string // what the tenant must still read, if anything
	}{
		{400, `{"error":{"message":"Invalid value for 'temperature': key sk-proj-abcdefghijklmnop1234 of org-platform123 is fine","type":"invalid_request_error"}}`, "Invalid value for 'temperature'"},
		{401, `{"error":{"message":"Incorrect API key provided: sk-platf***1234. You can find your API key at https://platform.openai.com","type":"invalid_request_error"}}`, ""},
		{429, `{"error":{"message":"Rate limit reached for gpt-4o in organization org-platform123 on tokens per min (TPM): Limit 30000","type":"tokens"}}`, ""},
		{500, `{"error":{"message":"internal failure of proj_platform456","type":"server_error"}}`, ""},
		{400, `{"error":{"message":"Invalid 'user': user-PLATFORMUSER789 is not allowed","type":"invalid_request_error"}}`, "Invalid 'user'"},
		{404, `{"error":{"code":404,"message":"Model not found for project 987654321012 (projects/platform-prod)","status":"NOT_FOUND"}}`, "Model not found"},
		{422, `{"error":{"message":"Unprocessable: see ?project=987654321012","type":"invalid_request_error"}}`, "Unprocessable"},
	} {
		r.up.Fail, r.up.FailBody = c.status, c.body
		resp, body := r.post("/v1/chat/completions", chat)
		if resp.StatusCode != c.status {
			t.Errorf("an upstream %d answered %d", c.status, resp.StatusCode)
		}
		for _, secret := range []string{"sk-", "org-platform", "proj_platform", "30000", "PLATFORMUSER", "987654321012", "platform-prod"} {
			if strings.Contains(body, secret) {
				t.Errorf("an upstream %d: the tenant reads %q in %s", c.status, secret, body)
			}
		}
		if !strings.Contains(body, `"error":{`) || !strings.Contains(body, `"message":"`) || c.keep != "" && !strings.Contains(body, c.keep) {
			t.Errorf("an upstream %d answered %s, want OpenAI's error format%s", c.status, body, map[bool]string{true: " saying " + c.keep}[c.keep != ""])
		}
		if c.status == 429 && resp.Header.Get("Retry-After") == "" {
			t.Errorf("an upstream 429 without Retry-After")
		}
	}
	if got := r.remaining("tokens"); got < 1000-40 {
		t.Errorf("errors were charged: the bucket holds %d", got)
	}
}

// A completion of several prompts, each answered best_of times, reserves
// every answer the provider bills: with no usage reported, the bucket
// keeps all of it charged.
func TestCompletionsReserveEveryAnswer(t *testing.T) {
	rule := tokenRule()
	rule.Burst = int64p(3000)
	r := newRig(t, []policy.RuleSpec{rule}, llm.GateOptions{})
	r.up.Output = 40
	body := `{"model":"gpt-3.5-turbo-instruct","prompt":["a","b","c","d"],"best_of":4,"max_tokens":40}`
	if resp, _ := r.post("/v1/completions", body); resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	billed := r.records[0].Usage[units.Output]
	if billed != 4*4*40 {
		t.Fatalf("the stand-in billed %d output tokens, want 640", billed)
	}
	r.up.NoUsage = true
	before := r.remaining("tokens")
	if resp, _ := r.post("/v1/completions", body); resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	if reserved := before - r.remaining("tokens"); reserved < billed {
		t.Fatalf("reserved %d tokens for a call billed %d output tokens", reserved, billed)
	}
	// 128 answers of 40 tokens are past the bucket's 3,000: refused
	// before the provider.
	calls := r.up.Calls()
	body = `{"model":"gpt-3.5-turbo-instruct","prompt":["a","b","c","d"],"best_of":32,"max_tokens":40}`
	if resp, msg := r.post("/v1/completions", body); resp.StatusCode != 429 || r.up.Calls() != calls || !strings.Contains(msg, "at most 3000 tokens in one request") {
		t.Fatalf("5,120 output tokens against a 3,000-token bucket: %d %s", resp.StatusCode, msg)
	}
}

// Embeddings of token ids reserve one token per id: 50 calls of 4 × 8,000
// ids each hold at least 32,000 tokens until settled.
func TestEmbeddingsTokenIDsReserved(t *testing.T) {
	rule := policy.RuleSpec{Name: "tokens", Scope: "tenant", Unit: "tokens", Algorithm: "token_bucket", Rate: "100000/h", Burst: int64p(2_000_000)}
	r := newRig(t, []policy.RuleSpec{rule}, llm.GateOptions{})
	r.up.NoUsage = true
	ids := make([]string, 8000)
	for i := range ids {
		ids[i] = strconv.Itoa(i + 1)
	}
	one := "[" + strings.Join(ids, ",") + "]"
	body := `{"model":"text-embedding-3-small","input":[` + one + "," + one + "," + one + "," + one + `]}`
	if billed := llmtest.InputTokens([]byte(body)); billed < 32_000 {
		t.Fatalf("the stand-in bills %d tokens", billed)
	}
	for i := range 50 {
		before := r.remaining("tokens")
		resp, msg := r.post("/v1/embeddings", body)
		if resp.StatusCode != 200 {
			t.Fatalf("call %d: %d %s", i, resp.StatusCode, msg)
		}
		if reserved := before - r.remaining("tokens"); reserved < 32_000 {
			t.Fatalf("call %d reserved %d tokens for 32,000 token ids", i, reserved)
		}
	}
}

// A miss is paid in full: when the provider reports more than was
// reserved (here an image the estimate counts as one media item, billed
// as 10,000 tokens of input), the whole excess is owed, beyond the rule's
// max_cost and beyond one burst of debt.
func TestMissPaidInFull(t *testing.T) {
	rule := policy.RuleSpec{Name: "tokens", Scope: "tenant", Unit: "tokens", Algorithm: "token_bucket", Rate: "5000/min", Burst: int64p(3000)}
	r := newRig(t, []policy.RuleSpec{rule}, llm.GateOptions{})
	r.up.Output = 10
	image := strings.Repeat("A", 40_000) // the stand-in bills 10,000 tokens for it
	body := `{"model":"gpt-4o","max_tokens":10,"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"data:image/png;base64,` + image + `"}}]}]}`
	if resp, out := r.post("/v1/chat/completions", body); resp.StatusCode != 200 {
		t.Fatalf("%d %s", resp.StatusCode, out)
	}
	rec := r.waitRecord(t)
	used := rec.Usage.Sum()
	if !rec.Reported || used < 10_000 {
		t.Fatalf("recorded %+v, want the provider's report of 10,000 tokens or more", rec)
	}
	// The bucket owes used − 3,000: a token comes back after all of it is
	// repaid, at 12 ms a token.
	req := policy.Request{Tenant: "acme", Metered: true, Model: "m", Cost: 1}
	var res policy.Resolution
	if err := r.pol.Resolve(&req, &res); err != nil {
		t.Fatal(err)
	}
	d, err := storetest.Check(context.Background(), r.store, res.Charges...)
	if err != nil {
		t.Fatal(err)
	}
	if want := time.Duration(used-3000+1) * 12 * time.Millisecond; d.Allowed || d.RetryAfter != want {
		t.Errorf("after a call that used %d tokens of a bucket of 3,000: allowed %v, retry after %v, want refused for %v (the whole excess owed)", used, d.Allowed, d.RetryAfter, want)
	}
}

// A tenant has at most its tier's llm_in_flight calls in flight through
// a proxy: past it a call is refused before its body is read, and when
// one ends the next passes.
func TestLLMInFlightBound(t *testing.T) {
	r := newRigTier(t, policy.TierSpec{Rules: []policy.RuleSpec{tokenRule()}, LLMInFlight: 2}, llm.GateOptions{}, 0)
	r.up.HoldAnswer = make(chan struct{})
	body := `{"model":"gpt-4o","max_tokens":10,"messages":[{"role":"user","content":"hi"}]}`
	var wg sync.WaitGroup
	for range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if resp, _ := r.post("/v1/chat/completions", body); resp.StatusCode != 200 {
				t.Errorf("a call within the bound: %d", resp.StatusCode)
			}
		}()
	}
	for r.up.Calls() < 2 {
		time.Sleep(time.Millisecond) // until both are with the provider
	}
	resp, msg, read := r.postCounting("/v1/chat/completions", body)
	if resp.StatusCode != 429 || !strings.Contains(msg, "llm_in_flight") || r.up.Calls() != 2 || read != 0 {
		t.Errorf("a third call in flight: %d %s, %d calls reached the provider, %d body bytes read; want 429 before reading it", resp.StatusCode, msg, r.up.Calls(), read)
	}
	close(r.up.HoldAnswer)
	wg.Wait()
	if resp, _ := r.post("/v1/chat/completions", body); resp.StatusCode != 200 {
		t.Errorf("a call once the others ended: %d", resp.StatusCode)
	}
}

// readCounter counts what is read of r.
type readCounter struct {
	r io.Reader
	n int
}

func (c *readCounter) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += n
	return n, err
}

// A dated snapshot the prices do not list is priced as its family.
func TestSnapshotPricedByFamily(t *testing.T) {
	budget := policy.RuleSpec{Name: "spend", Scope: "tenant", Unit: "money", Algorithm: "quota", Period: "day", Budget: "1"}
	r := newRig(t, []policy.RuleSpec{budget}, llm.GateOptions{
		Prices: map[string]llm.Price{"gpt-4o-mini": {Rates: llm.Rates{150_000, 75_000, 150_000, 600_000, 600_000}}, "claude-sonnet-4-5": {Rates: llm.Rates{3_000_000, 300_000, 3_750_000, 15_000_000, 15_000_000}}},
	})
	for _, model := range []string{"gpt-4o-mini-2024-07-18", "claude-sonnet-4-5-20250929", "claude-sonnet-4-5@20250929"} {
		path, body := "/v1/chat/completions", `{"model":"`+model+`","messages":[{"role":"user","content":"hi"}],"max_tokens":10}`
		if strings.HasPrefix(model, "claude") {
			path = "/v1/messages"
		}
		if resp, msg := r.post(path, body); resp.StatusCode != 200 {
			t.Errorf("%s: %d %s", model, resp.StatusCode, msg)
		}
	}
	if resp, msg := r.post("/v1/chat/completions", `{"model":"gpt-4o-mini-extra","messages":[{"role":"user","content":"hi"}],"max_tokens":10}`); resp.StatusCode != 400 {
		t.Errorf("a model of no listed family: %d %s", resp.StatusCode, msg)
	}
}

// A tenant whose budget holds nothing is refused its next calls for a
// moment before their bodies are read or counted, and without a look at
// the store; a reload, or the moment's end, asks again.
func TestSpentBudgetRefusedEarly(t *testing.T) {
	clock := epoch
	calls := policy.RuleSpec{Name: "calls", Scope: "tenant", Algorithm: "quota", Period: "day", Limit: int64p(3)}
	r := newRig(t, []policy.RuleSpec{calls}, llm.GateOptions{Now: func() time.Time { return clock }})
	body := `{"model":"gpt-4o-mini","messages":[{"role":"user","content":"hi"}],"max_tokens":100}`
	for i := 0; ; i++ {
		resp, msg := r.post("/v1/chat/completions", body)
		if resp.StatusCode == 429 {
			break
		}
		if i > 20 {
			t.Fatalf("never spent: %d %s", resp.StatusCode, msg)
		}
	}
	resp, msg, read := r.postCounting("/v1/chat/completions", body)
	if resp.StatusCode != 429 || read != 0 || !strings.Contains(msg, `rate limited by \"calls\"`) {
		t.Errorf("a call right after the budget was spent: %d %s, %d body bytes read; want 429 before reading it", resp.StatusCode, msg, read)
	}
	clock = clock.Add(2 * time.Second)
	if resp, _, read = r.postCounting("/v1/chat/completions", body); resp.StatusCode != 429 || read == 0 {
		t.Errorf("a call once the moment passed: %d, %d body bytes read; want it read and decided again", resp.StatusCode, read)
	}
}

// list prices the models of TestPricedAsBilled, in µUSD per million
// tokens (web searches: per million searches).
var listPrices = map[string]llm.Price{
	"gpt-4o-audio-preview": {Rates: rates(map[units.TokenKind]int64{units.Input: 2_500_000, units.Output: 10_000_000,
		units.AudioInput: 40_000_000, units.AudioOutput: 80_000_000})},
	"gpt-5": {Rates: rates(map[units.TokenKind]int64{units.Input: 1_250_000, units.CachedInput: 125_000, units.Output: 10_000_000}),
		Tiers: map[string]*llm.Price{
			"priority": {Rates: rates(map[units.TokenKind]int64{units.Input: 2_500_000, units.CachedInput: 250_000, units.Output: 20_000_000})},
		}},
	"claude-sonnet-4-5": {
		Rates: rates(map[units.TokenKind]int64{units.Input: 3_000_000, units.CachedInput: 300_000, units.CacheWrite: 3_750_000,
			units.CacheWriteLong: 6_000_000, units.Output: 15_000_000, units.WebSearch: 10_000_000_000}),
		LongContextAbove: 200_000,
		LongContext: rates(map[units.TokenKind]int64{units.Input: 6_000_000, units.CachedInput: 600_000, units.CacheWrite: 7_500_000,
			units.CacheWriteLong: 12_000_000, units.Output: 22_500_000, units.WebSearch: 10_000_000_000}),
	},
	"gemini-2.5-flash": {Rates: rates(map[units.TokenKind]int64{units.Input: 300_000, units.AudioInput: 1_000_000, units.Output: 2_500_000})},
}

func rates(m map[units.TokenKind]int64) llm.Rates {
	var r llm.Rates
	for k, v := range m {
		r[k] = v
	}
	return r
}

// Money is priced as the providers bill it: audio in and out, cache
// writes by how long they are kept, web searches (reported, or as
// reserved where the provider does not count them), service tiers asked
// for or reported, and a long prompt's whole call at its long-context
// rates. Each call's record costs what the list prices say, and the
// budget loses exactly that.
func TestPricedAsBilled(t *testing.T) {
	budget := policy.RuleSpec{Name: "spend", Scope: "tenant", Unit: "money", Algorithm: "quota", Period: "day", Budget: "100"}
	r := newRig(t, []policy.RuleSpec{budget}, llm.GateOptions{Prices: listPrices})
	type kinds = map[units.TokenKind]int64
	for _, c := range []struct {
		name, path, body string
		up               func(*llmtest.Upstream)
		// want are the billed tokens beyond the text input the stand-in
		// counts (added as Input) and its output; tier the tier billed.
		want kinds
		tier string
		long bool
	}{
		{name: "openai_audio", path: "/v1/chat/completions",
			body: `{"model":"gpt-4o-audio-preview","modalities":["text","audio"],"audio":{"voice":"alloy","format":"wav"},"max_completion_tokens":500,
				"messages":[{"role":"user","content":[{"type":"input_audio","input_audio":{"data":"` + llmtest.WAV(1) + `","format":"wav"}}]}]}`,
			up: func(u *llmtest.Upstream) { u.Output = 100; u.AudioIn = 32; u.AudioOut = 300 }, want: kinds{units.AudioInput: 32, units.AudioOutput: 300}, tier: "default"},
		{name: "anthropic_cache_1h_and_searches", path: "/v1/messages",
			body: `{"model":"claude-sonnet-4-5","max_tokens":400,"system":[{"type":"text","text":"rules","cache_control":{"type":"ephemeral","ttl":"1h"}}],
				"tools":[{"type":"web_search_20250305","name":"web_search","max_uses":3}],"messages":[{"role":"user","content":"news"}]}`,
			up: func(u *llmtest.Upstream) {
				u.Output = 100
				u.Cached = 500
				u.CacheWrite = 1000
				u.CacheWrite1h = 2000
				u.WebSearches = 3
			},
			want: kinds{units.CachedInput: 500, units.CacheWrite: 1000, units.CacheWriteLong: 2000, units.WebSearch: 3}, tier: "standard"},
		{name: "anthropic_more_searches_than_reserved", path: "/v1/messages",
			body: `{"model":"claude-sonnet-4-5","max_tokens":400,"tools":[{"type":"web_search_20250305","name":"web_search"}],"messages":[{"role":"user","content":"news"}]}`,
			up:   func(u *llmtest.Upstream) { u.Output = 100; u.WebSearches = 7 }, want: kinds{units.WebSearch: 7}, tier: "standard"},
		{name: "anthropic_long_context", path: "/v1/messages",
			body: `{"model":"claude-sonnet-4-5","max_tokens":400,"messages":[{"role":"user","content":"the rest of a long document"}]}`,
			up:   func(u *llmtest.Upstream) { u.Output = 100; u.Cached = 250_000 }, want: kinds{units.CachedInput: 250_000}, tier: "standard", long: true},
		{name: "openai_priority_asked", path: "/v1/chat/completions",
			body: `{"model":"gpt-5","service_tier":"priority","max_completion_tokens":300,"messages":[{"role":"user","content":"fast"}]}`,
			up:   func(u *llmtest.Upstream) { u.Output = 100 }, tier: "priority"},
		{name: "openai_priority_served_unasked", path: "/v1/chat/completions",
			body: `{"model":"gpt-5","stream":true,"max_completion_tokens":300,"messages":[{"role":"user","content":"auto"}]}`,
			up:   func(u *llmtest.Upstream) { u.Output = 100; u.ServiceTier = "priority" }, tier: "priority"},
		{name: "openai_responses_search_not_counted", path: "/v1/responses",
			body: `{"model":"gpt-5","input":"news","tools":[{"type":"web_search"}],"max_output_tokens":300}`,
			up:   func(u *llmtest.Upstream) { u.Output = 100 }, want: kinds{units.WebSearch: llm.DefaultSearches}, tier: "default"},
		{name: "gemini_audio", path: "/v1beta/models/gemini-2.5-flash:generateContent",
			body: `{"contents":[{"parts":[{"inline_data":{"mime_type":"audio/wav","data":"` + llmtest.WAV(1) + `"}}]}],"generationConfig":{"maxOutputTokens":300}}`,
			up:   func(u *llmtest.Upstream) { u.Output = 100; u.AudioIn = 32 }, want: kinds{units.AudioInput: 32}},
	} {
		t.Run(c.name, func(t *testing.T) {
			r.up.Cached, r.up.CacheWrite, r.up.CacheWrite1h, r.up.AudioIn, r.up.AudioOut, r.up.WebSearches, r.up.ServiceTier = 0, 0, 0, 0, 0, 0, ""
			c.up(r.up)
			before := r.remaining("spend")
			resp, msg := r.post(c.path, c.body)
			if resp.StatusCode != 200 {
				t.Fatalf("%d %s", resp.StatusCode, msg)
			}
			_, sent := r.up.Last()
			rec := r.records[len(r.records)-1]
			var want units.Tokens
			for k, n := range c.want {
				want[k] = n
			}
			want[units.Input] = llmtest.InputTokens(sent)
			want[units.Output] = 100
			if rec.Usage != want || !rec.Reported || rec.ServiceTier != c.tier {
				t.Fatalf("recorded %v (reported %v, tier %q), want %v (tier %q)", rec.Usage, rec.Reported, rec.ServiceTier, want, c.tier)
			}
			p := listPrices[rec.Model]
			cost := llmtest.ListCost(&p, c.tier, c.long, want)
			if rec.Cost != cost {
				t.Fatalf("cost %d µUSD, the list price is %d", rec.Cost, cost)
			}
			if got := before - r.remaining("spend"); got != cost {
				t.Fatalf("the budget lost %d µUSD for a call that cost %d", got, cost)
			}
		})
	}
}

// A large prompt whose input alone passes what its budget holds is
// refused once the text counted passes the room, without counting the
// rest: a refused call costs the proxy a piece of its prompt, not the
// whole. One that fits is counted whole and admitted.
func TestLargePromptRefusedBeforeCounted(t *testing.T) {
	var counted atomic.Int64
	count := func(_, text string) int64 { counted.Add(int64(len(text))); return int64(len(text)+2) / 3 }
	for _, unit := range []string{"tokens", "money"} {
		t.Run(unit, func(t *testing.T) {
			counted.Store(0)
			rule := policy.RuleSpec{Name: "budget", Scope: "tenant", Unit: "tokens", Algorithm: "quota", Period: "day", Limit: int64p(1_000_000)}
			if unit == "money" {
				rule.Limit, rule.Budget, rule.Unit = nil, "0.15", "money" // a million input tokens at 0.15
			}
			r := newRig(t, []policy.RuleSpec{rule}, llm.GateOptions{Count: count, Prices: map[string]llm.Price{
				"gpt-4o-mini": {Rates: llm.Rates{units.Input: 150_000, units.CachedInput: 75_000, units.Output: 600_000}}}})
			prompt := func(bytes int) string {
				return `{"model":"gpt-4o-mini","max_tokens":10,"messages":[{"role":"user","content":"` + strings.Repeat("word ", bytes/5) + `"}]}`
			}
			// 6 MB: 2,000,000 tokens at 3 bytes each, against a million
			// (money: two million at the cached price, the lightest).
			big := 6_000_000
			if unit == "money" {
				big = 12_000_000
			}
			resp, msg := r.post("/v1/chat/completions", prompt(big))
			if resp.StatusCode != 429 || r.up.Calls() != 0 || !strings.Contains(msg, "input tokens") {
				t.Fatalf("a prompt past the budget: %d %s (upstream calls %d)", resp.StatusCode, msg, r.up.Calls())
			}
			limit := int64(1_000_000 * 3)
			if unit == "money" {
				limit *= 2
			}
			if n := counted.Load(); n > limit+2*64<<10 {
				t.Fatalf("counted %d bytes of a %d-byte prompt refused for passing %d", n, big, limit)
			}
			t.Logf("refused after counting %d of %d bytes", counted.Load(), big)
			counted.Store(0)
			resp, msg = r.post("/v1/chat/completions", prompt(1_500_000))
			if resp.StatusCode != 200 || counted.Load() < 1_500_000 {
				t.Fatalf("a prompt that fits: %d %s, %d bytes counted", resp.StatusCode, msg, counted.Load())
			}
		})
	}
}

// A Gemini stream carries running totals in its chunks: one that ends
// cleanly before the chunk that says why it finished has not reported
// its usage, and is charged its reservation, not the totals so far (once
// 4 tokens recorded for 400 billed).
func TestGeminiStreamEndedEarlyKeepsReservation(t *testing.T) {
	r := newRig(t, []policy.RuleSpec{tokenRule()}, llm.GateOptions{})
	r.up.Output = 400
	r.up.Hold = make(chan struct{})
	go func() {
		for range 3 {
			r.up.Hold <- struct{}{}
		}
		close(r.up.Hold) // the upstream ends the stream, cleanly, here
	}()
	resp, body := r.post("/v1beta/models/gemini-2.5-flash:streamGenerateContent?alt=sse", `{"contents":[{"parts":[{"text":"hi"}]}],"generationConfig":{"maxOutputTokens":500}}`)
	if resp.StatusCode != 200 || !strings.Contains(body, "usageMetadata") {
		t.Fatalf("%d %s", resp.StatusCode, body)
	}
	rec := r.records[len(r.records)-1]
	if rec.Reported || rec.Usage[units.Output] != 500 {
		t.Fatalf("a stream ended before its last chunk: recorded %v (reported %v), want the reservation's 500 output tokens", rec.Usage, rec.Reported)
	}
}

// A stream past the maximum it was sent (an upstream that ignores it) is
// cut there: the client gets no more, the upstream call is cancelled, and
// the call is charged its reservation, the maximum (once 3,000 tokens
// relayed for max_tokens 100).
func TestStreamCutAtMaximum(t *testing.T) {
	for _, c := range []struct{ name, path, body string }{
		{"openai", "/v1/chat/completions", `{"model":"gpt-4o-mini","stream":true,"max_tokens":100,"messages":[{"role":"user","content":"go on"}]}`},
		{"anthropic", "/v1/messages", `{"model":"claude-sonnet-4-5","stream":true,"max_tokens":100,"messages":[{"role":"user","content":"go on"}]}`},
		{"gemini", "/v1beta/models/gemini-2.5-flash:streamGenerateContent?alt=sse", `{"contents":[{"parts":[{"text":"go on"}]}],"generationConfig":{"maxOutputTokens":100}}`},
		{"responses", "/v1/responses", `{"model":"gpt-4o","stream":true,"max_output_tokens":100,"input":"go on"}`},
	} {
		for _, spaced := range []bool{false, true} {
			t.Run(c.name+map[bool]string{true: "_spaced"}[spaced], func(t *testing.T) {
				rule := tokenRule()
				rule.Burst = int64p(5000)
				r := newRig(t, []policy.RuleSpec{rule}, llm.GateOptions{})
				r.up.Output, r.up.IgnoreMax, r.up.Spaced = 3000, true, spaced
				resp, body := r.post(c.path, c.body)
				if resp.StatusCode != 200 {
					t.Fatalf("%d %s", resp.StatusCode, body)
				}
				if words := strings.Count(body, "tok "); words > 101 || words < 99 {
					t.Errorf("the client got %d tokens of a stream sent with a maximum of 100", words)
				}
				rec := r.records[len(r.records)-1]
				if rec.Reported || rec.Usage[units.Output] != 100 {
					t.Errorf("recorded %v (reported %v), want the reservation's 100 output tokens", rec.Usage, rec.Reported)
				}
			})
		}
	}
}

// A stream that makes exactly its maximum is never cut, whatever events
// repeat its text (the Responses API's .done events): it is relayed
// whole and settled to its report.
func TestStreamAtMaximumNotCut(t *testing.T) {
	for _, c := range []struct{ name, path, body string }{
		{"openai", "/v1/chat/completions", `{"model":"gpt-4o-mini","stream":true,"n":3,"max_tokens":100,"messages":[{"role":"user","content":"go on"}]}`},
		{"anthropic", "/v1/messages", `{"model":"claude-sonnet-4-5","stream":true,"max_tokens":100,"messages":[{"role":"user","content":"go on"}]}`},
		{"gemini", "/v1beta/models/gemini-2.5-flash:streamGenerateContent?alt=sse", `{"contents":[{"parts":[{"text":"go on"}]}],"generationConfig":{"maxOutputTokens":100}}`},
		{"responses", "/v1/responses", `{"model":"gpt-4o","stream":true,"max_output_tokens":100,"input":"go on"}`},
	} {
		t.Run(c.name, func(t *testing.T) {
			rule := tokenRule()
			rule.Burst = int64p(5000)
			r := newRig(t, []policy.RuleSpec{rule}, llm.GateOptions{})
			r.up.Output = 100
			resp, body := r.post(c.path, c.body)
			if resp.StatusCode != 200 {
				t.Fatalf("%d %s", resp.StatusCode, body)
			}
			rec := r.records[len(r.records)-1]
			if !rec.Reported {
				t.Fatalf("a stream at its maximum was cut: recorded %v, reported %v", rec.Usage, rec.Reported)
			}
		})
	}
}
