package main

import (
	"bytes"
	"context"
	"encoding/json"
	"image/gif"
	"image/png"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func runCmd(args ...string) (int, string, string) {
	var out, errb bytes.Buffer
	code := run(context.Background(), args, &env{stdout: &out, stderr: &errb, getenv: os.Getenv})
	return code, out.String(), errb.String()
}

// TestSimulateCommand runs admit simulate as a user does: the seed's
// rules at twice their rate, pictures written, numbers for scripts.
func TestSimulateCommand(t *testing.T) {
	dir := t.TempDir()
	pngFile, gifFile := filepath.Join(dir, "sim.png"), filepath.Join(dir, "sim.gif")
	code, out, stderr := runCmd("simulate", "--independent", "--pattern", "bursts n=2 every=1s",
		"--rule", "fixed_window limit=5 window=5s", "--rule", "token_bucket rate=2/2s burst=5",
		"--out", pngFile, "--gif", gifFile, "--frames", "4", "--format", "json")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	var rep struct {
		Requests int
		Rules    []struct {
			Rule                 string
			Admitted, Refused    int64
			LongestRefusedStreak int64 `json:"longest_refused_streak"`
		}
	}
	if err := json.Unmarshal([]byte(out), &rep); err != nil || rep.Requests != 40 || len(rep.Rules) != 2 {
		t.Fatalf("summary %s: %v", out, err)
	}
	if b := rep.Rules[1]; b.Rule != "token_bucket" || b.Admitted != 24 || b.Refused != 16 || b.LongestRefusedStreak != 1 {
		t.Errorf("token bucket %+v", b)
	}
	f, err := os.Open(pngFile)
	if err != nil {
		t.Fatal(err)
	}
	img, err := png.Decode(f)
	f.Close()
	if err != nil || img.Bounds().Dx() != 1000 || img.Bounds().Dy() != 540 {
		t.Errorf("png: %v %v", err, img.Bounds())
	}
	f, err = os.Open(gifFile)
	if err != nil {
		t.Fatal(err)
	}
	anim, err := gif.DecodeAll(f)
	f.Close()
	if err != nil || len(anim.Image) != 4 {
		t.Errorf("gif: %v", err)
	}
}

// TestSimulateTenantReplay replays a tenant's recorded traffic through its
// tier in a configuration, the way a team tries a candidate tier.
func TestSimulateTenantReplay(t *testing.T) {
	dir := t.TempDir()
	cfg := filepath.Join(dir, "admit.yaml")
	writeConfig(t, cfg, "3")
	log := filepath.Join(dir, "traffic.csv")
	lines := "time,tenant,user\n"
	for _, s := range []string{"0", "0.1", "0.2", "0.3", "0.4", "5"} {
		lines += "17723592" + "0" + s + ",t1,alice\n"
	}
	lines += "1772359200.5,other,bob\n"
	if err := os.WriteFile(log, []byte(lines), 0o600); err != nil {
		t.Fatal(err)
	}
	code, out, stderr := runCmd("simulate", "--config", cfg, "--tenant", "t1", "--log", log, "--format", "csv", "--out", filepath.Join(dir, "t1.svg"))
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	if !strings.Contains(out, "tenant-requests,token_bucket,token_bucket 1/h burst 3,6,3,3,0,3,3,3600000") {
		t.Errorf("summary:\n%s", out)
	}
	svg, err := os.ReadFile(filepath.Join(dir, "t1.svg"))
	if err != nil || !bytes.Contains(svg, []byte("<svg")) {
		t.Errorf("svg: %v", err)
	}
}

func TestSimulateRefusesBadInput(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--rule", "token_bucket rate=2/2s"}, "burst"},
		{[]string{"--rule", "token_buckets rate=1/s burst=1"}, "token_bucket"},
		{[]string{}, "no rules"},
		{[]string{"--config", "demo.yaml"}, "--config needs --tenant"},
		{[]string{"--rule", "fixed_window limit=5 window=5s", "--pattern", "zigzag"}, "unknown kind"},
		{[]string{"--rule", "fixed_window limit=5 window=5s", "--out", "x.jpg"}, ".svg or .png"},
		{[]string{"--rule", "fixed_window limit=5 window=5s", "--format", "yaml"}, "want text, csv or json"},
		{[]string{"--rule", "fixed_window limit=5 window=5s", "--log", "no-such-file.csv"}, "no such file"},
		{[]string{"--rule", "fixed_window limit=5 window=5s", "--cost", "9"}, "costs 9"},
	} {
		code, _, stderr := runCmd(append([]string{"simulate"}, c.args...)...)
		if code != 2 || !strings.Contains(stderr, c.want) {
			t.Errorf("%v: exit %d, stderr %q; want 2 and %q", c.args, code, stderr, c.want)
		}
	}
}
