package usage_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/admitdev/admit/policy/usage"
	"github.com/admitdev/admit/policy/usage/usagetest"
)

func TestFileUsageConformance(t *testing.T) {
	usagetest.Run(t, func(t *testing.T) usage.Store {
		u, err := usage.OpenFile(filepath.Join(t.TempDir(), "usage.jsonl"), 0, 0)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { u.Close() })
		return u
	})
}

// TestFileUsageSurvivesRestarts: the records added are there after the
// journal is opened again, a crash's cut-short last line is skipped, and
// the journal is compacted, not grown without end.
func TestFileUsageSurvivesRestarts(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "data", "usage.jsonl")
	start := time.Now().UTC().Truncate(24 * time.Hour)
	rec := func(admitted int64) []usage.Record {
		return []usage.Record{{Tenant: "acme", Rule: "calls", PeriodStart: start, PeriodEnd: start.Add(24 * time.Hour), Admitted: admitted, Cost: admitted}}
	}
	u, err := usage.OpenFile(path, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	for range 3000 {
		if err := u.AddUsage(ctx, rec(2)); err != nil {
			t.Fatal(err)
		}
	}
	u.Close() // as a kill would leave it: nothing flushed at close
	// A crash cut the last line short.
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteString(`{"tenant":"acme","rule":"calls","period_st`); err != nil {
		t.Fatal(err)
	}
	f.Close()
	if st, _ := os.Stat(path); st.Size() > 20_000 {
		t.Errorf("the journal of 3000 additions to one record is %d bytes: not compacted", st.Size())
	}
	u, err = usage.OpenFile(path, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer u.Close()
	got, err := u.Usage(ctx, "acme", start, start.Add(24*time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got[0].Admitted != 6000 || got[0].Cost != 6000 {
		t.Fatalf("after a restart: %+v, want one record of 6000 admitted", got)
	}
}
