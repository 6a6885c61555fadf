package httplimit

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync/atomic"
	"time"

	"github.com/admitdev/admit/problem"
)

// ReverseProxy returns the reverse proxy of admit proxy: it forwards to
// upstream, streams responses of unknown length as they come and passes
// protocol upgrades (WebSocket) through. The forwarding headers it sends
// keep the chain of a trusted peer and start a new one for any other peer,
// so the upstream never sees a client's own X-Forwarded-For or Forwarded;
// header is the one of the two it writes besides X-Forwarded-For. Put it
// behind a Limiter's Handler.
func ReverseProxy(upstream *url.URL, trusted Proxies, header string, log *slog.Logger) *httputil.ReverseProxy {
	if log == nil {
		log = slog.Default()
	}
	return &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(upstream)
			peer := PeerIP(pr.In)
			fromTrusted := trusted.Contains(peer)
			if fromTrusted {
				if v := pr.In.Header.Values(XForwardedFor); len(v) > 0 {
					pr.Out.Header[XForwardedFor] = v
				}
			}
			pr.SetXForwarded() // appends the peer to X-Forwarded-For
			if !fromTrusted {
				pr.Out.Header.Del(Forwarded)
				dropClaims(pr.Out.Header)
			}
			if strings.EqualFold(header, Forwarded) && peer.IsValid() {
				node := peer.String()
				if peer.Is6() {
					node = `"[` + node + `]"`
				}
				pr.Out.Header.Add(Forwarded, "for="+node)
			}
		},
		// FlushInterval stays 0: ReverseProxy already flushes every write
		// of a response of unknown length (streams, server-sent events),
		// and flushing sized ones write by write costs a syscall each.
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			if bt := BodyTimedOut(r); bt != nil || errors.Is(err, ErrBodyTimeout) {
				// The client's doing, not the upstream's (the server has
				// cancelled the request, so err may only say that). The
				// connection is read no further: close it.
				if bt == nil {
					bt = err
				}
				w.Header().Set("Connection", "close")
				problem.Write(w, http.StatusRequestTimeout, strings.TrimPrefix(bt.Error(), "httplimit: "))
				return
			}
			log.Warn("upstream error", "method", r.Method, "path", r.URL.Path, "err", err)
			problem.Write(w, http.StatusBadGateway, "the upstream did not answer: "+err.Error())
		},
	}
}

// ErrBodyTimeout is the error a request body's Read returns past one of
// BodyTimeout's bounds: errors.Is(err, ErrBodyTimeout). Its Timeout
// method reports true.
var ErrBodyTimeout error = &bodyTimeoutError{"the request body came too slowly"}

type bodyTimeoutError struct{ msg string }

func (e *bodyTimeoutError) Error() string        { return "httplimit: " + e.msg }
func (e *bodyTimeoutError) Timeout() bool        { return true }
func (e *bodyTimeoutError) Is(target error) bool { return target == ErrBodyTimeout }

// BodyTimeout returns next with two bounds on how slowly request bodies
// may arrive: each read of a body must get data within idle, as nginx's
// client_body_timeout asks, and the whole body must have come within
// total of the request's start (its headers read). Past either, reads
// fail with ErrBodyTimeout, and the request with them: ReverseProxy
// abandons its request to the upstream, closing that connection, and
// answers the client 408 Request Timeout (other handlers may ask
// BodyTimedOut). A server without a read timeout (a proxy, whose streams
// last as long as they last) would otherwise hold a connection, and one
// to its upstream, for as long as a client dribbles a body: the idle
// bound alone lets a byte every idle − 1 s keep them forever. Responses
// are not bounded, nor upgraded connections, which have no body. A bound
// ≤ 0 is off.
//
// Whatever the bounds, a body that next leaves unread (a refusal answers
// before reading it) is not waited for: net/http reads up to 256 KiB of
// such a body, without a deadline, before it writes the response, to keep
// the connection for the next request, so a client that declared a small
// body and stalled was never answered. When next returns with its body
// unread, the rest is read only as far as it has already been received
// (then the connection is kept); otherwise the connection is closed, with
// "Connection: close" on the response.
func BodyTimeout(next http.Handler, idle, total time.Duration) http.Handler {
	idle, total = max(idle, 0), max(total, 0)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Body == nil || r.Body == http.NoBody {
			next.ServeHTTP(w, r)
			return
		}
		b := &slowBody{ReadCloser: r.Body, rc: http.NewResponseController(w), idle: idle, total: total}
		if total > 0 {
			b.end = time.Now().Add(total)
		}
		// A copy of r: the server must still see its own body, to
		// close a connection whose refused request left a large body
		// unread rather than read it first, without a deadline.
		r = r.WithContext(context.WithValue(r.Context(), slowBodyKey{}, b))
		r.Body = b
		next.ServeHTTP(w, r)
		b.abandon()
	})
}

