package httplimit

import (
	"fmt"
	"net/http"
	"net/netip"
	"strings"
)

// Forwarding headers.
const (
	XForwardedFor = "X-Forwarded-For"
	Forwarded     = "Forwarded" // RFC 7239
)

// Proxies is a set of trusted proxy networks: the peers whose forwarding
// headers are believed. The zero value trusts no one, so that the client
// is always the peer.
type Proxies []netip.Prefix

// ParseProxies parses CIDRs ("10.0.0.0/8") and single addresses
// ("192.0.2.1", "::1") into Proxies.
func ParseProxies(list []string) (Proxies, error) {
	p := make(Proxies, 0, len(list))
	for _, s := range list {
		if pf, err := netip.ParsePrefix(s); err == nil {
			p = append(p, pf.Masked())
			continue
		}
		a, err := netip.ParseAddr(s)
		if err != nil {
			return nil, fmt.Errorf("httplimit: trusted proxy %q is neither a CIDR nor an IP address", s)
		}
		a = fold(a)
		p = append(p, netip.PrefixFrom(a, a.BitLen()))
	}
	return p, nil
}

// Contains reports whether a is in one of the networks.
func (p Proxies) Contains(a netip.Addr) bool {
	if !a.IsValid() {
		return false
	}
	for _, pf := range p {
		if pf.Contains(a) {
			return true
		}
	}
	return false
}

// fold normalizes an address: IPv4-mapped IPv6 becomes IPv4, and the zone
// goes, so that one client has one address whatever the socket says.
func fold(a netip.Addr) netip.Addr { return a.Unmap().WithZone("") }

// PeerIP returns the address of r's peer, from r.RemoteAddr; the zero Addr
// when it is not an IP address (a Unix socket, say).
func PeerIP(r *http.Request) netip.Addr {
	return parseHost(r.RemoteAddr)
}

// ClientIP returns the address of the client that made r. It is the peer's
// address unless the peer is in trusted. Then the forwarding header
// (X-Forwarded-For, or Forwarded when header says so) is walked from right
// to left, every hop a proxy appended, and each trusted address steps one
// proxy further out; the first untrusted address is the client's. Entries
// to its left are whatever the client chose to send and are never read.
// A malformed, "unknown" or obfuscated entry ends the walk at the last
// trusted address, so a broken header can at worst make a proxy the
// client, never someone the sender picked. With every entry trusted, the
// leftmost is the client.
func ClientIP(r *http.Request, trusted Proxies, header string) netip.Addr {
	addr := PeerIP(r)
	if !trusted.Contains(addr) {
		return addr
	}
	if !strings.EqualFold(header, Forwarded) {
		return walkXFF(r.Header.Values(XForwardedFor), trusted, addr)
	}
	hops, ok := forwardedFor(r.Header.Values(Forwarded))
	if !ok {
		return addr
	}
	for i := len(hops) - 1; i >= 0; i-- {
		if !hops[i].IsValid() {
			return addr
		}
		addr = hops[i]
		if !trusted.Contains(addr) {
			return addr
		}
	}
	return addr
}

// walkXFF walks X-Forwarded-For field lines from the right, as ClientIP
// describes, starting from the trusted peer addr; it allocates nothing.
func walkXFF(lines []string, trusted Proxies, addr netip.Addr) netip.Addr {
	for l := len(lines) - 1; l >= 0; l-- {
		rest := lines[l]
		for rest != "" {
			var v string
			if i := strings.LastIndexByte(rest, ','); i >= 0 {
				v, rest = rest[i+1:], rest[:i]
			} else {
				v, rest = rest, ""
			}
			v = strings.TrimSpace(v)
			if v == "" {
				continue // tolerated: "a, , b" and trailing commas
			}
			hop := parseHost(v)
			if !hop.IsValid() {
				return addr
			}
			addr = hop
			if !trusted.Contains(addr) {
				return addr
			}
		}
	}
	return addr
}

// parseHost parses "addr", "addr:port", "[addr]" or "[addr]:port".
func parseHost(s string) netip.Addr {
	if a, err := netip.ParseAddr(s); err == nil {
		return fold(a)
	}
	if ap, err := netip.ParseAddrPort(s); err == nil {
		return fold(ap.Addr())
	}
	if len(s) > 2 && s[0] == '[' && s[len(s)-1] == ']' {
		if a, err := netip.ParseAddr(s[1 : len(s)-1]); err == nil && a.Is6() {
			return fold(a)
		}
	}
	return netip.Addr{}
}

