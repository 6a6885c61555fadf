package httplimit

import (
	"bufio"
	"errors"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/admitdev/admit/internal/httpx"
	"github.com/admitdev/admit/problem"
	"github.com/admitdev/admit/shed"
)

// ShedGroup protects the routes of some actions with an adaptive
// concurrency limit (package shed): past it, requests wait briefly, then
// are answered 503 with Retry-After, sheddable ones first.
type ShedGroup struct {
	// Name names the group in metrics.
	Name string
	// Actions are the actions (see Options.Actions) the group protects;
	// empty or "*" for all. A request belongs to the first group that
	// names its action.
	Actions []string
	// Limiter configures the group's limiter.
	Limiter shed.Options
	// A request's class is, first that applies: ClassHeader's value
	// ("critical", "default", "sheddable"), believed from
	// Options.TrustedProxies only; its action's in Classes; its tenant's
	// tier's in Tiers; Default.
	ClassHeader string
	Classes     map[string]shed.Class
	Tiers       map[string]shed.Class
	Default     shed.Class
}

type shedGroup struct {
	ShedGroup
	all bool
	lim *shed.Limiter
}

// compileShedding checks and starts the shedding groups.
func (l *Limiter) compileShedding() error {
	l.shedding = l.shedding[:0]
	for i, g := range l.opts.Shedding {
		if g.Name == "" {
			return optionError("Shedding", i, "shedding group %d has no name", i)
		}
		if g.ClassHeader != "" && !validHeaderName(g.ClassHeader) {
			return optionError("Shedding", i, "shedding group %q: class header %q is not a header name", g.Name, g.ClassHeader)
		}
		lim, err := shed.New(g.Limiter)
		if err != nil {
			return optionError("Shedding", i, "shedding group %q: %v", g.Name, err)
		}
		sg := &shedGroup{ShedGroup: g, lim: lim, all: len(g.Actions) == 0 || slices.Contains(g.Actions, "*")}
		sg.ClassHeader = http.CanonicalHeaderKey(g.ClassHeader)
		l.shedding = append(l.shedding, sg)
	}
	return nil
}

// group returns the shedding group of action, or nil.
func (l *Limiter) group(action string) *shedGroup {
	for _, g := range l.shedding {
		if g.all || slices.Contains(g.Actions, action) {
			return g
		}
	}
	return nil
}

func (g *shedGroup) class(l *Limiter, r *http.Request, c *call) shed.Class {
	if g.ClassHeader != "" && l.opts.TrustedProxies.Contains(PeerIP(r)) {
		if cl, err := shed.ParseClass(strings.ToLower(r.Header.Get(g.ClassHeader))); err == nil {
			return cl
		}
	}
	if cl, ok := g.Classes[c.req.Action]; ok {
		return cl
	}
	if t := c.res.Tenant; t != nil && t.Tier != nil {
		if cl, ok := g.Tiers[t.Tier.Name]; ok {
			return cl
		}
	}
	return g.Default
}

// ShedStat is a shedding group's state, for metrics.
type ShedStat struct {
	Group string
	shed.Stats
}

// ShedStats returns the state of every shedding group.
func (l *Limiter) ShedStats() []ShedStat {
	out := make([]ShedStat, len(l.shedding))
	for i, g := range l.shedding {
		out[i] = ShedStat{Group: g.Name, Stats: g.lim.Stats()}
	}
	return out
}

// serveShed passes an admitted request to next through its shedding
// group, if it has one.
//
// Every request takes a slot, whatever its headers say: an Upgrade header
// proves nothing until the upstream switches protocols, and a request
// that claims one and is served as an ordinary request is an ordinary
// request. One that the handler does upgrade (it hijacks the connection,
// as ReverseProxy does on the upstream's 101) reports its handshake's
// latency and then holds its slot for as long as the connection lasts
// (shed.Token.Hold): it is served for all that time.
func (l *Limiter) serveShed(w http.ResponseWriter, r *http.Request, c *call, next http.Handler) {
	g := l.group(c.req.Action)
	if g == nil {
		next.ServeHTTP(w, r)
		return
	}
	tenant := ""
	if c.res.Tenant != nil {
		tenant = c.res.Tenant.ID
	}
	tok, err := g.lim.Acquire(r.Context(), g.class(l, r, c), tenant)
	if err != nil {
		var s *shed.Shed
		if !errors.As(err, &s) {
			return // the client went away while waiting
		}
		endUnreadBody(w, r)
		w.Header().Set("Retry-After", strconv.FormatInt(l.retryAfter(s.RetryAfter), 10))
		retry := httpx.CeilDiv(s.RetryAfter, time.Millisecond)
		problem.WriteDetails(w, problem.Details{
			Status: http.StatusServiceUnavailable, RetryAfterMS: &retry,
			Detail: "the service is at its concurrency limit (" + g.Name + "); " + s.Class.String() + " requests are shed first",
		})
		return
	}
	sw := &statusWriter{ResponseWriter: w, tok: tok}
	defer func() {
		// An overloaded upstream answers 503 or times out (504): that is
		// what the limit must learn from, not just latency.
		if sw.status == http.StatusServiceUnavailable || sw.status == http.StatusGatewayTimeout {
			tok.Drop()
		} else {
			tok.Done()
		}
	}()
	next.ServeHTTP(sw, r)
}

// statusWriter records a response's status, and holds its shedding token
// when the handler takes the connection over. Unwrap lets
// http.ResponseController reach the writer's Flush and the rest.
type statusWriter struct {
	http.ResponseWriter
	status int
	tok    *shed.Token
}

func (s *statusWriter) WriteHeader(code int) {
	if s.status == 0 {
		s.status = code
	}
	s.ResponseWriter.WriteHeader(code)
}

func (s *statusWriter) Write(b []byte) (int, error) {
	if s.status == 0 {
		s.status = http.StatusOK
	}
	return s.ResponseWriter.Write(b)
}

// Hijack takes the connection over (http.Hijacker) for a protocol the
// upstream switched to. The request's slot is then held until the
// handler returns.
func (s *statusWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	conn, rw, err := http.NewResponseController(s.ResponseWriter).Hijack()
	if err == nil {
		s.status = http.StatusSwitchingProtocols
		s.tok.Hold()
	}
	return conn, rw, err
}

func (s *statusWriter) Unwrap() http.ResponseWriter { return s.ResponseWriter }
