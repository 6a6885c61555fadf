package envoyrls

import (
	"net"
	"testing"
	"time"

	"github.com/admitdev/admit/internal/connlimit"
)

// TestUncalledStreamsCloseTheConnection: a timeline of one connection's
// streams. Calls keep it open however many streams end uncalled beside
// them; past MaxUncalledStreams streams that were not calls, besides
// MaxStreams that may still be, it is closed and its address refused.
func TestUncalledStreamsCloseTheConnection(t *testing.T) {
	tcp, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln := connlimit.New(tcp, connlimit.Limits{Max: DefaultMaxConnections, MaxPerIP: DefaultMaxConnectionsPerIP})
	defer ln.Close()
	s := &Server{}
	sl := streamsListener{Listener: ln, s: s}
	accept := func() *countedConn {
		t.Helper()
		c, err := net.Dial("tcp", tcp.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		sc, err := sl.Accept()
		if err != nil {
			t.Fatal(err)
		}
		return sc.(*countedConn)
	}

	// As many calls as uncalled streams: never closed.
	c := accept()
	for i := range 10 * MaxUncalledStreams {
		if !c.opened() {
			t.Fatalf("closed at stream %d, half of them calls", i+1)
		}
		if i%2 == 0 {
			c.calls.Add(1)
		}
	}
	// A connection of resets: MaxUncalledStreams are let be, besides
	// MaxStreams whose calls may be to come; the next closes it.
	c = accept()
	for i := range MaxStreams + MaxUncalledStreams {
		if !c.opened() {
			t.Fatalf("closed at uncalled stream %d of at most %d", i+1, MaxStreams+MaxUncalledStreams)
		}
	}
	if c.opened() {
		t.Fatalf("open after %d uncalled streams", MaxStreams+MaxUncalledStreams+1)
	}
	if _, err := c.Write([]byte{0}); err == nil {
		t.Error("the connection still writes once closed")
	}
	_ = c.Close() // the transport's own close after it counts nothing
	if got := s.Connections(); got.Uncalled != 1 {
		t.Errorf("connections %+v, want 1 closed for uncalled streams", got)
	}
	if got := ln.Stats(); got.Open != 1 {
		t.Errorf("%d connections open, want 1", got.Open)
	}
	// The address is refused now: the next connection from it is closed
	// as it is accepted, and Accept waits for one it serves.
	refused, err := net.Dial("tcp", tcp.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer refused.Close()
	_ = refused.SetReadDeadline(time.Now().Add(5 * time.Second))
	go func() { _, _ = sl.Accept() }()
	if n, err := refused.Read(make([]byte, 1)); n != 0 || err == nil || isTimeout(err) {
		t.Errorf("a connection from a penalized address: read %d, %v; want it closed", n, err)
	}
}

func isTimeout(err error) bool {
	ne, ok := err.(net.Error)
	return ok && ne.Timeout()
}
