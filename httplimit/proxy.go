package httplimit

import (
	"io"
	"log/slog"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strings"
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
			log.Warn("upstream error", "method", r.Method, "path", r.URL.Path, "err", err)
			problem.Write(w, http.StatusBadGateway, "the upstream did not answer: "+err.Error())
		},
	}
}

// BodyTimeout returns next with a bound on how slowly request bodies may
// arrive: each read of a body must get data within idle, or the read
// fails and the request with it, as nginx's client_body_timeout does. A
// server without a read timeout (a proxy, whose streams last as long as
// they last) would otherwise hold a connection, and one to its upstream,
// for as long as a client dribbles a body a byte at a time. A body that
// keeps coming, however long, is not cut. idle ≤ 0 returns next.
func BodyTimeout(next http.Handler, idle time.Duration) http.Handler {
	if idle <= 0 {
		return next
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Body != nil && r.Body != http.NoBody {
			// A copy of r: the server must still see its own body, to
			// close a connection whose refused request left a large body
			// unread rather than read it first, without a deadline.
			r2 := new(http.Request)
			*r2 = *r
			r2.Body = &idleBody{ReadCloser: r.Body, rc: http.NewResponseController(w), idle: idle}
			r = r2
		}
		next.ServeHTTP(w, r)
	})
}

// idleBody moves the connection's read deadline before every read.
type idleBody struct {
	io.ReadCloser
	rc   *http.ResponseController
	idle time.Duration
}

func (b *idleBody) Read(p []byte) (int, error) {
	_ = b.rc.SetReadDeadline(time.Now().Add(b.idle)) // not every transport can; then the body is unbounded
	return b.ReadCloser.Read(p)
}
