package envoyrls

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/admitdev/admit"
	"github.com/admitdev/admit/configtest"
	"github.com/admitdev/admit/yamlconf"
)

// TestInvalidConfigs runs one fixture per kind of configuration error:
// testdata/invalid/NAME.yaml must be refused with an error that contains
// NAME.want (line:col: message).
func TestInvalidConfigs(t *testing.T) {
	configtest.Check(t, "testdata/invalid/*.yaml", 20, func(f string) error {
		data, err := os.ReadFile(f)
		if err != nil {
			return err
		}
		_, err = Parse(File{Name: f, Data: data})
		return err
	})
}

func TestParseReportsEveryError(t *testing.T) {
	data := "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n  - value: x\n  - key: b\n    bogus: 1\n"
	_, err := Parse(File{Name: "c.yaml", Data: []byte(data)})
	var errs yamlconf.Errors
	if !errors.As(err, &errs) || len(errs) != 3 {
		t.Fatalf("want 3 errors, got %v", err)
	}
	for i, want := range []string{"c.yaml:4:24: invalid rate limit unit", "c.yaml:5:5: descriptor has empty key", "c.yaml:7:5: config error, unknown key 'bogus'"} {
		if !strings.HasPrefix(errs[i].Error(), want) {
			t.Errorf("error %d = %q, want prefix %q", i, errs[i], want)
		}
	}
}

func TestLoadDir(t *testing.T) {
	dir := t.TempDir()
	write := func(name, data string) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(dir, name), []byte(data), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("a.yaml", "domain: one\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 3}\n")
	write("b.yaml", "domain: two\n")
	write("notes.txt", "not YAML, not loaded")
	c, err := LoadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(c.Domains(), ","); got != "one,two" {
		t.Fatalf("domains %s", got)
	}
	m := c.Lookup("one", []Entry{{"k", "x"}})
	if m.Limit == nil || m.Limit.RequestsPerUnit != 3 || m.Limit.Unit != Minute || m.Limit.Window() != time.Minute {
		t.Fatalf("lookup: %+v", m.Limit)
	}
	if r := m.Limit.Rule(); r == nil || r.Algorithm != admit.FixedWindow || r.Limit != 3 || r.Window != time.Minute {
		t.Fatalf("rule %+v", r)
	}

	write("c.yaml", "domain: one\n")
	_, err = LoadDir(dir)
	if err == nil || !strings.Contains(err.Error(), "c.yaml:1:9: duplicate domain 'one' in config file") {
		t.Fatalf("duplicate domain across files: %v", err)
	}
	if _, err := LoadDir(filepath.Join(dir, "missing")); err == nil {
		t.Fatal("a missing directory loaded")
	}
}

func TestCheckReportsStoreLimits(t *testing.T) {
	c, err := Parse(File{Name: "y.yaml", Data: []byte("domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 1}\n  - key: b\n    rate_limit: {unit: year, requests_per_unit: 1}\n")})
	if err != nil {
		t.Fatal(err)
	}
	err = c.Check(func(r *admit.Rule) error {
		if r.Window > 50*24*time.Hour {
			return errors.New("window too long for this store")
		}
		return nil
	})
	if err == nil || err.Error() != "y.yaml:6:17: d.b: window too long for this store" {
		t.Fatalf("Check: %v", err)
	}
}

// TestLookup follows envoyproxy/ratelimit's matching rules: the most
// specific entry first, then wildcards in file order, then the key alone;
// a descriptor must reach a limit with its last entry.
func TestLookup(t *testing.T) {
	c, err := Parse(File{Name: "m.yaml", Data: []byte(`
domain: m
descriptors:
  - key: remote_address
    rate_limit: {unit: second, requests_per_unit: 10}
  - key: remote_address
    value: 50.0.0.5
    rate_limit: {unit: second, requests_per_unit: 0}
  - key: path
    value: /api/*
    rate_limit: {name: api, unit: minute, requests_per_unit: 20}
  - key: path
    value: /api/v2*
    rate_limit: {unit: minute, requests_per_unit: 99}
  - key: path
    value: /files*
    share_threshold: true
    rate_limit: {unit: minute, requests_per_unit: 5}
  - key: message_type
    value: marketing
    descriptors:
      - key: to_number
        rate_limit: {unit: day, requests_per_unit: 5}
  - key: key
    value: value
    rate_limit: {unit: second, requests_per_unit: 300}
`)})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		entries []Entry
		want    string // FullKey, "" for no limit
		rpu     uint32
		shared  uint64
	}{
		{[]Entry{{"remote_address", "10.0.0.1"}}, "m.remote_address", 10, 0},
		{[]Entry{{"remote_address", "50.0.0.5"}}, "m.remote_address_50.0.0.5", 0, 0},
		{[]Entry{{"path", "/api/v2/users"}}, "m.path_/api/*", 20, 0}, // first wildcard in file order
		{[]Entry{{"path", "/api/"}}, "m.path_/api/*", 20, 0},
		{[]Entry{{"path", "/ap"}}, "", 0, 0},
		{[]Entry{{"path", "/files/a"}}, "m.path_/files*", 5, 1},
		{[]Entry{{"message_type", "marketing"}, {"to_number", "2061111111"}}, "m.message_type_marketing.to_number", 5, 0},
		{[]Entry{{"message_type", "marketing"}}, "", 0, 0},     // a placeholder level has no limit
		{[]Entry{{"message_type", "transactional"}}, "", 0, 0}, // no such value, no key-only entry
		{[]Entry{{"key", "value"}, {"subkey", "x"}}, "", 0, 0}, // deeper than the configuration
		{[]Entry{{"unknown", "x"}}, "", 0, 0},
	} {
		m := c.Lookup("m", tc.entries)
		got := ""
		if m.Limit != nil {
			got = m.Limit.FullKey
		}
		if got != tc.want || m.Limit != nil && m.Limit.RequestsPerUnit != tc.rpu || m.Shared != tc.shared {
			t.Errorf("%v: matched %q (%+v, shared %b), want %q", tc.entries, got, m.Limit, m.Shared, tc.want)
		}
	}
	if m := c.Lookup("other", []Entry{{"remote_address", "1"}}); m.Limit != nil {
		t.Error("an unknown domain matched")
	}
}

