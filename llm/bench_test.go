package llm_test

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/admitdev/admit/llm"
	"github.com/admitdev/admit/memstore"
	"github.com/admitdev/admit/policy"
)

// fixedAnswer answers every call with one small chat completion.
type fixedAnswer struct{}

const smallAnswer = `{"id":"chatcmpl-1","object":"chat.completion","created":1,"model":"gpt-4o-mini","choices":[{"index":0,"message":{"role":"assistant","content":"Hello there, how are you?"},"finish_reason":"stop"}],"usage":{"prompt_tokens":14,"completion_tokens":5,"total_tokens":19,"prompt_tokens_details":{"cached_tokens":0},"completion_tokens_details":{"reasoning_tokens":0}}}`

func (fixedAnswer) RoundTrip(r *http.Request) (*http.Response, error) {
	_, _ = io.Copy(io.Discard, r.Body)
	return &http.Response{StatusCode: 200, Header: http.Header{"Content-Type": {"application/json"}},
		Body: io.NopCloser(strings.NewReader(smallAnswer)), ContentLength: int64(len(smallAnswer)), Request: r}, nil
}

// benchGate is a Gate on a memory store for tenant acme, whose tier has
// rules.
func benchGate(b *testing.B, rules ...policy.RuleSpec) *llm.Gate {
	b.Helper()
	pol, err := policy.Compile(&policy.Spec{
		Tiers:   map[string]policy.TierSpec{"t": {Rules: rules}},
		Tenants: map[string]policy.TenantSpec{"acme": {Tier: "t"}},
	})
	if err != nil {
		b.Fatal(err)
	}
	s := memstore.New(nil)
	b.Cleanup(func() { s.Close() })
	gate, err := llm.NewGate(llm.GateOptions{Decider: policy.NewDecider(s, 1), Policy: func() *policy.Policy { return pol }})
	if err != nil {
		b.Fatal(err)
	}
	return gate
}

// BenchmarkTransportSmallCall is the metering of one small non-streamed
// chat completion: parse, estimate, reserve a request and a token rule,
// read the usage, settle. The upstream is a fixed answer in memory.
func BenchmarkTransportSmallCall(b *testing.B) {
	burst := int64(1_000_000_000)
	gate := benchGate(b,
		policy.RuleSpec{Name: "requests", Scope: "tenant", Algorithm: "token_bucket", Rate: "1000000000/s", Burst: &burst},
		policy.RuleSpec{Name: "tokens", Scope: "tenant", Unit: "tokens", Algorithm: "token_bucket", Rate: "1000000000/s", Burst: &burst})
	tr := &llm.Transport{Gate: gate, Base: fixedAnswer{}, Who: func(*http.Request) (policy.Request, error) {
		return policy.Request{Tenant: "acme", Cost: 1}, nil
	}}
	body := []byte(`{"model":"gpt-4o-mini","messages":[{"role":"user","content":"Say hello in five words."}],"max_tokens":5}`)
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			req, _ := http.NewRequest("POST", "http://upstream/v1/chat/completions", bytes.NewReader(body))
			resp, err := tr.RoundTrip(req)
			if err != nil || resp.StatusCode != 200 {
				b.Fatal(err)
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
	})
}

// BenchmarkLargePromptRefused is what a 4 MB prompt to gpt-4o costs the
// proxy (its real tokenizer) when its tenant's budget holds 10,000
// tokens: refused once the text counted passes them (refused), against
// the count of the whole prompt that a call refused only at its
// reservation once cost (whole).
func BenchmarkLargePromptRefused(b *testing.B) {
	limit := int64(10_000)
	gate := benchGate(b, policy.RuleSpec{Name: "tokens", Scope: "tenant", Unit: "tokens", Algorithm: "quota", Period: "day", Limit: &limit})
	var prose strings.Builder
	for prose.Len() < 4<<20 {
		prose.WriteString("The quick brown fox jumps over the lazy dog, and then it naps in the sun. ")
	}
	body := []byte(`{"model":"gpt-4o","max_tokens":10,"messages":[{"role":"user","content":"` + prose.String() + `"}]}`)
	b.Run("refused", func(b *testing.B) {
		b.ReportAllocs()
		b.SetBytes(int64(len(body)))
		for b.Loop() {
			if _, err := gate.Parse(context.Background(), policy.Request{Tenant: "acme"}, llm.ChatCompletions, "", body); err == nil {
				b.Fatal("admitted")
			}
		}
	})
	b.Run("whole", func(b *testing.B) {
		b.ReportAllocs()
		b.SetBytes(int64(len(body)))
		for b.Loop() {
			if _, err := llm.ParseRequest(llm.ChatCompletions, "", body, llm.CountTokens); err != nil {
				b.Fatal(err)
			}
		}
	})
}
