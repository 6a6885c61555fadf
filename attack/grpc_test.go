package attack

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	rlext "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/admitdev/admit/envoyrls"
	"github.com/admitdev/admit/proctest"
)

// h2conn is a raw HTTP/2 connection to the gRPC port, as an attacker
// holds one: no client library, no credentials.
type h2conn struct {
	c      net.Conn
	fr     *http2.Framer
	hbuf   bytes.Buffer
	enc    *hpack.Encoder
	next   uint32
	mu     sync.Mutex
	max    uint32       // the server's SETTINGS_MAX_CONCURRENT_STREAMS (0: none said)
	window atomic.Int64 // what the server's connection window lets us send
	ended  atomic.Int64
	closed chan struct{}
}

// dialH2 opens a connection, says it speaks HTTP/2, and reads frames
// until the server closes it, counting streams the server ended (reset,
// or answered with their end).
func dialH2(t *testing.T, addr string) *h2conn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	h := &h2conn{c: c, fr: http2.NewFramer(c, c), next: 1, closed: make(chan struct{})}
	h.window.Store(65535) // a connection's initial window
	h.enc = hpack.NewEncoder(&h.hbuf)
	if _, err := io.WriteString(c, http2.ClientPreface); err != nil {
		t.Fatal(err)
	}
	if err := h.fr.WriteSettings(); err != nil {
		t.Fatal(err)
	}
	settings := make(chan struct{})
	go func() {
		defer close(h.closed)
		said := false
		for {
			f, err := h.fr.ReadFrame()
			if err != nil {
				if !said {
					close(settings)
				}
				return
			}
			switch f := f.(type) {
			case *http2.SettingsFrame:
				if f.IsAck() || said {
					continue
				}
				if v, ok := f.Value(http2.SettingMaxConcurrentStreams); ok {
					h.max = v
				}
				h.mu.Lock()
				_ = h.fr.WriteSettingsAck()
				h.mu.Unlock()
				said = true
				close(settings)
			case *http2.WindowUpdateFrame:
				if f.StreamID == 0 {
					h.window.Add(int64(f.Increment))
				}
			case *http2.RSTStreamFrame:
				h.ended.Add(1)
			case *http2.HeadersFrame:
				if f.StreamEnded() {
					h.ended.Add(1)
				}
			case *http2.DataFrame:
				if f.StreamEnded() {
					h.ended.Add(1)
				}
			case *http2.PingFrame:
				if !f.IsAck() {
					h.mu.Lock()
					_ = h.fr.WritePing(true, f.Data)
					h.mu.Unlock()
				}
			}
		}
	}()
	select {
	case <-settings:
	case <-time.After(10 * time.Second):
		t.Fatal("no SETTINGS from the gRPC port in 10 s")
	}
	return h
}

// open opens n streams of ShouldRateLimit, each its headers and no
// message: what a stream costs the server before it is a call.
func (h *h2conn) open(t *testing.T, n int) {
	t.Helper()
	h.mu.Lock()
	defer h.mu.Unlock()
	for range n {
		h.hbuf.Reset()
		for _, f := range [][2]string{{":method", "POST"}, {":scheme", "http"}, {":path", "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"},
			{":authority", "admit"}, {"content-type", "application/grpc"}, {"te", "trailers"}} {
			_ = h.enc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]})
		}
		if err := h.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: h.next, BlockFragment: h.hbuf.Bytes(), EndHeaders: true}); err != nil {
			return // closed by the server
		}
		h.next += 2
	}
}

// partial opens n streams of ShouldRateLimit, each a message announced
// as MaxMessageSize bytes of which it sends body, within the windows the
// server gives: what a stream can make the server buffer.
func (h *h2conn) partial(t *testing.T, n, body int) {
	t.Helper()
	first := h.next
	h.open(t, n)
	chunk := make([]byte, 16384)
	for id := first; id < first+uint32(2*n); id += 2 {
		msg := append([]byte{0, 0, 1, 0, 0}, make([]byte, body)...) // a 65,536-byte message announced
		for len(msg) > 0 {
			m := min(len(msg), len(chunk))
			if !proctest.WaitFor(10*time.Second, func() bool { return h.window.Load() >= int64(m) }) {
				t.Fatalf("the server's connection window stayed at %d", h.window.Load())
			}
			h.window.Add(-int64(m))
			h.mu.Lock()
			err := h.fr.WriteData(id, false, msg[:m])
			h.mu.Unlock()
			if err != nil {
				return
			}
			msg = msg[m:]
		}
	}
}

