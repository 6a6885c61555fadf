package attack

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/admitdev/admit/redistest"
)

// requestCommands returns how many calls the Redis at addr received from
// Admit's request paths since it started: scripts and functions (EVAL,
// EVALSHA, FCALL: decisions, leases, sessions) and HKEYS (a lease's
// groups). INFO commandstats also counts the commands a script runs, and
// what a server sends whatever its clients do (health checks, the
// catalog's poll, usage flushes): neither is counted here.
func requestCommands(t *testing.T, addr string) int64 {
	t.Helper()
	return commandCalls(t, addr, "eval", "evalsha", "eval_ro", "evalsha_ro", "fcall", "fcall_ro", "hkeys")
}

// gatewayConfig: one keyless tenant, as the demo's are (anyone may create
// its sessions), of 4 connections and 60 messages a minute. The leases
// last an hour so that no heartbeat falls within the test: every Redis
// command counted is the attacker's.
const gatewayConfig = `version: 1
gateway:
  lease_ttl: 1h
tiers:
  open:
    gateway: {tenant_connections: 4, connections_per_session: 2, tenant_per_minute: 60, session_per_minute: 5, session_ttl: 200s, messages_per_minute: 60}
tenants:
  keyless: {tier: open}
`

// wsClient is an attacker's WebSocket connection: a reader in the
// background counts the frames the server answers until it closes.
type wsClient struct {
	c      *websocket.Conn
	opened time.Time // before the dial
	frames chan string
	closed chan websocket.StatusCode
}

func (s *server) dialWS(t *testing.T, tenant, session string) *wsClient {
	t.Helper()
	w, status := s.tryWS(t, tenant, session)
	if w == nil {
		t.Fatalf("connect: %d", status)
	}
	return w
}

// tryWS connects, or returns the refusal's status.
func (s *server) tryWS(t *testing.T, tenant, session string) (*wsClient, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	w := &wsClient{opened: time.Now(), frames: make(chan string, 1<<16), closed: make(chan websocket.StatusCode, 1)}
	c, resp, err := websocket.Dial(ctx, "ws"+strings.TrimPrefix(s.URL, "http")+"/v1/ws?tenant="+tenant+"&session="+session, nil)
	if err != nil {
		if resp == nil {
			t.Fatalf("connect: %v", err)
		}
		return nil, resp.StatusCode
	}
	t.Cleanup(func() { c.CloseNow() })
	w.c = c
	go func() {
		for {
			_, b, err := c.Read(context.Background())
			if err != nil {
				w.closed <- websocket.CloseStatus(err)
				return
			}
			w.frames <- string(b)
		}
	}()
	return w, 0
}

func (w *wsClient) send(t *testing.T, frame string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := w.c.Write(ctx, websocket.MessageText, []byte(frame)); err != nil {
		t.Fatalf("write: %v", err)
	}
}

// next returns the next frame's type.
func (w *wsClient) next(t *testing.T) string {
	t.Helper()
	select {
	case f := <-w.frames:
		typ, _, _ := strings.Cut(strings.TrimPrefix(f, `{"type":"`), `"`)
		return typ
	case code := <-w.closed:
		t.Fatalf("closed (%d) before an answer", code)
	case <-time.After(5 * time.Second):
		t.Fatal("no answer within 5s")
	}
	return ""
}

func (w *wsClient) ping() error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return w.c.Ping(ctx)
}

