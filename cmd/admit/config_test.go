package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/admitdev/admit/configtest"
	"github.com/admitdev/admit/yamlconf"
)

func TestDemoConfigValid(t *testing.T) {
	if _, err := ParseConfig("demo.yaml", demoConfig); err != nil {
		t.Fatal(err)
	}
}

// TestInvalidConfigs runs one fixture per kind of configuration error:
// testdata/invalid/NAME.yaml must be refused with an error that contains
// NAME.want (position, field and reason).
func TestInvalidConfigs(t *testing.T) {
	configtest.Check(t, "testdata/invalid/*.yaml", 20, func(f string) error {
		_, err := LoadConfig(f)
		return err
	})
}

func TestConfigReportsEveryErrorInOrder(t *testing.T) {
	data := "version: 1\nstore:\n  backend: etcd\n  on_error: maybe\nglobal:\n  - name: g\n    scope: global\n    algorithm: gcra\n    rate: 1/s\n"
	_, err := ParseConfig("c.yaml", []byte(data))
	var errs yamlconf.Errors
	if !errors.As(err, &errs) || len(errs) != 3 {
		t.Fatalf("want 3 errors, got %v", err)
	}
	for i, want := range []string{"c.yaml:3:12: store.backend", "c.yaml:4:13: store.on_error", "c.yaml:6:5: global[0].burst"} {
		if !strings.HasPrefix(errs[i].Error(), want) {
			t.Errorf("error %d = %q, want prefix %q", i, errs[i], want)
		}
	}
}

func TestConfigExpandsEnvironment(t *testing.T) {
	t.Setenv("ADMIT_TEST_BURST", "7")
	t.Setenv("ADMIT_TEST_TOKEN", "tok")
	cfg, err := ParseConfig("c.yaml", []byte("version: 1\nserver:\n  admin_token: ${ADMIT_TEST_TOKEN}\nglobal:\n  - name: g\n    scope: global\n    algorithm: gcra\n    rate: 1/s\n    burst: ${ADMIT_TEST_BURST}\n"))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Server.AdminToken != "tok" || *cfg.Global[0].Burst != 7 {
		t.Errorf("expanded: token %q, burst %d", cfg.Server.AdminToken, *cfg.Global[0].Burst)
	}
}

func FuzzParseConfig(f *testing.F) {
	f.Add(string(demoConfig))
	files, _ := filepath.Glob("testdata/invalid/*.yaml")
	for _, file := range files {
		b, _ := os.ReadFile(file)
		f.Add(string(b))
	}
	f.Fuzz(func(t *testing.T, data string) {
		cfg, err := ParseConfig("f.yaml", []byte(data))
		if err == nil && cfg == nil {
			t.Fatal("no config and no error")
		}
		var errs yamlconf.Errors
		if err != nil && (!errors.As(err, &errs) || len(errs) == 0) {
			t.Fatalf("error %v is not a yamlconf.Errors", err)
		}
	})
}

// TestConfigErrorsInOneRun: a file's duplicated keys, its other fields'
// errors and each parameter of a rule that is wrong are reported
// together, each at its line, and a rule's name used twice whatever else
// is wrong with either rule.
func TestConfigErrorsInOneRun(t *testing.T) {
	data := "version: 1\n" + // 1
		"bogus: 1\n" + // 2
		"tiers:\n" + // 3
		"  free:\n" + // 4
		"    rules:\n" + // 5
		"      - name: r1\n" + // 6
		"        scope: user\n" + // 7
		"        algorithm: token_bucket\n" + // 8
		"        rate: 10/s\n" + // 9
		"        burst: -5\n" + // 10
		"        burst: 6\n" + // 11: the later key is read
		"        initial: -3\n" + // 12
		"      - name: r1\n" + // 13
		"        scope: user\n" + // 14
		"        algorithm: fixed_window\n" + // 15
		"        limit: 0\n" + // 16
		"        window: 1m\n" + // 17
		"tenants:\n" + // 18
		"  acme: {tier: free}\n" + // 19
		"  acme: {tier: fre}\n" // 20
	_, err := ParseConfig("c.yaml", []byte(data))
	got := errorPlaces(t, err)
	want := []string{"2:bogus", "11:", "12:tiers.free.rules[0].initial", "13:tiers.free.rules[1].name", "16:tiers.free.rules[1].limit", "20:", "20:tenants.acme.tier"}
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Errorf("errors at\n %v\nwant\n %v\n%v", got, want, err)
	}
}

// TestConfigHTTPErrorsInOneRun: the server and http sections' errors all
// come in one run (a bad trusted proxy hid a bad forwarded header, which
// hid a bad route), and what would stop serve later is refused here with
// its position: a listen port that is none, a TLS file that is not there.
func TestConfigHTTPErrorsInOneRun(t *testing.T) {
	data := "version: 1\n" +
		"server:\n" +
		"  http: \"localhost:abc\"\n" + // 3
		"  grpc: \":99999\"\n" + // 4
		"  trusted_proxies: [\"nope\"]\n" + // 5
		"store:\n" +
		"  backend: redis\n" +
		"  redis:\n" +
		"    tls: {enabled: true, ca_file: /nonexistent/ca.pem}\n" + // 9
		"http:\n" +
		"  forwarded_header: x-real-ip\n" + // 11
		"  actions:\n" +
		"    - match: \"POST /a/{\"\n" + // 13
		"      action: a\n"
	_, err := ParseConfig("c.yaml", []byte(data))
	got := errorPlaces(t, err)
	want := []string{"3:server.http", "4:server.grpc", "5:server.trusted_proxies[0]", "9:store.redis.tls.ca_file", "11:http.forwarded_header", "13:http.actions[0]"}
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Errorf("errors at\n %v\nwant\n %v\n%v", got, want, err)
	}
}

