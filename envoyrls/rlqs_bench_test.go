package envoyrls

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/admitdev/admit"
	"github.com/admitdev/admit/policy"
)

// BenchmarkQuotaShare is one bucket's report as a limit's ledger takes
// it: the state read, the share computed among 50 holders, the state
// written back, on the memory ledger.
func BenchmarkQuotaShare(b *testing.B) {
	terms, _ := shareLimitOf(&admit.Rule{Algorithm: admit.TokenBucket, Rate: admit.PerSecond(1000), Burst: 1000})
	q, err := NewQuotaService(QuotaOptions{Service: &Service{}})
	if err != nil {
		b.Fatal(err)
	}
	st := &quotaStream{q: q}
	l := quotaLimit{key: "rlqs:k", rule: &policy.Rule{Rule: admit.Rule{Name: "r"}}, terms: terms}
	ctx := context.Background()
	for i := range 50 {
		_, _ = st.askLimit(ctx, l, shareAsk{ID: fmt.Sprint(i), Demand: 30, Reported: true, Measured: true, TTL: 12 * time.Second}, false)
	}
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		i := 0
		for pb.Next() {
			_, _ = st.askLimit(ctx, l, shareAsk{ID: fmt.Sprint(i % 50), Demand: 30, Reported: true, Measured: true, TTL: 12 * time.Second}, false)
			i++
		}
	})
}
