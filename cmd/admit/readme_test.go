package main

import (
	"bytes"
	"context"
	"io"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"
)

// walkthrough returns the README's walk through the demo tenants: its
// shell block, the lines a test can run against a server at base (curl,
// and the variables they use), and the admit check command line.
func walkthrough(t *testing.T, base string) (script string, check []string) {
	t.Helper()
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	s := string(readme)
	start := strings.Index(s, "## A walk through the demo tenants")
	block := s[start:]
	block = block[strings.Index(block, "then:\n\n```sh\n")+len("then:\n\n```sh\n"):]
	block = block[:strings.Index(block, "```")]
	var out []string
	lines := strings.Split(block, "\n")
	for i := 0; i < len(lines); i++ {
		line := lines[i]
		cmd := line
		for strings.HasSuffix(lines[i], `\`) && i+1 < len(lines) {
			i++
			cmd += "\n" + lines[i]
		}
		switch {
		case strings.HasPrefix(line, "go run ./cmd/admit check"):
			check = strings.Fields(strings.TrimPrefix(line, "go run ./cmd/admit "))
		case strings.Contains(cmd, "<lease_id>"), strings.HasPrefix(line, "go run"), strings.HasPrefix(line, "grpcurl"):
			// A placeholder to fill by hand; servers that run until stopped.
		case strings.HasPrefix(line, "curl"), strings.HasPrefix(line, "for "), strings.HasPrefix(line, "ADMIN="):
			out = append(out, cmd)
		}
	}
	script = strings.ReplaceAll(strings.Join(out, "\n"), "localhost:8080", strings.TrimPrefix(base, "http://"))
	// Each curl writes its status on a line of its own after its output.
	script = regexp.MustCompile(`\bcurl `).ReplaceAllString(script, `curl -w '\nSTATUS %{http_code}\n' `)
	for i, a := range check {
		check[i] = strings.ReplaceAll(a, "http://localhost:8080", base)
	}
	return script, check
}

// TestREADMEWalkthrough runs the README's walk through the demo tenants
// as a reader would, against admit serve started as it says, twice, the
// second time after a restart on the same data directory: every request
// answers as its comment says, and the second run as the first (the
// walk-through undoes its changes to the catalog).
func TestREADMEWalkthrough(t *testing.T) {
	dir := t.TempDir()
	tokens := map[string]string{"ADMIT_ADMIN_TOKEN": "admin-secret", "ADMIT_SERVICE_TOKEN": "backend-secret"}
	var runs [2][]string
	for i := range runs {
		srv := startCmdEnv(t, tokens, "serve", "--http", "127.0.0.1:0", "--grpc", "127.0.0.1:0", "--data-dir", dir)
		script, check := walkthrough(t, srv.url)
		cmd := exec.Command("bash", "-c", script)
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("run %d: %v: %s", i+1, err, stderr.String())
		}
		for _, line := range strings.Split(string(out), "\n") {
			// A status line of ours, or the one a command writes itself.
			if code, ok := strings.CutPrefix(line, "STATUS "); ok {
				runs[i] = append(runs[i], code)
			} else if regexp.MustCompile(`^\d{3}$`).MatchString(line) {
				runs[i] = append(runs[i], line)
			}
		}
		if len(check) == 0 {
			t.Fatal("no admit check line in the walk-through")
		}
		if code := run(context.Background(), check, &env{stdout: io.Discard, stderr: io.Discard, getenv: os.Getenv}); code != 0 {
			t.Errorf("run %d: %v exited %d, want 0 (admitted)", i+1, check, code)
		}
		if code := srv.stop(); code != 0 {
			t.Fatalf("serve exited %d", code)
		}
	}
	// The report of a debit past the bucket answers 429 as information
	// (docs/api.md); globex, once it has a key, 401.
	want := "200 200 200 429 429 200 200 200 200 200 201 200 200 200 201 401 204 200"
	for i, got := range runs {
		if strings.Join(got, " ") != want {
			t.Errorf("run %d: statuses %s\nwant %s", i+1, strings.Join(got, " "), want)
		}
	}
}