// forwardedFor returns the for= addresses of Forwarded field lines
// (RFC 7239) in order: the zero Addr for an element without for=, or whose
// node is "unknown", obfuscated ("_hidden") or malformed. ok is false when
// the syntax itself is broken (an unterminated quoted string, say): the
// header is then not believed at all.
func forwardedFor(lines []string) ([]netip.Addr, bool) {
	var hops []netip.Addr
	for _, line := range lines {
		elems, ok := splitQuoted(line, ',')
		if !ok {
			return nil, false
		}
		for _, e := range elems {
			if strings.TrimSpace(e) == "" {
				continue
			}
			pairs, ok := splitQuoted(e, ';')
			if !ok {
				return nil, false
			}
			var node netip.Addr
			seen := false
			for _, p := range pairs {
				name, value, found := strings.Cut(strings.TrimSpace(p), "=")
				if !found {
					if strings.TrimSpace(p) == "" {
						continue
					}
					return nil, false
				}
				if !strings.EqualFold(strings.TrimSpace(name), "for") {
					continue
				}
				if seen {
					node = netip.Addr{} // two for= in one element: believe neither
					break
				}
				seen = true
				v, ok := unquote(strings.TrimSpace(value))
				if !ok {
					return nil, false
				}
				node = forNode(v)
			}
			hops = append(hops, node)
		}
	}
	return hops, true
}

// forNode parses a Forwarded node: an IPv4 address, a bracketed IPv6
// address, either with an optional ":port"; "unknown" and obfuscated
// identifiers give the zero Addr.
func forNode(v string) netip.Addr {
	if strings.HasPrefix(v, "[") {
		end := strings.IndexByte(v, ']')
		if end < 0 || (end+1 < len(v) && v[end+1] != ':') {
			return netip.Addr{}
		}
		a, err := netip.ParseAddr(v[1:end])
		if err != nil || !a.Is6() {
			return netip.Addr{}
		}
		return fold(a)
	}
	host, _, _ := strings.Cut(v, ":")
	a, err := netip.ParseAddr(host)
	if err != nil || !a.Is4() {
		return netip.Addr{} // IPv6 must be bracketed; "unknown", "_x" are not addresses
	}
	return a
}

// splitQuoted splits s at sep outside quoted strings. ok is false when a
// quoted string is not terminated.
func splitQuoted(s string, sep byte) ([]string, bool) {
	var parts []string
	start, quoted := 0, false
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case quoted && c == '\\':
			i++
		case c == '"':
			quoted = !quoted
		case !quoted && c == sep:
			parts = append(parts, s[start:i])
			start = i + 1
		}
	}
	if quoted {
		return nil, false
	}
	return append(parts, s[start:]), true
}

// unquote returns a token as is, or the content of a quoted string with
// its escapes resolved.
func unquote(v string) (string, bool) {
	if !strings.HasPrefix(v, `"`) {
		if strings.ContainsAny(v, "\" \t") {
			return "", false
		}
		return v, true
	}
	if len(v) < 2 || !strings.HasSuffix(v, `"`) {
		return "", false
	}
	var b strings.Builder
	body := v[1 : len(v)-1]
	for i := 0; i < len(body); i++ {
		c := body[i]
		if c == '\\' {
			if i+1 == len(body) {
				return "", false
			}
			i++
			c = body[i]
		} else if c == '"' {
			return "", false
		}
		b.WriteByte(c)
	}
	return b.String(), true
}

// identityHeaders are the headers that say who a request is from. Their
// underscore spellings ("X_Forwarded_For") are removed from every request:
// some servers and frameworks (CGI, WSGI, PHP) fold "_" and "-" together,
// so an application behind Admit could read a client's X_Forwarded_For as
// the X-Forwarded-For that Admit checked.
var identityHeaders = []string{
	"x-forwarded-for", "forwarded", "x-real-ip", "x-forwarded-host", "x-forwarded-proto",
	"x-forwarded-method", "x-forwarded-uri", "x-original-uri", "x-original-method",
	"x-api-key", "authorization",
}

// stripUnderscoreVariants removes from h every header whose name, with
// underscores read as hyphens, is one of the forwarding or credential
// headers, or one of extra (the configured user header, say), while
// keeping the hyphenated originals.
func stripUnderscoreVariants(h http.Header, extra ...string) {
	for name := range h {
		if !strings.Contains(name, "_") {
			continue
		}
		folded := strings.ToLower(strings.ReplaceAll(name, "_", "-"))
		for _, id := range identityHeaders {
			if folded == id {
				delete(h, name)
			}
		}
		for _, id := range extra {
			if id != "" && strings.EqualFold(folded, id) {
				delete(h, name)
			}
		}
	}
}
