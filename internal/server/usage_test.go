package server

import (
	"testing"
	"time"

	"github.com/admitdev/admit/policy"
)

// TestUsage: GET /v1/usage reports, for every rule that applies, what is
// used and until when: a quota's period, a bucket's level and refill. A
// tenant reads its own with its API key; the admin reads any, and the
// rules every tenant shares, which no one else reads.
func TestUsage(t *testing.T) {
	s := testSpec()
	small := s.Tiers["small"]
	small.Rules = append(small.Rules, policy.RuleSpec{Name: "monthly", Scope: "tenant", Algorithm: "quota", Limit: n(10), Period: "month"})
	s.Tiers["small"] = small
	h := start(t, s, "s3cret")
	before := time.Now().UTC()
	for _, u := range []string{"u1", "u1", "u2"} {
		h.want(h.do("POST", "/v1/check", `{"tenant":"t1","user":"`+u+`"}`), 200, "check")
	}
	byName := func(a answer) map[string]map[string]any {
		rules := map[string]map[string]any{}
		for _, r := range a.body["rules"].([]any) {
			m := r.(map[string]any)
			rules[m["name"].(string)] = m
		}
		return rules
	}
	a := h.do("GET", "/v1/usage?tenant=t1&user=u1", "")
	h.want(a, 200, "usage")
	rules := byName(a)
	if rules["global"] != nil {
		t.Errorf("an anonymous caller read the global bucket: %v", rules["global"])
	}
	if g := byName(h.do("GET", "/v1/usage?tenant=t1&user=u1", "", "Authorization", "Bearer s3cret"))["global"]; g == nil || g["limit"] != float64(100) {
		t.Errorf("the admin's global bucket: %v", g) // (it refills 1,000 a second: its use is not read)
	}
	// The month of the checks: the one of before, unless the month
	// turned meanwhile (then nothing of it is counted in the new one).
	first := func(t time.Time) time.Time { return time.Date(t.Year(), t.Month(), 1, 0, 0, 0, 0, time.UTC) }
	m := rules["monthly"]
	if now := time.Now().UTC(); first(now) != first(before) {
		t.Logf("the month turned during the test; its period is not checked")
	} else if m == nil || m["used"] != float64(3) || m["remaining"] != float64(7) || m["limit"] != float64(10) ||
		m["period_start"] != first(now).Format(time.RFC3339) || m["period_end"] != first(now).AddDate(0, 1, 0).Format(time.RFC3339) {
		t.Errorf("monthly: %v", m)
	}
	// user-req: 1/min, burst 2, checked twice for u1: empty, full again
	// in 2 minutes.
	if u := rules["user-req"]; u == nil || u["remaining"] != float64(0) || u["rate"] != "1/min" || u["refill_ms"].(float64) < 119000 {
		t.Errorf("user-req: %v", u)
	}
	if a.body["tenant"] != "t1" || a.body["tier"] != "small" {
		t.Errorf("usage: %s", a.raw)
	}
	// Reading charged nothing.
	if b := h.do("GET", "/v1/usage?tenant=t1&user=u1", ""); byName(b)["monthly"]["used"] != float64(3) {
		t.Errorf("a second read: %s", b.raw)
	}

	h.want(h.do("GET", "/v1/usage?tenant=keyed", ""), 401, "a keyed tenant without its key")
	h.want(h.do("GET", "/v1/usage?tenant=keyed", "", "X-API-Key", "secret-key"), 200, "with its key")
	h.want(h.do("GET", "/v1/usage?tenant=keyed", "", "Authorization", "Bearer s3cret"), 200, "the admin")
	h.want(h.do("GET", "/v1/usage?tenant=t1", "", "X-API-Key", "secret-key"), 403, "another tenant's key")
	h.want(h.do("GET", "/v1/usage", ""), 400, "no tenant")
	h.want(h.do("GET", "/v1/usage?tenant=ghost", ""), 403, "unknown tenant")
}
