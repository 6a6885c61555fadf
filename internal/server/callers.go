package server

import (
	"crypto/sha256"
	"crypto/subtle"
	"mime"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strings"

	"github.com/admitdev/admit/httplimit"
	"github.com/admitdev/admit/internal/httpx"
)

// Who may do what on the HTTP API (docs/security.md):
//
//   - a caller without a credential, or with a tenant's API key, is
//     untrusted: it acts for a tenant without keys or for its key's own
//     tenant, and what it names reaches no key other tenants share (see
//     policy.Request.Untrusted);
//   - a service token (Options.ServiceTokens) is the platform's own
//     backends: it acts for any tenant and names any user, ip and
//     attribute, as the services that produce requests for every tenant
//     do;
//   - the admin token is a service token that also opens the admin API.
//
// Tokens are compared by their SHA-256, in constant time.

// caller is what a request's credentials make of its sender.
type caller uint8

const (
	untrusted caller = iota // no token: anonymous, or a tenant's API key
	service                 // a service token
	admin                   // the admin token
)

// trusted reports whether c may act for any tenant and name the values
// of keys that tenants share.
func (c caller) trusted() bool { return c >= service }

// hashToken is the form tokens are kept and compared in.
func hashToken(t string) [sha256.Size]byte { return sha256.Sum256([]byte(t)) }

// callerOf returns who r comes from, by the bearer token it carries.
func (s *Server) callerOf(r *http.Request) caller {
	if s.adminHash == nil && len(s.serviceHashes) == 0 {
		return untrusted // no token to hash a bearer credential for
	}
	tok, ok := httplimit.Bearer(r)
	if !ok || tok == "" {
		return untrusted
	}
	h := hashToken(tok)
	if s.adminHash != nil && subtle.ConstantTimeCompare(h[:], s.adminHash[:]) == 1 {
		return admin
	}
	found := 0
	for i := range s.serviceHashes {
		found |= subtle.ConstantTimeCompare(h[:], s.serviceHashes[i][:])
	}
	if found == 1 {
		return service
	}
	return untrusted
}

// Trusted reports whether r comes from the platform itself: it carries a
// service or the admin token, or it is a client on this host that reached
// the server directly (see loopbackClient). A front end that trusts its
// callers with every tenant's counters (Limitador's HTTP API) lets only
// such requests in.
func (s *Server) Trusted(r *http.Request) bool {
	if s.callerOf(r).trusted() {
		return true
	}
	// A credential that is no token of the platform's is refused, from
	// loopback too: an unknown token is never ignored.
	if _, ok := httplimit.Bearer(r); ok || unreadableCredential(r) != "" || len(r.Header["X-Api-Key"]) > 0 {
		return false
	}
	return s.loopbackClient(r) == ""
}

// isAdmin reports whether r carries the admin token.
func (s *Server) isAdmin(r *http.Request) bool { return s.callerOf(r) == admin }

// admin guards an admin handler. The request must carry the admin token
// as a bearer token, unless the operator let loopback clients in without
// one (Options.AdminLoopback) and r is such a client (see
// loopbackClient). Requests with a body must send it as JSON.
func (s *Server) admin(h http.HandlerFunc) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		isAdmin := s.isAdmin(r)
		// A refusal comes before the body is read: the body is not
		// waited for (httpx.CloseUnreadBody).
		if !isAdmin {
			if !s.adminLoopback {
				w.Header().Set("WWW-Authenticate", `Bearer realm="admit admin"`)
				detail := "the admin API needs Authorization: Bearer <admin token>"
				if s.adminHash == nil {
					detail = "the admin API is closed: no admin token is set (ADMIT_ADMIN_TOKEN or server.admin_token); admit serve --admin-loopback opens it to loopback clients without one"
				}
				httpx.CloseUnreadBody(w, r)
				writeProblem(w, http.StatusUnauthorized, detail)
				return
			}
			if why := s.loopbackClient(r); why != "" {
				httpx.CloseUnreadBody(w, r)
				writeProblem(w, http.StatusForbidden, "the admin API answers loopback clients without a token only when they reach it directly: "+why)
				return
			}
		}
		if why := jsonBody(r, s.adminLoopback && !isAdmin); why != "" {
			httpx.CloseUnreadBody(w, r)
			writeProblem(w, http.StatusUnsupportedMediaType, why)
			return
		}
		h(w, r)
	})
}

