package yamlconf_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
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

// TestReadFileBounded: a configuration file is read up to its bound and
// only from a regular file, so that a *.yaml name for /dev/zero in a
// watched directory cannot make a server read without end, nor a named
// pipe make it wait for a writer for ever (the test would hang).
func TestReadFileBounded(t *testing.T) {
	dir := t.TempDir()
	ok := filepath.Join(dir, "ok.yaml")
	big := filepath.Join(dir, "big.yaml")
	zero := filepath.Join(dir, "zero.yaml")
	pipe := filepath.Join(dir, "pipe.yaml")
	if err := syscall.Mkfifo(pipe, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(ok, []byte("version: 1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(big, make([]byte, 1025), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("/dev/zero", zero); err != nil {
		t.Fatal(err)
	}
	if b, err := yamlconf.ReadFile(ok, 1024); err != nil || string(b) != "version: 1\n" {
		t.Fatalf("a small file: %q %v", b, err)
	}
	for name, want := range map[string]string{big: "at most 1024", zero: "not a regular file", pipe: "not a regular file", filepath.Join(dir, "none.yaml"): "no such file"} {
		if _, err := yamlconf.ReadFile(name, 1024); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want an error with %q", filepath.Base(name), err, want)
		}
	}
}

func TestDuplicateKeys(t *testing.T) {
	var root yaml.Node
	src := "a: 1\nb:\n  c: 2\n  c: 3\n  d: [{e: 1, e: 2}]\na: 4\n\"b\": 5\n"
	if err := yaml.Unmarshal([]byte(src), &root); err != nil {
		t.Fatal(err)
	}
	got := yamlconf.DuplicateKeys("f.yaml", &root).Error()
	want := `f.yaml:4:3: duplicate key "c" (first at line 3): each key appears once in a mapping
f.yaml:5:14: duplicate key "e" (first at line 5): each key appears once in a mapping
f.yaml:6:1: duplicate key "a" (first at line 1): each key appears once in a mapping
f.yaml:7:1: duplicate key "b" (first at line 2): each key appears once in a mapping`
	if got != want {
		t.Errorf("got\n%s\nwant\n%s", got, want)
	}
}
