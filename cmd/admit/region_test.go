package main

import (
	"context"
	"io"
	"log/slog"
	"strings"
	"testing"
)

// TestRegionFlags: --region and --home go together, override the file's
// store section, and refuse, with the file's lines, rules the regions
// cannot hold; a home needs the region's own Redis.
func TestRegionFlags(t *testing.T) {
	const plain = "version: 1\nstore:\n  backend: redis\ntiers:\n  free:\n    rules:\n      - {name: r, scope: tenant, algorithm: gcra, rate: 1/s, burst: 5}\ntenants:\n  acme: {tier: free}\n"
	const window = "version: 1\nstore:\n  backend: redis\ntiers:\n  free:\n    rules:\n      - {name: w, scope: tenant, algorithm: sliding_window, limit: 5, window: 1m}\ntenants:\n  acme: {tier: free}\n"
	for _, c := range []struct {
		name, file, region, home, want string
	}{
		{"region alone", plain, "eu", "", "--region needs --home"},
		{"home alone", plain, "", "redis://h:6379", "needs a region"},
		{"bad name", plain, "eu west", "redis://h:6379", `--region "eu west": a region's name`},
		{"bad home", plain, "eu", "http://h", `--home "http://h": want a Redis URL`},
		{"rule", window, "eu", "redis://h:6379", `c.yaml:7:45: tiers.free.rules[0].algorithm: rule "w": sliding_window limits are not held across regions yet`},
		{"fine", plain, "eu", "redis://h:6379", ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg, err := ParseConfig("c.yaml", []byte(c.file))
			if err != nil {
				t.Fatal(err)
			}
			err = regionFlags(&backendFlags{region: c.region, home: c.home}, cfg)
			switch {
			case c.want == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)):
				t.Fatalf("got %v, want an error saying %q", err, c.want)
			case c.want == "" && (cfg.Store.Region != c.region || cfg.Store.Home != c.home):
				t.Fatalf("store section %+v: the flags did not apply", cfg.Store)
			}
		})
	}
	cfg, err := ParseConfig("c.yaml", []byte(strings.Replace(plain, "backend: redis", "backend: memory", 1)))
	if err != nil {
		t.Fatal(err)
	}
	cfg.Store.Region, cfg.Store.Home = "eu", "redis://h:6379"
	if _, err := openStore(context.Background(), "memory", cfg, t.TempDir(), slog.New(slog.NewTextHandler(io.Discard, nil))); err == nil || !strings.Contains(err.Error(), "needs the region's own Redis") {
		t.Errorf("a home with the memory store: %v", err)
	}
}