// TestGRPCPartialMessagesBounded: a stream that sends most of a message
// and stops holds at most its message, MaxMessageSize, until the unary
// deadline ends it. (A message announced as 1 MiB was buffered whole, 100
// a connection: 5.4 GB from one address.)
func TestGRPCPartialMessagesBounded(t *testing.T) {
	s := serve(t, "", false)
	baseRSS := s.RSSKB(t)
	h := dialH2(t, s.GRPC)
	start := time.Now()
	h.partial(t, envoyrls.MaxStreams, envoyrls.MaxMessageSize-1000)
	rss := s.RSSKB(t)
	report(t, "RSS kB, 100 streams of a message all but sent", rss-baseRSS)
	t.Logf("100 streams of %d bytes of a %d-byte message: RSS %d → %d kB", envoyrls.MaxMessageSize-1000, envoyrls.MaxMessageSize, baseRSS, rss)
	if bound := int64(envoyrls.MaxStreams) * (envoyrls.MaxMessageSize + 96<<10) / 1024; rss-baseRSS > bound {
		t.Errorf("100 streams of a message all but sent: RSS +%d kB, more than %d kB", rss-baseRSS, bound)
	}
	if !proctest.WaitFor(envoyrls.UnaryTimeout+10*time.Second, func() bool { return h.ended.Load() >= int64(envoyrls.MaxStreams) }) {
		t.Errorf("%d of %d streams of a message all but sent ended %v after they opened", h.ended.Load(), envoyrls.MaxStreams, time.Since(start).Round(time.Second))
	}
	// One announced past the bound is refused at once.
	first := h.ended.Load()
	h.open(t, 1)
	h.mu.Lock()
	_ = h.fr.WriteData(h.next-2, false, []byte{0, 0, 0x10, 0, 0}) // 1 MiB announced
	h.mu.Unlock()
	if !proctest.WaitFor(5*time.Second, func() bool { return h.ended.Load() > first }) {
		t.Error("a message announced as 1 MiB was not refused within 5 s")
	}
}

