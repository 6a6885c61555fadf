package main

import (
	"os"
	"strings"
	"testing"

	"github.com/admitdev/admit/internal/readmetest"
	"github.com/admitdev/admit/redistest"
)

// TestMain lets the test binary be the example's worker process: run
// starts its own executable with -worker, which here is this binary.
func TestMain(m *testing.M) {
	for _, a := range os.Args[1:] {
		if a == "-worker" {
			main()
			os.Exit(0)
		}
	}
	os.Exit(m.Run())
}

// Two processes on one real redis-server: run fails if they admitted more
// than the bucket holds; and each admitted something.
func TestExample(t *testing.T) {
	srv := redistest.Start(t)
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	per, err := run("redis://"+srv.Addr, self)
	if err != nil {
		t.Fatal(err)
	}
	if per[0] == 0 || per[1] == 0 {
		t.Errorf("admitted %v: a process admitted nothing", per)
	}
}

// TestREADME: the line README.md gives for opening the store in Redis is
// this example's, but for the URL it reads from a flag.
func TestREADME(t *testing.T) {
	line := readmetest.Inline(t, "(`examples/redis`): ")
	if want := strings.Replace(line, `"redis://…"`, "url", 1); !strings.Contains(readmetest.File(t, "main.go"), "\t"+want) {
		t.Errorf("README.md's %q is not in examples/redis/main.go (as %q)", line, want)
	}
}
