// Package connlimit bounds the connections a listener serves at once, in
// all and from one client address, and refuses for a while an address it
// is told to penalize. A connection past a bound is closed as soon as it
// is accepted, before it is read.
//
// The bound in all keeps a server's file descriptors for what it must
// open itself (its store's connections, its files): a flood of
// connections that took the last ones would fail those. The bound per
// address keeps one client from taking the whole of the other.
package connlimit

import (
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"
)

// Limits are a Listener's bounds.
type Limits struct {
	// Max bounds the connections served at once; 0 is no bound.
	Max int
	// MaxPerIP bounds those of one client address (an IPv6 address's
	// /64); 0 is no bound.
	MaxPerIP int
	// Exempt, if set, reports the addresses MaxPerIP does not bound: the
	// platform's own proxies, whose connections carry many clients.
	Exempt func(netip.Addr) bool
}

// Stats count a Listener's connections.
type Stats struct {
	Open    int64 // served now
	Refused int64 // closed as they were accepted: past a bound, or penalized
}

// maxPenalized bounds the addresses penalized at once: past it, an
// address is not penalized (its connection is still closed by its
// server).
const maxPenalized = 1 << 16

// A Listener is a net.Listener whose Accept returns only the connections
// within its Limits, each a *Conn. Create it with New.
type Listener struct {
	net.Listener
	limits    Limits
	open      atomic.Int64
	refused   atomic.Int64
	mu        sync.Mutex
	byIP      map[netip.Addr]int
	penalized map[netip.Addr]time.Time
	now       func() time.Time
}

// New returns ln bounded by limits.
func New(ln net.Listener, limits Limits) *Listener {
	return &Listener{Listener: ln, limits: limits, byIP: map[netip.Addr]int{}, now: time.Now}
}

// Accept returns the next connection within the limits, closing at once
// those that are not.
func (l *Listener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		ip := AddrOf(c.RemoteAddr())
		if !l.take(ip) {
			l.refused.Add(1)
			c.Close()
			continue
		}
		return &Conn{Conn: c, l: l, ip: ip}, nil
	}
}

// Stats returns the listener's counts.
func (l *Listener) Stats() Stats { return Stats{Open: l.open.Load(), Refused: l.refused.Load()} }

// Penalize refuses connections from ip's address (its /64 for IPv6) for d.
func (l *Listener) Penalize(ip netip.Addr, d time.Duration) {
	ip = key(ip)
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.now()
	if l.penalized == nil {
		l.penalized = map[netip.Addr]time.Time{}
	}
	if len(l.penalized) >= maxPenalized {
		for a, until := range l.penalized {
			if !now.Before(until) {
				delete(l.penalized, a)
			}
		}
		if len(l.penalized) >= maxPenalized {
			return
		}
	}
	l.penalized[ip] = now.Add(d)
}

// take counts a connection from ip, unless it is past a bound or ip is
// penalized.
func (l *Listener) take(ip netip.Addr) bool {
	k := key(ip)
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.limits.Max > 0 && l.open.Load() >= int64(l.limits.Max) {
		return false
	}
	if until, ok := l.penalized[k]; ok {
		if l.now().Before(until) {
			return false
		}
		delete(l.penalized, k)
	}
	if l.limits.MaxPerIP > 0 && ip.IsValid() && (l.limits.Exempt == nil || !l.limits.Exempt(ip)) {
		if l.byIP[k] >= l.limits.MaxPerIP {
			return false
		}
	}
	l.byIP[k]++
	l.open.Add(1)
	return true
}

func (l *Listener) release(ip netip.Addr) {
	k := key(ip)
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.byIP[k]--; l.byIP[k] <= 0 {
		delete(l.byIP, k)
	}
	l.open.Add(-1)
}

// key is the address the per-address bound counts: an IPv6 client holds
// a /64 at least, and would otherwise have a bound of its own per address.
func key(ip netip.Addr) netip.Addr {
	if ip.Is6() {
		p, _ := ip.Prefix(64)
		return p.Addr()
	}
	return ip
}

// AddrOf returns the IP address of a, or the zero Addr when a is not an
// IP address (a Unix socket's).
func AddrOf(a net.Addr) netip.Addr {
	if t, ok := a.(*net.TCPAddr); ok {
		ip, _ := netip.AddrFromSlice(t.IP)
		return ip.Unmap()
	}
	ap, err := netip.ParseAddrPort(a.String())
	if err != nil {
		return netip.Addr{}
	}
	return ap.Addr().Unmap()
}

// A Conn is a connection a Listener counts until it is closed.
type Conn struct {
	net.Conn
	l    *Listener
	ip   netip.Addr
	once sync.Once
}

// IP returns the client's address.
func (c *Conn) IP() netip.Addr { return c.ip }

// Close closes the connection, no longer counted.
func (c *Conn) Close() error {
	c.once.Do(func() { c.l.release(c.ip) })
	return c.Conn.Close()
}
