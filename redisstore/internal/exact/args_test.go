package exact

import (
	"runtime"
	"testing"
	"time"

	"github.com/admitdev/admit"
)

func cached() int { return argsCache.Len() }

// TestArgsCacheForgetsRules: the arguments of rules no policy holds any more
// leave the cache, so reloads and admin changes do not grow it.
func TestArgsCacheForgetsRules(t *testing.T) {
	before := cached()
	func() {
		for i := range 100 {
			r := &admit.Rule{Name: "r", Algorithm: admit.TokenBucket, Rate: admit.PerSecond(int64(i + 1)), Burst: 10}
			if a := argsOf(r); a.err != nil || a.fixed[5] != itoa(int64(i+1)) || argsOf(r) != a {
				t.Fatalf("rule %d: %+v", i, a)
			}
		}
	}()
	if cached() < before+100 {
		t.Fatalf("%d cached, want %d more than %d", cached(), 100, before)
	}
	deadline := time.Now().Add(5 * time.Second)
	for cached() > before {
		if time.Now().After(deadline) {
			t.Fatalf("%d rules still cached after they were collected (%d before)", cached(), before)
		}
		runtime.GC()
		time.Sleep(10 * time.Millisecond)
	}
}

// TestHead: a decision's head names its debits as a mask of its charges,
// a field of its own, so that a cost is only ever a number; the usual
// decision, with no flags, debits or lease, is its count alone.
func TestHead(t *testing.T) {
	for _, c := range []struct {
		n      int
		flags  string
		debits uint64
		lease  string
		want   string
	}{
		{3, "", 0, "", "3"},
		{3, "", 0b101, "", "3::5:"},
		{1, "d", 0, "", "1:d::"},
		{2, "rs", 1 << 1, "L1", "2:rs:2:L1"},
		{32, "", 1 << 31, "", "32::2147483648:"},
	} {
		if got := head(c.n, c.flags, c.debits, c.lease); got != c.want {
			t.Errorf("head(%d, %q, %b, %q) = %q, want %q", c.n, c.flags, c.debits, c.lease, got, c.want)
		}
	}
}
