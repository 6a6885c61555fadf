package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/admitdev/admit/limitador"
)

// runImport runs admit with args and returns the exit code, stdout and
// stderr.
func runImport(args ...string) (int, string, string) {
	var out, errs bytes.Buffer
	code := run(context.Background(), args, &env{stdout: &out, stderr: &errs, getenv: func(string) string { return "" }})
	return code, out.String(), errs.String()
}

// TestImportKuadrantDoc: the example of docs/limitador.md is what
// the command does: its files, run as its command says, print its limits
// and its refusal, and exit 1.
func TestImportKuadrantDoc(t *testing.T) {
	doc, err := os.ReadFile("../../docs/limitador.md")
	if err != nil {
		t.Fatal(err)
	}
	_, example, ok := strings.Cut(string(doc), "### Example\n")
	if !ok {
		t.Fatal("docs/limitador.md has no Example section")
	}
	blocks := func(lang string) []string {
		var out []string
		rest := example
		for {
			_, after, ok := strings.Cut(rest, "```"+lang+"\n")
			if !ok {
				return out
			}
			block, after, _ := strings.Cut(after, "```")
			out = append(out, block)
			rest = after
		}
	}
	yamls, shs, texts := blocks("yaml"), blocks("sh"), blocks("text")
	if len(yamls) != 3 || len(shs) != 1 || len(texts) != 1 {
		t.Fatalf("the example has %d yaml, %d sh, %d text blocks; want 3, 1, 1", len(yamls), len(shs), len(texts))
	}
	dir := t.TempDir()
	for name, data := range map[string]string{"policies.yaml": yamls[0], "routes.yaml": yamls[1]} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(data), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	t.Chdir(dir)
	args := strings.Fields(shs[0])
	if args[0] != "admit" {
		t.Fatalf("the command is %q", shs[0])
	}
	code, stdout, stderr := runImport(args[1:]...)
	if code != 1 {
		t.Errorf("exit %d, want 1", code)
	}
	if stdout != yamls[2] {
		t.Errorf("stdout:\n%s\nthe doc says:\n%s", stdout, yamls[2])
	}
	// What it prints is a limits file admit serve --limitador-config
	// loads.
	if ls, err := limitador.Parse("imported.yaml", []byte(stdout)); err != nil || len(ls.All()) == 0 {
		t.Errorf("the imported limits do not load: %v", err)
	}
	if stderr != texts[0] {
		t.Errorf("stderr:\n%s\nthe doc says:\n%s", stderr, texts[0])
	}
}

const importPolicy = `apiVersion: kuadrant.io/v1
kind: RateLimitPolicy
metadata:
  name: toystore
spec:
  targetRef:
    group: gateway.networking.k8s.io
    kind: HTTPRoute
    name: toystore
    sectionName: toys
  limits:
    global:
      rates:
      - limit: 6
        window: 30s
`

const importRoutes = `apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata:
  name: toystore
  namespace: shop
spec:
  parentRefs:
  - name: external
    namespace: gateway-system
  rules:
  - name: toys
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata:
  name: external
`

