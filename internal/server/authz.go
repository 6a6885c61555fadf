package server

import (
	"net/http"
	"net/url"
	"strconv"
	"strings"

	"github.com/admitdev/admit"
	"github.com/admitdev/admit/httplimit"
)

// handleAuthz is the forward-auth endpoint (Traefik forwardAuth, Caddy
// forward_auth, nginx auth_request, HAProxy, Envoy ext_authz over HTTP). It
// rebuilds the original request (originalRequest) and decides it as the
// middleware would: 200 with RateLimit headers, or 429 (401 for an unknown
// key). ?deny_status=403 makes refusals 403 instead of 429, for nginx, which
// treats any status of the subrequest other than 2xx, 401 and 403 as an
// error.
func (s *Server) handleAuthz(w http.ResponseWriter, r *http.Request) {
	orig, err := s.originalRequest(r)
	if err != nil {
		s.fail(w, r, "authz", err)
		return
	}
	// Not strict: a proxy may pass the original request's query along,
	// which is the protected service's to judge, not Admit's.
	if ds := r.URL.Query().Get("deny_status"); ds != "" {
		code, err := strconv.Atoi(ds)
		if err != nil || (code != http.StatusForbidden && code != http.StatusUnauthorized && code != http.StatusTooManyRequests) {
			writeProblem(w, http.StatusBadRequest, "deny_status "+strconv.Quote(ds)+": want 401, 403 or 429")
			return
		}
		w = &denyStatus{ResponseWriter: w, code: code}
	}
	if !s.authz.Check(w, orig) {
		return
	}
	writeBody(w, http.StatusOK, []byte("{\"allowed\":true}\n"))
}

// ForwardAuthProxies are the proxies whose headers /v1/authz can read the
// original request from (Options.ForwardAuth), and the headers each sets:
// method, URI and host. "envoy" (and "") read none: Envoy sends the
// original method, and the original path under its path_prefix.
var ForwardAuthProxies = map[string][3]string{
	"":        {},
	"envoy":   {},
	"traefik": {"X-Forwarded-Method", "X-Forwarded-Uri", "X-Forwarded-Host"},
	"caddy":   {"X-Forwarded-Method", "X-Forwarded-Uri", "X-Forwarded-Host"},
	"nginx":   {"X-Original-Method", "X-Original-Uri", "X-Original-Host"},
	"haproxy": {"X-Original-Method", "X-Original-Uri", "X-Original-Host"},
}

// originalRequest returns the request a proxy asks about. It shares r's
// headers (the credentials and forwarding headers) and peer address, so
// that forwarding headers are believed only if the proxy is trusted.
//
// The original method, URI and host come from the headers of the one proxy
// the server is configured for (Options.ForwardAuth), and only when the
// peer is a trusted proxy: every proxy passes the client's own headers on
// to the auth request, and sets only its own, so a header of another
// proxy's set, or any from a peer that is not a proxy, is whatever the
// client chose. Otherwise the request speaks for itself: its method, and
// its path past /v1/authz, as Envoy sends them.
func (s *Server) originalRequest(r *http.Request) (*http.Request, error) {
	method, uri, host := r.Method, "", r.Host
	if names := s.forwardAuth; names[0] != "" && s.trustedProxies.Contains(httplimit.PeerIP(r)) {
		method = first(r.Header.Get(names[0]), method)
		uri = r.Header.Get(names[1])
		host = first(r.Header.Get(names[2]), host)
	}
	if uri == "" {
		uri = strings.TrimPrefix(r.URL.RequestURI(), "/v1/authz")
		if uri == "" || uri[0] == '?' {
			uri = "/" + uri
		}
	}
	if len(method) > 32 {
		return nil, errInvalid("the original method %.32q is not an HTTP method", method)
	}
	if len(uri) > 8192 {
		return nil, errInvalid("the original URI is %d bytes; at most 8192", len(uri))
	}
	if !strings.HasPrefix(uri, "/") {
		return nil, errInvalid("the original URI %.64q is not a path", uri)
	}
	// The original URI is a request-target in origin-form, a path and a
	// query, and is parsed as a server parses one: "//login" is the path
	// "//login", which the app behind squeezes to its login route. Parsed
	// as a URI reference, it was a network-path reference to the host
	// "login" with an empty path, of no action, past the login limits.
	u, err := url.ParseRequestURI(uri)
	if err != nil {
		return nil, errInvalid("the original URI: %v", err)
	}
	// NewRequest checks the method is a token.
	o, err := http.NewRequestWithContext(r.Context(), method, "/", nil)
	if err != nil {
		return nil, errInvalid("the original request: %v", err)
	}
	o.URL, o.Header, o.Host, o.RemoteAddr, o.RequestURI = u, r.Header, host, r.RemoteAddr, uri
	// r's body and protocol, so that a refusal closes the connection of
	// a body it leaves unread rather than wait for it.
	o.Body, o.ContentLength = r.Body, r.ContentLength
	o.Proto, o.ProtoMajor, o.ProtoMinor = r.Proto, r.ProtoMajor, r.ProtoMinor
	return o, nil
}

// denyStatus turns the 429 of a refusal into another status.
type denyStatus struct {
	http.ResponseWriter
	code int
}

func (d *denyStatus) WriteHeader(code int) {
	if code == http.StatusTooManyRequests {
		code = d.code
	}
	d.ResponseWriter.WriteHeader(code)
}

func errInvalid(format string, args ...any) error {
	return admit.Errorf(admit.CodeInvalid, format, args...)
}

func first(vals ...string) string {
	for _, v := range vals {
		if v != "" {
			return v
		}
	}
	return ""
}
