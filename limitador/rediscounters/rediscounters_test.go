package rediscounters_test

import (
	"context"
	"testing"
	"time"

	"github.com/admitdev/admit/limitador"
	"github.com/admitdev/admit/limitador/rediscounters"
	"github.com/admitdev/admit/policy"
	"github.com/admitdev/admit/redisstore"
	"github.com/admitdev/admit/redistest"
)

const limits = `
- {namespace: app, max_value: 5, seconds: 60, conditions: [], variables: ["descriptors[0].user"]}
- {namespace: app, max_value: 50, seconds: 3600, conditions: [], variables: []}
`

// TestEveryServerListsEveryCounter: counters charged on one server are
// listed by the other, with what both counted.
func TestEveryServerListsEveryCounter(t *testing.T) {
	srv := redistest.Start(t)
	ls, err := limitador.Parse("limits.yaml", []byte(limits))
	if err != nil {
		t.Fatal(err)
	}
	var lims []*limitador.Limiter
	for range 2 {
		st, err := redisstore.Open(context.Background(), "redis://"+srv.Addr, &redisstore.Options{Timeout: 10 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { st.Close() })
		l, err := limitador.New(limitador.Options{Decider: policy.NewDecider(st, 1), Limits: ls, Shared: rediscounters.New(st)})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(l.Close)
		lims = append(lims, l)
	}
	ctx := context.Background()
	for i, user := range []string{"x", "x", "x", "y"} {
		// x on the first server (three hits), y on the second.
		s := lims[0]
		if user == "y" {
			s = lims[1]
		}
		if _, err := s.Decide(ctx, limitador.CheckAndReport, "app", []map[string]string{{"user": user}}, 1, false); err != nil {
			t.Fatal(i, err)
		}
	}
	for i, l := range lims {
		// The index is written after the decision: wait for it, a bounded
		// while.
		var got map[string]int64
		for deadline := time.Now().Add(10 * time.Second); ; {
			cs, _, err := l.Counters(ctx, "app")
			if err != nil {
				t.Fatal(err)
			}
			got = map[string]int64{}
			for _, c := range cs {
				got[c.Variables["descriptors[0].user"]] = c.Remaining
			}
			if len(got) == 3 || time.Now().After(deadline) {
				break
			}
			time.Sleep(10 * time.Millisecond)
		}
		if len(got) != 3 || got["x"] != 2 || got["y"] != 4 || got[""] != 46 {
			t.Fatalf("server %d lists %v; want x 2, y 4 and the namespace's 46 left", i, got)
		}
	}
}