// TestGRPCStreamsAndConnectionsBounded: the gRPC port, attacked with raw
// HTTP/2 and no credentials. It says it takes at most envoyrls.MaxStreams
// streams a connection and refuses more; a stream that never sends its
// message is ended after envoyrls.UnaryTimeout; a connection that never
// speaks HTTP/2 is closed after envoyrls.HandshakeTimeout; one address
// gets at most envoyrls.DefaultMaxConnectionsPerIP connections. (It said no
// stream limit and held streams as long as the client liked: 5
// connections × 20,000 streams took goroutines from 21 to 62,223 and RSS
// from 280 to 742 MB; 400 bare TCP connections stayed open past 40 s.)
func TestGRPCStreamsAndConnectionsBounded(t *testing.T) {
	s := serve(t, "", false)
	// One address: at most MaxConnectionsPerIP connections; those past it
	// are closed before a SETTINGS.
	var refused atomic.Int64
	var wg sync.WaitGroup
	var held []net.Conn
	for range envoyrls.DefaultMaxConnectionsPerIP + 6 {
		c, err := net.Dial("tcp", s.GRPC)
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, c)
		_, _ = io.WriteString(c, http2.ClientPreface)
		wg.Add(1)
		go func() {
			defer wg.Done()
			_ = c.SetReadDeadline(time.Now().Add(3 * time.Second))
			if n, _ := c.Read(make([]byte, 64)); n == 0 {
				refused.Add(1)
			}
		}()
	}
	wg.Wait()
	if refused.Load() != 6 {
		t.Errorf("%d connections from one address: %d closed at once, want the 6 past %d", envoyrls.DefaultMaxConnectionsPerIP+6, refused.Load(), envoyrls.DefaultMaxConnectionsPerIP)
	}
	for _, c := range held {
		c.Close()
	}
	// Once the server has let them go, a connection is taken again.
	if !proctest.WaitFor(10*time.Second, func() bool {
		answered, _ := prefaceAnswered(t, s.GRPC, time.Second)
		return answered
	}) {
		t.Fatal("the gRPC port takes no connection after the ones past the bound were closed")
	}

	baseG, baseRSS := s.Metric(t, "go_goroutines"), s.RSSKB(t)

	const conns, perConn = 5, 300 // past 300 uncalled streams a connection is closed (TestGRPCRefusedStreamsClosed)
	var hs []*h2conn
	for range conns {
		h := dialH2(t, s.GRPC)
		if h.max != envoyrls.MaxStreams {
			t.Fatalf("the gRPC port says SETTINGS_MAX_CONCURRENT_STREAMS %d, want %d", h.max, envoyrls.MaxStreams)
		}
		h.open(t, perConn)
		hs = append(hs, h)
	}
	// Connections that never say they speak HTTP/2, meanwhile.
	var bare []net.Conn
	for range 20 {
		c, err := net.Dial("tcp", s.GRPC)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		bare = append(bare, c)
	}
	bareAt := time.Now()
	// The streams past the bound are refused at once; the others held.
	refusedAll := proctest.WaitFor(10*time.Second, func() bool {
		for _, h := range hs {
			if h.ended.Load() < perConn-envoyrls.MaxStreams {
				return false
			}
		}
		return true
	})
	g, rss := s.Metric(t, "go_goroutines"), s.RSSKB(t)
	report(t, "goroutines, held", g-baseG)
	report(t, "RSS kB, held", rss-baseRSS)
	t.Logf("%d connections × %d streams: goroutines %.0f → %.0f, RSS %d → %d kB", conns, perConn, baseG, g, baseRSS, rss)
	if !refusedAll {
		t.Errorf("streams past %d a connection were not refused", envoyrls.MaxStreams)
	}
	if g-baseG > conns*envoyrls.MaxStreams+100 {
		t.Errorf("goroutines %.0f → %.0f for %d connections of at most %d streams", baseG, g, conns, envoyrls.MaxStreams)
	}
	// Past the unary deadline every held stream is ended, and what they
	// held is let go.
	ended := proctest.WaitFor(envoyrls.UnaryTimeout+15*time.Second, func() bool {
		for _, h := range hs {
			if h.ended.Load() < perConn {
				return false
			}
		}
		return true
	})
	if !ended {
		for i, h := range hs {
			t.Logf("connection %d: %d of %d streams ended", i, h.ended.Load(), perConn)
		}
		t.Errorf("streams without their message were not ended within %v of the unary deadline (%v)", 15*time.Second, envoyrls.UnaryTimeout)
	}
	for i, c := range bare {
		_ = c.SetReadDeadline(bareAt.Add(envoyrls.HandshakeTimeout + 10*time.Second))
		if _, err := io.Copy(io.Discard, c); err != nil {
			t.Errorf("bare connection %d: still open %v after it was made (%v)", i, time.Since(bareAt).Round(time.Second), err)
			break
		}
	}
	report(t, "bare connections closed after", time.Since(bareAt).Round(100*time.Millisecond))
	if !proctest.WaitFor(5*time.Second, func() bool { return s.Metric(t, "go_goroutines")-baseG < 50 }) {
		t.Errorf("goroutines %.0f once the streams ended and the bare connections closed, from %.0f", s.Metric(t, "go_goroutines"), baseG)
	}
}

// reset opens n streams of ShouldRateLimit and resets each at once, as a
// rapid-reset flood does (CVE-2023-44487): with its message first when
// withMessage is set. It reports how many it wrote before the server
// closed the connection.
func (h *h2conn) reset(n int, withMessage bool) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	for i := range n {
		h.hbuf.Reset()
		for _, f := range [][2]string{{":method", "POST"}, {":scheme", "http"}, {":path", "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"},
			{":authority", "admit"}, {"content-type", "application/grpc"}, {"te", "trailers"}} {
			_ = h.enc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]})
		}
		id := h.next
		h.next += 2
		if h.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: h.hbuf.Bytes(), EndHeaders: true}) != nil {
			return i
		}
		if withMessage && h.fr.WriteData(id, false, []byte{0, 0, 0, 0, 0}) != nil {
			return i
		}
		if h.fr.WriteRSTStream(id, http2.ErrCodeCancel) != nil {
			return i
		}
	}
	return n
}

