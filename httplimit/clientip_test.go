package httplimit

import (
	"net/http"
	"net/netip"
	"strings"
	"testing"
	"unicode"
)

func mustProxies(t testing.TB, list ...string) Proxies {
	t.Helper()
	p, err := ParseProxies(list)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// TestClientIPSpoofing is the spoofing table: who the client is, for each
// peer and forwarding header, with 10.0.0.0/8 and 2001:db8:1::/48 trusted.
func TestClientIPSpoofing(t *testing.T) {
	trusted := mustProxies(t, "10.0.0.0/8", "2001:db8:1::/48", "192.0.2.9")
	cases := []struct {
		name, peer string
		xff        []string // X-Forwarded-For lines
		fwd        []string // Forwarded lines
		want       string   // "" for no address
	}{
		{name: "no header", peer: "203.0.113.5:4000", want: "203.0.113.5"},
		{name: "untrusted peer's XFF ignored", peer: "203.0.113.5:4000", xff: []string{"1.2.3.4"}, want: "203.0.113.5"},
		{name: "untrusted peer's Forwarded ignored", peer: "203.0.113.5:4000", fwd: []string{"for=1.2.3.4"}, want: "203.0.113.5"},
		{name: "trusted peer, one hop", peer: "10.0.0.1:80", xff: []string{"198.51.100.7"}, want: "198.51.100.7"},
		{name: "client-sent entries left of the hop are never read", peer: "10.0.0.1:80", xff: []string{"6.6.6.6, 198.51.100.7"}, want: "198.51.100.7"},
		{name: "chain through trusted proxies", peer: "10.0.0.1:80", xff: []string{"6.6.6.6, 198.51.100.7, 10.1.1.1, 10.2.2.2"}, want: "198.51.100.7"},
		{name: "chain over several field lines", peer: "10.0.0.1:80", xff: []string{"6.6.6.6, 198.51.100.7", "10.1.1.1"}, want: "198.51.100.7"},
		{name: "single trusted address", peer: "192.0.2.9:80", xff: []string{"198.51.100.8"}, want: "198.51.100.8"},
		{name: "all trusted: leftmost", peer: "10.0.0.1:80", xff: []string{"10.9.9.9, 10.1.1.1"}, want: "10.9.9.9"},
		{name: "trusted peer, empty header", peer: "10.0.0.1:80", xff: []string{""}, want: "10.0.0.1"},
		{name: "malformed hop stops at last trusted", peer: "10.0.0.1:80", xff: []string{"198.51.100.7, not-an-ip, 10.1.1.1"}, want: "10.1.1.1"},
		{name: "malformed rightmost keeps the peer", peer: "10.0.0.1:80", xff: []string{"198.51.100.7, 999.1.1.1"}, want: "10.0.0.1"},
		{name: "hop with port", peer: "10.0.0.1:80", xff: []string{"198.51.100.7:5555"}, want: "198.51.100.7"},
		{name: "IPv6 hop bracketed with port", peer: "10.0.0.1:80", xff: []string{"[2001:db8:9::1]:443"}, want: "2001:db8:9::1"},
		{name: "IPv6 hop bare", peer: "10.0.0.1:80", xff: []string{"2001:db8:9::1"}, want: "2001:db8:9::1"},
		{name: "IPv4-mapped hop folded", peer: "10.0.0.1:80", xff: []string{"::ffff:198.51.100.7"}, want: "198.51.100.7"},
		{name: "IPv4-mapped trusted hop folded and trusted", peer: "10.0.0.1:80", xff: []string{"198.51.100.7, ::ffff:10.3.3.3"}, want: "198.51.100.7"},
		{name: "zone removed", peer: "10.0.0.1:80", xff: []string{"fe80::1%eth0"}, want: "fe80::1"},
		{name: "IPv4-mapped peer is trusted", peer: "[::ffff:10.0.0.1]:80", xff: []string{"198.51.100.7"}, want: "198.51.100.7"},
		{name: "IPv6 trusted peer", peer: "[2001:db8:1::5]:80", xff: []string{"198.51.100.7"}, want: "198.51.100.7"},
		{name: "IPv6 peer with zone", peer: "[fe80::2%lo]:80", want: "fe80::2"},
		{name: "peer not an address", peer: "@", want: ""},
		{name: "spaces and empty entries", peer: "10.0.0.1:80", xff: []string{" 198.51.100.7 ,, 10.1.1.1 ,"}, want: "198.51.100.7"},

		{name: "Forwarded one hop", peer: "10.0.0.1:80", fwd: []string{"for=198.51.100.7;proto=https"}, want: "198.51.100.7"},
		{name: "Forwarded chain", peer: "10.0.0.1:80", fwd: []string{"for=6.6.6.6, for=198.51.100.7;by=10.0.0.1, for=10.1.1.1"}, want: "198.51.100.7"},
		{name: "Forwarded quoted IPv6 with port", peer: "10.0.0.1:80", fwd: []string{`for="[2001:db8:cafe::17]:4711"`}, want: "2001:db8:cafe::17"},
		{name: "Forwarded quoted IPv4", peer: "10.0.0.1:80", fwd: []string{`For="198.51.100.7"`}, want: "198.51.100.7"},
		{name: "Forwarded IPv4 with port", peer: "10.0.0.1:80", fwd: []string{`for="198.51.100.7:8080"`}, want: "198.51.100.7"},
		{name: "Forwarded unquoted IPv6 refused", peer: "10.0.0.1:80", fwd: []string{"for=2001:db8::1"}, want: "10.0.0.1"},
		{name: "Forwarded unknown stops", peer: "10.0.0.1:80", fwd: []string{"for=198.51.100.7, for=unknown"}, want: "10.0.0.1"},
		{name: "Forwarded obfuscated stops", peer: "10.0.0.1:80", fwd: []string{"for=198.51.100.7, for=_hidden, for=10.1.1.1"}, want: "10.1.1.1"},
		{name: "Forwarded comma inside quotes", peer: "10.0.0.1:80", fwd: []string{`for=198.51.100.7;ext="a,b"`}, want: "198.51.100.7"},
		{name: "Forwarded unterminated quote: header ignored", peer: "10.0.0.1:80", fwd: []string{`for="198.51.100.7`}, want: "10.0.0.1"},
		{name: "Forwarded element without for stops", peer: "10.0.0.1:80", fwd: []string{"for=198.51.100.7, proto=http"}, want: "10.0.0.1"},
		{name: "Forwarded two for= in one element", peer: "10.0.0.1:80", fwd: []string{"for=198.51.100.7;for=6.6.6.6"}, want: "10.0.0.1"},
		{name: "Forwarded escaped quote", peer: "10.0.0.1:80", fwd: []string{`for="[2001:db8::\1]"`}, want: "2001:db8::1"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := &http.Request{RemoteAddr: tc.peer, Header: http.Header{}}
			for _, v := range tc.xff {
				r.Header.Add("X-Forwarded-For", v)
			}
			for _, v := range tc.fwd {
				r.Header.Add("Forwarded", v)
			}
			header := XForwardedFor
			if tc.fwd != nil {
				header = Forwarded
			}
			got := ClientIP(r, trusted, header)
			if s := addrString(got); s != tc.want {
				t.Fatalf("ClientIP = %q, want %q", s, tc.want)
			}
			// Nothing is believed without trusted proxies.
			if got := ClientIP(r, nil, header); got != PeerIP(r) {
				t.Fatalf("with no trusted proxies ClientIP = %v, want the peer %v", got, PeerIP(r))
			}
		})
	}
}