// TestGatewayRefusalsCostRedisNothing: one keyless tenant's four
// connections, over messages_per_minute, send thousands of frames over
// the limit, malformed frames and pings. Once the first refusal is known
// none of them costs Redis a command (each frame over the limit once
// touched the session: 399,331 scripts for 400,000 frames), and each
// connection is closed with 1008 past its frame budget (100 frames,
// refilled 10 a second) instead of being answered without end (malformed
// frames once ran at 175,000 a second on one connection).
func TestGatewayRefusalsCostRedisNothing(t *testing.T) {
	srv := redistest.Start(t)
	s := serve(t, patientStore(gatewayConfig), false, "--store", "redis://"+srv.Addr)
	var conns []*wsClient
	var sessions []string
	for range 2 {
		a := s.do("PUT", "/v1/sessions", `{"tenant":"keyless"}`)
		if a.status != 201 {
			t.Fatalf("a session: %d %s", a.status, a.raw)
		}
		id := a.body["session_id"].(string)
		sessions = append(sessions, id)
		conns = append(conns, s.dialWS(t, "keyless", id), s.dialWS(t, "keyless", id))
	}

	// The minute's 60 messages, then the first refusal: the one decision
	// over the limit that reaches Redis.
	admitted := 0
	for {
		conns[0].send(t, `{"route":"pool","id":"m"}`)
		typ := conns[0].next(t)
		if typ == "throttled" {
			break
		}
		if typ != "echo" {
			t.Fatalf("message %d: %s", admitted, typ)
		}
		admitted++
		conns[1].next(t) // the echo reaches the session's other connection
	}
	if admitted != 60 {
		t.Fatalf("%d messages admitted before the first refusal, want 60", admitted)
	}
	// Within the budget: 30 frames over the limit, 30 malformed frames
	// and 30 pings on each connection, each answered.
	before := requestCommands(t, srv.Addr)
	answered := make([]int, len(conns))
	answered[0] = 1 // the first refusal
	for i, w := range conns {
		for range 30 {
			w.send(t, `{"route":"silo","id":"over-the-limit"}`)
			if typ := w.next(t); typ != "throttled" {
				t.Fatalf("connection %d, over the limit: %s", i, typ)
			}
			w.send(t, `{"route":`)
			if typ := w.next(t); typ != "error" {
				t.Fatalf("connection %d, malformed: %s", i, typ)
			}
			if err := w.ping(); err != nil {
				t.Fatalf("connection %d, ping: %v", i, err)
			}
			answered[i] += 3
		}
	}
	within := requestCommands(t, srv.Addr) - before
	report(t, "Redis commands for 360 frames over the limit, malformed and pings (4 connections)", within)
	if within != 0 {
		t.Errorf("360 refused frames and pings cost Redis %d commands, want 0", within)
	}

	// Past the budget: each connection floods until the server closes it.
	before = requestCommands(t, srv.Addr)
	var wg sync.WaitGroup
	floods := make([]flood, len(conns))
	for i, w := range conns {
		wg.Add(1)
		go func() { defer wg.Done(); floods[i] = w.flood() }()
	}
	wg.Wait()
	// The server frees the connections' slots, then counts them gone.
	if !waitMetric(t, s, "admit_gateway_connections", 0) {
		t.Fatal("the server still counts connections")
	}
	cost := requestCommands(t, srv.Addr) - before
	total := 0
	for i, f := range floods {
		f.answered += answered[i]
		total += f.sent
		report(t, fmt.Sprintf("connection %d: frames sent, answered, close code, seconds open", i), f)
		f.check(t)
	}
	report(t, "Redis calls for the flood of frames, closes included", fmt.Sprint(cost, " for ", total, " frames"))
	// Each closed connection frees its slot and renews its session's
	// (HKEYS and FCALL each: 4 calls); the frames cost nothing.
	if cost > 4*int64(len(conns)) {
		t.Errorf("%d frames past the budget and 4 closes cost Redis %d calls, want at most 16 (the closes)", total, cost)
	}
	decoded := s.Metric(t, `admit_gateway_messages_total{result="throttled"}`) + s.Metric(t, `admit_gateway_messages_total{result="malformed"}`)
	report(t, "frames the server decoded, of all sent (the rest came after the close)", fmt.Sprint(decoded, " of ", total+360+1))
	if got := s.Metric(t, "admit_gateway_throttled_locally_total"); got < 120 {
		t.Errorf("admit_gateway_throttled_locally_total %v, want the 120 frames over the limit at least", got)
	}

	// The client: it reconnects as often as the tenant's limits let it
	// (session_per_minute 5: 3 more of each session this minute) and
	// floods each connection. What it gets answered is bounded by the
	// connections it may open.
	before = requestCommands(t, srv.Addr)
	opened, refusedConnects, answeredAll := 0, 0, 0
	for i := range 20 {
		w, status := s.tryWS(t, "keyless", sessions[i%2])
		if w == nil {
			if status != 429 {
				t.Fatalf("reconnect %d: %d, want 429", i, status)
			}
			refusedConnects++
			continue
		}
		opened++
		f := w.flood()
		f.check(t)
		answeredAll += f.answered
	}
	if !waitMetric(t, s, "admit_gateway_connections", 0) {
		t.Fatal("the server still counts connections")
	}
	cost = requestCommands(t, srv.Addr) - before
	report(t, "20 reconnects: admitted, refused, refused frames answered, Redis calls", fmt.Sprint(opened, refusedConnects, answeredAll, cost))
	if opened != 6 {
		t.Errorf("%d reconnects admitted, want 6 (session_per_minute 5, 2 sessions, 2 connections each before)", opened)
	}
	// An admitted connection costs 6 calls (the session, the decision,
	// the subscription, the session's deadline and slot), its close 4; a
	// refusal 2 when it reaches the store, and most never do: the server
	// remembers one of a per-minute limit until its time, one of a full
	// count for a second (a slow run may see it lapse). So at most 2 a
	// refusal, and usually 2 a session in all.
	if bound := int64(opened*(6+4) + 2*refusedConnects); cost > bound {
		t.Errorf("20 reconnects and their floods cost Redis %d calls, want at most %d", cost, bound)
	}
}

