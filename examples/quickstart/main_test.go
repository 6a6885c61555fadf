package main

import (
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// TestQuickStart runs the README's quick start and checks what it prints.
func TestQuickStart(t *testing.T) {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout := os.Stdout
	os.Stdout = w
	main()
	os.Stdout = stdout
	w.Close()
	out, _ := io.ReadAll(r)
	if string(out) != "true 49\n" {
		t.Errorf("printed %q, want %q", out, "true 49\n")
	}
}

// TestREADME: the quick start in README.md is this program, to the byte,
// so that what a reader copies compiles.
func TestREADME(t *testing.T) {
	_, here, _, _ := runtime.Caller(0)
	dir := filepath.Dir(here)
	readme, err := os.ReadFile(filepath.Join(dir, "..", "..", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	prog, err := os.ReadFile(filepath.Join(dir, "main.go"))
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(readme), "## Quick start (library)")
	if !ok {
		t.Fatal("README.md has no Quick start (library) section")
	}
	_, block, ok := strings.Cut(section, "```go\n")
	block, _, ok2 := strings.Cut(block, "```")
	if !ok || !ok2 {
		t.Fatal("the quick start section has no Go block")
	}
	if block != string(prog) {
		t.Errorf("README.md's quick start differs from examples/quickstart/main.go:\n%s", block)
	}
}
