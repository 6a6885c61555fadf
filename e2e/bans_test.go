package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/admitdev/admit/redistest"
)

const bansConfig = `version: 1
tiers:
  free:
    rules:
      - {name: api, scope: user, algorithm: fixed_window, limit: 3, window: 1h}
    gateway:
      connections_per_session: 4
      tenant_connections: 10
tenants:
  acme: {tier: free}
  beta: {tier: free}
bans:
  - {name: abuse, rule: api, refusals: 4, within: 1m, ban: 30s, max: 2m, scope: user}
`

// banView is a ban as the admin API answers it.
type banView struct {
	ID         string    `json:"id"`
	Scope      string    `json:"scope"`
	Value      string    `json:"value"`
	Tenant     string    `json:"tenant"`
	Source     string    `json:"source"`
	Strike     int       `json:"strike"`
	Reason     string    `json:"reason"`
	Created    time.Time `json:"created_at"`
	Expires    time.Time `json:"expires_at"`
	ExpiresInS int64     `json:"expires_in_s"`
}

func setBan(t *testing.T, p *admitProcess, body string) banView {
	t.Helper()
	code, out := call(t, p, "POST", "/v1/admin/bans", body, "", true)
	if code != http.StatusCreated {
		t.Fatalf("POST /v1/admin/bans %s: %d %s", body, code, out)
	}
	var b banView
	if err := json.Unmarshal([]byte(out), &b); err != nil {
		t.Fatal(err)
	}
	return b
}

func listBans(t *testing.T, p *admitProcess) []banView {
	t.Helper()
	code, out := call(t, p, "GET", "/v1/admin/bans", "", "", true)
	if code != http.StatusOK {
		t.Fatalf("GET /v1/admin/bans: %d %s", code, out)
	}
	var l struct {
		Bans []banView `json:"bans"`
	}
	if err := json.Unmarshal([]byte(out), &l); err != nil {
		t.Fatal(err)
	}
	return l.Bans
}

// banCheck is /v1/check of body on p: the status and the decoded answer.
func banCheck(t *testing.T, p *admitProcess, body string) (int, map[string]any) {
	t.Helper()
	code, out := call(t, p, "POST", "/v1/check", body, "", false)
	var m map[string]any
	_ = json.Unmarshal([]byte(out), &m)
	return code, m
}

// until calls f until it reports true, at most d, and returns how long it
// took; it fails the test after d.
func until(t *testing.T, d time.Duration, what string, f func() bool) time.Duration {
	t.Helper()
	start := time.Now()
	for !f() {
		if time.Since(start) > d {
			t.Fatalf("%s: not within %s", what, d)
		}
		time.Sleep(5 * time.Millisecond)
	}
	return time.Since(start)
}

