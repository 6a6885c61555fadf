package attack

import (
	"strings"
	"testing"

	"github.com/admitdev/admit/policy"
)

// TestUserHeaderNeedsItsProxy: admit serve trusts loopback and reads
// X-User-Id, but http.forward_auth names no proxy, so none is known to set
// or clear that header on the auth requests it sends. A client that names
// user victim in it (a proxy passes the client's own headers on) must not
// spend the victim's limit.
func TestUserHeaderNeedsItsProxy(t *testing.T) {
	cfg := `version: 1
server:
  trusted_proxies: ["127.0.0.1"]
http:
  user_header: X-User-Id
  actions:
    - {match: "POST /comments", action: comment}
tiers:
  t:
    rules:
      - {name: comments-per-user, scope: user, actions: [comment], algorithm: fixed_window, limit: 2, window: 1h}
tenants:
  acme: {tier: t, api_keys_sha256: ["` + policy.HashKey("acme-key") + `"]}
`
	s := serve(t, cfg, false)
	codes := make([]int, 4)
	for i := range codes {
		codes[i] = s.do("POST", "/v1/authz/comments", "", "X-API-Key", "acme-key", "X-User-Id", "victim").status
	}
	report(t, "answers to 4 comments naming user victim (limit 2)", codes)
	state := s.do("GET", "/v1/admin/state?tenant=acme&user=victim&action=comment", "", admin...)
	if codes[2] != 200 || codes[3] != 200 || !strings.Contains(state.raw, `"remaining":2`) {
		t.Errorf("comments naming user victim: %v; the victim's bucket: %s; want all admitted, the victim's comments untouched", codes, state.raw)
	}
	if !strings.Contains(s.Output.String(), "reads no http.user_header") {
		t.Error("admit serve did not warn that /v1/authz ignores the user header")
	}
}
