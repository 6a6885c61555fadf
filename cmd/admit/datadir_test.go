package main

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// TestDataDirIsOneServers: a data directory is locked by the server that
// uses it; a second is refused, naming the holder's PID; once released it
// can be taken again, and a crash's temporary files are gone.
func TestDataDirIsOneServers(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "data")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	leftover := filepath.Join(dir, ".catalog-123.tmp")
	if err := os.WriteFile(leftover, []byte("{half"), 0o600); err != nil {
		t.Fatal(err)
	}
	release, err := lockDataDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(leftover); !os.IsNotExist(err) {
		t.Errorf("a crash's temporary file is still there: %v", err)
	}
	_, err = lockDataDir(dir)
	if err == nil || !strings.Contains(err.Error(), "in use by another admit (pid "+strconv.Itoa(os.Getpid())+")") {
		t.Fatalf("a second lock of a held data directory: %v; want refused, naming pid %d", err, os.Getpid())
	}
	release()
	again, err := lockDataDir(dir)
	if err != nil {
		t.Fatalf("after release: %v", err)
	}
	again()
}
