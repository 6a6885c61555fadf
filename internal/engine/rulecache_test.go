package engine_test

import (
	"runtime"
	"testing"
	"time"

	"github.com/admitdev/admit"
	"github.com/admitdev/admit/internal/engine"
)

func TestRuleCacheComputesOnce(t *testing.T) {
	var c engine.RuleCache[int64]
	r := &admit.Rule{Name: "r", Burst: 7}
	calls := 0
	f := func(r *admit.Rule) int64 { calls++; return r.Burst * 2 }
	if got := c.Get(r, f); got != 14 {
		t.Fatalf("Get = %d, want 14", got)
	}
	if got := c.Get(r, f); got != 14 || calls != 1 {
		t.Fatalf("second Get = %d after %d calls, want 14 after 1", got, calls)
	}
	runtime.KeepAlive(r)
}

func TestRuleCacheEntriesGoWithTheirRules(t *testing.T) {
	var c engine.RuleCache[int64]
	keep := &admit.Rule{Burst: 1}
	c.Get(keep, func(r *admit.Rule) int64 { return r.Burst })
	for i := range 100 {
		c.Get(&admit.Rule{Burst: int64(i)}, func(r *admit.Rule) int64 { return r.Burst })
	}
	// The collector and the cleanups run when they run: wait for them,
	// bounded, rather than assume a schedule.
	deadline := time.Now().Add(5 * time.Second)
	for c.Len() > 1 && time.Now().Before(deadline) {
		runtime.GC()
		time.Sleep(time.Millisecond)
	}
	if n := c.Len(); n != 1 {
		t.Fatalf("%d entries after the rules were collected, want 1 (the live rule's)", n)
	}
	if got := c.Get(keep, func(*admit.Rule) int64 { return -1 }); got != 1 {
		t.Fatalf("the live rule's entry = %d, want 1", got)
	}
	runtime.KeepAlive(keep)
}
