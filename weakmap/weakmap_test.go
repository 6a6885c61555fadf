package weakmap

import (
	"runtime"
	"testing"
	"time"
)

type rule struct{ n int }

func TestGetComputesOnce(t *testing.T) {
	var m Map[rule, int]
	r := &rule{n: 7}
	calls := 0
	f := func(r *rule) int { calls++; return r.n * 2 }
	if got := m.Get(r, f); got != 14 {
		t.Fatalf("Get = %d, want 14", got)
	}
	if got := m.Get(r, f); got != 14 || calls != 1 {
		t.Fatalf("second Get = %d after %d calls, want 14 after 1", got, calls)
	}
	runtime.KeepAlive(r)
}

func TestEntriesGoWithTheirKeys(t *testing.T) {
	var m Map[rule, int]
	keep := &rule{n: 1}
	m.Get(keep, func(r *rule) int { return r.n })
	for i := range 100 {
		m.Get(&rule{n: i}, func(r *rule) int { return r.n })
	}
	deadline := time.Now().Add(5 * time.Second)
	for m.Len() > 1 && time.Now().Before(deadline) {
		runtime.GC()
		time.Sleep(time.Millisecond)
	}
	if n := m.Len(); n != 1 {
		t.Fatalf("%d entries after the keys were collected, want 1 (the live key's)", n)
	}
	if got := m.Get(keep, func(*rule) int { return -1 }); got != 1 {
		t.Fatalf("the live key's entry = %d, want 1", got)
	}
	runtime.KeepAlive(keep)
}
