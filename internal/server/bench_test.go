package server

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/admitdev/admit/policy"
)

// BenchmarkCheck measures the /v1/check handler without the network: JSON
// decoding, authentication, resolution, the decision, headers, metrics and
// the answer. "user" names its tenant; "api-key" presents a tenant's API
// key, which names the tenant and keys one of its rules.
func BenchmarkCheck(b *testing.B) {
	spec := testSpec()
	spec.Tiers["keyed"] = policy.TierSpec{Rules: []policy.RuleSpec{
		tb("user-req", "user", nil, "1/min", 5),
		tb("per-key", "api_key", nil, "1/min", 5),
	}}
	spec.Tenants["keyed"] = policy.TenantSpec{Tier: "keyed", APIKeysSHA256: []string{policy.HashKey("secret-key")}}
	h := start(b, spec, "")
	for _, c := range []struct {
		name string
		body func(i int) string
	}{
		{"user", func(i int) string {
			return fmt.Sprintf(`{"tenant":"t%d","user":"user-%d","action":"read","cost":0}`, 1+i%2, i)
		}},
		{"api-key", func(i int) string {
			return fmt.Sprintf(`{"api_key":"secret-key","user":"user-%d","action":"read","cost":0}`, i)
		}},
	} {
		bodies := make([]string, 1000)
		for i := range bodies {
			bodies[i] = c.body(i)
		}
		b.Run(c.name, func(b *testing.B) {
			var next atomic.Int64
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					w := httptest.NewRecorder()
					i := next.Add(1)
					req := httptest.NewRequest(http.MethodPost, "/v1/check", strings.NewReader(bodies[i%int64(len(bodies))]))
					h.srv.ServeHTTP(w, req)
					if w.Code != 200 {
						b.Fatalf("status %d: %s", w.Code, w.Body)
					}
				}
			})
		})
	}
}
