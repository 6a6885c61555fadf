package proctest

import "testing"

// TestFreeAddrNeverTwice: FreeAddr hands out a port once per process,
// however often it is asked: a process given its listener and its
// metrics addresses gets two ports.
func TestFreeAddrNeverTwice(t *testing.T) {
	seen := map[string]bool{}
	for range 2000 {
		a := FreeAddr(t)
		if seen[a] {
			t.Fatalf("%s handed out twice", a)
		}
		seen[a] = true
	}
}