// jsonBody checks that r sends its body, if any, as JSON. With
// sameOriginOnly (a loopback client without a token), every request that
// changes something must say Content-Type: application/json even without
// a body: a browser sends that type to another origin only after a CORS
// preflight, which this server never grants, so a page on any site cannot
// make a visitor's browser change the admin state.
func jsonBody(r *http.Request, sameOriginOnly bool) string {
	ct := r.Header.Get("Content-Type")
	hasBody := r.ContentLength != 0 && r.Body != nil && r.Body != http.NoBody
	mutating := r.Method != http.MethodGet && r.Method != http.MethodHead
	if ct == "" && !hasBody && !(sameOriginOnly && mutating) {
		return ""
	}
	mt, _, err := mime.ParseMediaType(ct)
	if err == nil && mt == "application/json" {
		return ""
	}
	if ct == "" {
		return "the admin API takes JSON: send Content-Type: application/json"
	}
	return "the admin API takes JSON, not " + strings.TrimSpace(ct) + ": send Content-Type: application/json"
}

// loopbackClient says why r is not a client on this host that reached the
// server directly, or "" when it is. A loopback peer is not enough: a
// proxy, a TLS terminator or a service mesh sidecar on the same host
// connects from loopback on behalf of clients anywhere, and a browser on
// the host is driven by any page it visits. So r must come from 127.0.0.1
// or ::1 (Istio's sidecar delivers from 127.0.0.6), not from a trusted
// proxy, carry no forwarding header, name a loopback host (a DNS rebinding
// page names its own), and, when a browser says where it comes from, come
// from this origin.
func (s *Server) loopbackClient(r *http.Request) string {
	peer := httplimit.PeerIP(r)
	if !peer.IsValid() || peer != netip.IPv6Loopback() && peer != netip.AddrFrom4([4]byte{127, 0, 0, 1}) {
		return "the peer " + r.RemoteAddr + " is not 127.0.0.1 or ::1"
	}
	if s.trustedProxies.Contains(peer) {
		return "the peer is a trusted proxy, which forwards other clients"
	}
	for name := range r.Header {
		if forwardingHeader(name) {
			return "the request carries " + name + ", so a proxy forwarded it"
		}
	}
	if !loopbackHost(r.Host) {
		return "the Host " + r.Host + " is not a loopback name"
	}
	if site := r.Header.Get("Sec-Fetch-Site"); site != "" && site != "same-origin" && site != "none" {
		return "a browser sent it from another site (Sec-Fetch-Site: " + site + ")"
	}
	if o := r.Header.Get("Origin"); o != "" {
		if u, err := url.Parse(o); err != nil || u.Host != r.Host {
			return "a browser sent it from another origin (" + o + ")"
		}
	}
	return ""
}

// forwardingHeader reports whether a header (canonical form) is one that
// proxies add to the requests they forward.
func forwardingHeader(name string) bool {
	switch name {
	case "Forwarded", "Via", "X-Real-Ip", "X-Client-Ip", "True-Client-Ip", "Cf-Connecting-Ip":
		return true
	}
	return strings.HasPrefix(name, "X-Forwarded-") || strings.HasPrefix(name, "X-Envoy-") || strings.HasPrefix(name, "X-Original-")
}

// loopbackHost reports whether a Host header names this host by a
// loopback name or address.
func loopbackHost(host string) bool {
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	host = strings.TrimSuffix(strings.TrimPrefix(host, "["), "]")
	if strings.EqualFold(host, "localhost") {
		return true
	}
	a, err := netip.ParseAddr(host)
	return err == nil && a.Unmap().IsLoopback()
}

// credentials guards a handler of the decision API: a credential that is
// present must be one it can read, or the request is 401, as an unknown
// key is. An Authorization header of another scheme (Basic) or an empty
// bearer token, or either header given twice, was ignored, so that a request a client meant to authenticate went through
// as unauthenticated (a tenant without keys admitted it).
func credentials(h http.HandlerFunc) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if msg := unreadableCredential(r); msg != "" {
			httpx.CloseUnreadBody(w, r)
			writeProblem(w, http.StatusUnauthorized, msg)
			return
		}
		h(w, r)
	})
}

// unreadableCredential says what is wrong with r's credential headers, or
// "" when each is absent or readable.
func unreadableCredential(r *http.Request) string {
	// Read by canonical name: Header.Values would canonicalize (and
	// allocate) "X-API-Key" on every request.
	if v := r.Header["Authorization"]; len(v) > 0 {
		tok, ok := httplimit.Bearer(r)
		switch {
		case len(v) > 1:
			return "the request has two Authorization headers; send one"
		case !ok:
			return "the Authorization header is not a bearer credential (Authorization: Bearer <API key or token>)"
		case tok == "":
			return "the Authorization header's bearer credential is empty"
		}
	}
	// An empty X-API-Key is no key: clients send one for a key left unset.
	if len(r.Header["X-Api-Key"]) > 1 {
		return "the request has two X-API-Key headers; send one"
	}
	return ""
}