func TestConfigImportKuadrant(t *testing.T) {
	dir := t.TempDir()
	policy, routes := filepath.Join(dir, "policy.yaml"), filepath.Join(dir, "routes.yaml")
	if err := os.WriteFile(policy, []byte(importPolicy), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(routes, []byte(importRoutes), 0o600); err != nil {
		t.Fatal(err)
	}
	want := `- namespace: shop/toystore
  max_value: 6
  seconds: 30
  conditions:
    - descriptors[0]["limit.global__3c70c879"] == "1"
  variables: []
  name: global
`
	// Converted whole: the namespace given, the route file read past a
	// document that is not a route, which is named.
	code, stdout, stderr := runImport("config", "import", "kuadrant", policy, "--namespace", "shop", "--route="+routes)
	if code != 1 || stdout != want || stderr != routes+":14:7: kind: Gateway (gateway.networking.k8s.io/v1): a route file holds HTTPRoute and GRPCRoute manifests (Gateways are not read: a route's parentRefs say which Gateways it attaches to)\nadmit config import: 1 refused; the limits above are the rest\n" {
		t.Errorf("exit %d\n%s\n%s", code, stdout, stderr)
	}
	onlyRoute := filepath.Join(dir, "route.yaml")
	if err := os.WriteFile(onlyRoute, []byte(strings.Split(importRoutes, "---\n")[0]), 0o600); err != nil {
		t.Fatal(err)
	}
	if code, stdout, stderr := runImport("config", "import", "kuadrant", "-n", "shop", "--route", onlyRoute, policy); code != 0 || stdout != want || stderr != "" {
		t.Errorf("all converted: exit %d\n%s\n%s", code, stdout, stderr)
	}
	// Without the namespace, the policy is refused at its metadata.
	code, stdout, stderr = runImport("config", "import", "kuadrant", policy)
	if code != 1 || stdout != "[]\n" || !strings.Contains(stderr, policy+":4:3: metadata.namespace: is missing") {
		t.Errorf("no namespace: exit %d\n%s\n%s", code, stdout, stderr)
	}
	// A rule the route does not have.
	other := filepath.Join(dir, "other.yaml")
	if err := os.WriteFile(other, []byte(strings.Replace(importPolicy, "sectionName: toys", "sectionName: admin", 1)), 0o600); err != nil {
		t.Fatal(err)
	}
	code, _, stderr = runImport("config", "import", "kuadrant", other, "-n=shop", "--route", onlyRoute)
	if code != 1 || !strings.Contains(stderr, other+`:7:5: spec.targetRef.sectionName: HTTPRoute shop/toystore (`+onlyRoute+`:1) has no rule "admin" (its rules: toys)`) {
		t.Errorf("no such rule: exit %d\n%s", code, stderr)
	}
	for _, c := range []struct {
		args []string
		code int
		says string
	}{
		{[]string{"config", "import"}, 2, "name the format"},
		{[]string{"config", "import", "envoy", policy}, 2, `unknown format "envoy"`},
		{[]string{"config", "import", "kuadrant"}, 2, "name one or more policy files"},
		{[]string{"config", "import", "kuadrant", "--route", routes}, 2, "name one or more policy files"},
		{[]string{"config", "import", "kuadrant", policy, "--route"}, 2, "--route needs a value"},
		{[]string{"config", "import", "kuadrant", policy, "--frobnicate"}, 2, "unknown flag --frobnicate"},
		{[]string{"config", "import", "kuadrant", filepath.Join(dir, "missing.yaml")}, 2, "missing.yaml: open"},
		{[]string{"config", "import", "kuadrant", dir}, 2, "is not a regular file"},
		{[]string{"config", "import", "--help"}, 0, "Usage:\n  admit config import kuadrant POLICY.yaml..."},
		{[]string{"config", "import", "kuadrant", "-h"}, 0, "--namespace NS"},
		{[]string{"config", "--help"}, 0, "admit config import kuadrant"},
		{[]string{"help"}, 0, "admit config import kuadrant POLICY.yaml... [--route ROUTE.yaml...]"},
	} {
		code, stdout, stderr := runImport(c.args...)
		if code != c.code || !strings.Contains(stdout+stderr, c.says) {
			t.Errorf("%q: exit %d, want %d with %q:\n%s%s", c.args, code, c.code, c.says, stdout, stderr)
		}
	}
}

// TestImportRefusedByServe: limits Kuadrant would write that admit serve
// refuses (a window past the Redis store's span) are named, exit 1.
func TestImportRefusedByServe(t *testing.T) {
	dir := t.TempDir()
	policy := filepath.Join(dir, "policy.yaml")
	long := strings.Replace(strings.Replace(importPolicy, "window: 30s", "window: 99999h", 1), "    sectionName: toys\n", "", 1)
	if err := os.WriteFile(policy, []byte(long), 0o600); err != nil {
		t.Fatal(err)
	}
	code, stdout, stderr := runImport("config", "import", "kuadrant", policy, "--namespace", "shop")
	if code != 1 || !strings.Contains(stdout, "seconds: 359996400") || !strings.Contains(stderr, "would refuse the limits written") || !strings.Contains(stderr, "a window is at most") {
		t.Errorf("exit %d\n%s\n%s", code, stdout, stderr)
	}
}
