package wsgateway

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/admitdev/admit/memstore"
	"github.com/admitdev/admit/policy"
)

// FuzzFrame sends arbitrary client frames through the message path of a
// connection (not yet upgraded, so every frame stays in its send queue):
// no input may panic, and every frame the gateway answers with, echoes
// included, must be one JSON object with a known type.
func FuzzFrame(f *testing.F) {
	for _, s := range []string{
		`{"route":"silo","id":"1","data":{"a":[1,2]}}`, `{"route":"pool"}`, `{"route":"x"}`,
		`not json`, `{"route":"silo","id":7}`, `{"route":"silo","Route":"pool"}`, `{"route":"pool","id":"\u2028\"<>","data":"\ud800"}`, `[]`, `null`,
	} {
		f.Add([]byte(s))
	}
	g, s := fuzzGateway(f)
	msgKey := key(g.limitsOf(policy.DefaultGateway).messages[0], "t", "", ActionMessage)
	f.Fuzz(func(t *testing.T, data []byte) {
		c := &conn{g: g, tenant: "t", session: s.ID, id: "fuzz", msgKey: msgKey, refusalKey: msgKey}
		c.ctx, c.cancel = context.WithCancel(context.Background())
		defer c.cancel()
		stop, err := g.sessions.Subscribe(c.ctx, s.ID, c.deliver)
		if err != nil {
			t.Fatal(err)
		}
		defer stop()
		g.onMessage(c, data)
		// A queued message is answered by its route's worker.
		deadline := time.Now().Add(2 * time.Second)
		for {
			c.mu.Lock()
			n := len(c.queue)
			c.mu.Unlock()
			if n > 0 || time.Now().After(deadline) {
				break
			}
			time.Sleep(time.Millisecond)
		}
		c.mu.Lock()
		defer c.mu.Unlock()
		if len(c.queue) != 1 {
			t.Fatalf("%q: %d frames answered, want 1", data, len(c.queue))
		}
		var fr struct {
			Type string `json:"type"`
		}
		if err := json.Unmarshal(c.queue[0], &fr); err != nil || (fr.Type != "echo" && fr.Type != "error" && fr.Type != "throttled") {
			t.Fatalf("%q → %s: %v", data, c.queue[0], err)
		}
	})
}

// FuzzQuery asks the upgrade's preflight with any query string and Origin:
// every answer is 200 or a 4xx problem (never a 5xx or a panic), and no
// refusal charges anything: the session's connection budget is whole
// afterwards.
func FuzzQuery(f *testing.F) {
	for _, s := range []struct{ query, origin string }{
		{"tenant=t&session=S", ""}, {"tenant=t", ""}, {"session=S", "http://evil.example"},
		{"tenant=t&session=S&tenant=u", "null"}, {"tenant=%00&session=%ff", ""}, {"tenant=nobody&session=S", ""},
		{";;&&==", "http://[::1"},
	} {
		f.Add(s.query, s.origin)
	}
	g, s := fuzzGateway(f)
	f.Fuzz(func(t *testing.T, query, origin string) {
		// A preflight does not refresh the session; fuzzing lasts longer
		// than its TTL.
		if _, err := g.sessions.Touch(context.Background(), s.ID, time.Hour); err != nil {
			t.Fatal(err)
		}
		query = strings.ReplaceAll(query, "S", s.ID)
		req := httptest.NewRequest("GET", "/v1/ws/preflight", nil)
		req.URL.RawQuery = query
		if origin != "" {
			req.Header.Set("Origin", origin)
		}
		rec := httptest.NewRecorder()
		g.Preflight(rec, req)
		switch {
		case rec.Code == 200:
		case rec.Code >= 400 && rec.Code < 500:
			if rec.Header().Get("Content-Type") != "application/problem+json" {
				t.Fatalf("?%s Origin %q: %d without a problem: %s", query, origin, rec.Code, rec.Body)
			}
		default:
			t.Fatalf("?%s Origin %q: status %d: %s", query, origin, rec.Code, rec.Body)
		}
		// A preflight is a dry run: whatever was asked, the session can
		// still take a connection.
		rec = httptest.NewRecorder()
		g.Preflight(rec, httptest.NewRequest("GET", "/v1/ws/preflight?tenant=t&session="+s.ID, nil))
		if rec.Code != 200 {
			t.Fatalf("after ?%s, the session's own preflight: %d %s", query, rec.Code, rec.Body)
		}
	})
}