// CloseUnreadBodies returns next, closing the connection of a request
// whose body next leaves unread rather than waiting for the body: it is
// BodyTimeout without bounds.
func CloseUnreadBodies(next http.Handler) http.Handler { return BodyTimeout(next, 0, 0) }

// WriteTimeout returns next with a bound on how long a write of a
// response may wait for the client, as nginx's send_timeout bounds it:
// each write (and flush) must be taken by the client within d, or it
// fails, and the response with it (ReverseProxy abandons the request to
// the upstream, and the server closes the connection). A client that
// stops reading would otherwise hold the response's handler, and the
// request to the upstream, and its shedding slot while the upstream still
// sends, for as long as it liked. A stream's pauses are not bounded, only
// its writes: a client that reads keeps a stream of server-sent events
// however long it lasts. Writes after a protocol switch (the handler
// hijacks the connection) are not bounded. A d ≤ 0 returns next.
func WriteTimeout(next http.Handler, d time.Duration) http.Handler {
	if d <= 0 {
		return next
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tw := &timedWriter{ResponseWriter: w, rc: http.NewResponseController(w), d: d}
		next.ServeHTTP(tw, r)
		tw.arm() // the server writes what is buffered when the handler returns
	})
}

// timedWriter sets the connection's write deadline d ahead before each
// write and flush.
type timedWriter struct {
	http.ResponseWriter
	rc *http.ResponseController
	d  time.Duration
}

func (t *timedWriter) arm() { _ = t.rc.SetWriteDeadline(time.Now().Add(t.d)) }

func (t *timedWriter) Write(p []byte) (int, error) {
	t.arm()
	return t.ResponseWriter.Write(p)
}

func (t *timedWriter) WriteHeader(code int) {
	t.arm() // an informational status is written at once
	t.ResponseWriter.WriteHeader(code)
}

// FlushError flushes, as http.ResponseController asks it to.
func (t *timedWriter) FlushError() error {
	t.arm()
	return t.rc.Flush()
}

func (t *timedWriter) Flush() { _ = t.FlushError() }

func (t *timedWriter) Unwrap() http.ResponseWriter { return t.ResponseWriter }

// BodyTimedOut returns the error with which r's body failed a bound of
// BodyTimeout, or nil.
func BodyTimedOut(r *http.Request) error {
	if b, _ := r.Context().Value(slowBodyKey{}).(*slowBody); b != nil {
		if err := b.failed.Load(); err != nil {
			return err
		}
	}
	return nil
}

type slowBodyKey struct{}

// slowBody moves the connection's read deadline before every read: idle
// from now, or the body's end if that comes first.
type slowBody struct {
	io.ReadCloser
	rc          *http.ResponseController
	idle, total time.Duration
	end         time.Time   // zero: no total bound
	eof         atomic.Bool // read to its end: the deadline is the server's again
	abandoned   atomic.Bool // the handler returned: no more waiting for data
	failed      atomic.Pointer[bodyTimeoutError]
}

func (b *slowBody) Read(p []byte) (int, error) {
	if b.eof.Load() {
		// Once a body is done the server reads the connection in the
		// background; a deadline set now would end that read, and the
		// request's context with it.
		return b.ReadCloser.Read(p)
	}
	now := time.Now()
	deadline := b.end
	if b.idle > 0 && (deadline.IsZero() || now.Add(b.idle).Before(deadline)) {
		deadline = now.Add(b.idle)
	}
	switch {
	case b.abandoned.Load():
		// A transport still sending the body upstream after the handler
		// returned: what has arrived, and nothing more.
		deadline = now
	case !deadline.IsZero() && !deadline.After(now):
		return 0, b.fail(true)
	}
	if !deadline.IsZero() {
		_ = b.rc.SetReadDeadline(deadline) // not every transport can; then the body is unbounded
	}
	n, err := b.ReadCloser.Read(p)
	switch {
	case err == io.EOF:
		b.eof.Store(true)
	case err != nil && b.idle+b.total > 0 && isTimeout(err) && !time.Now().Before(deadline) && !b.abandoned.Load():
		err = b.fail(deadline.Equal(b.end))
	}
	return n, err
}

// abandon ends the wait for a body the handler left unread: the server,
// which reads the rest before it answers, gets what has been received
// and no more (a read deadline now), and closes the connection if that
// is not all.
func (b *slowBody) abandon() {
	b.abandoned.Store(true)
	if !b.eof.Load() {
		_ = b.rc.SetReadDeadline(time.Now())
	}
}

