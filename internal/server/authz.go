package server

import (
	"net/http"
	"strconv"
	"strings"

	"github.com/admitdev/admit"
)

// handleAuthz is the forward-auth endpoint (Traefik forwardAuth, nginx
// auth_request, Envoy ext_authz over HTTP). It rebuilds the original
// request from what the proxy forwards and decides it as the middleware
// would: 200 with RateLimit headers, or 429 (401 for an unknown key).
//
// The original method and URI come from X-Forwarded-Method and
// X-Forwarded-Uri (Traefik), X-Original-Method and X-Original-URI (the
// usual nginx set-up) or, for Envoy, from the request itself: its method,
// and its path past /v1/authz (Envoy's path_prefix). ?deny_status=403 makes
// refusals 403 instead of 429, for nginx, which treats any status of the
// subrequest other than 2xx, 401 and 403 as an error.
func (s *Server) handleAuthz(w http.ResponseWriter, r *http.Request) {
	orig, err := originalRequest(r)
	if err != nil {
		s.fail(w, r, "authz", err)
		return
	}
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

// originalRequest returns the request a proxy asks about. It shares r's
// headers (the credentials and forwarding headers) and peer address, so
// that forwarding headers are believed only if the proxy is trusted.
func originalRequest(r *http.Request) (*http.Request, error) {
	method := first(r.Header.Get("X-Forwarded-Method"), r.Header.Get("X-Original-Method"), r.Method)
	uri := first(r.Header.Get("X-Forwarded-Uri"), r.Header.Get("X-Original-Uri"))
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
	// NewRequest checks the method is a token and parses the URI.
	o, err := http.NewRequestWithContext(r.Context(), method, uri, nil)
	if err != nil {
		return nil, errInvalid("the original request: %v", err)
	}
	o.Header, o.Host, o.RemoteAddr, o.RequestURI = r.Header, first(r.Header.Get("X-Forwarded-Host"), r.Host), r.RemoteAddr, uri
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