// TestConfigStoreBoundsValidated: with backend redis, every rule the
// Redis store cannot hold is refused by validate, each at its position
// (serve refused the first alone, without one); two servers on one
// address too.
func TestConfigStoreBoundsValidated(t *testing.T) {
	data := "version: 1\n" +
		"server: {http: \":9000\", grpc: \":9000\"}\n" + // 2
		"store: {backend: redis}\n" +
		"tiers:\n" +
		"  free:\n" +
		"    rules:\n" +
		"      - {name: a, scope: tenant, algorithm: token_bucket, rate: 1/h, burst: 100000}\n" + // 7
		"      - {name: b, scope: tenant, algorithm: token_bucket, rate: 10/s, burst: 10}\n" +
		"      - {name: c, scope: tenant, algorithm: token_bucket, rate: 1/h, burst: 200000}\n" // 9
	_, err := ParseConfig("c.yaml", []byte(data))
	got := errorPlaces(t, err)
	if want := "2:server.grpc 7:tiers.free.rules[0].algorithm 9:tiers.free.rules[2].algorithm"; strings.Join(got, " ") != want {
		t.Errorf("errors at %v, want %s\n%v", got, want, err)
	}
}

// TestConfigBansErrors: each bad escalation rule is refused at its field's
// line: a duration that is none, a bound past its range, a rule the
// configuration lacks (with the name it likely meant), a scope, a name
// given twice.
func TestConfigBansErrors(t *testing.T) {
	data := "version: 1\n" + // 1
		"global:\n" + // 2
		"  - {name: per-ip, scope: ip, algorithm: token_bucket, rate: 10/s, burst: 10}\n" + // 3
		"bans:\n" + // 4
		"  - name: a\n" + // 5
		"    rule: per-ip\n" + // 6
		"    refusals: 5\n" + // 7
		"    within: soon\n" + // 8
		"    ban: 10m\n" + // 9
		"    scope: ip\n" + // 10
		"  - name: b\n" + // 11
		"    rule: per-iq\n" + // 12
		"    refusals: 5\n" + // 13
		"    within: 1m\n" + // 14
		"    ban: 10m\n" + // 15
		"    scope: ip\n" + // 16
		"  - name: c\n" + // 17
		"    rule: per-ip\n" + // 18
		"    refusals: 0\n" + // 19
		"    within: 1m\n" + // 20
		"    ban: 10m\n" + // 21
		"    scope: ip\n" + // 22
		"  - name: d\n" + // 23
		"    rule: per-ip\n" + // 24
		"    refusals: 2\n" + // 25
		"    within: 1m\n" + // 26
		"    ban: 10m\n" + // 27
		"    max: 1m\n" + // 28
		"    scope: session\n" // 29
	_, err := ParseConfig("c.yaml", []byte(data))
	got := errorPlaces(t, err)
	want := []string{"8:bans[0].within", "12:bans[1].rule", "19:bans[2].refusals", "29:bans[3].scope"}
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Errorf("errors at\n %v\nwant\n %v\n%v", got, want, err)
	}
	if !strings.Contains(err.Error(), `did you mean "per-ip"?`) {
		t.Errorf("no suggestion for per-iq: %v", err)
	}
	good := "version: 1\nglobal:\n  - {name: per-ip, scope: ip, algorithm: token_bucket, rate: 10/s, burst: 10}\n" +
		"bans:\n  - {name: a, rule: per-ip, refusals: 5, within: 1m, ban: 10m, max: 1h, scope: ip}\n"
	cfg, err := ParseConfig("c.yaml", []byte(good))
	if err != nil {
		t.Fatal(err)
	}
	if e := cfg.Escalations(); len(e) != 1 || e[0].Max != time.Hour || e[0].Refusals != 5 {
		t.Fatalf("escalations %+v", e)
	}
}

// TestConfigurationDocBans parses the escalation rule docs/configuration.md
// shows, beside the rule it names.
func TestConfigurationDocBans(t *testing.T) {
	doc, err := os.ReadFile("../../docs/configuration.md")
	if err != nil {
		t.Fatal(err)
	}
	_, after, _ := strings.Cut(string(doc), "## Bans")
	_, block, ok := strings.Cut(after, "```yaml\n")
	block, _, ok2 := strings.Cut(block, "```")
	if !ok || !ok2 {
		t.Fatal("docs/configuration.md has no yaml block under ## Bans")
	}
	data := "version: 1\nglobal:\n  - {name: login, scope: ip, algorithm: fixed_window, limit: 5, window: 1m}\n" + block
	cfg, err := ParseConfig("configuration.md", []byte(data))
	if err != nil {
		t.Fatal(err)
	}
	if e := cfg.Escalations(); len(e) != 1 || e[0].Forget != 168*time.Hour || e[0].Max != 24*time.Hour {
		t.Fatalf("escalations %+v", e)
	}
}

// errorPlaces returns the line and path of each error of a configuration
// that did not parse, as "line:path".
func errorPlaces(t *testing.T, err error) []string {
	t.Helper()
	var errs yamlconf.Errors
	if !errors.As(err, &errs) {
		t.Fatalf("want errors, got %v", err)
	}
	var got []string
	for _, e := range errs {
		got = append(got, fmt.Sprintf("%d:%s", e.Line, e.Path))
	}
	return got
}
