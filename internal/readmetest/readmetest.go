// Package readmetest reads the code of the module's README.md, for the
// tests that hold each code block to a program or a command that runs.
package readmetest

import (
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// Block returns the first code block of language lang ("go", "sh") that
// follows marker in README.md, without its fences. It fails the test when
// there is none.
func Block(t testing.TB, marker, lang string) string {
	t.Helper()
	_, after, ok := strings.Cut(readme(t), marker)
	_, block, ok2 := strings.Cut(after, "```"+lang+"\n")
	block, _, ok3 := strings.Cut(block, "```")
	if !ok || !ok2 || !ok3 {
		t.Fatalf("README.md has no %s block after %q", lang, marker)
	}
	return block
}

// Inline returns the inline code (between backquotes) that immediately
// follows marker in README.md.
func Inline(t testing.TB, marker string) string {
	t.Helper()
	_, after, ok := strings.Cut(readme(t), marker+"`")
	code, _, ok2 := strings.Cut(after, "`")
	if !ok || !ok2 {
		t.Fatalf("README.md has no inline code after %q", marker)
	}
	return code
}

// File returns the contents of name, a file of the calling test's package
// directory.
func File(t testing.TB, name string) string {
	t.Helper()
	b, err := os.ReadFile(name)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func readme(t testing.TB) string {
	t.Helper()
	_, here, _, _ := runtime.Caller(0)
	return File(t, filepath.Join(filepath.Dir(here), "..", "..", "README.md"))
}
