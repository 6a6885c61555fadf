package server

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/admitdev/admit"
	"github.com/admitdev/admit/policy"
)

// TestActivity feeds the dashboard's memory decisions at chosen instants
// and reads back the seconds, the top refused tenants and the refusals.
func TestActivity(t *testing.T) {
	a := newActivity()
	t0 := time.Unix(1_800_000_000, 0)
	rule := &policy.Rule{Rule: admit.Rule{Name: "per-user"}}
	tenant := func(id string) *policy.Resolution {
		return &policy.Resolution{Tenant: &policy.Tenant{ID: id}, Rules: []*policy.Rule{rule}}
	}
	ok := &admit.Decision{Allowed: true, Results: []admit.Result{{Allowed: true}}}
	no := &admit.Decision{DeniedBy: "per-user", Results: []admit.Result{{}}}
	a.add(t0, "check", "u", "read", tenant("a"), ok)
	a.add(t0.Add(500*time.Millisecond), "check", "u", "read", tenant("a"), no)
	a.add(t0.Add(time.Second), "check", "v", "write", tenant("b"), no)
	a.add(t0.Add(time.Second), "check", "v", "write", tenant("b"), no)
	a.add(t0.Add(time.Second), "grpc", "", "", &policy.Resolution{}, &admit.Decision{Allowed: true})
	a.add(t0.Add(time.Second), "nope", "", "", &policy.Resolution{}, ok) // not an endpoint: ignored

	v := a.view(t0.Add(time.Second), "")
	c := v.Endpoints["check"]
	last := activityWindow - 1
	if c.Allowed[last-1] != 1 || c.Refused[last-1] != 1 || c.Refused[last] != 2 || c.Allowed[last] != 0 || v.Endpoints["grpc"].Allowed[last] != 1 {
		t.Errorf("check series end %v %v", c.Allowed[last-2:], c.Refused[last-2:])
	}
	if r := v.Rules["per-user"]; r.Allowed[last-1] != 1 || r.Refused[last-1] != 1 || r.Refused[last] != 2 {
		t.Errorf("rule series %v %v", r.Allowed[last-1:], r.Refused[last-1:])
	}
	if fmt.Sprint(v.TopRefused) != "[{b 2} {a 1}]" {
		t.Errorf("top refused %v", v.TopRefused)
	}
	if len(v.RecentRefusals) != 3 || v.RecentRefusals[0].Tenant != "b" || v.RecentRefusals[2].User != "u" || v.RecentRefusals[2].Rule != "per-user" {
		t.Errorf("recent refusals %+v", v.RecentRefusals)
	}
	if only := a.view(t0.Add(time.Second), "a"); len(only.RecentRefusals) != 1 || only.RecentRefusals[0].Action != "read" {
		t.Errorf("refusals of a: %+v", only.RecentRefusals)
	}

	// Ten minutes on, the old seconds are gone, and a second reused by
	// the ring starts empty.
	later := t0.Add((activityWindow + 1) * time.Second) // t0+1s's slot, reused
	a.add(later, "check", "", "", tenant("c"), ok)
	v = a.view(later, "")
	var sum int64
	for _, n := range v.Endpoints["check"].Allowed {
		sum += n
	}
	for _, n := range v.Endpoints["check"].Refused {
		sum += n
	}
	if sum != 1 || len(v.TopRefused) != 0 {
		t.Errorf("after ten minutes: %d decisions, top %v", sum, v.TopRefused)
	}

	// Tenants counted per second are bounded.
	for i := range maxTenantsPerSecond + 5 {
		a.add(later, "check", "", "", tenant(fmt.Sprint("t", i)), no)
	}
	if v := a.view(later, ""); v.TopRefused[0].Tenant != "(others)" || v.TopRefused[0].Refused != 5 || len(v.RecentRefusals) != 50 {
		t.Errorf("bounded: top %v, %d refusals", v.TopRefused[:2], len(v.RecentRefusals))
	}
}

