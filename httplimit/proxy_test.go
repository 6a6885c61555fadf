package httplimit

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/admitdev/admit"
	"github.com/admitdev/admit/memstore"
)

// trickle sends a request with a body of a million bytes to addr, a byte
// every gap, until an answer comes or giveUp passes, and returns the
// answer's status (0 for none).
func trickle(t *testing.T, addr string, gap, giveUp time.Duration) int {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	fmt.Fprint(conn, "POST /upload HTTP/1.1\r\nHost: x\r\nContent-Length: 1000000\r\n\r\n")
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		tick := time.NewTicker(gap)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
				if _, err := conn.Write([]byte("x")); err != nil {
					return
				}
			}
		}
	}()
	_ = conn.SetReadDeadline(time.Now().Add(giveUp))
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		return 0
	}
	resp.Body.Close()
	return resp.StatusCode
}

// TestBodyDeadline: a body that never pauses long enough for the idle
// bound, a byte at a time, is cut at the total bound: the client gets
// 408, and the upstream's request ends, its body failed. Before the total
// bound, such a client held both connections for as long as it liked.
func TestBodyDeadline(t *testing.T) {
	var open, failed atomic.Int64
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		open.Add(1)
		defer open.Add(-1)
		if _, err := io.Copy(io.Discard, r.Body); err != nil {
			failed.Add(1)
		}
	}))
	defer up.Close()
	u, _ := url.Parse(up.URL)
	front := httptest.NewServer(BodyTimeout(ReverseProxy(u, Proxies{}, XForwardedFor, nil), 5*time.Second, 300*time.Millisecond))
	defer front.Close()
	addr := strings.TrimPrefix(front.URL, "http://")
	if code := trickle(t, addr, 50*time.Millisecond, 20*time.Second); code != http.StatusRequestTimeout {
		t.Fatalf("a body trickled a byte every 50 ms, past a total bound of 300 ms: %d, want 408", code)
	}
	if !waitFor(func() bool { return open.Load() == 0 }) || failed.Load() != 1 {
		t.Fatalf("the upstream: %d requests open, %d bodies failed", open.Load(), failed.Load())
	}

	// The idle bound alone: a pause past it is 408 too.
	idle := httptest.NewServer(BodyTimeout(ReverseProxy(u, Proxies{}, XForwardedFor, nil), 200*time.Millisecond, 0))
	defer idle.Close()
	if code := trickle(t, strings.TrimPrefix(idle.URL, "http://"), time.Hour, 20*time.Second); code != http.StatusRequestTimeout {
		t.Fatalf("a body that stops, past an idle bound of 200 ms: %d, want 408", code)
	}

	// A body that comes whole in time passes, and so does its response,
	// however long it streams after the body ended.
	slow := httptest.NewServer(BodyTimeout(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, err := io.ReadAll(r.Body)
		if err != nil || BodyTimedOut(r) != nil {
			t.Errorf("a body in time: %v %v", err, BodyTimedOut(r))
		}
		time.Sleep(400 * time.Millisecond) // past both bounds
		if err := r.Context().Err(); err != nil {
			t.Errorf("the request's context after its body: %v", err)
		}
		fmt.Fprintf(w, "%d", len(b))
	}), 200*time.Millisecond, 300*time.Millisecond))
	defer slow.Close()
	resp, err := http.Post(slow.URL, "text/plain", strings.NewReader("hello"))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || string(b) != "5" {
		t.Fatalf("a body in time: %d %q", resp.StatusCode, b)
	}
}

// TestBodyTimeoutError: the error of a body past a bound is
// ErrBodyTimeout, says which bound, and is a timeout.
func TestBodyTimeoutError(t *testing.T) {
	errc := make(chan error, 1)
	h := BodyTimeout(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, err := io.ReadAll(r.Body)
		if !errors.Is(err, ErrBodyTimeout) || !isTimeout(err) || !errors.Is(BodyTimedOut(r), ErrBodyTimeout) {
			t.Errorf("the error of a body past its bound: %v (%v)", err, BodyTimedOut(r))
		}
		errc <- err
	}), 0, 100*time.Millisecond)
	s := httptest.NewServer(h)
	defer s.Close()
	trickle(t, strings.TrimPrefix(s.URL, "http://"), 20*time.Millisecond, 20*time.Second)
	if got := <-errc; got == nil || !strings.Contains(got.Error(), "within 100ms") {
		t.Fatalf("the error: %v", got)
	}
}

// stalled sends a POST declaring a body of 1,000 bytes and sending 10, and
// returns the answer's status and whether the server said and did close
// the connection, within 10 s (0 for no answer).
func stalled(t *testing.T, addr, key string) (status int, closed bool) {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	fmt.Fprintf(conn, "POST /upload HTTP/1.1\r\nHost: x\r\nX-API-Key: %s\r\nContent-Length: 1000\r\n\r\n0123456789", key)
	_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		return 0, false
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	_, err = br.ReadByte()
	return resp.StatusCode, resp.Close && err == io.EOF
}

