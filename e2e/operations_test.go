package e2e

import (
	"encoding/json"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

const operationsConfig = `version: 1
global:
  - {name: login, scope: ip, actions: [login], algorithm: fixed_window, limit: 2, window: 1m}
tiers:
  free:
    rules:
      - {name: api, scope: user, algorithm: token_bucket, rate: 10/s, burst: 10}
tenants:
  acme: {tier: free}
`

// docBlocks returns the code blocks of language lang in a file of docs/.
func docBlocks(t *testing.T, name, lang string) []string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "docs", name))
	if err != nil {
		t.Fatal(err)
	}
	re := regexp.MustCompile("(?s)```" + lang + "\n(.*?)```")
	var out []string
	for _, m := range re.FindAllStringSubmatch(string(b), -1) {
		out = append(out, m[1])
	}
	return out
}

// TestOperationsRunbook runs docs/operations.md's commands, in order,
// against `admit serve`, and checks that each does what the runbook says.
func TestOperationsRunbook(t *testing.T) {
	dir := t.TempDir()
	cfg := filepath.Join(dir, "admit.yaml")
	if err := os.WriteFile(cfg, []byte(operationsConfig), 0o600); err != nil {
		t.Fatal(err)
	}
	p := startAdmitEnv(t, []string{"ADMIT_ADMIN_TOKEN=" + catalogToken}, "--config", cfg)
	// Someone hammers the login.
	for range 6 {
		call(t, p, "POST", "/v1/check", `{"action":"login","ip":"203.0.113.7"}`, "", true)
	}
	blocks := docBlocks(t, "operations.md", "sh")
	if len(blocks) != 5 {
		t.Fatalf("docs/operations.md has %d sh blocks; this test runs 5", len(blocks))
	}
	banID := ""
	run := func(i int) string {
		t.Helper()
		cmd := exec.Command("bash", "-euo", "pipefail", "-c", blocks[i])
		cmd.Env = append(os.Environ(), "ADMIT="+p.url, "TOKEN="+catalogToken, "BAN_ID="+banID)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("block %d:\n%s\nfailed: %v\n%s", i+1, blocks[i], err, out)
		}
		return string(out)
	}

	var top struct {
		Rule    string `json:"rule"`
		Refused []struct {
			Scope, Value string
			Count        int64
		} `json:"refused"`
	}
	if err := json.Unmarshal([]byte(run(0)), &top); err != nil || top.Rule != "login" || len(top.Refused) != 1 ||
		top.Refused[0].Value != "203.0.113.7" || top.Refused[0].Scope != "ip" || top.Refused[0].Count != 4 {
		t.Fatalf("who is refused: %+v, %v", top, err)
	}

	var ban banView
	if err := json.Unmarshal([]byte(run(1)), &ban); err != nil || ban.Value != "203.0.113.7" || ban.ExpiresInS != 600 {
		t.Fatalf("the ban: %+v, %v", ban, err)
	}
	banID = ban.ID
	if code, m := banCheck(t, p, `{"tenant":"acme","user":"x","ip":"203.0.113.7"}`); code != http.StatusTooManyRequests || m["denied_by"] != "ban:"+ban.ID {
		t.Fatalf("the banned address: %d %v", code, m)
	}

	out := run(2)
	if strings.Count(out, `"id"`) != 2 {
		t.Fatalf("the network and the user: %s", out)
	}
	if code, _ := banCheck(t, p, `{"tenant":"acme","user":"x","ip":"198.51.100.99"}`); code != http.StatusTooManyRequests {
		t.Fatalf("an address of the banned network: %d", code)
	}
	if code, _ := banCheck(t, p, `{"tenant":"acme","user":"mallory"}`); code != http.StatusTooManyRequests {
		t.Fatalf("the banned user: %d", code)
	}

	if out := run(3); strings.Count(out, ban.ID) < 2 || !strings.Contains(out, "INC-4711") {
		t.Fatalf("listing: %s", out)
	}
	run(4)
	if code, _ := banCheck(t, p, `{"tenant":"acme","user":"x","ip":"203.0.113.7"}`); code != http.StatusOK {
		t.Fatalf("after the ban was lifted: %d", code)
	}

	// The escalation rule of the runbook is valid beside a login rule.
	yamls := docBlocks(t, "operations.md", "yaml")
	if len(yamls) != 1 {
		t.Fatalf("docs/operations.md has %d yaml blocks; want 1", len(yamls))
	}
	file := filepath.Join(dir, "escalation.yaml")
	if err := os.WriteFile(file, []byte(operationsConfig+yamls[0]), 0o600); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(admitBinary(t), "config", "validate", file).CombinedOutput(); err != nil {
		t.Fatalf("the runbook's escalation rule: %v\n%s", err, out)
	}
}
