package yamlconf_test

import (
	"errors"
	"testing"

	"go.yaml.in/yaml/v3"

	"github.com/admitdev/admit/yamlconf"
)

func TestSyntaxError(t *testing.T) {
	var n yaml.Node
	err := yaml.Unmarshal([]byte("a: 1\nb: [1, 2\n"), &n)
	if err == nil {
		t.Fatal("no error from a broken list")
	}
	e := yamlconf.SyntaxError("c.yaml", err)
	if e.File != "c.yaml" || e.Line == 0 || e.Col != 1 || e.Msg == "" {
		t.Fatalf("%+v", e)
	}
	if got := e.Error(); got[:len("c.yaml:")] != "c.yaml:" {
		t.Errorf("Error() = %q", got)
	}
	// An error without a line is the whole file's.
	if e := yamlconf.SyntaxError("c.yaml", errors.New("yaml: control characters are not allowed")); e.Line != 0 || e.Error() != "c.yaml: control characters are not allowed" {
		t.Errorf("%+v %q", e, e.Error())
	}
}

func TestErrorText(t *testing.T) {
	errs := yamlconf.Errors{
		{File: "a.yaml", Line: 3, Col: 9, Path: "tiers.free", Msg: "unknown"},
		{File: "a.yaml", Msg: "empty"},
		yamlconf.At("b.yaml", &yaml.Node{Line: 2, Column: 4}, "", "bad"),
	}
	want := "a.yaml:3:9: tiers.free: unknown\na.yaml: empty\nb.yaml:2:4: bad"
	if got := errs.Error(); got != want {
		t.Errorf("got %q\nwant %q", got, want)
	}
}

func TestKindName(t *testing.T) {
	var doc yaml.Node
	if err := yaml.Unmarshal([]byte("m: {a: 1}\nl: [1]\ns: text\nx: &x 1\ny: *x\n"), &doc); err != nil {
		t.Fatal(err)
	}
	m := doc.Content[0].Content
	for i, want := range []string{"a mapping", "a list", `"text"`, `"1"`, "an alias"} {
		if got := yamlconf.KindName(m[2*i+1]); got != want {
			t.Errorf("%s: %s, want %s", m[2*i].Value, got, want)
		}
	}
}
