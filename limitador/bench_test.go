package limitador

import (
	"context"
	"strconv"
	"testing"
)

// BenchmarkDecide decides a request of Kuadrant's shape against a
// namespace of four limits, two of which apply (one per user), on the
// memory store, from every core.
func BenchmarkDecide(b *testing.B) {
	l, _ := newLimiter(&testing.T{}, `
- {namespace: shop/toystore, max_value: 1000000000, seconds: 60, name: per-user, conditions: ["descriptors[0]['limit.per_user__1da6e70a'] == '1'"], variables: ["descriptors[0]['auth.identity.username']"]}
- {namespace: shop/toystore, max_value: 1000000000, seconds: 3600, name: per-user, conditions: ["descriptors[0]['limit.per_user__1da6e70a'] == '1'"], variables: ["descriptors[0]['auth.identity.username']"]}
- {namespace: shop/toystore, max_value: 10, seconds: 60, name: other, conditions: ["descriptors[0]['limit.other__2c1520b6'] == '1'"], variables: []}
- {namespace: shop/other, max_value: 10, seconds: 60, conditions: [], variables: []}
`)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		i := 0
		for pb.Next() {
			ds := []map[string]string{{"limit.per_user__1da6e70a": "1", "auth.identity.username": "user" + strconv.Itoa(i%1000)}}
			res, err := l.Decide(context.Background(), CheckAndReport, "shop/toystore", ds, 1, false)
			if err != nil || res.Limited || res.Applied != 2 {
				b.Fatalf("%+v %v", res, err)
			}
			i++
		}
	})
}