// fail records and returns the error of a bound passed: the total one,
// or the pause between reads.
func (b *slowBody) fail(total bool) error {
	err := &bodyTimeoutError{"the request body paused for more than " + b.idle.String()}
	if total {
		err.msg = "the request body did not come whole within " + b.total.String()
	}
	b.failed.CompareAndSwap(nil, err)
	return err
}

func isTimeout(err error) bool {
	var t interface{ Timeout() bool }
	return errors.As(err, &t) && t.Timeout()
}

// clientClaims are headers by which proxies tell an upstream who the
// client is (its address, its user, tenant and priority) or what it
// asked for (the URL before a rewrite, the method it overrides).
// ReverseProxy passes them on from trusted proxies only: from anyone else
// they are the client's own claims, which an upstream that believes them
// (an X-Original-URL routing IIS or Symfony to another path than the one
// limited, a method override another action) must never see.
var clientClaims = [...]string{
	// who the client is
	"x-real-ip", "x-client-ip", "true-client-ip", "cf-connecting-ip", "fastly-client-ip", "x-cluster-client-ip",
	"x-original-forwarded-for", "x-envoy-external-address", "x-forwarded-port", "x-forwarded-server",
	"x-user-id", "x-user", "x-remote-user", "remote-user", "x-forwarded-user", "x-forwarded-email", "x-forwarded-groups",
	"x-auth-request-user", "x-auth-request-email", "x-auth-request-groups", "x-tenant-id", "x-priority",
	// what it asked for, other than the request Admit decided
	"x-original-url", "x-rewrite-url", "x-forwarded-prefix", "x-forwarded-uri", "x-forwarded-method",
	"x-http-method-override", "x-method-override", "x-http-method",
}

// dropClaims removes clientClaims from h, in any spelling (case, and
// underscores for dashes, which some servers read alike), allocating
// nothing: it runs on every request of a peer that is not trusted.
func dropClaims(h http.Header) {
	for k := range h {
		for _, c := range clientClaims {
			if sameClaim(k, c) {
				delete(h, k)
				break
			}
		}
	}
}

// sameClaim reports whether header name k spells claim c, a lower-case
// name, ignoring case and reading '_' as '-'.
func sameClaim(k, c string) bool {
	if len(k) != len(c) {
		return false
	}
	for i := 0; i < len(k); i++ {
		b := k[i]
		switch {
		case b == '_':
			b = '-'
		case 'A' <= b && b <= 'Z':
			b += 'a' - 'A'
		}
		if b != c[i] {
			return false
		}
	}
	return true
}

// Forwardable answers the requests a reverse proxy must not forward, and
// passes the others to next: CONNECT, which asks for a tunnel to a host
// of the client's choosing (501); TRACE, which has the upstream echo the
// request with what proxies added to it (501); the preface of HTTP/2
// with prior knowledge, which an HTTP/1 listener reads as a request "PRI
// *" (505); a path with a backslash or a NUL byte (400). An upgrade to
// h2c is dropped from the request (the upstream would speak HTTP/2 on the
// proxied connection, every request after the first unseen by the
// limits); other upgrades (WebSocket) pass. Put it in front of a
// Limiter's Handler: what it answers costs no decision.
func Forwardable(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case r.Method == http.MethodConnect:
			problem.Write(w, http.StatusNotImplemented, "CONNECT: this proxy forwards requests to its upstream, and opens no tunnels")
		case r.Method == http.MethodTrace:
			problem.Write(w, http.StatusNotImplemented, "TRACE: this proxy does not forward it")
		case r.Method == "PRI" && r.ProtoMajor == 2:
			problem.Write(w, http.StatusHTTPVersionNotSupported, "HTTP/2 with prior knowledge: this port speaks HTTP/1.1")
		case strings.ContainsAny(r.URL.Path, "\\\x00"):
			// A backslash is a slash to some servers (IIS), a NUL the end
			// of the path to others: either would route the request
			// elsewhere than the path it was limited as.
			problem.Write(w, http.StatusBadRequest, "a path with a backslash or a NUL byte")
		default:
			dropH2CUpgrade(r.Header)
			next.ServeHTTP(w, r)
		}
	})
}

// dropH2CUpgrade removes an upgrade to h2c, and its settings, from h.
func dropH2CUpgrade(h http.Header) {
	ups := h.Values("Upgrade")
	if len(ups) == 0 {
		return
	}
	var keep []string
	for _, v := range ups {
		for _, p := range strings.Split(v, ",") {
			if p = strings.TrimSpace(p); p != "" && !strings.EqualFold(p, "h2c") {
				keep = append(keep, p)
			}
		}
	}
	h.Del("Http2-Settings")
	if len(keep) == 0 {
		h.Del("Upgrade")
		return
	}
	h["Upgrade"] = []string{strings.Join(keep, ", ")}
}
