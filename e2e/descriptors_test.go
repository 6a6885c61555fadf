package e2e

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	rlext "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	earlyv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/http/early_header_mutation/header_mutation/v3"
)

// Envoy is not installable on this machine (no Debian package, no
// registry ships it), so the tests of what a deploy file makes Envoy send
// to Admit work it out from the file itself: edge below follows what
// Envoy's documentation says it does to a request before its rate limit
// filter reads it, and refuses (fails the test on) any setting it does not
// model, so that a file reading the client's headers some other way is
// not passed for safe.

// edgeRequest is a request as it reaches Envoy.
type edgeRequest struct {
	peer    string      // the connection's peer address
	headers [][2]string // name and value, as the client sent them
	// claims are those of the platform's token the request carries, once
	// verified; nil for a request without one.
	claims map[string]string
}

// edge is what Envoy does to a request before its rate limit filter
// builds the descriptors, as a configuration sets it.
type edge struct {
	// removed are the headers the connection manager's early header
	// mutation removes, before routing and before any HTTP filter.
	removed map[string]bool
	// useRemoteAddress and xffHops decide the client's address that the
	// remote_address action sends.
	useRemoteAddress bool
	xffHops          uint32
	// underscores is what becomes of header names with underscores.
	underscores corev3.HttpProtocolOptions_HeadersWithUnderscoresAction
	// claimToHeaders are the headers a JWT filter before the rate limit
	// filter sets from a verified token's claims: header name → claim.
	claimToHeaders map[string]string
}

// readHCM takes from a connection manager what edge models. Early header
// mutations other than removals, and extensions other than Envoy's header
// mutation, fail the test: they could put anything in a header.
func readHCM(t *testing.T, hcm *hcmv3.HttpConnectionManager) edge {
	t.Helper()
	e := edge{
		removed:          map[string]bool{},
		useRemoteAddress: hcm.GetUseRemoteAddress().GetValue(),
		xffHops:          hcm.GetXffNumTrustedHops(),
		underscores:      hcm.GetCommonHttpProtocolOptions().GetHeadersWithUnderscoresAction(),
		claimToHeaders:   map[string]string{},
	}
	for _, ext := range hcm.GetEarlyHeaderMutationExtensions() {
		var m earlyv3.HeaderMutation
		if err := ext.GetTypedConfig().UnmarshalTo(&m); err != nil {
			t.Fatalf("early header mutation %s: %v", ext.GetName(), err)
		}
		for _, mu := range m.GetMutations() {
			if mu.GetRemove() == "" {
				t.Fatalf("early header mutation %v is not a removal: not modelled", mu)
			}
			e.removed[strings.ToLower(mu.GetRemove())] = true
		}
	}
	return e
}

// prepare returns the request's headers as the rate limit filter sees
// them, and the client's address, or refused for a request Envoy answers
// itself.
func (e edge) prepare(t *testing.T, r edgeRequest) (headers [][2]string, addr string, refused bool) {
	t.Helper()
	var xff []string
	for _, h := range r.headers {
		name := strings.ToLower(h[0])
		if strings.Contains(name, "_") {
			switch e.underscores {
			case corev3.HttpProtocolOptions_REJECT_REQUEST:
				return nil, "", true
			case corev3.HttpProtocolOptions_DROP_HEADER:
				continue
			}
		}
		if e.removed[name] {
			continue
		}
		if name == "x-forwarded-for" {
			for _, a := range strings.Split(h[1], ",") {
				xff = append(xff, strings.TrimSpace(a))
			}
		}
		headers = append(headers, [2]string{name, h[1]})
	}
	// The client's address: the peer's with use_remote_address (and no
	// trusted hops), else the last X-Forwarded-For address (the client's
	// own, when nothing in front appends to it).
	switch {
	case e.xffHops != 0:
		t.Fatalf("xff_num_trusted_hops %d: not modelled", e.xffHops)
	case e.useRemoteAddress || len(xff) == 0:
		addr = r.peer
	default:
		addr = xff[len(xff)-1]
	}
	// The JWT filter sets each claim's header. Envoy's API now says the
	// filter replaces a header the request already had; a release that
	// adds to it instead leaves the client's value first, which is the
	// one a request_headers action reads. The model takes the weaker
	// behaviour, so that only the early removal keeps the client's own out.
	if r.claims != nil {
		for _, name := range slices.Sorted(mapsKeys(e.claimToHeaders)) {
			if v, ok := r.claims[e.claimToHeaders[name]]; ok {
				headers = append(headers, [2]string{name, v})
			}
		}
	}
	return headers, addr, false
}