func TestDistribution(t *testing.T) {
	c, err := Parse(File{Name: "d.yaml", Data: []byte(`
domain: d
descriptors:
  - key: leased
    rate_limit: {unit: second, requests_per_unit: 10, distribution: leased}
  - key: exact
    rate_limit: {unit: second, requests_per_unit: 10}
`)})
	if err != nil {
		t.Fatal(err)
	}
	for key, want := range map[string]admit.Distribution{"leased": admit.Leased, "exact": admit.Exact} {
		m := c.Lookup("d", []Entry{{Key: key}})
		if m.Limit == nil || m.Limit.Rule().Distribution != want {
			t.Errorf("%s: %+v, want distribution %v", key, m.Limit, want)
		}
	}
}

// TestParseErrorsInOneRun: the problems of every file are reported in
// one run, in the order of their lines: a duplicated key beside the
// file's other errors, and a domain that two files name though the first
// has errors of its own.
func TestParseErrorsInOneRun(t *testing.T) {
	a := "domain: alpha\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: -1}\n  - key: k2\n    bogus: 1\n    rate_limit: {unit: day, requests_per_unit: 5}\n    rate_limit: {unit: day, requests_per_unit: 6}\n"
	b := "domain: alpha\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 1}\n"
	_, err := Parse(File{Name: "a.yaml", Data: []byte(a)}, File{Name: "b.yaml", Data: []byte(b)})
	var errs yamlconf.Errors
	if !errors.As(err, &errs) {
		t.Fatalf("want errors, got %v", err)
	}
	var got []string
	for _, e := range errs {
		got = append(got, fmt.Sprintf("%s:%d", e.File, e.Line))
	}
	if want := "a.yaml:4 a.yaml:6 a.yaml:8 b.yaml:1"; strings.Join(got, " ") != want {
		t.Errorf("errors at %v, want %s:\n%v", got, want, err)
	}
}

// TestAnchorsAndMergeKeys: files that share settings by anchors, aliases
// and merge keys (<<), as envoyproxy/ratelimit's YAML library reads them,
// load as if written out: a key of the mapping itself overrides what a
// merge brings. A few anchors standing for millions of nodes are refused.
func TestAnchorsAndMergeKeys(t *testing.T) {
	c, err := Parse(File{Name: "a.yaml", Data: []byte(`
domain: anchors
descriptors:
  - &login
    key: generic_key
    value: login
    rate_limit: &perminute {unit: minute, requests_per_unit: 5}
  - <<: *login
    value: signup
  - key: remote_address
    rate_limit: *perminute
  - <<: [*login, {key: ignored, value: ignored}]
    value: reset
    rate_limit: {<<: *perminute, requests_per_unit: 2}
`)})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		entries []Entry
		want    string
		rpu     uint32
	}{
		{[]Entry{{"generic_key", "login"}}, "anchors.generic_key_login", 5},
		{[]Entry{{"generic_key", "signup"}}, "anchors.generic_key_signup", 5},
		{[]Entry{{"remote_address", "192.0.2.7"}}, "anchors.remote_address", 5},
		{[]Entry{{"generic_key", "reset"}}, "anchors.generic_key_reset", 2},
	} {
		m := c.Lookup("anchors", tc.entries)
		if m.Limit == nil || m.Limit.FullKey != tc.want || m.Limit.RequestsPerUnit != tc.rpu || m.Limit.Unit.String() != "MINUTE" {
			t.Errorf("%v: %+v, want %s at %d a minute", tc.entries, m.Limit, tc.want, tc.rpu)
		}
	}

	// Nine levels of ten aliases: a billion nodes from a few lines.
	laughs := "domain: laughs\nx0: &a0 [v, v, v, v, v, v, v, v, v, v]\n"
	for i := 1; i < 9; i++ {
		laughs += fmt.Sprintf("x%d: &a%d [*a%d, *a%d, *a%d, *a%d, *a%d, *a%d, *a%d, *a%d, *a%d, *a%d]\n", i, i, i-1, i-1, i-1, i-1, i-1, i-1, i-1, i-1, i-1, i-1)
	}
	_, err = Parse(File{Name: "laughs.yaml", Data: []byte(laughs)})
	if err == nil || !strings.Contains(err.Error(), "once its aliases are expanded") {
		t.Errorf("a billion nodes: %v; want refused at the bound", err)
	}
}
