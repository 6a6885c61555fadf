package attack

import (
	"strings"
	"testing"
)

// TestOneAddressOneBucket: a per-IP limit (logins-per-ip, 2 an hour)
// counts one address in one bucket however the caller spells it — with a
// port, IPv4-mapped, an IPv6 address anywhere in its /64, a zone — and an
// ip that is not an address is 400 naming the field. (Each spelling was a
// bucket of its own: a login limit of 5 a minute admitted 8 of 8 for one
// address; "not-an-ip", "999.1.1.1" and leading zeros were accepted.)
func TestOneAddressOneBucket(t *testing.T) {
	s := serve(t, "", false)
	check := func(ip string) answer {
		t.Helper()
		return s.do("POST", "/v1/check", `{"tenant":"acme","action":"login","ip":"`+ip+`"}`, service...)
	}
	for _, group := range [][]string{
		{"198.51.100.7", "198.51.100.7:1", "198.51.100.7:65535", "::ffff:198.51.100.7", "[::ffff:198.51.100.7]:443", "::ffff:c633:6407"},
		{"2001:db8:1:2::1", "2001:db8:1:2:ffff:ffff:ffff:ffff", "[2001:db8:1:2::7]:80", "2001:DB8:1:2::9", "2001:db8:1:2::1%eth0"},
	} {
		admitted := 0
		for _, ip := range group {
			a := check(ip)
			if a.status != 200 && a.status != 429 {
				t.Fatalf("ip %q: %d %s", ip, a.status, a.raw)
			}
			if a.status == 200 {
				admitted++
			}
		}
		if admitted != 2 {
			t.Errorf("%d spellings of one address (%s…): %d admitted by a limit of 2, want 2", len(group), group[0], admitted)
		}
	}
	for _, ip := range []string{"not-an-ip", "999.1.1.1", "01.2.3.4", "1.2.3.4 ", " 1.2.3.4", "1.2.3", "1.2.3.4:99999", "[1.2.3.4]:80", "1.2.3.4/24"} {
		a := check(ip)
		if a.status != 400 || !strings.Contains(a.raw, `ip`) || !strings.Contains(a.header.Get("Content-Type"), "problem+json") {
			t.Errorf("ip %q: %d %s, want a 400 problem naming ip", ip, a.status, a.raw)
		}
	}
}