// TestGRPCRapidResetsClosed: a connection whose streams are reset before
// they are calls (before their message) is closed once
// envoyrls.MaxUncalledStreams of them were, and its address refused
// connections for envoyrls.UncalledPenalty, while other addresses are
// served; streams reset after their message are calls, and stay. (4
// connections made 1.3 million streams in 11 s and took most of 2 cores,
// legitimate calls 2 → 100 ms.)
func TestGRPCRapidResetsClosed(t *testing.T) {
	s := serve(t, "", false)
	h := dialH2(t, s.GRPC)
	closedAt, cpu := time.Now(), s.CPU(t)
	sent := 0
	for sent < 1_000_000 {
		select {
		case <-h.closed:
		default:
			sent += h.reset(1000, false)
			continue
		}
		break
	}
	select {
	case <-h.closed:
	case <-time.After(10 * time.Second):
		t.Fatalf("a connection of %d streams reset at once was still open 10 s later", sent)
	}
	cpu = s.CPU(t) - cpu
	report(t, "streams written before the close", sent)
	report(t, "server CPU until the close", cpu)
	t.Logf("closed after the attacker wrote %d streams, in %v; the server's CPU meanwhile %v", sent, time.Since(closedAt).Round(time.Millisecond), cpu)
	// The address is refused at once for a while, then served again.
	if answered, held := prefaceAnswered(t, s.GRPC, 3*time.Second); answered || held {
		t.Errorf("the address of a connection closed for its resets connected again at once (answered %v, held %v)", answered, held)
	}
	if !proctest.WaitFor(envoyrls.UncalledPenalty+5*time.Second, func() bool {
		answered, _ := prefaceAnswered(t, s.GRPC, time.Second)
		return answered
	}) {
		t.Fatalf("the address was still refused %v after its penalty of %v", envoyrls.UncalledPenalty+5*time.Second, envoyrls.UncalledPenalty)
	}
	// Streams reset after their message are calls (what a client whose
	// deadline is shorter than the answer sends): they cost what calls
	// cost, 100 at once at most, and the connection stays.
	h = dialH2(t, s.GRPC)
	sent = 0
	for range 10 {
		sent += h.reset(1000, true)
	}
	select {
	case <-h.closed:
		t.Errorf("a connection of %d calls, each reset after its message, was closed", sent)
	case <-time.After(2 * time.Second):
	}
	if got := s.Metric(t, "admit_grpc_connections_uncalled_total"); got != 1 {
		t.Errorf("admit_grpc_connections_uncalled_total %v, want 1", got)
	}
	// Another address is served meanwhile.
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 2)}}
	cc, err := grpc.NewClient("passthrough:///"+s.GRPC, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) { return d.DialContext(ctx, "tcp", addr) }))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := healthpb.NewHealthClient(cc).Check(ctx, &healthpb.HealthCheckRequest{}); err != nil {
		t.Errorf("a health check from another address: %v", err)
	}
}

// amplified opens n streams of ShouldRateLimit whose headers name one
// header of size bytes again and again through HPACK's dynamic table:
// about 2 × size bytes sent, size² decoded.
func (h *h2conn) amplified(n, size int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	big := hpack.HeaderField{Name: "x-big", Value: strings.Repeat("a", size)}
	for range n {
		h.hbuf.Reset()
		for _, f := range [][2]string{{":method", "POST"}, {":scheme", "http"}, {":path", "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"},
			{":authority", "admit"}, {"content-type", "application/grpc"}, {"te", "trailers"}} {
			_ = h.enc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]})
		}
		for range size {
			_ = h.enc.WriteField(big)
		}
		if h.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: h.next, BlockFragment: h.hbuf.Bytes(), EndHeaders: true}) != nil {
			return
		}
		h.next += 2
	}
}

// TestGRPCHeadersBounded: a stream's headers are bounded as they are
// decoded (envoyrls.MaxHeaderListSize, said in
// SETTINGS_MAX_HEADER_LIST_SIZE): 8 connections × 100 streams, each
// naming a 4,000-byte header 4,000 times through HPACK (8 KB sent, 16 MB
// decoded), hold a few megabytes. (They held 58 MB a connection: 1.9 GB
// from one address's 32.)
func TestGRPCHeadersBounded(t *testing.T) {
	s := serve(t, "", false)
	baseRSS := s.RSSKB(t)
	var hs []*h2conn
	for range 8 {
		h := dialH2(t, s.GRPC)
		h.amplified(envoyrls.MaxStreams, 4000)
		hs = append(hs, h)
	}
	// Every stream answered (refused) or its connection closed.
	done := proctest.WaitFor(20*time.Second, func() bool {
		for _, h := range hs {
			select {
			case <-h.closed:
				continue
			default:
			}
			if h.ended.Load() < envoyrls.MaxStreams {
				return false
			}
		}
		return true
	})
	rss := s.RSSKB(t) - baseRSS
	report(t, "RSS kB, 8 connections × 100 streams of amplified headers", rss)
	t.Logf("8 × 100 streams of 16 MB of headers each: RSS +%d kB", rss)
	if !done {
		t.Error("streams of amplified headers neither refused nor their connections closed within 20 s")
	}
	if rss > 64<<10 {
		t.Errorf("8 connections of amplified headers: RSS +%d kB, want at most 64 MB", rss)
	}
}