// TestClientIPIgnoresTheOtherHeader: a proxy that sets X-Forwarded-For may
// pass a client's Forwarded through; only the configured header is read.
func TestClientIPIgnoresTheOtherHeader(t *testing.T) {
	trusted := mustProxies(t, "10.0.0.0/8")
	r := &http.Request{RemoteAddr: "10.0.0.1:80", Header: http.Header{}}
	r.Header.Set("X-Forwarded-For", "198.51.100.7")
	r.Header.Set("Forwarded", "for=6.6.6.6")
	if got := ClientIP(r, trusted, XForwardedFor); got.String() != "198.51.100.7" {
		t.Fatalf("X-Forwarded-For mode: %v", got)
	}
	r.Header.Set("Forwarded", "for=198.51.100.8")
	r.Header.Set("X-Forwarded-For", "6.6.6.6")
	if got := ClientIP(r, trusted, Forwarded); got.String() != "198.51.100.8" {
		t.Fatalf("Forwarded mode: %v", got)
	}
}

func TestParseProxies(t *testing.T) {
	p := mustProxies(t, "10.0.0.0/8", "::ffff:192.0.2.1", "2001:db8::/32", "192.0.2.128/25")
	for addr, want := range map[string]bool{
		"10.255.0.1": true, "11.0.0.1": false, "192.0.2.1": true, "192.0.2.2": false,
		"192.0.2.200": true, "2001:db8::1": true, "2001:db9::1": false,
	} {
		if got := p.Contains(netip.MustParseAddr(addr)); got != want {
			t.Errorf("Contains(%s) = %v, want %v", addr, got, want)
		}
	}
	if p.Contains(netip.Addr{}) {
		t.Error("the zero address is trusted")
	}
	for _, bad := range []string{"", "10.0.0.0/33", "example.com", "10.0.0.1/8/8"} {
		if _, err := ParseProxies([]string{bad}); err == nil {
			t.Errorf("ParseProxies(%q) accepted", bad)
		}
	}
}

