package e2e

import (
	"encoding/json"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/admitdev/admit/redistest"
)

// recordsConfig has tenant acme with a monthly quota of 1000.
const recordsConfig = `version: 1
store:
  on_error: closed
  redis:
    timeout: 2s
tiers:
  paid:
    rules:
      - {name: monthly, scope: tenant, algorithm: quota, limit: 1000, period: month, time_zone: UTC}
tenants:
  acme: {tier: paid}
`

// recordsServer starts `admit serve` on store with data directory dir.
func recordsServer(t *testing.T, store, dir string) *admitProcess {
	t.Helper()
	cfg := filepath.Join(t.TempDir(), "admit.yaml")
	if err := os.WriteFile(cfg, []byte(recordsConfig), 0o644); err != nil {
		t.Fatal(err)
	}
	return startAdmitEnv(t, []string{"ADMIT_ADMIN_TOKEN=" + catalogToken}, "--config", cfg, "--store", store, "--data-dir", dir)
}

// quotaChecks makes n checks of acme, each admitted.
func quotaChecks(t *testing.T, p *admitProcess, n int) {
	t.Helper()
	for range n {
		if code, body := call(t, p, "POST", "/v1/check", `{"tenant":"acme"}`, "", false); code != 200 {
			t.Fatalf("a check of acme's quota: %d %s", code, body)
		}
	}
}

// recorded returns the admitted count of acme's record of this month.
func recorded(t *testing.T, p *admitProcess) int64 {
	t.Helper()
	code, body := call(t, p, "GET", "/v1/admin/usage?tenant=acme", "", "", true)
	if code != 200 {
		t.Fatalf("usage records: %d %s", code, body)
	}
	var u struct {
		Records []struct {
			Rule     string `json:"rule"`
			Admitted int64  `json:"admitted"`
		} `json:"records"`
	}
	if err := json.Unmarshal([]byte(body), &u); err != nil {
		t.Fatalf("%v: %s", err, body)
	}
	n := int64(0)
	for _, r := range u.Records {
		if r.Rule == "monthly" {
			n += r.Admitted
		}
	}
	return n
}

// used returns what acme's quota has counted, as /v1/usage reads it.
func used(t *testing.T, p *admitProcess) int64 {
	t.Helper()
	code, body := call(t, p, "GET", "/v1/usage?tenant=acme", "", "", true)
	if code != 200 {
		t.Fatalf("usage: %d %s", code, body)
	}
	var u struct {
		Rules []struct {
			Name string `json:"name"`
			Used int64  `json:"used"`
		} `json:"rules"`
	}
	if err := json.Unmarshal([]byte(body), &u); err != nil {
		t.Fatalf("%v: %s", err, body)
	}
	for _, r := range u.Rules {
		if r.Name == "monthly" {
			return r.Used
		}
	}
	t.Fatalf("no quota monthly in %s", body)
	return 0
}

// kill stops p with SIGKILL, as a crash would, and waits for it.
func kill(t *testing.T, p *admitProcess) {
	t.Helper()
	if err := p.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = p.cmd.Wait()
}

// TestRecordsSurviveRestarts: the usage records of a quota outlive the
// server. On the memory store they are kept in --data-dir (a restart
// emptied them): 60 admitted are 60 recorded after a SIGTERM, and after
// a SIGKILL a second after the last. On Redis, a SIGKILL a second after
// the last check loses none (it lost all 60), and one at once loses at
// most the decisions of the last second, the bound the docs give; the
// quota's own count keeps all.
func TestRecordsSurviveRestarts(t *testing.T) {
	t.Run("memory", func(t *testing.T) {
		dir := filepath.Join(t.TempDir(), "data")
		p := recordsServer(t, "memory", dir)
		quotaChecks(t, p, 60)
		if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		_ = p.cmd.Wait()
		p = recordsServer(t, "memory", dir)
		if got := recorded(t, p); got != 60 {
			t.Fatalf("after a SIGTERM: %d recorded of 60 admitted", got)
		}
		quotaChecks(t, p, 40)
		time.Sleep(1500 * time.Millisecond) // the records' write, every second
		kill(t, p)
		p = recordsServer(t, "memory", dir)
		if got := recorded(t, p); got != 100 {
			t.Errorf("after a SIGKILL 1.5 s after the last check: %d recorded of 100 admitted", got)
		}
	})
	t.Run("redis", func(t *testing.T) {
		redis := redistest.Start(t)
		store := "redis://" + redis.Addr
		p := recordsServer(t, store, t.TempDir())
		quotaChecks(t, p, 60)
		time.Sleep(1500 * time.Millisecond)
		kill(t, p)
		p = recordsServer(t, store, t.TempDir())
		if got, q := recorded(t, p), used(t, p); got != 60 || q != 60 {
			t.Fatalf("after a SIGKILL 1.5 s after the last check: %d recorded, the quota counts %d, of 60 admitted", got, q)
		}
		start := time.Now()
		quotaChecks(t, p, 30)
		kill(t, p)
		within := time.Since(start)
		p = recordsServer(t, store, t.TempDir())
		got, q := recorded(t, p), used(t, p)
		t.Logf("30 checks in %v, then SIGKILL at once: %d recorded, the quota counts %d", within.Round(time.Millisecond), got, q)
		if q != 90 || got > 90 || got < 60 {
			t.Errorf("30 more checks, then SIGKILL at once: %d recorded (want 60 to 90), the quota counts %d (want 90)", got, q)
		}
	})
}