// TestBansAcrossServers: two `admit serve` on one Redis. A ban set on one
// refuses on the other within a second, at no Redis command per banned
// request, on the decision API (429, abnormal-usage-detected, Retry-After
// to the ban's end), the Envoy RLS (OVER_LIMIT) and the WebSocket gateway
// (429 at connect, open connections closed with 4003); lifting it on the
// other server admits again. An escalation rule counts refusals made on
// both servers.
func TestBansAcrossServers(t *testing.T) {
	redis := redistest.Start(t)
	cfg := filepath.Join(t.TempDir(), "admit.yaml")
	if err := os.WriteFile(cfg, []byte(bansConfig), 0o600); err != nil {
		t.Fatal(err)
	}
	env := []string{"ADMIT_ADMIN_TOKEN=" + catalogToken}
	store := "redis://" + redis.Addr
	a := startAdmitEnv(t, env, "--config", cfg, "--store", store, "--top-publish-interval", "200ms")
	b := startAdmitEnv(t, env, "--config", cfg, "--store", store, "--top-publish-interval", "200ms")

	// An address banned on a is refused on b.
	ban := setBan(t, a, `{"scope":"ip","value":"198.51.100.0/24","ttl":"10m","reason":"scraping"}`)
	if ban.Value != "198.51.100.0/24" || ban.ExpiresInS != 600 || ban.Source != "admin" {
		t.Fatalf("ban = %+v", ban)
	}
	took := until(t, 5*time.Second, "the ban on the other server", func() bool {
		// No user: only the ban can refuse.
		_, m := banCheck(t, b, `{"tenant":"acme","ip":"198.51.100.7"}`)
		return m["denied_by"] == "ban:"+ban.ID
	})
	t.Logf("a ban set on one server refused on the other after %s", took.Round(time.Millisecond))
	if took > time.Second {
		t.Errorf("the ban took %s to refuse on the other server; want within a second", took)
	}
	code, body := call(t, b, "POST", "/v1/check", `{"tenant":"acme","user":"u1","ip":"198.51.100.7"}`, "", false)
	var refusal map[string]any
	_ = json.Unmarshal([]byte(body), &refusal)
	if code != 429 || refusal["denied_by"] != "ban:"+ban.ID || refusal["type"] != "https://iana.org/assignments/http-problem-types#abnormal-usage-detected" {
		t.Fatalf("banned check: %d %s", code, body)
	}
	if ms, _ := refusal["retry_after_ms"].(float64); ms < 590_000 || ms > 600_000 {
		t.Fatalf("retry_after_ms %v; want the ban's end, about 600000", refusal["retry_after_ms"])
	}
	// Other addresses pass.
	if code, m := banCheck(t, b, `{"tenant":"acme","user":"u5","ip":"198.51.101.7"}`); code != 200 {
		t.Fatalf("another address: %d %v", code, m)
	}

	// No Redis command per banned request: the store's decisions are
	// function calls, and a banned request makes none.
	before, err := redistest.CommandCalls(redis.Addr)
	if err != nil {
		t.Fatal(err)
	}
	for range 50 {
		if code, _ := banCheck(t, b, `{"tenant":"acme","user":"u2","ip":"198.51.100.9"}`); code != 429 {
			t.Fatalf("banned request: %d", code)
		}
	}
	after, err := redistest.CommandCalls(redis.Addr)
	if err != nil {
		t.Fatal(err)
	}
	for _, cmd := range []string{"fcall", "evalsha", "eval", "fcall_ro"} {
		if n := after[cmd] - before[cmd]; n != 0 {
			t.Errorf("50 banned requests made %d %s calls; want 0", n, cmd)
		}
	}

	// The Envoy RLS refuses the address too.
	conn, err := grpc.NewClient(b.grpc, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	rls := rlsv3.NewRateLimitServiceClient(conn)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := rls.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "admit", Descriptors: []*rlv3.RateLimitDescriptor{{
		Entries: []*rlv3.RateLimitDescriptor_Entry{{Key: "tenant", Value: "acme"}, {Key: "user", Value: "u3"}, {Key: "remote_address", Value: "198.51.100.200"}}}}})
	if err != nil {
		t.Fatal(err)
	}
	if resp.GetOverallCode() != rlsv3.RateLimitResponse_OVER_LIMIT || resp.GetStatuses()[0].GetCurrentLimit().GetName() != "ban:"+ban.ID ||
		resp.GetStatuses()[0].GetDurationUntilReset().GetSeconds() < 590 {
		t.Fatalf("RLS under the ban: %v", resp)
	}

	// Lifted on b: a admits the address again.
	if code, out := call(t, b, "DELETE", "/v1/admin/bans/"+ban.ID, "", "", true); code != http.StatusNoContent {
		t.Fatalf("DELETE: %d %s", code, out)
	}
	until(t, 5*time.Second, "the lifted ban on the other server", func() bool {
		code, _ := banCheck(t, a, `{"tenant":"acme","ip":"198.51.100.7"}`)
		return code == http.StatusOK
	})
	if code, out := call(t, a, "DELETE", "/v1/admin/bans/"+ban.ID, "", "", true); code != http.StatusNotFound {
		t.Fatalf("DELETE again: %d %s; want 404", code, out)
	}

	// WebSocket: a tenant banned on a closes its connections on b, and
	// its next connection is refused.
	code, out := call(t, b, "PUT", "/v1/sessions", `{"tenant":"beta"}`, "", true)
	if code != http.StatusCreated {
		t.Fatalf("PUT /v1/sessions: %d %s", code, out)
	}
	var sess struct {
		ID string `json:"session_id"`
	}
	_ = json.Unmarshal([]byte(out), &sess)
	ws, status := dialWS(t, b.url, "beta", sess.ID)
	if ws == nil {
		t.Fatalf("connecting: %d", status)
	}
	defer ws.CloseNow()
	tban := setBan(t, a, `{"scope":"tenant","value":"beta","ttl":"1m"}`)
	rctx, rcancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer rcancel()
	_, _, err = ws.Read(rctx)
	var ce websocket.CloseError
	if !errors.As(err, &ce) || ce.Code != 4003 || !strings.Contains(ce.Reason, tban.ID) {
		t.Fatalf("the open connection ended with %v; want close 4003 naming the ban", err)
	}
	if _, status := dialWS(t, b.url, "beta", sess.ID); status != http.StatusTooManyRequests {
		t.Fatalf("a banned tenant's connection: %d; want 429", status)
	}

	// Escalation: the refusals of one user on both servers count
	// together. Three pass (the limit), then four refusals ban. The
	// platform's backend names the user (a token vouches for it); the
	// same requests without one, which anyone could make naming any user
	// of a tenant without keys, are never counted.
	for i := range 8 {
		banCheck(t, []*admitProcess{a, b}[i%2], `{"tenant":"acme","user":"victim"}`)
	}
	for i := range 3 {
		if code, _ := call(t, []*admitProcess{a, b}[i%2], "POST", "/v1/check", `{"tenant":"acme","user":"mallory"}`, "", true); code != 200 {
			t.Fatalf("request %d: %d", i, code)
		}
	}
	for i := range 4 {
		if code, _ := call(t, []*admitProcess{a, b}[i%2], "POST", "/v1/check", `{"tenant":"acme","user":"mallory"}`, "", true); code != 429 {
			t.Fatalf("refusal %d: %d", i, code)
		}
	}
	var esc banView
	until(t, 5*time.Second, "the escalation's ban", func() bool {
		for _, x := range listBans(t, b) {
			if x.Source == "escalation:abuse" && x.Value == "mallory" {
				esc = x
				return true
			}
		}
		return false
	})
	if esc.Tenant != "acme" || esc.Strike != 1 || esc.Expires.Sub(esc.Created) != 30*time.Second {
		t.Fatalf("escalated ban %+v; want mallory of acme, strike 1, 30s", esc)
	}
	for _, x := range listBans(t, a) {
		if x.Value == "victim" {
			t.Fatalf("anonymous refusals banned a user: %+v", x)
		}
	}
	until(t, 5*time.Second, "the escalated ban on both servers", func() bool {
		_, ma := banCheck(t, a, `{"tenant":"acme","user":"mallory"}`)
		_, mb := banCheck(t, b, `{"tenant":"acme","user":"mallory"}`)
		return ma["denied_by"] == "ban:"+esc.ID && mb["denied_by"] == "ban:"+esc.ID
	})

	// The heaviest callers of rule api, merged from both servers.
	var top struct {
		Servers int `json:"servers"`
		Refused []struct {
			Key, Scope, Value, Tenant string
			Count                     int64
		} `json:"refused"`
	}
	until(t, 10*time.Second, "both servers' callers", func() bool {
		code, out := call(t, a, "GET", "/v1/admin/top?rule=api&window=5m", "", "", true)
		if code != 200 {
			t.Fatalf("GET /v1/admin/top: %d %s", code, out)
		}
		_ = json.Unmarshal([]byte(out), &top)
		// Four refusals, and those of the requests made before the ban
		// reached the server each one went to.
		return top.Servers == 2 && len(top.Refused) > 0 && top.Refused[0].Count >= 4
	})
	if r := top.Refused[0]; r.Key != "acme/mallory" || r.Scope != "user" || r.Value != "mallory" || r.Tenant != "acme" {
		t.Fatalf("top refused %+v", top.Refused)
	}
}