// TestGRPCRefusedStreamsClosed: a connection that opens stream after
// stream past the 100 it may hold, each refused by the server, is closed
// like one that resets them (envoyrls.MaxUncalledStreams); one that sends
// SETTINGS after SETTINGS, past envoyrls.MaxControlFrames, too. (7.1
// million refused streams in 30 s on one connection, never closed, took
// a core; 12.5 million SETTINGS in 20 s, each acknowledged.)
func TestGRPCRefusedStreamsClosed(t *testing.T) {
	for _, flood := range []string{"streams", "settings"} {
		s := serve(t, "", false)
		h := dialH2(t, s.GRPC)
		sent := 0
		for sent < 1_000_000 {
			select {
			case <-h.closed:
			default:
				if flood == "streams" {
					h.open(t, 1000)
				} else {
					h.mu.Lock()
					for range 1000 {
						if h.fr.WriteSettings() != nil {
							break
						}
					}
					h.mu.Unlock()
				}
				sent += 1000
				continue
			}
			break
		}
		select {
		case <-h.closed:
		case <-time.After(10 * time.Second):
			t.Fatalf("%s: a connection flooding %d was still open 10 s later", flood, sent)
		}
		report(t, flood+" written before the close", sent)
		if got := s.Metric(t, "admit_grpc_connections_uncalled_total"); got != 1 {
			t.Errorf("%s: admit_grpc_connections_uncalled_total %v, want 1", flood, got)
		}
	}
}

// prefaceAnswered dials the gRPC port afresh and sends the client
// preface: answered when the server sends something back within wait,
// held when it neither answers nor closes the connection by then (a
// refused connection is closed at once: neither).
func prefaceAnswered(t *testing.T, addr string, wait time.Duration) (answered, held bool) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_, _ = io.WriteString(c, http2.ClientPreface)
	_ = c.SetReadDeadline(time.Now().Add(wait))
	n, err := c.Read(make([]byte, 64))
	var ne net.Error
	return n > 0, n == 0 && errors.As(err, &ne) && ne.Timeout()
}

// TestGRPCClientDeadlinesKeepTheConnection: a real gRPC client calling
// with Envoy's default timeout (20 ms) and with 2 ms, many calls at once,
// some given up before their answer: its connection is never closed as a
// rapid reset, nor its address refused. (A client of 1 ms deadlines was
// cut off once, its calls reset after their message counted as resets.)
func TestGRPCClientDeadlinesKeepTheConnection(t *testing.T) {
	s := serve(t, "", false)
	cc, err := grpc.NewClient(s.GRPC, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	client := rlsv3.NewRateLimitServiceClient(cc)
	req := &rlsv3.RateLimitRequest{Domain: "admit", Descriptors: []*rlext.RateLimitDescriptor{{Entries: []*rlext.RateLimitDescriptor_Entry{{Key: "tenant", Value: "acme"}}}}}
	var calls, cut atomic.Int64
	var wg sync.WaitGroup
	for i := range 50 {
		deadline := 20 * time.Millisecond
		if i%2 == 1 {
			deadline = 2 * time.Millisecond // shorter than many answers under the race detector
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 100 {
				ctx, cancel := context.WithTimeout(context.Background(), deadline)
				_, err := client.ShouldRateLimit(ctx, req)
				cancel()
				calls.Add(1)
				if status.Code(err) == codes.Unavailable {
					cut.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	if cut.Load() > 0 {
		t.Errorf("%d of %d calls found the connection cut", cut.Load(), calls.Load())
	}
	if got := s.Metric(t, "admit_grpc_connections_uncalled_total"); got != 0 {
		t.Errorf("admit_grpc_connections_uncalled_total %v, want 0", got)
	}
}
