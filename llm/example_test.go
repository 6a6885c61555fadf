package llm_test

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/admitdev/admit/llm"
	"github.com/admitdev/admit/llm/llmtest"
	"github.com/admitdev/admit/memstore"
	"github.com/admitdev/admit/policy"
	"github.com/admitdev/admit/units"
)

// A Go service that calls an LLM provider itself puts a Gate in its HTTP
// client: each call reserves its bound in the tenant's token budget and
// settles to the usage the provider reports.
func ExampleTransport() {
	provider := httptest.NewServer(&llmtest.Upstream{Output: 40}) // stands in for api.openai.com
	defer provider.Close()

	burst := int64(1000)
	pol, _ := policy.Compile(&policy.Spec{
		Tiers: map[string]policy.TierSpec{"standard": {Rules: []policy.RuleSpec{
			{Name: "tokens", Scope: "tenant", Unit: "tokens", Algorithm: "token_bucket", Rate: "1000/min", Burst: &burst},
		}}},
		Tenants: map[string]policy.TenantSpec{"acme": {Tier: "standard"}},
	})
	store := memstore.New(nil)
	defer store.Close()
	gate, _ := llm.NewGate(llm.GateOptions{
		Decider: policy.NewDecider(store, 1),
		Policy:  func() *policy.Policy { return pol },
		Record: func(r *llm.Record) {
			fmt.Printf("%s used %d output tokens of %s\n", r.Tenant, r.Usage[units.Output], r.Model)
		},
	})
	client := &http.Client{Transport: &llm.Transport{
		Gate: gate,
		// Who the call is for: here always acme; a service would read it
		// from its own request.
		Who: func(*http.Request) (policy.Request, error) { return policy.Request{Tenant: "acme", Cost: 1}, nil },
	}}
	// With the OpenAI SDK: option.WithHTTPClient(client), or
	// option.WithMiddleware(transport.Middleware()).
	resp, err := client.Post(provider.URL+"/v1/chat/completions", "application/json",
		strings.NewReader(`{"model":"gpt-4o-mini","messages":[{"role":"user","content":"Say hello"}],"max_tokens":100}`))
	if err != nil {
		fmt.Println(err)
		return
	}
	// Reading the answer to its end settles the call. (Closed before it,
	// it is charged as a call whose client left.)
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	fmt.Println(resp.Status, resp.Header.Get("X-Ratelimit-Limit-Tokens"))
	// Output:
	// acme used 40 output tokens of gpt-4o-mini
	// 200 OK 1000
}
