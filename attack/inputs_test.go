package attack

import (
	"strings"
	"testing"

	"github.com/admitdev/admit/policy"
)

// TestInputsStrict: what is not what it claims to be is refused, on the
// decision API, never folded or ignored. Text that is not UTF-8 (a lone
// surrogate, a raw 0xff: once both the user U+FFFD, one bucket) is 400
// naming the field; a null body (taken as {}), a query parameter given
// twice (first wins) or not UTF-8 are 400; an Authorization header that
// is not a bearer credential, or an empty one, is 401 (it was ignored, and
// a tenant without keys admitted the request).
func TestInputsStrict(t *testing.T) {
	s := serve(t, `version: 1
tiers:
  free:
    rules:
      - {name: per-user, scope: user, algorithm: token_bucket, rate: 1/h, burst: 100}
tenants:
  acme: {tier: free, api_keys_sha256: ["`+policy.HashKey("acme-key")+`"]}
  open: {tier: free}
`, false)
	for _, c := range []struct {
		name, body, field string
	}{
		{"a lone surrogate", `{"tenant":"acme","user":"\ud800"}`, "user"},
		{"half a pair", `{"tenant":"acme","user":"x\udfffy"}`, "user"},
		{"a raw 0xff", "{\"tenant\":\"acme\",\"user\":\"\xff\"}", "user"},
		{"in an attribute's name", "{\"tenant\":\"acme\",\"attributes\":{\"r\xffgion\":\"eu\"}}", ""},
	} {
		a := s.do("POST", "/v1/check", c.body, acme...)
		if a.status != 400 || !strings.Contains(a.raw, "not UTF-8") || c.field != "" && !strings.Contains(a.raw, `"`+c.field+``) {
			t.Errorf("%s: %d %s, want 400 saying %s is not UTF-8", c.name, a.status, a.raw, c.field)
		}
	}
	if a := s.do("POST", "/v1/check", `null`, acme...); a.status != 400 {
		t.Errorf("a null body: %d %s, want 400", a.status, a.raw)
	}
	for _, q := range []string{"tenant=acme&tenant=globex", "tenant=acme&user=a&user=b", "tenant=acme&user=%ff", "tenant=acme&user=%zz"} {
		if a := s.do("GET", "/v1/usage?"+q, "", acme...); a.status != 400 {
			t.Errorf("GET /v1/usage?%s: %d %s, want 400", q, a.status, a.raw)
		}
	}
	for _, auth := range []string{"Basic YWNtZTpzZWNyZXQ=", "Bearer ", "Bearer", "Token acme-key"} {
		for _, h := range [][]string{{"Authorization", auth}, {"Authorization", auth, "X-API-Key", "acme-key"}} {
			body := `{"tenant":"open","user":"u"}`
			if len(h) > 2 {
				body = `{"tenant":"acme","user":"u"}`
			}
			a := s.do("POST", "/v1/check", body, h...)
			if a.status != 401 || a.header.Get("WWW-Authenticate") == "" {
				t.Errorf("Authorization %q (beside %v): %d %s, want 401", auth, h[2:], a.status, a.raw)
			}
		}
	}
	// A user of any text is one key: what /v1/check charged is what
	// /v1/usage reads.
	user := "ünïcødé 😀"
	if a := s.do("POST", "/v1/check", `{"tenant":"acme","user":"`+user+`"}`, acme...); a.status != 200 {
		t.Fatalf("check: %d %s", a.status, a.raw)
	}
	a := s.do("GET", "/v1/usage?tenant=acme&user="+strings.ReplaceAll(user, " ", "%20"), "", acme...)
	if a.status != 200 || !strings.Contains(a.raw, `"used":1`) {
		t.Errorf("usage of the user checked: %d %s, want a rule with used 1", a.status, a.raw)
	}
}
