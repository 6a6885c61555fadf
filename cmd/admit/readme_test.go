package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/admitdev/admit/internal/readmetest"
	"github.com/coder/websocket"
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
		case strings.HasPrefix(line, "go run"), strings.HasPrefix(line, "grpcurl"):
			// Servers that run until stopped; grpcurl: TestREADMEEnvoyPath.
		case strings.HasPrefix(line, "curl"), strings.HasPrefix(line, "for "), strings.HasPrefix(line, "ADMIN="), strings.HasPrefix(line, "LEASE="):
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
	tokens := readmeServeEnv(t)
	var runs [2][]string
	for i := range runs {
		srv := startCmdEnv(t, tokens, "serve", "--http", "127.0.0.1:0", "--grpc", "127.0.0.1:0", "--data-dir", dir)
		checkFirstHeaders(t, srv.url)
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
	// The report of a debit past the bucket answers 200, charged, with
	// over_limit (docs/api.md); t1234 moved to premium keeps its drained
	// bucket, 429; the lease taken into $LEASE is released, 204; globex,
	// once it has a key, 401.
	want := "200 200 200 429 200 200 200 429 200 200 204 200 200 200 201 401 204 200"
	for i, got := range runs {
		if strings.Join(got, " ") != want {
			t.Errorf("run %d: statuses %s\nwant %s", i+1, strings.Join(got, " "), want)
		}
	}
}

// shellWords splits a command line as bash does.
func shellWords(t *testing.T, line string) []string {
	t.Helper()
	out, err := exec.Command("bash", "-c", `printf '%s\0' `+line).Output()
	if err != nil {
		t.Fatalf("%s: %v", line, err)
	}
	return strings.Split(strings.TrimSuffix(string(out), "\x00"), "\x00")
}

// TestREADMESimulate runs the README's simulate command as it is written
// (drawing into a temporary file), and make pictures draws the README's
// picture with the same command.
func TestREADMESimulate(t *testing.T) {
	block := readmetest.Block(t, "drawn by `make pictures`:", "sh")
	line := strings.TrimSpace(strings.ReplaceAll(block, "\\\n", " "))
	args, ok := strings.CutPrefix(line, "go run ./cmd/admit ")
	if !ok {
		t.Fatalf("the simulate block runs %q", line)
	}
	words := shellWords(t, args)
	out := filepath.Join(t.TempDir(), "seed004.png")
	found := false
	for i, w := range words {
		if w == "--out" && i+1 < len(words) {
			if words[i+1] != "docs/img/seed004.png" {
				t.Errorf("the README's picture is docs/img/seed004.png, the command draws %s", words[i+1])
			}
			words[i+1], found = out, true
		}
	}
	if !found {
		t.Fatal("the simulate command has no --out")
	}
	var stderr bytes.Buffer
	if code := run(context.Background(), words, &env{stdout: io.Discard, stderr: &stderr, getenv: func(string) string { return "" }}); code != 0 {
		t.Fatalf("%v exited %d: %s", words, code, stderr.String())
	}
	png, err := os.ReadFile(out)
	if err != nil || !bytes.HasPrefix(png, []byte("\x89PNG\r\n")) {
		t.Fatalf("no PNG drawn: %v", err)
	}
	makefile, err := os.ReadFile("../../Makefile")
	if err != nil {
		t.Fatal(err)
	}
	_, recipe, _ := strings.Cut(string(makefile), "\npictures:")
	recipe, _, _ = strings.Cut(recipe, "\n\n")
	recipe = strings.Join(strings.Fields(strings.ReplaceAll(recipe, "\\\n", " ")), " ")
	if !strings.Contains(recipe, "$(GO) run ./cmd/admit "+strings.Join(strings.Fields(args), " ")) {
		t.Errorf("make pictures runs\n%s\nnot the README's\n%s", recipe, args)
	}
}

