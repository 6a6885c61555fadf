package server

import (
	"net/http/httptest"
	"testing"
)

// TestTrusted: the platform is a service or the admin token, or a direct
// loopback client without a credential; a credential that is none of the
// platform's tokens is refused, from loopback too.
func TestTrusted(t *testing.T) {
	h := start(t, testSpec(), "admin-token", func(o *Options) { o.ServiceTokens = []string{"backend"} })
	for _, tc := range []struct {
		header, value, remote string
		want                  bool
	}{
		{"", "", "127.0.0.1:5000", true},
		{"Authorization", "Bearer backend", "192.0.2.2:5000", true},
		{"Authorization", "Bearer admin-token", "192.0.2.2:5000", true},
		{"Authorization", "Bearer wrong", "127.0.0.1:5000", false},
		{"Authorization", "Basic dTpw", "127.0.0.1:5000", false},
		{"X-API-Key", "a-tenants-key", "127.0.0.1:5000", false},
		{"", "", "192.0.2.2:5000", false},
		{"X-Forwarded-For", "203.0.113.1", "127.0.0.1:5000", false},
	} {
		r := httptest.NewRequest("POST", "http://127.0.0.1/report", nil)
		r.RemoteAddr = tc.remote
		if tc.header != "" {
			r.Header.Set(tc.header, tc.value)
		}
		if got := h.srv.Trusted(r); got != tc.want {
			t.Errorf("%s: %q from %s: Trusted %v, want %v", tc.header, tc.value, tc.remote, got, tc.want)
		}
	}
}