func TestStripUnderscoreVariants(t *testing.T) {
	h := http.Header{}
	for _, k := range []string{"X_Forwarded_For", "x_forwarded_for", "X_Real_Ip", "X_Api_Key", "X_User", "Forwarded", "X-Forwarded-For", "X_Other_Thing"} {
		h[k] = []string{"v"}
	}
	stripUnderscoreVariants(h, "X-User")
	var kept []string
	for k := range h {
		kept = append(kept, k)
	}
	want := map[string]bool{"Forwarded": true, "X-Forwarded-For": true, "X_Other_Thing": true}
	if len(kept) != len(want) {
		t.Fatalf("kept %v, want %v", kept, want)
	}
	for _, k := range kept {
		if !want[k] {
			t.Fatalf("kept %q (all kept: %v)", k, kept)
		}
	}
}

func addrString(a netip.Addr) string {
	if !a.IsValid() {
		return ""
	}
	return a.String()
}

// FuzzForwardingHeaders: parsing never panics, and whatever the headers
// say, the client is the peer, an address in one of the headers' entries,
// or nothing.
func FuzzForwardingHeaders(f *testing.F) {
	for _, s := range []string{"198.51.100.7", "a, b, 10.0.0.1", `for="[2001:db8::1]:80";proto=http, for=10.1.1.1`, `for="\`, `for=_x;by="a,b"`, "[::1]:80, ::ffff:1.2.3.4", ""} {
		f.Add(s, "10.0.0.1:80")
	}
	trusted := mustProxies(f, "10.0.0.0/8", "::1")
	f.Fuzz(func(t *testing.T, value, peer string) {
		for _, header := range []string{XForwardedFor, Forwarded} {
			r := &http.Request{RemoteAddr: peer, Header: http.Header{header: {value}}}
			got := ClientIP(r, trusted, header)
			if !got.IsValid() {
				if PeerIP(r).IsValid() {
					t.Fatalf("%s %q from %q: no client, but the peer is an address", header, value, peer)
				}
				continue
			}
			if got.Zone() != "" || got.Is4In6() {
				t.Fatalf("%s %q: client %v is not folded", header, value, got)
			}
			if got != PeerIP(r) && !strings.Contains(strings.ToLower(value), strings.ToLower(got.String())) && !mentions(value, got) {
				t.Fatalf("%s %q from %q: client %v is neither the peer nor in the header", header, value, peer, got)
			}
		}
	})
}

// mentions reports whether value holds some spelling of a (a folded
// IPv4-mapped or zoned address is spelled differently in the header).
func mentions(value string, a netip.Addr) bool {
	// White space of any kind separates too: the parser trims it (a
	// header value cannot hold CR or LF on the wire, but a test can).
	for _, tok := range strings.FieldsFunc(value, func(r rune) bool { return unicode.IsSpace(r) || strings.ContainsRune(`,;="[]`, r) }) {
		host := tok
		if h, _, ok := strings.Cut(tok, "%"); ok {
			host = h
		}
		if b, err := netip.ParseAddr(host); err == nil && fold(b) == a {
			return true
		}
		if ap, err := netip.ParseAddrPort(tok); err == nil && fold(ap.Addr()) == a {
			return true
		}
		if h, _, ok := strings.Cut(tok, ":"); ok {
			if b, err := netip.ParseAddr(h); err == nil && fold(b) == a {
				return true
			}
		}
	}
	return false
}
