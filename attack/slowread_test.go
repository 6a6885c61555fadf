package attack

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/admitdev/admit/proctest"
)

// slowClient sends GET path on a connection whose receive buffer is
// small, and reads nothing until told to: a client that reads its
// response slowly, or not at all.
func slowClient(t *testing.T, addr, path string) net.Conn {
	t.Helper()
	d := net.Dialer{Control: func(_, _ string, c syscall.RawConn) error {
		var serr error
		err := c.Control(func(fd uintptr) { serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4096) })
		if err != nil {
			return err
		}
		return serr
	}}
	conn, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	fmt.Fprintf(conn, "GET %s HTTP/1.1\r\nHost: x\r\n\r\n", path)
	return conn
}

// TestSlowReaders: with a shedding group of one slot, a client that
// reads its response slowly (1 KB/s: the slot held for the 60 s it read)
// or not at all held the upstream's request and the group's only slot
// for as long as it liked. A response the socket buffers between the
// proxy and the client hold (200 KiB here) frees the upstream and the
// slot as soon as it is written; one they do not (64 MiB) holds them,
// since the upstream still sends it, but a client that stops reading it
// is cut after --write-timeout, its upstream request ended and the slot
// freed. A client that reads a stream of server-sent events keeps it,
// however long it lasts.
func TestSlowReaders(t *testing.T) {
	var open atomic.Int64
	chunk := make([]byte, 64<<10)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		open.Add(1)
		defer open.Add(-1)
		switch r.URL.Path {
		case "/small":
			w.Header().Set("Content-Length", fmt.Sprint(200<<10))
			_, _ = w.Write(make([]byte, 200<<10))
		case "/big":
			for range 1024 { // 64 MiB
				if _, err := w.Write(chunk); err != nil {
					return
				}
			}
		case "/events":
			w.Header().Set("Content-Type", "text/event-stream")
			for i := range 20 {
				fmt.Fprintf(w, "data: %d\n\n", i)
				http.NewResponseController(w).Flush()
				time.Sleep(150 * time.Millisecond)
			}
		}
	}))
	defer up.Close()
	cfg := "version: 1\nglobal:\n  - {name: all, scope: global, algorithm: token_bucket, rate: 1000/s, burst: 1000}\n" +
		"shedding:\n  - {name: app, algorithm: aimd, initial_limit: 1, min_limit: 1, max_limit: 1, tenant_share: 1.0, max_wait: 10ms, classes: {default: critical}}\n"
	listen := proctest.FreeAddr(t)
	p := proctest.Start(t, admitBin, listen, nil, "proxy", "--listen", listen, "--upstream", up.URL, "--keys-optional",
		"--data-dir", t.TempDir(), "--write-timeout", "2s", "--config", writeFile(t, "admit.yaml", cfg))
	get := func(path string) int {
		resp, err := proctest.Client.Get(p.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode
	}
	if code := get("/small"); code != 200 {
		t.Fatalf("GET /small: %d", code)
	}

	// A client that reads nothing of a response of 200 KiB, which the
	// buffers hold: the slot is free for the next request at once.
	slow := slowClient(t, listen, "/small")
	proctest.WaitFor(5*time.Second, func() bool { return open.Load() == 0 })
	code := get("/small")
	report(t, "beside a client that reads nothing of 200 KiB, the next request", code)
	if code != 200 {
		t.Errorf("beside a client that reads nothing of 200 KiB: %d, want 200 (the upstream is done with it)", code)
	}
	// It has its response whole when it reads.
	_ = slow.SetReadDeadline(time.Now().Add(10 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(slow), nil)
	if err != nil {
		t.Fatal(err)
	}
	n, _ := io.Copy(io.Discard, resp.Body)
	if n != 200<<10 {
		t.Errorf("the slow client read %d bytes of %d", n, 200<<10)
	}

	// A client that stops reading 64 MiB: cut after --write-timeout, once
	// the buffers between are full; the upstream's request ends, and the
	// slot is free again.
	stalled := slowClient(t, listen, "/big")
	start := time.Now()
	if !proctest.WaitFor(5*time.Second, func() bool { return open.Load() == 1 }) {
		t.Fatal("the upstream never saw the request for 64 MiB")
	}
	// While the upstream still serves it: on a loaded machine the cut at
	// --write-timeout may come first, and then the slot is rightly free.
	if code := get("/small"); code != 503 && open.Load() == 1 {
		t.Errorf("beside a client reading 64 MiB from the upstream: %d, want 503 (the upstream still serves it)", code)
	}
	ended := proctest.WaitFor(20*time.Second, func() bool { return open.Load() == 0 })
	report(t, "a client that stops reading 64 MiB: its upstream request ended after", time.Since(start).Round(100*time.Millisecond))
	if !ended {
		t.Fatalf("the upstream request of a client that stopped reading was still open after 20 s")
	}
	if code := get("/small"); code != 200 {
		t.Errorf("after the stalled client was cut: %d, want 200", code)
	}
	_ = stalled.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.Copy(io.Discard, stalled); err != nil {
		t.Errorf("the stalled client's connection was not closed: %v", err)
	}

	// A stream of 20 events, 150 ms apart, read as they come: whole, its
	// pauses longer than nothing, its length (3 s) longer than
	// --write-timeout.
	resp, err = proctest.Client.Get(p.URL + "/events")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if events := strings.Count(string(b), "data: "); events != 20 {
		t.Errorf("a stream of 20 events read as they came: %d events", events)
	}
}
