package wsgateway

import (
	"context"
	"sync"
	"time"

	"github.com/admitdev/admit"
)

// expiryTick is how often the gateway looks for sessions past their
// deadline: a session's connections close at most this much after it
// expires (plus one store round trip).
const expiryTick = 250 * time.Millisecond

// maintain runs until Close: it closes the connections of expired sessions,
// renews the connections' leases every LeaseTTL/3 and pings silent
// connections every PingInterval.
func (g *Gateway) maintain() {
	t := time.NewTicker(min(expiryTick, g.leaseTTL/3))
	defer t.Stop()
	var lastRenew, lastPing time.Time
	for {
		select {
		case <-g.ctx.Done():
			return
		case now := <-t.C:
			conns := g.snapshot()
			g.expire(conns, now)
			g.forgetRefusals(g.now())
			if now.Sub(lastRenew) >= g.leaseTTL/3 {
				lastRenew = now
				g.renew(conns)
			}
			if now.Sub(lastPing) >= g.pingInterval {
				lastPing = now
				g.ping(conns, now)
			}
		}
	}
}

func (g *Gateway) snapshot() []*conn {
	g.mu.Lock()
	defer g.mu.Unlock()
	out := make([]*conn, 0, len(g.conns))
	for c := range g.conns {
		out = append(out, c)
	}
	return out
}

// expire asks the store about the sessions whose last known deadline has
// passed (activity on another server may have moved it) and closes the
// connections of those that are gone.
func (g *Gateway) expire(conns []*conn, now time.Time) {
	due := map[string][]*conn{}
	for _, c := range conns {
		if d := c.deadline.Load(); d != 0 && now.UnixNano() >= d {
			due[c.session] = append(due[c.session], c)
		}
	}
	for id, cs := range due {
		ctx, cancel := context.WithTimeout(g.ctx, 2*time.Second)
		s, err := g.sessions.Get(ctx, id)
		cancel()
		switch {
		case err == nil:
			for _, c := range cs {
				c.setDeadline(s.ExpiresAt)
			}
		case admit.ErrorCode(err) == admit.CodeNotFound:
			for _, c := range cs {
				g.stats.expired.Add(1)
				c.close(CloseSessionExpired, "the session expired")
			}
		default:
			g.log.Warn("gateway: checking a session's expiry", "err", err)
		}
	}
}

// renew extends the leases of the connections, a few at a time, and the
// tenant_sessions slots of their sessions. A connection lease the store no
// longer has means the slot may have gone to someone else: the connection
// is closed (CloseSlotLost). A store that does not answer leaves the
// connections be; the next round tries again.
func (g *Gateway) renew(conns []*conn) {
	seen := map[string]bool{}
	var one []*conn // a connection of each session
	for _, c := range conns {
		if c.sessionLease != "" && !seen[c.sessionLease] {
			seen[c.sessionLease] = true
			one = append(one, c)
		}
	}
	g.each(one, func(c *conn) {
		ctx, cancel := context.WithTimeout(g.ctx, g.leaseTTL/3)
		g.renewSlot(ctx, c.sessionLease, c.tenant)
		cancel()
	})
	g.each(conns, func(c *conn) {
		if c.lease == "" {
			return
		}
		ctx, cancel := context.WithTimeout(g.ctx, g.leaseTTL/3)
		_, err := g.decider.RenewLease(ctx, c.lease)
		cancel()
		switch {
		case err == nil:
		case admit.ErrorCode(err) == admit.CodeNotFound:
			c.close(CloseSlotLost, "the connection's slot expired; connect again")
		default:
			g.log.Warn("gateway: renewing a connection's slot", "tenant", c.tenant, "err", err)
		}
	})
}

// ping pings the connections that sent nothing for a ping interval; one
// that does not answer within the interval is dropped (its slot freed).
func (g *Gateway) ping(conns []*conn, now time.Time) {
	var silent []*conn
	for _, c := range conns {
		if now.UnixNano()-c.lastRead.Load() >= int64(g.pingInterval) {
			silent = append(silent, c)
		}
	}
	for _, c := range silent {
		go func() {
			ctx, cancel := context.WithTimeout(c.ctx, g.pingInterval)
			defer cancel()
			if err := c.ws.Ping(ctx); err != nil && c.ctx.Err() == nil {
				c.ws.CloseNow()
			}
		}()
	}
}

// each calls f for every connection, 16 at a time.
func (g *Gateway) each(conns []*conn, f func(*conn)) {
	sem := make(chan struct{}, 16)
	var wg sync.WaitGroup
	for _, c := range conns {
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			f(c)
		}()
	}
	wg.Wait()
}
