package main

import (
	"context"
	"flag"
	"fmt"
	"net/http"
	"runtime/debug"
	"time"
)

// version is set at build time: go build -ldflags "-X main.version=v1.2.3".
// Otherwise the module version go install recorded, or "devel".
var version = ""

// versionInfo returns the version, the commit (with "-dirty" when the
// tree was modified) and the Go version the binary was built with.
func versionInfo() (v, commit, goVersion string) {
	v, commit = version, "unknown"
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return first(v, "devel"), commit, "unknown"
	}
	if v == "" && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
		v = bi.Main.Version
	}
	dirty := false
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			commit = s.Value
		case "vcs.modified":
			dirty = s.Value == "true"
		}
	}
	if dirty {
		commit += "-dirty"
	}
	return first(v, "devel"), commit, bi.GoVersion
}

func versionCmd(e *env) int {
	v, commit, gov := versionInfo()
	fmt.Fprintf(e.stdout, "admit %s (commit %s, %s)\n", v, commit, gov)
	return 0
}

// healthcheck asks a running server's /healthz: the HEALTHCHECK of the
// container image, which holds no shell and no curl.
func healthcheck(ctx context.Context, args []string, e *env) int {
	fs := flag.NewFlagSet("admit healthcheck", flag.ContinueOnError)
	url := fs.String("url", "http://127.0.0.1:8080/healthz", "the `URL` to ask; /readyz asks whether the store answers too")
	timeout := fs.Duration("timeout", 3*time.Second, "how long to wait for an answer")
	if code, done := parseFlags(fs, "Usage: admit healthcheck [--url URL]\n\nExit 0 when the server answers 200, 1 otherwise.\n\nFlags:\n", args, e); done {
		return code
	}
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, "GET", *url, nil)
	if err != nil {
		fmt.Fprintln(e.stderr, "admit healthcheck:", err)
		return 2
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		fmt.Fprintln(e.stderr, "admit healthcheck:", err)
		return 1
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		fmt.Fprintln(e.stderr, "admit healthcheck:", resp.Status)
		return 1
	}
	return 0
}
