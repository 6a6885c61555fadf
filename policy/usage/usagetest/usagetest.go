// Package usagetest is the conformance suite of usage.Store: every
// implementation runs it.
package usagetest

import (
	"context"
	"testing"
	"time"

	"github.com/admitdev/admit/policy/usage"
)

// Run runs the suite on stores that open returns, new and empty, keeping
// usage.DefaultKeepPeriods periods.
func Run(t *testing.T, open func(t *testing.T) usage.Store) {
	ctx := context.Background()
	day := func(y int, m time.Month, d int) time.Time { return time.Date(y, m, d, 0, 0, 0, 0, time.UTC) }
	now := time.Now().UTC()
	thisMonth := day(now.Year(), now.Month(), 1)
	nextMonth, lastMonth := thisMonth.AddDate(0, 1, 0), thisMonth.AddDate(0, -1, 0)
	rec := func(tenant, rule string, start, end time.Time, admitted, refused, cost int64) usage.Record {
		return usage.Record{Tenant: tenant, Rule: rule, PeriodStart: start, PeriodEnd: end, Admitted: admitted, Refused: refused, Cost: cost}
	}

	t.Run("adds_up", func(t *testing.T) {
		s := open(t)
		for range 3 { // three servers' flushes
			if err := s.AddUsage(ctx, []usage.Record{
				rec("acme", "ai", thisMonth, nextMonth, 2, 1, 70),
				rec("acme", "mail", thisMonth, nextMonth, 1, 0, 1),
			}); err != nil {
				t.Fatal(err)
			}
		}
		got, err := s.Usage(ctx, "acme", lastMonth, nextMonth)
		if err != nil {
			t.Fatal(err)
		}
		want := []usage.Record{rec("acme", "ai", thisMonth, nextMonth, 6, 3, 210), rec("acme", "mail", thisMonth, nextMonth, 3, 0, 3)}
		check(t, got, want)
	})

	t.Run("ranges_tenants_and_order", func(t *testing.T) {
		s := open(t)
		weekStart := thisMonth.AddDate(0, 0, 7)
		if err := s.AddUsage(ctx, []usage.Record{
			rec("acme", "ai", thisMonth, nextMonth, 1, 0, 1),
			rec("acme", "ai", lastMonth, thisMonth, 5, 5, 5),
			rec("acme", "week", weekStart, weekStart.AddDate(0, 0, 7), 2, 0, 2),
			rec("beta", "ai", thisMonth, nextMonth, 9, 9, 9),
		}); err != nil {
			t.Fatal(err)
		}
		all, err := s.Usage(ctx, "acme", lastMonth, nextMonth)
		if err != nil {
			t.Fatal(err)
		}
		check(t, all, []usage.Record{
			rec("acme", "ai", lastMonth, thisMonth, 5, 5, 5),
			rec("acme", "ai", thisMonth, nextMonth, 1, 0, 1),
			rec("acme", "week", weekStart, weekStart.AddDate(0, 0, 7), 2, 0, 2),
		})
		// [from, to) selects the periods that overlap it.
		cur, err := s.Usage(ctx, "acme", thisMonth, thisMonth.Add(time.Hour))
		if err != nil {
			t.Fatal(err)
		}
		check(t, cur, []usage.Record{rec("acme", "ai", thisMonth, nextMonth, 1, 0, 1)})
		none, err := s.Usage(ctx, "nobody", lastMonth, nextMonth)
		if err != nil || len(none) != 0 {
			t.Fatalf("a tenant with no records: %v, %v", none, err)
		}
	})

	t.Run("retention", func(t *testing.T) {
		s := open(t)
		// Ended more than 12 periods ago: not kept.
		old := day(2000, time.January, 1)
		if err := s.AddUsage(ctx, []usage.Record{
			rec("acme", "ai", old, old.AddDate(0, 1, 0), 1, 0, 1),
			rec("acme", "ai", lastMonth, thisMonth, 1, 0, 1),
		}); err != nil {
			t.Fatal(err)
		}
		got, err := s.Usage(ctx, "acme", old, nextMonth)
		if err != nil {
			t.Fatal(err)
		}
		check(t, got, []usage.Record{rec("acme", "ai", lastMonth, thisMonth, 1, 0, 1)})
	})
}

func check(t *testing.T, got, want []usage.Record) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("got %d records, want %d:\n%+v\nwant\n%+v", len(got), len(want), got, want)
	}
	for i := range got {
		g, w := got[i], want[i]
		if g.Tenant != w.Tenant || g.Rule != w.Rule || !g.PeriodStart.Equal(w.PeriodStart) || !g.PeriodEnd.Equal(w.PeriodEnd) ||
			g.Admitted != w.Admitted || g.Refused != w.Refused || g.Cost != w.Cost {
			t.Errorf("record %d: %+v, want %+v", i, g, w)
		}
	}
}
