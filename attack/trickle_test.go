package attack

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/admitdev/admit/proctest"
)

// TestTrickledBodies: 20 clients send a body a byte every 250 ms, never
// pausing as long as --body-timeout (1 s): each is answered 408 at
// --body-deadline (2 s), and the upstream's requests end with them. Until
// the total bound, they held admit proxy's connections and the
// upstream's for as long as they kept trickling.
func TestTrickledBodies(t *testing.T) {
	var open atomic.Int64
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		open.Add(1)
		defer open.Add(-1)
		_, _ = io.Copy(io.Discard, r.Body)
	}))
	defer up.Close()
	listen := proctest.FreeAddr(t)
	proctest.Start(t, admitBin, listen, nil, "proxy", "--listen", listen, "--upstream", up.URL, "--keys-optional",
		"--data-dir", t.TempDir(), "--body-timeout", "1s", "--body-deadline", "2s", "--config", writeFile(t, "admit.yaml", anyone))
	const clients = 20
	var wg sync.WaitGroup
	var timedOut, held atomic.Int64
	for range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			conn, err := net.Dial("tcp", listen)
			if err != nil {
				t.Error(err)
				return
			}
			defer conn.Close()
			fmt.Fprint(conn, "POST /upload HTTP/1.1\r\nHost: x\r\nContent-Length: 1000000\r\n\r\n")
			stop := make(chan struct{})
			defer close(stop)
			go func() {
				tick := time.NewTicker(250 * time.Millisecond)
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
			_ = conn.SetReadDeadline(time.Now().Add(20 * time.Second))
			resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
			switch {
			case err != nil:
				held.Add(1) // no answer while it trickled for 20 s
			case resp.StatusCode == http.StatusRequestTimeout:
				timedOut.Add(1)
			}
		}()
	}
	wg.Wait()
	proctest.WaitFor(5*time.Second, func() bool { return open.Load() == 0 })
	report(t, "of 20 trickled bodies, answered 408", timedOut.Load())
	report(t, "of 20 trickled bodies, held 20 s", held.Load())
	report(t, "upstream requests still open after", open.Load())
	if timedOut.Load() != clients || open.Load() != 0 {
		t.Errorf("%d of %d trickled bodies answered 408 (%d held 20 s); %d upstream requests open", timedOut.Load(), clients, held.Load(), open.Load())
	}
}
