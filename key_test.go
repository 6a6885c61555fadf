package admit

import "testing"

func TestKeyEncoding(t *testing.T) {
	k := Key{Scope: "user", Tenant: "acme", Subject: "alice", Action: "search", Rule: "search-floor"}
	if got, want := k.String(), "4:user4:acme5:alice6:search12:search-floor"; got != want {
		t.Fatalf("String() = %q, want %q", got, want)
	}
	// Fields that would collide under naive joining stay apart.
	a := Key{Tenant: "a:b", Subject: "c"}
	b := Key{Tenant: "a", Subject: "b:c"}
	if a.String() == b.String() {
		t.Fatalf("%+v and %+v share the encoding %q", a, b, a.String())
	}
	for _, bad := range []string{"", "4:user", "1:a1:b1:c1:d1:e!", "01:a0:0:0:0:", "-1:a", "+1:a0:0:0:0:", "9:a0:0:0:0:"} {
		if _, err := parseKey(bad); err == nil {
			t.Errorf("parseKey(%q) succeeded", bad)
		}
	}
}

func TestKeyAppendNoAlloc(t *testing.T) {
	k := Key{Scope: "tenant", Tenant: "t1234", Action: "schedule-email", Rule: "r"}
	buf := make([]byte, 0, 64)
	if n := testing.AllocsPerRun(100, func() { buf = k.Append(buf[:0]) }); n != 0 {
		t.Fatalf("Append allocates %v times", n)
	}
}

// FuzzKey proves the encoding injective: it round-trips, so two different
// Keys can never share an encoding.
func FuzzKey(f *testing.F) {
	f.Add("user", "acme", "alice", "search", "r1", "tenant", "acme", "", "search", "r1")
	f.Add("1:", ":", "0:", "", "", "", "1::", "", "", "")
	f.Fuzz(func(t *testing.T, s1, t1, u1, a1, r1, s2, t2, u2, a2, r2 string) {
		k1 := Key{s1, t1, u1, a1, r1}
		k2 := Key{s2, t2, u2, a2, r2}
		e1, e2 := k1.String(), k2.String()
		if (k1 == k2) != (e1 == e2) {
			t.Fatalf("%+v -> %q, %+v -> %q", k1, e1, k2, e2)
		}
		back, err := parseKey(e1)
		if err != nil || back != k1 {
			t.Fatalf("parseKey(%q) = %+v, %v; want %+v", e1, back, err, k1)
		}
	})
}
