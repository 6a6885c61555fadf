package main

import (
	"strings"
	"testing"
)

// TestLines: a package's line when it ends, a failed test's output in
// full, a build failure, the slowest tests, and the exit code.
func TestLines(t *testing.T) {
	in := strings.Join([]string{
		`{"Action":"start","Package":"a"}`,
		`{"Action":"run","Package":"a","Test":"TestOK"}`,
		`{"Action":"output","Package":"a","Test":"TestOK","Output":"quiet\n"}`,
		`{"Action":"pass","Package":"a","Test":"TestOK","Elapsed":2.5}`,
		`{"Action":"pass","Package":"a","Elapsed":2.6}`,
		`{"Action":"run","Package":"b","Test":"TestBad"}`,
		`{"Action":"output","Package":"b","Test":"TestBad","Output":"b_test.go:9: wrong\n"}`,
		`{"Action":"fail","Package":"b","Test":"TestBad","Elapsed":0.1}`,
		`{"Action":"fail","Package":"b","Elapsed":0.2}`,
		`{"ImportPath":"c","Action":"build-output","Output":"c.go:1: syntax error\n"}`,
		`{"ImportPath":"c","Action":"build-fail"}`,
	}, "\n")
	var out strings.Builder
	if code := run(strings.NewReader(in), &out); code != 1 {
		t.Errorf("exit %d, want 1", code)
	}
	got := out.String()
	for _, want := range []string{"ok    a", "--- FAIL: b/TestBad (0.10s)\nb_test.go:9: wrong\n", "FAIL  b", "FAIL  c (build)\nc.go:1: syntax error", "2.5s  a/TestOK"} {
		if !strings.Contains(got, want) {
			t.Errorf("output lacks %q:\n%s", want, got)
		}
	}
	if strings.Contains(got, "quiet") {
		t.Errorf("a passing test's output printed:\n%s", got)
	}
	out.Reset()
	if code := run(strings.NewReader(`{"Action":"pass","Package":"a","Elapsed":1}`), &out); code != 0 {
		t.Errorf("all passed: exit %d", code)
	}
}
