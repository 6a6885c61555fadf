package server

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/admitdev/admit/policy"
	"github.com/admitdev/admit/wsgateway"
)

// withGateway serves a gateway over the harness's store and catalog.
func withGateway(t *testing.T) func(*Options) {
	return func(o *Options) {
		g, err := wsgateway.New(wsgateway.Options{Store: o.Store, Policy: o.Catalog.Policy})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			g.Close(ctx)
		})
		o.Gateway, o.Demo = g, true
	}
}

func TestSessionAPI(t *testing.T) {
	h := start(t, testSpec(), "admintoken", withGateway(t))

	a := h.do("PUT", "/v1/sessions", `{"tenant":"t1"}`)
	h.want(a, 201, "create")
	id, _ := a.body["session_id"].(string)
	if len(id) < 32 || a.body["tenant"] != "t1" || a.header.Get("Location") != "/v1/sessions/t1/"+id {
		t.Fatalf("created %v, Location %q", a.body, a.header.Get("Location"))
	}
	if exp, err := time.Parse(time.RFC3339Nano, a.body["expires_at"].(string)); err != nil || time.Until(exp) < 190*time.Second {
		t.Errorf("expires_at %v (the default session_ttl is 200s): %v", a.body["expires_at"], err)
	}

	for _, tc := range []struct {
		body   string
		hdr    []string
		status int
	}{
		{`{"tenant":"nobody"}`, nil, 403},
		{`{}`, nil, 400},
		{`{"tenant":"t1","extra":1}`, nil, 400},
		{`not json`, nil, 400},
		{`{"tenant":"keyed"}`, nil, 401},
		{`{"tenant":"keyed"}`, []string{"X-API-Key", "wrong"}, 401},
		{`{"tenant":"t1"}`, []string{"X-API-Key", "wrong"}, 401},
		{`{"tenant":"keyed"}`, []string{"X-API-Key", "secret-key"}, 201},
		{`{"tenant":"keyed"}`, []string{"Authorization", "Bearer secret-key"}, 201},
		{`{"tenant":"keyed"}`, []string{"Authorization", "Bearer admintoken"}, 201},
	} {
		if got := h.do("PUT", "/v1/sessions", tc.body, tc.hdr...); got.status != tc.status {
			t.Errorf("PUT %s %v: %d, want %d: %s", tc.body, tc.hdr, got.status, tc.status, got.raw)
		}
	}

	keyed := h.do("PUT", "/v1/sessions", `{"tenant":"keyed"}`, "X-API-Key", "secret-key")
	kid, _ := keyed.body["session_id"].(string)
	h.want(h.do("DELETE", "/v1/sessions/keyed/"+kid, ""), 401, "delete a keyed tenant's session without its key")
	h.want(h.do("DELETE", "/v1/sessions/t2/"+id, ""), 403, "delete another tenant's session")
	h.want(h.do("DELETE", "/v1/sessions/t1/"+id, ""), 204, "delete")
	h.want(h.do("DELETE", "/v1/sessions/t1/"+id, ""), 404, "delete twice")
	h.want(h.do("DELETE", "/v1/sessions/keyed/"+kid, "", "X-API-Key", "secret-key"), 204, "delete with the key")
	h.want(h.do("POST", "/v1/sessions", `{"tenant":"t1"}`), 405, "POST")

	// The upgrade endpoint and its preflight answer problems before any
	// upgrade; the preflight of a live session is admitted.
	h.want(h.do("GET", "/v1/ws?tenant=t1&session="+id, ""), 426, "plain GET of /v1/ws")
	h.want(h.do("GET", "/v1/ws/preflight?tenant=t1&session="+id, ""), 404, "preflight of a deleted session")
	live := h.do("PUT", "/v1/sessions", `{"tenant":"t2"}`)
	pre := h.do("GET", "/v1/ws/preflight?tenant=t2&session="+live.body["session_id"].(string), "")
	if pre.status != 200 || pre.body["allowed"] != true {
		t.Errorf("preflight: %d %s", pre.status, pre.raw)
	}

	// The demo page and the tenants it lists (not the keyed one).
	if page := get(t, h.url+"/demo/tenants"); strings.Contains(page, "keyed") || !strings.Contains(page, `{"id":"t1","tier":"small","gateway":{"tenant_connections":10,`) {
		t.Errorf("demo tenants: %s", page)
	}
	if page := get(t, h.url+"/demo/"); !strings.Contains(page, "Create Session") {
		t.Errorf("demo page: %.200s", page)
	}
	metrics := get(t, h.url+"/metrics")
	for _, want := range []string{`admit_gateway_connects_total{result="rejected"} 2`, `admit_gateway_connections 0`} {
		if !strings.Contains(metrics, want) {
			t.Errorf("metrics lack %s", want)
		}
	}
}

// get returns the body of a 200 answer.
func get(t *testing.T, url string) string {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 {
		t.Fatalf("GET %s: %d %s", url, resp.StatusCode, b)
	}
	return string(b)
}

// TestInventedTenantsSessions: a caller without a credential that names
// tenants only the default tier knows holds, whatever tenants it invents,
// the sessions one tenant of that tier may (tenant_sessions), counted for
// its address; a catalog tenant's sessions are its own.
func TestInventedTenantsSessions(t *testing.T) {
	spec := testSpec()
	spec.UnknownTenant = "small"
	ts := spec.Tiers["small"]
	ts.Gateway = &policy.GatewaySpec{TenantSessions: 3}
	spec.Tiers["small"] = ts
	h := start(t, spec, "admintoken", withGateway(t))
	created := 0
	for i := range 10 {
		if a := h.do("PUT", "/v1/sessions", fmt.Sprintf(`{"tenant":"invented-%d"}`, i)); a.status == 201 {
			created++
		} else if a.status != 429 {
			t.Fatalf("invented tenant %d: %d %s", i, a.status, a.raw)
		}
	}
	if created != 3 {
		t.Errorf("an anonymous caller inventing 10 tenants created %d sessions, want 3 (tenant_sessions, for its address)", created)
	}
	for i := range 3 {
		h.want(h.do("PUT", "/v1/sessions", `{"tenant":"t1"}`), 201, fmt.Sprintf("the catalog tenant's session %d", i))
	}
}