// TestRefusalsDoNotWaitForBodies: a request refused before its body is
// read, whose small body stalls, is answered at once and its connection
// closed, on a server without a read timeout: net/http reads up to 256 KiB
// of an unread body, without a deadline, before it writes the response.
// So through Limiter.Handler and Middleware alone, and through BodyTimeout
// around a handler that answers without reading.
func TestRefusalsDoNotWaitForBodies(t *testing.T) {
	f := newFixture(t, Options{RequireKey: true})
	lim := httptest.NewServer(f.server)
	defer lim.Close()
	if code, closed := stalled(t, strings.TrimPrefix(lim.URL, "http://"), "bogus"); code != 401 || !closed {
		t.Errorf("Limiter.Handler, an unknown key: %d, closed %v; want 401 and closed", code, closed)
	}
	st := memstore.New(nil)
	defer st.Close()
	l, err := admit.NewLimiter(st, admit.Bucket("one", admit.Rate{N: 1, Per: time.Hour}, 1).Per(admit.PerTenant))
	if err != nil {
		t.Fatal(err)
	}
	mw := httptest.NewServer(Middleware(l, func(r *http.Request) (admit.Who, error) {
		if r.Header.Get("X-API-Key") == "bogus" {
			return admit.Who{}, admit.Errorf(admit.CodeUnauthenticated, "unknown key")
		}
		return admit.Who{Tenant: "t"}, nil
	})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _, _ = io.Copy(io.Discard, r.Body) })))
	defer mw.Close()
	addr := strings.TrimPrefix(mw.URL, "http://")
	if code, closed := stalled(t, addr, "bogus"); code != 401 || !closed {
		t.Errorf("Middleware, refused by who: %d, closed %v; want 401 and closed", code, closed)
	}
	resp, err := http.Post(mw.URL, "text/plain", strings.NewReader("spend the limit"))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if code, closed := stalled(t, addr, "good"); code != 429 || !closed {
		t.Errorf("Middleware, a refusal: %d, closed %v; want 429 and closed", code, closed)
	}
	answer := httptest.NewServer(BodyTimeout(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "no", http.StatusForbidden)
	}), time.Hour, 0))
	defer answer.Close()
	if code, closed := stalled(t, strings.TrimPrefix(answer.URL, "http://"), ""); code != 403 || !closed {
		t.Errorf("BodyTimeout over a handler that does not read: %d, closed %v; want 403 and closed", code, closed)
	}
}

// TestWriteTimeout: a client that stops reading a response is cut after
// the write timeout, and the handler's writes fail; a stream whose pauses
// are longer than the timeout, read as it comes, is whole.
func TestWriteTimeout(t *testing.T) {
	failed := make(chan error, 1)
	h := WriteTimeout(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/stream" {
			for i := range 3 {
				fmt.Fprintf(w, "data: %d\n\n", i)
				if err := http.NewResponseController(w).Flush(); err != nil {
					t.Errorf("flush: %v", err)
				}
				time.Sleep(300 * time.Millisecond) // longer than the bound
			}
			return
		}
		chunk := make([]byte, 64<<10)
		for range 1024 {
			if _, err := w.Write(chunk); err != nil {
				failed <- err
				return
			}
		}
		failed <- nil
	}), 200*time.Millisecond)
	s := httptest.NewServer(h)
	defer s.Close()
	conn, err := net.Dial("tcp", strings.TrimPrefix(s.URL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	fmt.Fprint(conn, "GET /big HTTP/1.1\r\nHost: x\r\n\r\n")
	select {
	case err := <-failed:
		if err == nil || !errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("the writes to a client that reads nothing: %v, want a deadline exceeded", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the writes to a client that reads nothing did not fail within 20 s")
	}
	resp, err := http.Get(s.URL + "/stream")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if strings.Count(string(b), "data: ") != 3 {
		t.Errorf("a stream read as it came: %q", b)
	}
}

// TestDropClaims: every spelling of a claim goes, other headers stay,
// and nothing is allocated.
func TestDropClaims(t *testing.T) {
	h := http.Header{"X-Real-Ip": {"1"}, "X_user_id": {"2"}, "X-Http-Method-Override": {"POST"}, "Accept": {"*/*"}, "X-Request-Id": {"3"}}
	dropClaims(h)
	if len(h) != 2 || h.Get("Accept") == "" || h.Get("X-Request-Id") == "" {
		t.Errorf("left %v, want Accept and X-Request-Id", h)
	}
	keep := http.Header{"Accept": {"*/*"}, "User-Agent": {"x"}, "Content-Type": {"text/plain"}}
	if n := testing.AllocsPerRun(100, func() { dropClaims(keep) }); n != 0 {
		t.Errorf("%v allocations a request", n)
	}
}
