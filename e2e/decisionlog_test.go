package e2e

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"testing"
	"time"
)

// TestDecisionLogFullDisk: `admit serve --decision-log` on a tmpfs that
// fills up. Every line it could not write is counted, none is left in
// part, the failure is logged and shown (admit_decision_log_failing), and
// once there is room again the log is written again (it once wrote 108
// lines of 300 and half of one, then nothing more, silently).
func TestDecisionLogFullDisk(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("mounting a tmpfs needs root")
	}
	disk := filepath.Join(t.TempDir(), "disk")
	if err := os.MkdirAll(disk, 0o700); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", disk).CombinedOutput(); err != nil {
		t.Fatalf("mount tmpfs: %v %s", err, out)
	}
	t.Cleanup(func() { _ = exec.Command("umount", "-l", disk).Run() })
	// Leave room for about a hundred lines.
	filler := filepath.Join(disk, "filler")
	if out, err := exec.Command("dd", "if=/dev/zero", "of="+filler, "bs=1k", "count=236").CombinedOutput(); err != nil {
		t.Fatalf("dd: %v %s", err, out)
	}
	cfg := filepath.Join(t.TempDir(), "admit.yaml")
	if err := os.WriteFile(cfg, []byte("version: 1\ntiers:\n  free:\n    rules:\n      - {name: calls, scope: tenant, algorithm: token_bucket, rate: 1000/s, burst: 1000}\ntenants:\n  acme: {tier: free}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	logFile := filepath.Join(disk, "decisions.log")
	p := startAdmit(t, "--config", cfg, "--decision-log", logFile)
	checks := func(n int) {
		t.Helper()
		for range n {
			if code, body := call(t, p, "POST", "/v1/check", `{"tenant":"acme"}`, "", false); code != 200 {
				t.Fatalf("check: %d %s", code, body)
			}
		}
	}
	// lines waits until the log has written or dropped all of sent, and
	// returns its whole lines, failing t on part of one.
	lines := func(sent int) int {
		t.Helper()
		var n int
		waitFor(t, 10*time.Second, "the decision log writing or dropping every decision", func() bool {
			data, err := os.ReadFile(logFile)
			if err != nil {
				t.Fatal(err)
			}
			n = bytes.Count(data, []byte("\n"))
			if len(data) > 0 && data[len(data)-1] != '\n' {
				return false // a write that did not fit, before it is cut back
			}
			for _, l := range bytes.Split(bytes.TrimSuffix(data, []byte("\n")), []byte("\n")) {
				var e map[string]any
				if len(l) > 0 && json.Unmarshal(l, &e) != nil {
					t.Fatalf("a line that is not JSON: %q", l)
				}
			}
			return n+int(metric(t, p.url, "admit_decision_log_dropped_total")) >= sent
		})
		return n
	}
	checks(300)
	written := lines(300)
	dropped := metric(t, p.url, "admit_decision_log_dropped_total")
	t.Logf("300 decisions on a disk with room for some: %d lines written, %.0f dropped", written, dropped)
	if written == 0 || written == 300 || float64(written)+dropped != 300 {
		t.Fatalf("%d lines written and %.0f counted dropped of 300", written, dropped)
	}
	if metric(t, p.url, "admit_decision_log_failing") != 1 || len(p.log.matching(regexp.MustCompile(`the decision log cannot be written.*no space left`))) == 0 {
		t.Errorf("a full disk is not said: failing %v", metric(t, p.url, "admit_decision_log_failing"))
	}
	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	time.Sleep(1100 * time.Millisecond) // the retry's wait
	checks(100)
	if got := lines(400); got != written+100 {
		t.Errorf("with room again: %d lines, want %d", got, written+100)
	}
	if metric(t, p.url, "admit_decision_log_failing") != 0 || len(p.log.matching(regexp.MustCompile(`the decision log is written again`))) == 0 {
		t.Errorf("the log written again is not said: failing %v", metric(t, p.url, "admit_decision_log_failing"))
	}
}