// TestDashboardAPI drives decisions through the HTTP API and reads them
// back from the dashboard's endpoint; then asks the simulator for a
// picture, and the page itself.
func TestDashboardAPI(t *testing.T) {
	h := start(t, testSpec(), "tok")
	admin := []string{"Authorization", "Bearer tok"}
	for range 3 {
		h.do("POST", "/v1/check", `{"tenant":"t1","user":"u1","action":"read"}`)
	}
	h.want(h.do("GET", "/v1/admin/dashboard", ""), 401, "dashboard without the token")
	a := h.do("GET", "/v1/admin/dashboard", "", admin...)
	h.want(a, 200, "dashboard")
	sum := func(path ...string) (n float64) {
		var v any = a.body
		for _, p := range path {
			v = v.(map[string]any)[p]
		}
		for _, x := range v.([]any) {
			n += x.(float64)
		}
		return n
	}
	if sum("endpoints", "check", "allowed") != 2 || sum("endpoints", "check", "refused") != 1 || sum("rules", "user-req", "refused") != 1 || sum("rules", "global", "allowed") != 3 {
		t.Errorf("dashboard counts: %s", a.raw)
	}
	top := a.body["top_refused_tenants"].([]any)
	recent := a.body["recent_refusals"].([]any)
	if len(top) != 1 || top[0].(map[string]any)["tenant"] != "t1" || len(recent) != 1 || recent[0].(map[string]any)["rule"] != "user-req" || recent[0].(map[string]any)["user"] != "u1" {
		t.Errorf("top %v, recent %v", top, recent)
	}
	if a.body["store"].(map[string]any)["status"] != "ready" || a.body["config"].(map[string]any)["tenants"] != float64(3) {
		t.Errorf("store and config: %s", a.raw)
	}

	for _, c := range []struct {
		body, want string
	}{
		{`{"rules":["token_bucket rate=2/2s burst=5"],"pattern":"bursts n=2 every=1s"}`, "token_bucket 2/2s burst 5"},
		{`{"tenant":"t1","action":"doc","pattern":"constant rate=1/10s duration=5m"}`, "docs"},
	} {
		raw, ct := h.raw("POST", "/v1/admin/simulate", c.body, admin...)
		if ct != "image/svg+xml" || !strings.Contains(raw, "<svg") || !strings.Contains(raw, strings.ReplaceAll(c.want, " ", "&#32;")) && !strings.Contains(raw, c.want) {
			t.Errorf("simulate %s: %s %.200s", c.body, ct, raw)
		}
	}
	for body, field := range map[string]string{
		`{"rules":["token_bucket rate=2/2s"]}`: "burst",
		`{"tenant":"ghost"}`:                   "ghost",
		`{}`:                                   "no rules",
		`{"rules":["fixed_window limit=1 window=1s"],"pattern":"constant rate=1000000/s duration=1h"}`: "at most",
		// 3.6 M requests: refused from the pattern, before they are built.
		`{"rules":["fixed_window limit=1 window=1s"],"pattern":"constant rate=1000/s duration=1h"}`:                  "at most 200000",
		`{"rules":[` + strings.Repeat(`"fixed_window limit=1 window=1s",`, 8) + `"fixed_window limit=1 window=1s"]}`: "at most 8",
	} {
		a := h.do("POST", "/v1/admin/simulate", body, admin...)
		if a.status != 400 || !strings.Contains(a.body["detail"].(string), field) {
			t.Errorf("simulate %s: %d %s", body, a.status, a.raw)
		}
	}

	page, ct := h.raw("GET", "/", "")
	if !strings.HasPrefix(ct, "text/html") || !strings.Contains(page, "<title>Admit</title>") || strings.Contains(page, "http://") || strings.Contains(page, "https://") {
		t.Errorf("page: %s", ct)
	}
	h.want(h.do("GET", "/no-such-page", ""), 404, "unknown page")
}

// raw makes a request and returns the body and Content-Type as they are.
func (h *harness) raw(method, path, body string, hdr ...string) (string, string) {
	h.t.Helper()
	resp, b := h.send(method, path, body, hdr...)
	return string(b), resp.Header.Get("Content-Type")
}

// TestRegionSeen: a store that is one region of limits held across regions
// shows, in /metrics (labelled by region) and in the dashboard, what it
// holds, its share, its calls to the home and whether it is cut off.
func TestRegionSeen(t *testing.T) {
	rg := RegionHealth{Name: "eu", Held: 42, Share: 0.7, HomeCalls: 9, HomeFailures: 2, Granted: 500, GivenBack: 12, RoundTripMS: 81.5, Cut: true}
	h := start(t, testSpec(), "tok", func(o *Options) {
		o.Health = func() StoreHealth { r := rg; return StoreHealth{Breaker: "closed", Region: &r} }
	})
	a := h.do("GET", "/v1/admin/dashboard", "", "Authorization", "Bearer tok")
	region, _ := a.body["region"].(map[string]any)
	if region["name"] != "eu" || region["held"] != 42.0 || region["share"] != 0.7 || region["home_calls"] != 9.0 || region["cut"] != true {
		t.Errorf("dashboard region: %s", a.raw)
	}
	resp, err := http.Get(h.url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{
		`admit_region_held_units{region="eu"} 42`,
		`admit_region_share{region="eu"} 0.7`,
		`admit_region_cut{region="eu"} 1`,
		`admit_region_home_calls_total{region="eu"} 9`,
		`admit_region_home_failures_total{region="eu"} 2`,
		`admit_region_granted_units_total{region="eu"} 500`,
		`admit_region_given_back_units_total{region="eu"} 12`,
		`admit_region_home_round_trip_seconds{region="eu"} 0.0815`,
	} {
		if !strings.Contains(string(body), want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
}
