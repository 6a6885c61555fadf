package e2e

import (
	"context"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/admitdev/admit/redistest"
)

// killConfig: one connection per session, and a dead server's slots
// reclaimed after 2 s.
const killConfig = `version: 1
store:
  backend: redis
gateway:
  lease_ttl: 2s
tiers:
  free:
    gateway:
      connections_per_session: 1
      tenant_connections: 10
tenants:
  t1: {tier: free}
`

func dialWS(t *testing.T, base, tenant, session string) (*websocket.Conn, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	u := "ws" + strings.TrimPrefix(base, "http") + "/v1/ws?tenant=" + tenant + "&session=" + session
	c, resp, err := websocket.Dial(ctx, u, nil)
	if err != nil {
		if resp == nil {
			t.Fatal(err)
		}
		return nil, resp.StatusCode
	}
	return c, http.StatusSwitchingProtocols
}

// TestKilledGatewayLeasesReclaimed: two `admit serve` processes on one
// Redis; the one holding a session's only slot is killed (SIGKILL: no
// release, no goodbye). The other refuses the session until the dead
// server's lease expires, then admits it.
func TestKilledGatewayLeasesReclaimed(t *testing.T) {
	redis := redistest.Start(t)
	cfg := filepath.Join(t.TempDir(), "admit.yaml")
	if err := os.WriteFile(cfg, []byte(killConfig), 0o600); err != nil {
		t.Fatal(err)
	}
	store := "redis://" + redis.Addr
	doomed := startAdmit(t, "--config", cfg, "--store", store)
	survivor := startAdmit(t, "--config", cfg, "--store", store)

	req, _ := http.NewRequest("PUT", survivor.url+"/v1/sessions", strings.NewReader(`{"tenant":"t1"}`))
	resp, err := http.DefaultClient.Do(req)
	if err != nil || resp.StatusCode != http.StatusCreated {
		t.Fatalf("PUT /v1/sessions: %v %v", resp, err)
	}
	var body struct {
		SessionID string `json:"session_id"`
	}
	err = json.NewDecoder(resp.Body).Decode(&body)
	resp.Body.Close()
	if err != nil {
		t.Fatal(err)
	}

	c, code := dialWS(t, doomed.url, "t1", body.SessionID)
	if c == nil {
		t.Fatalf("connect on the first server: %d", code)
	}
	defer c.CloseNow()
	if _, code := dialWS(t, survivor.url, "t1", body.SessionID); code != http.StatusTooManyRequests {
		t.Fatalf("second connection on the other server: %d, want 429", code)
	}

	if err := doomed.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	_ = doomed.cmd.Wait()
	if _, code := dialWS(t, survivor.url, "t1", body.SessionID); code != http.StatusTooManyRequests {
		t.Fatalf("right after the kill: %d, want 429 (the dead server's lease still holds)", code)
	}
	for {
		c2, code := dialWS(t, survivor.url, "t1", body.SessionID)
		if c2 != nil {
			c2.CloseNow()
			break
		}
		if code != http.StatusTooManyRequests {
			t.Fatalf("while waiting: %d", code)
		}
		if time.Since(killed) > 5*time.Second {
			t.Fatal("the dead server's slot was not reclaimed within 5s (lease TTL 2s)")
		}
		time.Sleep(100 * time.Millisecond)
	}
	took := time.Since(killed)
	t.Logf("slot reclaimed %v after the kill (lease TTL 2s)", took.Round(time.Millisecond))
	if took < time.Second {
		t.Errorf("reclaimed after %v: sooner than any renewal could have left it", took)
	}
}