// descriptors returns the descriptors Envoy's rate limit filter sends for
// r under limits: one per rate limit whose actions all apply, its entries
// in the order of its actions. refused reports a request Envoy answers
// itself, before any descriptor.
func (e edge) descriptors(t *testing.T, limits []*routev3.RateLimit, r edgeRequest) (ds []*rlext.RateLimitDescriptor, refused bool) {
	t.Helper()
	headers, addr, refused := e.prepare(t, r)
	if refused {
		return nil, true
	}
	first := func(name string) (string, bool) {
		for _, h := range headers {
			if h[0] == strings.ToLower(name) {
				return h[1], true
			}
		}
		return "", false
	}
	for _, rl := range limits {
		if rl.GetStage().GetValue() != 0 || rl.GetLimit() != nil || rl.GetApplyOnStreamDone() {
			t.Fatalf("rate limit %v: stage, limit override or stream-done: not modelled", rl)
		}
		d := &rlext.RateLimitDescriptor{}
		for _, a := range rl.GetActions() {
			switch s := a.GetActionSpecifier().(type) {
			case *routev3.RateLimit_Action_GenericKey_:
				// A value with a format specifier (%REQ(x-user-id)%) could
				// read the request: not modelled.
				if strings.Contains(s.GenericKey.GetDescriptorValue(), "%") {
					t.Fatalf("generic_key %q: a format specifier is not modelled", s.GenericKey.GetDescriptorValue())
				}
				key := s.GenericKey.GetDescriptorKey()
				if key == "" {
					key = "generic_key"
				}
				d.Entries = append(d.Entries, &rlext.RateLimitDescriptor_Entry{Key: key, Value: s.GenericKey.GetDescriptorValue()})
			case *routev3.RateLimit_Action_RemoteAddress_:
				d.Entries = append(d.Entries, &rlext.RateLimitDescriptor_Entry{Key: "remote_address", Value: addr})
			case *routev3.RateLimit_Action_RequestHeaders_:
				v, ok := first(s.RequestHeaders.GetHeaderName())
				switch {
				case ok:
					d.Entries = append(d.Entries, &rlext.RateLimitDescriptor_Entry{Key: s.RequestHeaders.GetDescriptorKey(), Value: v})
				case !s.RequestHeaders.GetSkipIfAbsent():
					d = nil // the descriptor is not sent
				}
			default:
				t.Fatalf("rate limit action %T: not modelled", s)
			}
			if d == nil {
				break
			}
		}
		if d != nil {
			ds = append(ds, d)
		}
	}
	return ds, false
}

// describe writes descriptors as key=value lists, for comparing and for
// messages.
func describe(ds []*rlext.RateLimitDescriptor) string {
	var b strings.Builder
	for i, d := range ds {
		if i > 0 {
			b.WriteString(" | ")
		}
		for j, e := range d.GetEntries() {
			if j > 0 {
				b.WriteByte(',')
			}
			fmt.Fprintf(&b, "%s=%s", e.GetKey(), e.GetValue())
		}
	}
	return b.String()
}

// spoofs are what a client adds to its requests hoping to choose its rate
// limit keys: another tenant and user, in every spelling, and an address.
func spoofs(i int) [][2]string {
	return [][2]string{
		{"X-Tenant-Id", "victim"},
		{"x-user-id", fmt.Sprintf("fresh-%d", i)},
		{"X-User-ID", "bob"},
		{"x_user_id", "bob"},
		{"X_Tenant_Id", "victim"},
		{"X-Forwarded-For", fmt.Sprintf("203.0.113.%d", i+1)},
	}
}

// checkPlatformKeys fails the test unless the descriptors e and limits
// make depend on the platform's word only: a client's own x-tenant-id,
// x-user-id (any spelling) and X-Forwarded-For change nothing, with a
// token and without one, and none of them reaches the application as a
// tenant or user header, while the token's claims and the connection's
// peer do choose the descriptors. want gives, for a token's claims (nil
// for none) and a peer, the descriptors expected.
func checkPlatformKeys(t *testing.T, e edge, limits []*routev3.RateLimit, anonymous bool, want func(claims map[string]string, peer string) string) {
	t.Helper()
	alice := map[string]string{"sub": "alice", "tenant": "acme"}
	type client struct {
		name   string
		claims map[string]string
		peer   string
	}
	cases := []client{
		{"acme's alice", alice, "192.0.2.1"},
		{"acme's alice from elsewhere", alice, "192.0.2.9"},
		{"victim's bob", map[string]string{"sub": "bob", "tenant": "victim"}, "192.0.2.2"},
	}
	if anonymous {
		cases = append(cases, client{"a client without a token", nil, "192.0.2.3"})
	}
	for _, c := range cases {
		plain, refused := e.descriptors(t, limits, edgeRequest{peer: c.peer, claims: c.claims})
		if refused {
			t.Fatalf("%s: a plain request refused", c.name)
		}
		for i := range 20 {
			// Each spoof alone, then all at once.
			all := spoofs(i)
			for j := 0; j <= len(all); j++ {
				hs := all
				if j < len(all) {
					hs = all[j : j+1]
				}
				r := edgeRequest{peer: c.peer, headers: hs, claims: c.claims}
				ds, refused := e.descriptors(t, limits, r)
				if refused {
					continue // Envoy answers it itself: nothing reaches Admit or the application
				}
				if got := describe(ds); got != describe(plain) {
					t.Fatalf("%s adding %q sends %q, not %q: the client chose a key", c.name, hs, got, describe(plain))
				}
				headers, _, _ := e.prepare(t, r)
				for _, h := range headers {
					name := strings.ReplaceAll(h[0], "_", "-")
					if (name == "x-user-id" || name == "x-tenant-id") && h[1] != c.claims["sub"] && h[1] != c.claims["tenant"] {
						t.Fatalf("%s adding %q: the application gets %s: %s", c.name, hs, h[0], h[1])
					}
				}
			}
		}
		if got := describe(plain); got != want(c.claims, c.peer) {
			t.Fatalf("%s sends %q, want %q", c.name, got, want(c.claims, c.peer))
		}
	}
}