// TestBansSurviveRestart: with the memory store, a ban and an
// escalation's history are in the data directory, and a restarted server
// enforces and remembers them.
func TestBansSurviveRestart(t *testing.T) {
	dir := t.TempDir()
	cfg := filepath.Join(dir, "admit.yaml")
	if err := os.WriteFile(cfg, []byte(bansConfig), 0o600); err != nil {
		t.Fatal(err)
	}
	data := filepath.Join(dir, "data")
	env := []string{"ADMIT_ADMIN_TOKEN=" + catalogToken}
	p := startAdmitEnv(t, env, "--config", cfg, "--data-dir", data)
	ban := setBan(t, p, `{"scope":"user","tenant":"acme","value":"bob","ttl":"1h","reason":"fraud"}`)
	_ = p.cmd.Process.Kill()
	_ = p.cmd.Wait()
	q := startAdmitEnv(t, env, "--config", cfg, "--data-dir", data)
	got := listBans(t, q)
	if len(got) != 1 || got[0].ID != ban.ID || got[0].Reason != "fraud" {
		t.Fatalf("after a restart: %+v", got)
	}
	if _, m := banCheck(t, q, `{"tenant":"acme","user":"bob"}`); m["denied_by"] != "ban:"+ban.ID {
		t.Fatalf("after a restart bob is %v", m)
	}
}
