package admit_test

import (
	"os/exec"
	"strings"
	"testing"
)

// layers places every package of the module in the house: a package
// imports only packages of lower layers, and within its own layer only
// its parent (wsgateway/redissessions imports wsgateway). So the stores
// never see policy, adapters never import each other, and nothing imports
// the server wiring but the command. docs/architecture.md draws it.
var layers = []struct {
	name     string
	packages []string
}{
	{"the slots of rules and charges, 128-bit arithmetic, files saved whole", []string{"internal/slots", "internal/wide", "internal/syncfile", "internal/portset"}},
	{"the bounds", []string{"internal/bounds"}},
	{"vocabulary and basement", []string{"", "units", "redistest", "proctest", "configtest", "yamlconf", "api", "internal/readmetest", "internal/testlines", "internal/sftest"}},
	{"the engine", []string{"internal/engine", "internal/redishook", "internal/ruletext"}},
	{"helpers on the vocabulary", []string{"problem", "storetest", "shed"}},
	{"the Redis store's connection", []string{"redisstore/internal/link"}},
	{"the Redis store's exact path", []string{"redisstore/internal/exact"}},
	{"the Redis store's rooms on the exact path", []string{"redisstore/internal/counted", "redisstore/internal/leased"}},
	{"stores", []string{"memstore", "redisstore"}},
	{"policy", []string{"policy", "policy/catalog", "policy/catalog/changestest", "policy/catalog/redischanges", "policy/usage", "policy/usage/usagetest", "policy/usage/redisusage", "policy/redisbans", "policy/banstest", "policy/top", "policy/top/redistop", "idempotency", "idempotency/redisidem", "idempotency/idemtest"}},
	{"adapter helpers", []string{"internal/httpx", "internal/connlimit", "internal/tracing", "limitador/kuadrantpb"}},
	{"adapters", []string{"httplimit", "envoyrls", "envoyrls/redisquota", "envoyrls/quotaledgertest", "wsgateway", "wsgateway/redissessions", "wsgateway/sessionstest", "simulate", "llm", "llm/llmtest", "llm/usagetest", "llm/redisllm", "limitador", "limitador/kuadrant", "limitador/rediscounters"}},
	{"server wiring", []string{"internal/server"}},
	{"command", []string{"cmd/admit"}},
	{"uses of the whole", []string{"examples/*", "fault", "attack"}},
}

const module = "github.com/admitdev/admit"

// storesImport names the stores, which import nothing of the module but
// the root, the internal packages beneath it (the engine, the hooks
// redisstore fills) and their own rooms (redisstore/internal/…): whoever
// wants a store gets the store and its driver.
var storesImport = map[string]bool{"memstore": true, "redisstore": true}

// layerOf returns the layer of a package path relative to the module, or
// -1 if it has none.
func layerOf(rel string) int {
	for i, l := range layers {
		for _, p := range l.packages {
			if p == rel || strings.HasSuffix(p, "/*") && strings.HasPrefix(rel, strings.TrimSuffix(p, "*")) {
				return i
			}
		}
	}
	return -1
}

// allowed reports whether package from may import package to (both
// relative to the module).
func allowed(from, to string) bool {
	lf, lt := layerOf(from), layerOf(to)
	return lt < lf || lt == lf && strings.HasPrefix(from, to+"/")
}

func TestImportsRunDownward(t *testing.T) {
	out, err := exec.Command("go", "list", "-f", `{{.ImportPath}} {{join .Imports " "}}`, "./...").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	rel := func(p string) string { return strings.TrimPrefix(strings.TrimPrefix(p, module), "/") }
	seen := 0
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Fields(line)
		from := rel(f[0])
		if layerOf(from) < 0 {
			t.Errorf("package %q has no layer: place it in layers", from)
			continue
		}
		seen++
		for _, imp := range f[1:] {
			if imp != module && !strings.HasPrefix(imp, module+"/") {
				continue
			}
			to := rel(imp)
			if storesImport[from] && to != "" && !strings.HasPrefix(to, "internal/") && !strings.HasPrefix(to, from+"/internal/") {
				t.Errorf("store %q imports %q: a store imports only the root, internal packages and its driver", from, to)
			}
			if !allowed(from, to) {
				t.Errorf("%q (%s) imports %q (%s): imports run down the layers", from, layers[layerOf(from)].name, to, layerName(to))
			}
		}
	}
	if seen < 15 {
		t.Fatalf("go list found %d packages", seen)
	}
}

func layerName(rel string) string {
	if l := layerOf(rel); l >= 0 {
		return layers[l].name
	}
	return "no layer"
}

// TestLayersRule: the rule itself refuses what it should.
func TestLayersRule(t *testing.T) {
	for _, c := range []struct {
		from, to string
		ok       bool
	}{
		{"redisstore", "", true},
		{"redisstore", "problem", true}, // by layer; storesImport says more
		{"redisstore", "policy", false},
		{"redisstore", "wsgateway", false},
		{"redisstore", "memstore", false},
		{"policy", "memstore", true},
		{"policy/catalog/redischanges", "policy", true},
		{"policy/catalog/redischanges", "redisstore", true},
		{"policy", "policy/catalog/redischanges", false},
		{"httplimit", "wsgateway", false},
		{"wsgateway/redissessions", "wsgateway", true},
		{"wsgateway/redissessions", "envoyrls", false},
		{"envoyrls/redisquota", "envoyrls", true},
		{"envoyrls/redisquota", "wsgateway", false},
		{"envoyrls", "envoyrls/redisquota", false},
		{"wsgateway", "internal/server", false},
		{"cmd/admit", "internal/server", true},
		{"examples/hierarchy", "memstore", true},
		{"", "yamlconf", false},
		{"", "internal/engine", false},
		{"", "internal/slots", true},
		{"memstore", "internal/engine", true},
		{"internal/engine", "memstore", false},
	} {
		if got := allowed(c.from, c.to); got != c.ok {
			t.Errorf("allowed(%q, %q) = %v, want %v", c.from, c.to, got, c.ok)
		}
	}
}