// fuzzGateway returns a gateway on a memory store with tenants t and u of
// the default gateway limits, and a session of t; closed when f ends.
func fuzzGateway(f *testing.F) (*Gateway, Session) {
	p, err := policy.Compile(&policy.Spec{Tenants: map[string]policy.TenantSpec{"t": {Tier: "a"}, "u": {Tier: "a"}},
		Tiers: map[string]policy.TierSpec{"a": {}}})
	if err != nil {
		f.Fatal(err)
	}
	store := memstore.New(nil)
	g, err := New(Options{Store: store, Policy: func() *policy.Policy { return p }})
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() {
		g.Close(context.Background())
		store.Close()
	})
	s, err := g.CreateSession(context.Background(), "t")
	if err != nil {
		f.Fatal(err)
	}
	return g, s
}

// chunkConn is a net.Conn whose reads return its data in the chunk sizes
// given, then io.EOF.
type chunkConn struct {
	net.Conn
	data   []byte
	chunks []byte
}

func (c *chunkConn) Read(p []byte) (int, error) {
	if len(c.data) == 0 {
		return 0, io.EOF
	}
	n := len(c.data)
	if len(c.chunks) > 0 {
		n = min(n, int(c.chunks[0])+1)
		c.chunks = c.chunks[1:]
	}
	n = copy(p, c.data[:n])
	c.data = c.data[n:]
	return n, nil
}

// FuzzFrameConn reads a stream of messages (a message of k frames for
// each byte k%6+1 of sizes, with payloads of every length encoding and a
// ping among their frames) through a frameConn allowing 4 frames a
// message, split into reads of arbitrary sizes: it fails exactly when a
// message has more than 4 frames, whatever the splits, and passes every
// byte through until then.
func FuzzFrameConn(f *testing.F) {
	f.Add([]byte{0, 1, 2, 3}, []byte{0, 5, 200})
	f.Add([]byte{4, 0}, []byte{13})
	f.Fuzz(func(t *testing.T, sizes, chunks []byte) {
		var stream []byte
		var frame = func(op byte, fin bool, n int) {
			b0 := op
			if fin {
				b0 |= 0x80
			}
			switch {
			case n < 126:
				stream = append(stream, b0, 0x80|byte(n))
			case n < 1<<16:
				stream = append(stream, b0, 0x80|126, byte(n>>8), byte(n))
			default:
				stream = append(stream, b0, 0x80|127, 0, 0, 0, 0, 0, byte(n>>16), byte(n>>8), byte(n))
			}
			stream = append(stream, 1, 2, 3, 4)
			stream = append(stream, make([]byte, n)...)
		}
		lengths := []int{0, 5, 125, 126, 300, 70000}
		over := -1 // the byte offset at which the first message passes 4 frames
		for i, s := range sizes[:min(len(sizes), 8)] {
			k := int(s)%6 + 1
			for j := range k {
				op := byte(0)
				if j == 0 {
					op = 1
				}
				if j == 4 && over < 0 {
					over = len(stream)
				}
				frame(op, j == k-1, lengths[(i+j)%len(lengths)])
				if j == 1 {
					frame(9, true, 4)
				}
			}
		}
		fc := &frameConn{Conn: &chunkConn{data: stream, chunks: chunks}, maxFrames: 4}
		got, err := io.ReadAll(fc)
		switch {
		case over < 0 && err != nil:
			t.Fatalf("messages of at most 4 frames: %v", err)
		case over < 0 && !bytes.Equal(got, stream):
			t.Fatalf("read %d bytes of %d", len(got), len(stream))
		case over >= 0 && err != errMessageFrames:
			t.Fatalf("a message of more than 4 frames: %v", err)
		case over >= 0 && (len(got) > over+14 || !bytes.Equal(got, stream[:len(got)])):
			t.Fatalf("passed %d bytes, the fifth frame at %d", len(got), over)
		}
	})
}
