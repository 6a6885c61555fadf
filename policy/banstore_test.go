package policy_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/admitdev/admit/policy"
	"github.com/admitdev/admit/policy/banstest"
)

func TestMemoryBansConformance(t *testing.T) {
	banstest.Run(t, func(t *testing.T) func() policy.BanStore {
		m := &policy.MemoryBans{}
		return func() policy.BanStore { return m }
	})
}

// TestMemoryBansSurviveRestart reads a file another process wrote: bans
// and their history are the file's.
func TestMemoryBansSurviveRestart(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "bans.json")
	at := time.Now().Truncate(time.Millisecond)
	first := &policy.MemoryBans{Path: path}
	e := policy.Escalated{Key: "k", Ban: policy.Ban{ID: "x", Scope: policy.BanIP, Value: "192.0.2.1", Source: "escalation:e"},
		Base: time.Minute, Max: time.Hour, Forget: time.Hour}
	if _, _, err := first.Escalate(ctx, e, at); err != nil {
		t.Fatal(err)
	}
	if _, _, err := first.Add(ctx, policy.Ban{ID: "y", Scope: policy.BanTenant, Value: "acme", Source: "admin", Created: at, Expires: at.Add(time.Hour)}, at); err != nil {
		t.Fatal(err)
	}
	again := &policy.MemoryBans{Path: path}
	st, err := again.Load(ctx, at.Add(time.Second))
	if err != nil || len(st.Bans) != 2 || st.History["k"].Strikes != 1 {
		t.Fatalf("after a restart: %+v, %v; want 2 bans and 1 strike", st, err)
	}
	// The next escalation, after the first ban ended, doubles.
	b, _, err := again.Escalate(ctx, e, at.Add(2*time.Minute))
	if err != nil || b.Strike != 2 || b.Expires.Sub(at.Add(2*time.Minute)) != 2*time.Minute {
		t.Fatalf("second escalation after a restart: %+v, %v", b, err)
	}
}

// TestMemoryBansJournalCompacts grows the journal past twice what is in
// force, and reads back what is.
func TestMemoryBansJournalCompacts(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "bans.jsonl")
	at := time.Now().Truncate(time.Millisecond)
	m := &policy.MemoryBans{Path: path}
	for i := range 300 {
		b := policy.Ban{ID: fmt.Sprint("b", i), Scope: policy.BanTenant, Value: fmt.Sprint("t", i), Source: "admin", Created: at, Expires: at.Add(time.Hour)}
		if _, _, err := m.Add(ctx, b, at); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 250 {
		if _, err := m.Remove(ctx, fmt.Sprint("b", i), at); err != nil {
			t.Fatal(err)
		}
	}
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if lines := bytes.Count(data, []byte("\n")); lines > 2*50+100 {
		t.Errorf("the journal holds %d lines for 50 bans; want it compacted", lines)
	}
	st, err := (&policy.MemoryBans{Path: path}).Load(ctx, at)
	if err != nil || len(st.Bans) != 50 {
		t.Fatalf("read back %d bans, %v; want 50", len(st.Bans), err)
	}
}

// TestMemoryBansRefuseABrokenJournal names the file and line of a journal
// that is not one.
func TestMemoryBansRefuseABrokenJournal(t *testing.T) {
	path := filepath.Join(t.TempDir(), "bans.jsonl")
	if err := os.WriteFile(path, []byte("{\"remove\":\"x\"}\n{oops\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := (&policy.MemoryBans{Path: path}).Load(context.Background(), time.Now())
	if err == nil || !strings.Contains(err.Error(), path+", line 2") {
		t.Fatalf("Load = %v; want the file and line 2", err)
	}
}

// TestMemoryBansDropATornLine: a crash in the middle of a change leaves
// its line cut short; the bans before it load, and the next change is
// journaled after them.
func TestMemoryBansDropATornLine(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "bans.jsonl")
	at := time.Now().Truncate(time.Millisecond)
	m := &policy.MemoryBans{Path: path}
	if _, _, err := m.Add(ctx, policy.Ban{ID: "a", Scope: policy.BanTenant, Value: "acme", Source: "admin", Created: at, Expires: at.Add(time.Hour)}, at); err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = f.WriteString(`{"ban":{"id":"b","scope":"ip","val`)
	f.Close()
	again := &policy.MemoryBans{Path: path}
	st, err := again.Load(ctx, at)
	if err != nil || len(st.Bans) != 1 || st.Bans[0].ID != "a" {
		t.Fatalf("after a torn line: %+v, %v", st, err)
	}
	if _, _, err := again.Add(ctx, policy.Ban{ID: "c", Scope: policy.BanTenant, Value: "beta", Source: "admin", Created: at, Expires: at.Add(time.Hour)}, at); err != nil {
		t.Fatal(err)
	}
	st, err = (&policy.MemoryBans{Path: path}).Load(ctx, at)
	if err != nil || len(st.Bans) != 2 {
		t.Fatalf("after the next change: %+v, %v", st, err)
	}
}
