package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// podman runs podman as these machines need it: as root, with runc and
// cgroupfs (crun refuses their hybrid cgroups).
func podman(t *testing.T, args ...string) (string, error) {
	t.Helper()
	cmd := exec.Command("podman", append([]string{"--runtime", "runc", "--cgroup-manager=cgroupfs"}, args...)...)
	var out, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &stderr
	if err := cmd.Run(); err != nil {
		return strings.TrimSpace(out.String()), fmt.Errorf("podman %s: %v: %s", args[0], err, stderr.String())
	}
	// Without systemd, podman warns on stderr that it cannot schedule the
	// health check's timer; `podman healthcheck run` still runs it.
	return strings.TrimSpace(out.String()), nil
}

// TestContainerImage builds the image with `make image` (podman, nothing
// pulled), runs it, and checks what a user of it relies on: /healthz, a
// decision, the version, a user that is not root, the health check.
func TestContainerImage(t *testing.T) {
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	image := fmt.Sprintf("localhost/admit-e2e:%d", time.Now().UnixNano())
	build := exec.Command("make", "-s", "image", "IMAGE="+image)
	build.Dir = root
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("make image: %v\n%s", err, out)
	}
	t.Cleanup(func() { _, _ = podman(t, "rmi", "-f", image) })

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	// The machine's hard limits: podman's defaults ask for more.
	id, err := podman(t, "run", "-d", "--ulimit", "nofile=8192:8192", "--ulimit", "nproc=4096:4096",
		"-p", fmt.Sprintf("127.0.0.1:%d:8080", port), image)
	if err != nil {
		t.Fatalf("podman run: %v\n%s", err, id)
	}
	t.Cleanup(func() { _, _ = podman(t, "rm", "-f", "-t", "2", id) })
	url := fmt.Sprintf("http://127.0.0.1:%d", port)

	for deadline := time.Now().Add(20 * time.Second); ; {
		resp, err := http.Get(url + "/healthz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				break
			}
		}
		if time.Now().After(deadline) {
			logs, _ := podman(t, "logs", id)
			t.Fatalf("/healthz did not answer 200: %v\n%s", err, logs)
		}
		time.Sleep(100 * time.Millisecond)
	}
	resp, err := http.Post(url+"/v1/check", "application/json", strings.NewReader(`{"tenant":"t1234","action":"invoke-doc-summary-ai"}`))
	if err != nil {
		t.Fatal(err)
	}
	var d map[string]any
	_ = json.NewDecoder(resp.Body).Decode(&d)
	resp.Body.Close()
	if resp.StatusCode != 200 || d["allowed"] != true || d["tier"] != "free" {
		t.Fatalf("a decision in the container: %d %v", resp.StatusCode, d)
	}
	if user, err := podman(t, "top", id, "huser"); err != nil || !strings.Contains(user, "65532") || strings.Contains(user, "root") {
		t.Fatalf("the server's user: %q (%v), want 65532, not root", user, err)
	}
	if v, err := podman(t, "exec", id, "/admit", "version"); err != nil || !strings.HasPrefix(v, "admit ") || strings.Contains(v, "commit unknown") {
		t.Fatalf("admit version in the image: %q (%v)", v, err)
	}
	if out, err := podman(t, "healthcheck", "run", id); err != nil {
		t.Fatalf("the image's health check: %v %s", err, out)
	}

	// As Envoy Gateway runs it: /bin/ratelimit, as its user, configured
	// by envoyproxy/ratelimit's variables.
	conf := t.TempDir()
	if err := os.WriteFile(filepath.Join(conf, "rl.yaml"), []byte("domain: rl\ndescriptors:\n  - key: k\n    rate_limit: {unit: day, requests_per_unit: 1}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	ln, err = net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port = ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	rl, err := podman(t, "run", "-d", "--ulimit", "nofile=8192:8192", "--ulimit", "nproc=4096:4096", "--user", "65534:65534",
		"--entrypoint", "/bin/ratelimit", "-e", "RUNTIME_ROOT=/data", "-e", "RUNTIME_SUBDIRECTORY=ratelimit", "-e", "LOG_LEVEL=info",
		"-v", conf+":/data/ratelimit/config:ro", "-p", fmt.Sprintf("127.0.0.1:%d:8080", port), image)
	if err != nil {
		t.Fatalf("podman run /bin/ratelimit: %v\n%s", err, rl)
	}
	t.Cleanup(func() { _, _ = podman(t, "rm", "-f", "-t", "2", rl) })
	for deadline := time.Now().Add(20 * time.Second); ; {
		resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/healthcheck", port))
		if err == nil {
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK && string(body) == "OK" {
				break
			}
		}
		if time.Now().After(deadline) {
			logs, _ := podman(t, "logs", rl)
			t.Fatalf("/bin/ratelimit's /healthcheck did not answer OK: %v\n%s", err, logs)
		}
		time.Sleep(100 * time.Millisecond)
	}
	// A container's log is on podman logs' standard error.
	if logs, _ := exec.Command("podman", "logs", rl).CombinedOutput(); !strings.Contains(string(logs), "envoy_domains=rl") {
		t.Fatalf("/bin/ratelimit did not load the runtime directory:\n%s", logs)
	}
}
