package attack

import (
	"math"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/admitdev/admit/redistest"
)

// gatewaySharedConfig is the configuration of docs/gateway.md's "Global
// limits on WebSocket traffic": global rules of every tenant's live
// connections (10) and messages (600 a minute), and two keyless tenants.
func gatewaySharedConfig(t *testing.T) string {
	t.Helper()
	doc, err := os.ReadFile("../docs/gateway.md")
	if err != nil {
		t.Fatal(err)
	}
	_, sec, ok := strings.Cut(string(doc), "## Global limits on WebSocket traffic\n")
	_, yml, ok2 := strings.Cut(sec, "```yaml\n")
	yml, _, ok3 := strings.Cut(yml, "```")
	if !ok || !ok2 || !ok3 {
		t.Fatal("docs/gateway.md has no Global limits on WebSocket traffic section with a yaml block")
	}
	return yml
}

// TestGatewayGlobalLimitsShared: with docs/gateway.md's global rules on
// WebSocket traffic, on Redis, one tenant takes every connection and
// floods messages it may open and send. Alone it takes at most its share
// ceiling of the global slots (half) and of the messages' window (half),
// then what the window's pace lends as time passes; the other tenant then
// finds its share of both at once. (Before
// the gateway charged global rules, none applied to WebSocket traffic:
// all 6 connections and 90 messages admitted.)
func TestGatewayGlobalLimitsShared(t *testing.T) {
	srv := redistest.Start(t)
	s := serve(t, gatewaySharedConfig(t), false, "--store", "redis://"+srv.Addr)
	session := func(tenant string) string {
		a := s.do("PUT", "/v1/sessions", `{"tenant":"`+tenant+`"}`)
		if a.status != 201 {
			t.Fatalf("a session of %s: %d %s", tenant, a.status, a.raw)
		}
		return a.body["session_id"].(string)
	}

	// Connections: alpha alone holds at most 5 of the 10 global slots;
	// beta then holds its 5.
	// Each of alpha's connections has a session of its own: a session's
	// replies go to all its connections.
	sb := session("beta")
	var alpha []*wsClient
	for i := range 6 {
		w, status := s.tryWS(t, "alpha", session("alpha"))
		switch {
		case i < 5 && w == nil:
			t.Fatalf("alpha's connection %d: %d", i, status)
		case i == 5 && w != nil:
			t.Fatal("alpha alone holds a 6th of the 10 global slots, over its share ceiling of 5")
		case i == 5 && status != 429:
			t.Fatalf("alpha's 6th connection: %d, want 429", status)
		}
		if w != nil {
			alpha = append(alpha, w)
		}
	}
	var beta *wsClient
	for i := range 6 {
		w, status := s.tryWS(t, "beta", sb)
		if i < 5 && w == nil {
			t.Fatalf("beta's connection %d beside alpha's 5: %d", i, status)
		}
		if i == 5 && (w != nil || status != 429) {
			t.Fatalf("beta's 6th connection: %d, want 429", status)
		}
		if beta == nil {
			beta = w
		}
	}
	report(t, "global slots held by alpha, then by beta (10 in all)", "5 5")
	if got := s.Metric(t, `admit_gateway_refused_total{limit="global"}`); got != 2 {
		t.Errorf(`admit_gateway_refused_total{limit="global"} %v, want 2`, got)
	}

	// Messages: alpha floods 450 frames on its 5 connections (90 each,
	// within each one's frame budget). Of the window's 600 a minute it
	// takes at most its share ceiling, half, then only what the pace lets
	// it borrow: a twentieth of the window, then 10 a second. A flood
	// across the window's end would find a new window: wait for one that
	// has time to spare.
	minuteWithTimeToSpare(10 * time.Second)
	start := time.Now()
	for range 90 {
		for _, w := range alpha {
			w.send(t, `{"route":"pool","id":"flood"}`)
		}
	}
	admitted, throttled := 0, 0
	for _, w := range alpha {
		for n := 0; n < 90; n++ {
			f := w.frame(t)
			switch {
			case strings.HasPrefix(f, `{"type":"echo"`):
				admitted++
			case strings.HasPrefix(f, `{"type":"throttled"`) && strings.Contains(f, `"denied_by":"ws-messages"`):
				throttled++
			default:
				t.Fatalf("an answer to alpha's flood: %s", f)
			}
		}
	}
	took := time.Since(start)
	report(t, "alpha's 450 messages admitted (window of 600/min, alone)", admitted)
	if bound := 300 + 30 + int(math.Ceil(10*took.Seconds())); admitted > bound {
		t.Errorf("alpha's flood: %d of 450 admitted in %v, want at most %d (half the window, a twentieth more, and 10 a second)", admitted, took, bound)
	}
	got := 0
	for range 10 {
		beta.send(t, `{"route":"silo","id":"m"}`)
		if typ := beta.next(t); typ == "echo" {
			got++
		} else {
			t.Errorf("beta's message: %s", typ)
		}
	}
	report(t, "beta's 10 messages admitted after alpha's flood", got)
}

// frame returns the next frame w receives.
func (w *wsClient) frame(t *testing.T) string {
	t.Helper()
	select {
	case f := <-w.frames:
		return f
	case code := <-w.closed:
		t.Fatalf("closed (%d) before an answer", code)
	case <-time.After(5 * time.Second):
		t.Fatal("no answer within 5s")
	}
	return ""
}
