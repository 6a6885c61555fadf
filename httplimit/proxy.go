package httplimit

import (
	"log/slog"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strings"

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
