package attack

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/admitdev/admit/proctest"
)

// openKeptAlive opens n connections to addr from the loopback address
// from, each answered one request and kept alive, and returns those the
// server answered (the others it closed at once). The connections are
// closed at the test's end.
func openKeptAlive(t *testing.T, addr, from string, n int) (answered []net.Conn) {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}, Timeout: 5 * time.Second}
	for range n {
		c, err := d.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		_ = c.SetDeadline(time.Now().Add(5 * time.Second))
		if _, err := io.WriteString(c, "GET /healthz HTTP/1.1\r\nHost: admit\r\n\r\n"); err != nil {
			continue
		}
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			continue
		}
		resp.Body.Close()
		if resp.StatusCode == 200 {
			answered = append(answered, c)
		}
	}
	return answered
}

// TestHTTPConnectionsBounded: the HTTP port serves at most
// server.http_max_connections_per_ip connections from one address, none
// of that bound for a trusted proxy, and server.http_max_connections in
// all: the others are closed as they are accepted. (One address held
// 19,990 idle keep-alive connections, 14 kB each, 290 MB, and could take
// every file descriptor of the process, its store's connections' too.)
func TestHTTPConnectionsBounded(t *testing.T) {
	cfg := strings.Replace(suiteConfig, "server:\n", "server:\n  http_max_connections: 120\n  http_max_connections_per_ip: 50\n  trusted_proxies: [\"127.0.0.4\"]\n", 1)
	s := serve(t, cfg, false)
	baseRSS := s.RSSKB(t)
	// The test's own readiness probe and scrapes come from 127.0.0.1.
	addr := strings.TrimPrefix(s.URL, "http://")
	if got := len(openKeptAlive(t, addr, "127.0.0.2", 60)); got != 50 {
		t.Errorf("60 connections from one address: %d answered, want 50", got)
	}
	if got := len(openKeptAlive(t, addr, "127.0.0.4", 60)); got != 60 {
		t.Errorf("60 connections from a trusted proxy: %d answered, want all", got)
	}
	// 110 held, and the readiness probe's connection if it is still open.
	third := openKeptAlive(t, addr, "127.0.0.3", 20)
	if len(third) != 10 && len(third) != 9 {
		t.Errorf("20 connections from a third address with 110 held: %d answered, want 10 (120 in all; 9 if the readiness probe's is open)", len(third))
	}
	report(t, "RSS kB, 120 connections held", s.RSSKB(t)-baseRSS)
	for _, c := range third {
		c.Close()
	}
	var refused float64
	if !proctest.WaitFor(5*time.Second, func() bool {
		resp, err := proctest.Client.Get(s.URL + "/healthz")
		if err == nil {
			resp.Body.Close()
		}
		return err == nil
	}) {
		t.Fatal("the HTTP port takes no connection once some of the 120 closed")
	}
	if refused = s.Metric(t, "admit_http_connections_refused_total"); refused < 20 {
		t.Errorf("admit_http_connections_refused_total %v, want at least 20", refused)
	}
}

// TestHTTPConnectionsBoundedByDefault: one address gets at most 1,000
// connections of the HTTP port by default.
func TestHTTPConnectionsBoundedByDefault(t *testing.T) {
	s := serve(t, "", false)
	baseRSS := s.RSSKB(t)
	got := len(openKeptAlive(t, strings.TrimPrefix(s.URL, "http://"), "127.0.0.2", 1010))
	rss := s.RSSKB(t) - baseRSS
	report(t, "RSS kB, 1,000 idle connections of one address", rss)
	t.Logf("1,010 connections from one address: %d answered, RSS +%d kB", got, rss)
	if got != 1000 {
		t.Errorf("1,010 connections from one address: %d answered, want 1,000", got)
	}
	if !proctest.WaitFor(5*time.Second, func() bool { return s.Metric(t, "admit_http_connections") >= 1000 }) {
		t.Error(fmt.Sprint("admit_http_connections ", s.Metric(t, "admit_http_connections"), ", want the 1,000 held"))
	}
}
