package main

import (
	"io"
	"os"
	"testing"

	"github.com/admitdev/admit/internal/readmetest"
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
	if block := readmetest.Block(t, "## Quick start (library)", "go"); block != readmetest.File(t, "main.go") {
		t.Errorf("README.md's quick start differs from examples/quickstart/main.go:\n%s", block)
	}
}
