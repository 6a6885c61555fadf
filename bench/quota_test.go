package bench

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/admitdev/admit"
	"github.com/admitdev/admit/internal/engine"
	"github.com/admitdev/admit/memstore"
)

// BenchmarkQuota compares a calendar quota's decision with a fixed
// window's, in one run: a quota works out its period in a time zone, which
// the rule's preparation keeps for the whole period, so the two should cost
// the same.
//
//	cd bench && go test -run='^$' -bench=Quota -count=6 .
func BenchmarkQuota(b *testing.B) {
	paris, err := time.LoadLocation("Europe/Paris")
	if err != nil {
		b.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		rule *admit.Rule
	}{
		{"fixed_window", &admit.Rule{Name: "w", Algorithm: admit.FixedWindow, Limit: 1 << 30, Window: 30 * 24 * time.Hour}},
		{"quota", &admit.Rule{Name: "q", Algorithm: admit.Quota, Limit: 1 << 30, Period: admit.Month, Location: paris}},
	} {
		charges := make([]admit.Charge, 1000)
		for i := range charges {
			charges[i] = admit.Charge{Key: "tenant:" + strconv.Itoa(i), Rule: tc.rule, Cost: 1}
			engine.PrepareCharge(&charges[i])
		}
		s := memstore.New(nil)
		b.Run(tc.name+"/serial", func(b *testing.B) {
			var d admit.Decision
			b.ReportAllocs()
			i := 0
			for range b.N {
				i = next(i, len(charges))
				_ = s.Decide(context.Background(), charges[i:i+1], &d)
			}
		})
		b.Run(tc.name+"/parallel", func(b *testing.B) {
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				var d admit.Decision
				i := 0
				for pb.Next() {
					i = next(i, len(charges))
					_ = s.Decide(context.Background(), charges[i:i+1], &d)
				}
			})
		})
		s.Close()
	}
}