// flood is what a connection that floods the server with frames over the
// limit and malformed frames saw.
type flood struct {
	sent, answered int
	code           websocket.StatusCode
	open           time.Duration // from before the dial to the close
}

func (f flood) String() string {
	return fmt.Sprint(f.sent, " ", f.answered, " ", int(f.code), " ", f.open.Round(time.Millisecond).Seconds())
}

// check: the connection was closed with 1008, and answered no more than
// its budget: 100 frames, 10 more a second it was open (the client's
// clock runs at least as long as the server's).
func (f flood) check(t *testing.T) {
	t.Helper()
	if f.code != websocket.StatusPolicyViolation {
		t.Errorf("after %d frames: close code %d, want 1008 past the frame budget", f.sent, f.code)
	}
	if bound := 100 + int(10*f.open.Seconds()) + 1; f.answered > bound {
		t.Errorf("%d refused frames answered in %v, want at most %d", f.answered, f.open, bound)
	}
}

// flood sends frames over the limit and malformed frames, up to 100,000,
// until the server closes the connection.
func (w *wsClient) flood() flood {
	var f flood
	stop := make(chan struct{})
	sent := make(chan int)
	go func() {
		n := 0
		defer func() { sent <- n }()
		frames := [2][]byte{[]byte(`{"route":"silo","id":"over-the-limit"}`), []byte(`not json`)}
		for ; n < 100_000; n++ {
			select {
			case <-stop:
				return
			default:
			}
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			err := w.c.Write(ctx, websocket.MessageText, frames[n%2])
			cancel()
			if err != nil {
				return
			}
		}
	}()
	timeout := time.After(20 * time.Second)
	for f.code == 0 {
		select {
		case <-w.frames:
			f.answered++
		case f.code = <-w.closed:
			f.open = time.Since(w.opened)
		case <-timeout:
			f.code = -2 // still open
		}
	}
	close(stop)
	f.sent = <-sent
	return f
}

// waitMetric waits up to 10 s for an unlabelled sample of s's metrics to
// reach want.
func waitMetric(t *testing.T, s *server, name string, want float64) bool {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for s.Metric(t, name) != want {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(20 * time.Millisecond)
	}
	return true
}

// TestGatewayRefusedUpgradesCostRedisOnce: a client whose session holds
// all its connections asks for more, upgrades and preflights, as fast as
// it can: each once cost Redis 2 calls (the session, the decision). The
// refusal is known for a second (a full count frees a slot whenever a
// connection ends), so they cost 2 calls a second. A session id that does
// not exist still costs its lookup.
func TestGatewayRefusedUpgradesCostRedisOnce(t *testing.T) {
	srv := redistest.Start(t)
	s := serve(t, patientStore(gatewayConfig), false, "--store", "redis://"+srv.Addr)
	a := s.do("PUT", "/v1/sessions", `{"tenant":"keyless"}`)
	if a.status != 201 {
		t.Fatalf("a session: %d %s", a.status, a.raw)
	}
	id := a.body["session_id"].(string)
	s.dialWS(t, "keyless", id)
	s.dialWS(t, "keyless", id)
	u := "ws" + strings.TrimPrefix(s.URL, "http") + "/v1/ws?tenant=keyless&session=" + id
	before, start := requestCommands(t, srv.Addr), time.Now()
	const n = 200
	for i := range n {
		status := 0
		if i%2 == 0 {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			c, resp, err := websocket.Dial(ctx, u, nil)
			cancel()
			if err == nil {
				c.CloseNow()
			} else if resp != nil {
				status = resp.StatusCode
			}
		} else {
			status = s.do("GET", "/v1/ws/preflight?tenant=keyless&session="+id, "").status
		}
		if status != 429 {
			t.Fatalf("attempt %d: %d, want 429", i, status)
		}
	}
	took := time.Since(start)
	refused := requestCommands(t, srv.Addr) - before
	report(t, "Redis calls for 100 refused upgrades and 100 preflights", fmt.Sprint(refused, " in ", took.Round(time.Millisecond)))
	// 2 calls when the refusal is learned, then at most once a second.
	if bound := 2 * (1 + int64(took/time.Second)); refused > bound {
		t.Errorf("%d refused upgrades and preflights in %v cost Redis %d calls, want at most %d", n, took, refused, bound)
	}
	before = requestCommands(t, srv.Addr)
	for i := range 100 {
		if a := s.do("GET", fmt.Sprintf("/v1/ws/preflight?tenant=keyless&session=made-up-%d", i), ""); a.status != 404 {
			t.Fatalf("a made-up session: %d", a.status)
		}
	}
	unknown := requestCommands(t, srv.Addr) - before
	report(t, "Redis calls for 100 made-up session ids", unknown)
	if unknown > 100 {
		t.Errorf("100 made-up session ids cost Redis %d calls, want at most 1 each", unknown)
	}
}
