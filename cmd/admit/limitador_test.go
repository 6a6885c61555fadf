package main

import (
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TestFileDigestTellsRewritesApart: a file rewritten in place, caught
// twice at the same cut (the same bytes), reads as two contents, so that
// the settle period starts again at each write and a writer rewriting it
// more often than that period never has its first half applied.
func TestFileDigestTellsRewritesApart(t *testing.T) {
	file := filepath.Join(t.TempDir(), "limits.yaml")
	half := []byte("- namespace: other\n  max_value: 1\n")
	write := func(at time.Time) [32]byte {
		t.Helper()
		if err := os.WriteFile(file, half, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chtimes(file, at, at); err != nil {
			t.Fatal(err)
		}
		return fileDigest(file)
	}
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	if a, b := write(t0), write(t0.Add(time.Second)); a == b {
		t.Fatal("two writes of the same half read as one settled file")
	}
	if a, b := write(t0), write(t0); a != b {
		t.Fatal("the same file read twice differs")
	}
}
