package main

import (
	"net/http/httptest"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/admitdev/admit/httplimit"
	"github.com/admitdev/admit/memstore"
	"github.com/admitdev/admit/policy"
)

// TestDocListsTheUsage: the package doc, which go doc shows, lists the
// same commands as the usage text the command prints.
func TestDocListsTheUsage(t *testing.T) {
	src, err := os.ReadFile("main.go")
	if err != nil {
		t.Fatal(err)
	}
	doc, _, _ := strings.Cut(string(src), "package main")
	re := regexp.MustCompile(`(?m)^(?://\t|  )admit ([a-z]+(?: [a-z]+)?)`)
	commands := func(text string) []string {
		var out []string
		for _, m := range re.FindAllStringSubmatch(text, -1) {
			out = append(out, m[1])
		}
		return out
	}
	inDoc, inUsage := commands(doc), commands(usageText)
	if len(inUsage) < 8 || !slices.Equal(inDoc, inUsage) {
		t.Errorf("the package doc lists %q, the usage %q", inDoc, inUsage)
	}
}

// TestMatchingPathsDoc: the "Matching paths" section of docs/http.md is
// true. Its configuration is valid, and every request of its table gets
// the action the table says, by default and with http.strict_paths.
func TestMatchingPathsDoc(t *testing.T) {
	doc, err := os.ReadFile("../../docs/http.md")
	if err != nil {
		t.Fatal(err)
	}
	_, sec, ok := strings.Cut(string(doc), "### Matching paths\n")
	sec, _, _ = strings.Cut(sec, "\n## ")
	_, yml, ok2 := strings.Cut(sec, "```yaml\n")
	yml, table, ok3 := strings.Cut(yml, "```")
	if !ok || !ok2 || !ok3 {
		t.Fatal("docs/http.md has no Matching paths section with a yaml block")
	}
	cfg, err := ParseConfig("docs/http.md", []byte(yml))
	if err != nil {
		t.Fatal(err)
	}
	pol, err := policy.Compile(cfg.Spec())
	if err != nil {
		t.Fatal(err)
	}
	lims := map[bool]*httplimit.Limiter{}
	for _, strict := range []bool{false, true} {
		cfg.HTTP.StrictPaths = strict
		o, err := httpOptions(cfg)
		if err != nil {
			t.Fatal(err)
		}
		st := memstore.New(nil)
		defer st.Close()
		o.Store, o.Policy = st, func() *policy.Policy { return pol }
		if lims[strict], err = httplimit.New(o); err != nil {
			t.Fatal(err)
		}
		defer lims[strict].Close()
	}
	// action reads a cell: `name`, or no action.
	action := func(cell string) string {
		cell = strings.TrimSpace(cell)
		if !strings.HasPrefix(cell, "`") {
			return ""
		}
		return strings.Trim(cell, "`")
	}
	rows := 0
	for line := range strings.Lines(table) {
		cells := strings.Split(line, "|")
		if len(cells) != 5 || !strings.HasPrefix(strings.TrimSpace(cells[1]), "`") {
			continue
		}
		method, target, _ := strings.Cut(strings.Trim(strings.TrimSpace(cells[1]), "`"), " ")
		for strict, want := range map[bool]string{false: action(cells[2]), true: action(cells[3])} {
			var req policy.Request
			if err := lims[strict].Identify(httptest.NewRequest(method, target, nil), &req); err != nil {
				t.Fatal(err)
			}
			if req.Action != want {
				t.Errorf("%s %s (strict_paths %v): action %q, the doc says %q", method, target, strict, req.Action, want)
			}
		}
		rows++
	}
	if rows < 10 {
		t.Fatalf("the Matching paths table has %d rows", rows)
	}
}
