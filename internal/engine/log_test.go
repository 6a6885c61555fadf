package engine

import (
	"slices"
	"testing"

	"github.com/admitdev/admit"
	"github.com/admitdev/admit/internal/bounds"
)

// FuzzKthExpiry holds the window that finds a refusal's k-th soonest expiry
// to a full sort of the live slots.
func FuzzKthExpiry(f *testing.F) {
	f.Add([]byte{3, 1, 4, 1, 5, 9, 2, 6}, uint8(2), int64(1))
	f.Add([]byte{0, 0, 0}, uint8(1), int64(0))
	f.Fuzz(func(t *testing.T, expiries []byte, k uint8, now int64) {
		var s LeaseSet
		var live []int64
		for i, e := range expiries {
			s.slots = append(s.slots, leaseSlot{lease: uint64(i), expiry: int64(e)})
			if int64(e) > now {
				live = append(live, int64(e))
			}
		}
		slices.Sort(live)
		got, ok := s.kthExpiry(now, int(k%40))
		want, wantOK := int64(0), false
		if kk := int(k % 40); kk >= 1 && kk <= len(live) {
			want, wantOK = live[kk-1], true
		}
		if got != want || ok != wantOK {
			t.Fatalf("kthExpiry(%d, %d) = %d, %v, want %d, %v", now, k%40, got, ok, want, wantOK)
		}
	})
}

// BenchmarkFullLeaseSetRefusal is one refusal of a concurrency key holding
// MaxConcurrency slots: what a caller at its limit costs per request.
func BenchmarkFullLeaseSetRefusal(b *testing.B) {
	r := &admit.Rule{Name: "c", Algorithm: admit.Concurrency, Max: bounds.MaxConcurrency}
	var s LeaseSet
	for i := range bounds.MaxConcurrency {
		s.Commit(0, uint64(i), 1, int64(1e9+i*7919%bounds.MaxConcurrency))
	}
	b.ReportAllocs()
	b.ResetTimer()
	var res admit.Result
	for b.Loop() {
		s.EvalTo(&res, r, 1, 1, 0)
	}
	if res.Allowed {
		b.Fatal("allowed beyond max")
	}
}
