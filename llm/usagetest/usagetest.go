// Package usagetest is the conformance suite of llm.UsageStore, run on
// the memory and the Redis implementations.
package usagetest

import (
	"context"
	"testing"
	"time"

	"github.com/admitdev/admit/llm"
	"github.com/admitdev/admit/units"
)

// Run checks a new, empty store: calls add up by tenant, model and UTC
// day, from any number of writers, and a tenant sees only its own days
// in the range asked.
func Run(t *testing.T, s llm.UsageStore) {
	ctx := context.Background()
	day1 := time.Date(2026, 3, 1, 23, 30, 0, 0, time.UTC)
	day2 := day1.Add(time.Hour) // 00:30 the next day
	recs := []*llm.Record{
		{Tenant: "acme", Model: "gpt-4o-mini", At: day1, Usage: units.Tokens{10, 2, 0, 5, 1}, Cost: 7, Reported: true},
		{Tenant: "acme", Model: "gpt-4o-mini", At: day1, Usage: units.Tokens{20, 0, 0, 5, 0}, Cost: 9, Reported: false},
		{Tenant: "acme", Model: "claude-haiku-4-5", At: day1, Usage: units.Tokens{1, 0, 3, 1, 0}, Reported: true},
		{Tenant: "acme", Model: "gpt-4o-mini", At: day2, Usage: units.Tokens{4, 0, 0, 4, 0}, Cost: 2, Reported: true},
		{Tenant: "other", Model: "gpt-4o-mini", At: day1, Usage: units.Tokens{100, 0, 0, 100, 0}, Cost: 100, Reported: true},
	}
	// Two writers, as two proxies.
	if err := s.Add(ctx, recs[:2]); err != nil {
		t.Fatal(err)
	}
	if err := s.Add(ctx, recs[2:]); err != nil {
		t.Fatal(err)
	}
	got, err := s.Usage(ctx, "acme", day1.Add(-48*time.Hour), day2.Add(48*time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	want := []llm.DayUsage{
		{Tenant: "acme", Model: "claude-haiku-4-5", Day: "2026-03-01", Requests: 1, Tokens: units.Tokens{1, 0, 3, 1, 0}},
		{Tenant: "acme", Model: "gpt-4o-mini", Day: "2026-03-01", Requests: 2, Unreported: 1, Tokens: units.Tokens{30, 2, 0, 10, 1}, Cost: 16},
		{Tenant: "acme", Model: "gpt-4o-mini", Day: "2026-03-02", Requests: 1, Tokens: units.Tokens{4, 0, 0, 4, 0}, Cost: 2},
	}
	if len(got) != len(want) {
		t.Fatalf("acme's usage: %+v, want %+v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("day %d: %+v, want %+v", i, got[i], want[i])
		}
	}
	// Only the second day.
	got, err = s.Usage(ctx, "acme", time.Date(2026, 3, 2, 0, 0, 0, 0, time.UTC), time.Date(2026, 3, 3, 0, 0, 0, 0, time.UTC))
	if err != nil || len(got) != 1 || got[0].Day != "2026-03-02" {
		t.Fatalf("acme's 2 March: %+v, %v", got, err)
	}
	if got, _ := s.Usage(ctx, "nobody", day1.Add(-48*time.Hour), day2); len(got) != 0 {
		t.Fatalf("a tenant without calls: %+v", got)
	}
}
