package connlimit

import (
	"net"
	"net/netip"
	"testing"
	"time"
)

// TestBounds: a timeline of take and release: the bound in all, the
// bound per address (an IPv6 /64 one address), exempt addresses, and a
// penalty that ends.
func TestBounds(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	proxy := netip.MustParseAddr("10.0.0.1")
	l := New(nil, Limits{Max: 5, MaxPerIP: 2, Exempt: func(a netip.Addr) bool { return a == proxy }})
	l.now = func() time.Time { return now }
	a, b := netip.MustParseAddr("192.0.2.1"), netip.MustParseAddr("2001:db8::1")
	b2 := netip.MustParseAddr("2001:db8::ffff:2") // b's /64
	for _, step := range []struct {
		ip   netip.Addr
		want bool
	}{{a, true}, {a, true}, {a, false}, {b, true}, {b2, true}, {b2, false}, {proxy, true}, {proxy, false /* past Max */}} {
		if got := l.take(step.ip); got != step.want {
			t.Fatalf("take %v with %d open: %v, want %v", step.ip, l.open.Load(), got, step.want)
		}
	}
	l.release(a)
	if !l.take(proxy) {
		t.Error("an exempt address refused under the bounds")
	}
	l.release(proxy)
	l.release(proxy)
	l.Penalize(a, 10*time.Second)
	if l.take(a) {
		t.Error("a penalized address taken")
	}
	now = now.Add(10*time.Second - time.Millisecond)
	if l.take(a) {
		t.Error("a penalized address taken before its penalty ended")
	}
	now = now.Add(time.Millisecond)
	if !l.take(a) {
		t.Error("an address refused once its penalty ended")
	}
	if got := l.Stats().Open; got != 4 {
		t.Errorf("%d open, want 4", got)
	}
}

// TestPenalizedBounded: the addresses penalized at once are bounded; the
// expired ones are forgotten to make room.
func TestPenalizedBounded(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	l := New(nil, Limits{})
	l.now = func() time.Time { return now }
	for i := range maxPenalized + 10 {
		l.Penalize(netip.AddrFrom4([4]byte{10, byte(i >> 16), byte(i >> 8), byte(i)}), time.Second)
	}
	if len(l.penalized) != maxPenalized {
		t.Fatalf("%d addresses penalized, want at most %d", len(l.penalized), maxPenalized)
	}
	now = now.Add(time.Second)
	l.Penalize(netip.MustParseAddr("192.0.2.9"), time.Second)
	if len(l.penalized) != 1 {
		t.Errorf("%d addresses penalized once the others expired, want 1", len(l.penalized))
	}
}

// TestListener: connections past the bound are closed as they are
// accepted; one closed lets the next in.
func TestListener(t *testing.T) {
	tcp, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l := New(tcp, Limits{MaxPerIP: 1})
	defer l.Close()
	dial := func() net.Conn {
		c, err := net.Dial("tcp", tcp.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	dial()
	first, err := l.Accept()
	if err != nil {
		t.Fatal(err)
	}
	if got := first.(*Conn).IP(); got != netip.MustParseAddr("127.0.0.1") {
		t.Errorf("IP %v", got)
	}
	second := dial()
	accepted := make(chan net.Conn)
	go func() {
		c, _ := l.Accept()
		accepted <- c
	}()
	_ = second.SetReadDeadline(time.Now().Add(5 * time.Second))
	if n, err := second.Read(make([]byte, 1)); n != 0 || err == nil {
		t.Errorf("a connection past the bound: read %d, %v; want it closed", n, err)
	}
	first.Close()
	dial()
	select {
	case c := <-accepted:
		c.Close()
	case <-time.After(5 * time.Second):
		t.Error("no connection accepted after one closed")
	}
	if got := l.Stats(); got.Refused != 1 || got.Open != 0 {
		t.Errorf("stats %+v, want 1 refused, none open", got)
	}
}