// readmeServeEnv returns the environment the README's walk-through starts
// admit serve with, checking that it starts it as the two commands do.
func readmeServeEnv(t *testing.T) map[string]string {
	t.Helper()
	words := shellWords(t, strings.TrimSpace(readmetest.Block(t, "## A walk through the demo tenants", "sh")))
	environ := map[string]string{}
	for len(words) > 0 && strings.Contains(words[0], "=") {
		k, v, _ := strings.Cut(words[0], "=")
		environ[k] = v
		words = words[1:]
	}
	if strings.Join(words, " ") != "go run ./cmd/admit serve" || environ["ADMIT_ADMIN_TOKEN"] == "" || environ["ADMIT_SERVICE_TOKEN"] == "" {
		t.Fatalf("the walk-through starts %v with %v, want go run ./cmd/admit serve with both tokens", words, environ)
	}
	return environ
}

// TestREADMESessions runs the README's WebSocket session block against
// admit serve on the demo configuration: the curl that opens a session,
// then a client connecting with its URL, sending its message and reading
// the echo it shows; a third connection of the session is refused with
// 429, as its last line says.
func TestREADMESessions(t *testing.T) {
	srv := startCmdEnv(t, readmeServeEnv(t), "serve", "--http", "127.0.0.1:0", "--grpc", "127.0.0.1:0", "--data-dir", t.TempDir())
	block := readmetest.Block(t, "for the sample client, or from a shell:", "sh")
	host := strings.TrimPrefix(srv.url, "http://")
	var curl, url, send, echo string
	for _, line := range strings.Split(block, "\n") {
		comment := strings.TrimSpace(strings.TrimLeft(line, "# "))
		switch {
		case strings.HasPrefix(line, "curl "):
			curl = strings.ReplaceAll(line, "localhost:8080", host)
		case strings.HasPrefix(comment, "go run ./examples/wsclient "):
			url = strings.Trim(strings.TrimPrefix(comment, "go run ./examples/wsclient "), `"`)
		case strings.HasPrefix(comment, "{"):
			send = comment
		case strings.HasPrefix(comment, "→ "):
			echo = strings.TrimPrefix(comment, "→ ")
		}
	}
	if curl == "" || url == "" || send == "" || echo == "" || !strings.Contains(block, "a third connection of the session is 429") {
		t.Fatalf("the session block lacks a step:\n%s", block)
	}
	out, err := exec.Command("bash", "-c", curl).Output()
	if err != nil {
		t.Fatalf("%s: %v", curl, err)
	}
	var opened struct {
		Tenant    string `json:"tenant"`
		SessionID string `json:"session_id"`
		ExpiresAt string `json:"expires_at"`
	}
	if err := json.Unmarshal(out, &opened); err != nil || opened.Tenant != "tenant-1" || opened.SessionID == "" || opened.ExpiresAt == "" {
		t.Fatalf("%s answered %s (%v), want the tenant, a session and its expiry", curl, out, err)
	}
	url = strings.Replace(strings.ReplaceAll(url, "localhost:8080", host), "session=…", "session="+opened.SessionID, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	// The README's client, as written: the line typed, the echo printed.
	client := exec.CommandContext(ctx, "go", "run", "./examples/wsclient", url)
	client.Dir = "../.."
	stdin, _ := client.StdinPipe()
	stdout, _ := client.StdoutPipe()
	if err := client.Start(); err != nil {
		t.Fatal(err)
	}
	_, _ = io.WriteString(stdin, send+"\n")
	got, err := bufio.NewReader(stdout).ReadString('\n')
	stdin.Close()
	if werr := client.Wait(); err != nil || werr != nil {
		t.Fatalf("go run ./examples/wsclient: %q, %v, %v", got, err, werr)
	}
	// Two connections held, the session's most: a third is refused.
	for i := range 2 {
		c, _, err := websocket.Dial(ctx, url, nil)
		if err != nil {
			t.Fatalf("connection %d: %v", i+1, err)
		}
		defer c.CloseNow()
	}
	var gotFields, wantFields map[string]any
	if err := json.Unmarshal([]byte(got), &gotFields); err != nil {
		t.Fatalf("echo %s: %v", got, err)
	}
	if err := json.Unmarshal([]byte(echo), &wantFields); err != nil {
		t.Fatalf("the README's echo %s: %v", echo, err)
	}
	for k, want := range wantFields {
		if want == "…" {
			if gotFields[k] == nil || gotFields[k] == "" {
				t.Errorf("echo %s has no %s", got, k)
			}
		} else if gotFields[k] != want {
			t.Errorf("echo %s: %s is %v, the README says %v", got, k, gotFields[k], want)
		}
	}
	_, resp, err := websocket.Dial(ctx, url, nil)
	if err == nil || resp == nil || resp.StatusCode != http.StatusTooManyRequests {
		code := 0
		if resp != nil {
			code = resp.StatusCode
		}
		t.Errorf("third connection of the session: %v, status %d, want 429", err, code)
	}
}

// checkFirstHeaders: the walk-through's first request, to a server just
// started, answers with the RateLimit-Policy and RateLimit headers its
// comment shows (as far as the comment goes before "...").
func checkFirstHeaders(t *testing.T, base string) {
	t.Helper()
	block := readmetest.Block(t, "then:\n\n", "sh")
	var body string
	want := map[string]string{}
	for _, line := range strings.Split(block, "\n") {
		if strings.HasPrefix(line, "curl -si localhost:8080/v1/check -d '") && body == "" {
			body = strings.TrimSuffix(strings.TrimPrefix(line, "curl -si localhost:8080/v1/check -d '"), "'")
		}
		for _, h := range []string{"RateLimit-Policy", "RateLimit"} {
			if _, v, ok := strings.Cut(line, " "+h+": "); ok && strings.HasPrefix(line, "#") && want[h] == "" {
				want[h] = strings.TrimSuffix(v, ", ...")
			}
		}
	}
	if body == "" || want["RateLimit"] == "" || want["RateLimit-Policy"] == "" {
		t.Fatalf("the walk-through's first request or its headers are not in README.md: %q %v", body, want)
	}
	resp, err := http.Post(base+"/v1/check", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	for h, v := range want {
		if got := resp.Header.Get(h); !strings.HasPrefix(got, v) {
			t.Errorf("the first request's %s is %q; README.md says it begins %q", h, got, v)
		}
	}
}

// TestAPIDocExamples runs every curl line of docs/api.md's shell blocks
// against admit serve on the built-in demo, as a reader would paste them:
// each answers 2xx.
func TestAPIDocExamples(t *testing.T) {
	doc, err := os.ReadFile("../../docs/api.md")
	if err != nil {
		t.Fatal(err)
	}
	srv := startCmd(t, "serve", "--http", "127.0.0.1:0", "--grpc", "127.0.0.1:0", "--data-dir", t.TempDir())
	n := 0
	for _, b := range regexp.MustCompile("(?s)```sh\n(.*?)```").FindAllStringSubmatch(string(doc), -1) {
		lines := strings.Split(b[1], "\n")
		for i := 0; i < len(lines); i++ {
			line := lines[i]
			for strings.HasSuffix(line, `\`) && i+1 < len(lines) {
				i++
				line = strings.TrimSuffix(line, `\`) + lines[i]
			}
			if !strings.HasPrefix(line, "curl ") || !strings.Contains(line, "localhost:8080") {
				continue
			}
			n++
			script := strings.ReplaceAll(line, "localhost:8080", strings.TrimPrefix(srv.url, "http://")) + " -o /dev/null -w '%{http_code}'"
			out, err := exec.Command("bash", "-c", script).Output()
			if err != nil || len(out) != 3 || out[0] != '2' {
				t.Errorf("%s\n answered %s (%v)", line, out, err)
			}
		}
	}
	if n < 3 {
		t.Fatalf("%d curl lines found in docs/api.md", n)
	}
}
