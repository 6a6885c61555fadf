package envoyrls

import (
	"net"
	"testing"
	"time"
)

// TestUncalledStreamsCloseTheConnection: a timeline of one connection's
// streams. Calls keep it open however many streams end uncalled beside
// them; past MaxUncalledStreams streams that were not calls, most of
// its streams, it is closed, and its address refused connections for
// UncalledPenalty.
func TestUncalledStreamsCloseTheConnection(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	s := &Server{maxConns: DefaultMaxConnections, maxPerIP: DefaultMaxConnectionsPerIP, now: func() time.Time { return now }}
	accept := func(ip string) *countedConn {
		t.Helper()
		if !s.take(ip) {
			t.Fatalf("a connection from %s refused", ip)
		}
		a, b := net.Pipe()
		t.Cleanup(func() { a.Close(); b.Close() })
		return &countedConn{Conn: a, s: s, ip: ip}
	}

	// As many calls as uncalled streams: never closed.
	c := accept("192.0.2.1")
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
	c = accept("192.0.2.2")
	for i := range MaxStreams + MaxUncalledStreams {
		if !c.opened() {
			t.Fatalf("closed at uncalled stream %d of at most %d", i+1, MaxStreams+MaxUncalledStreams)
		}
	}
	if c.opened() {
		t.Fatalf("open after %d uncalled streams", MaxStreams+MaxUncalledStreams+1)
	}
	if _, err := c.Conn.Write([]byte{0}); err == nil {
		t.Error("the connection still writes once closed")
	}
	if got := s.Connections(); got.Uncalled != 1 || got.Open != 1 {
		t.Errorf("connections %+v, want 1 open, 1 closed for uncalled streams", got)
	}
	_ = c.Close() // the server's own close after ours counts nothing
	if got := s.Connections(); got.Open != 1 {
		t.Errorf("%d connections open after the closed one's Close, want 1", got.Open)
	}

	if s.take("192.0.2.2") {
		t.Error("the address of a closed connection connected again at once")
	}
	if !s.take("192.0.2.3") {
		t.Error("another address refused")
	}
	now = now.Add(UncalledPenalty - time.Millisecond)
	if s.take("192.0.2.2") {
		t.Error("the address connected again before its penalty ended")
	}
	now = now.Add(time.Millisecond)
	if !s.take("192.0.2.2") {
		t.Error("the address refused once its penalty ended")
	}
}

// TestPenalizedBounded: the addresses penalized at once are bounded; the
// expired ones are forgotten to make room.
func TestPenalizedBounded(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	s := &Server{maxConns: 1, maxPerIP: 1, now: func() time.Time { return now }}
	for i := range maxPenalized + 10 {
		s.penalize(net.IPv4(10, byte(i>>16), byte(i>>8), byte(i)).String())
	}
	if len(s.penalized) != maxPenalized {
		t.Fatalf("%d addresses penalized, want at most %d", len(s.penalized), maxPenalized)
	}
	now = now.Add(UncalledPenalty)
	s.penalize("192.0.2.9")
	if len(s.penalized) != 1 {
		t.Errorf("%d addresses penalized once the others expired, want 1", len(s.penalized))
	}
}
