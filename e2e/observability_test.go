package e2e

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"

	"github.com/admitdev/admit/redistest"
)

// promtool runs Prometheus's promtool (Debian's prometheus package).
func promtool(t *testing.T, dir string, args ...string) {
	t.Helper()
	cmd := exec.Command("promtool", args...)
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
	}
}

// TestAlertRules checks deploy/prometheus/alerts.yaml and runs the unit
// test of each alert.
func TestAlertRules(t *testing.T) {
	dir := filepath.Join("..", "deploy", "prometheus")
	promtool(t, dir, "check", "rules", "alerts.yaml")
	promtool(t, dir, "test", "rules", "alerts_test.yaml")
}

var metricName = regexp.MustCompile(`\badmit_[a-z_]+\b`)

// TestDashboardAndAlertsNameRealMetrics: every query of the Grafana
// dashboard parses (promtool checks them as recording rules), and every
// metric the dashboard and the alerts name is one a running admit serve
// exports, on the memory store or on Redis.
func TestDashboardAndAlertsNameRealMetrics(t *testing.T) {
	data, err := os.ReadFile("../deploy/grafana/admit.json")
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Panels []struct {
			Title   string
			Targets []struct{ Expr string }
		}
	}
	if err := json.Unmarshal(data, &dash); err != nil {
		t.Fatal(err)
	}
	var rules strings.Builder
	rules.WriteString("groups:\n  - name: dashboard\n    rules:\n")
	used := map[string]bool{}
	n := 0
	for _, p := range dash.Panels {
		for _, tg := range p.Targets {
			expr := strings.ReplaceAll(tg.Expr, "$instance", ".*")
			fmt.Fprintf(&rules, "      - record: dashboard:query%d\n        expr: %q\n", n, expr)
			n++
			for _, m := range metricName.FindAllString(expr, -1) {
				used[strings.TrimSuffix(m, "_bucket")] = true
			}
		}
	}
	if n < 10 {
		t.Fatalf("the dashboard has %d queries", n)
	}
	tmp := t.TempDir()
	if err := os.WriteFile(filepath.Join(tmp, "dashboard.yaml"), []byte(rules.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	promtool(t, tmp, "check", "rules", "dashboard.yaml")
	alerts, err := os.ReadFile("../deploy/prometheus/alerts.yaml")
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range metricName.FindAllString(string(alerts), -1) {
		used[m] = true
	}

	exported := map[string]bool{}
	read := func(url string) {
		resp, err := http.Get(url + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		for _, line := range strings.Split(string(body), "\n") {
			if f := strings.Fields(line); len(f) >= 3 && f[0] == "#" && f[1] == "TYPE" {
				exported[f[2]] = true
			}
		}
	}
	for _, a := range []*admitProcess{startAdmit(t), startAdmit(t, "--store", "redis://"+redistest.Start(t).Addr)} {
		// A decision and a bad request: the series of a vector exist
		// once something is counted in them.
		for _, body := range []string{`{"tenant":"acme","user":"alice"}`, `{"tenant":`} {
			resp, err := http.Post(a.url+"/v1/check", "application/json", strings.NewReader(body))
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
		}
		read(a.url)
	}
	var missing []string
	for m := range used {
		if !exported[m] {
			missing = append(missing, m)
		}
	}
	sort.Strings(missing)
	if len(missing) > 0 {
		t.Fatalf("the dashboard or the alerts name metrics admit serve does not export: %v", missing)
	}
}
