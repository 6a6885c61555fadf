// Command testlines reads the events of go test -json on its standard
// input and prints a line per package as it finishes (so that a long run
// shows its progress), the output of every failed test in full, and at
// the end the slowest tests. It exits 1 when a test or a build failed.
//
//	go test -json ./... | go run ./internal/testlines
package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
	"time"
)

// event is one line of go test -json (cmd/test2json).
type event struct {
	Action     string
	Package    string
	ImportPath string // of a build's events
	Test       string
	Elapsed    float64
	Output     string
}

// slowest is how many of the slowest tests the summary lists.
const slowest = 10

type testTime struct {
	name    string
	elapsed float64
}

func main() {
	os.Exit(run(os.Stdin, os.Stdout))
}

func run(in io.Reader, out io.Writer) int {
	outputs := map[string][]string{} // package or package/test → its output
	var times []testTime
	failed := false
	packages := 0
	start := time.Now()
	sc := bufio.NewScanner(in)
	sc.Buffer(nil, 16<<20)
	for sc.Scan() {
		var e event
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			// Not an event: what go test printed itself (a build error).
			fmt.Fprintln(out, sc.Text())
			continue
		}
		key := e.Package
		if key == "" {
			key = e.ImportPath
		}
		if e.Test != "" {
			key += "/" + e.Test
		}
		switch e.Action {
		case "output", "build-output":
			outputs[key] = append(outputs[key], e.Output)
		case "pass", "skip":
			if e.Test != "" {
				if !strings.Contains(e.Test, "/") {
					times = append(times, testTime{key, e.Elapsed})
				}
				delete(outputs, key)
				continue
			}
			packages++
			if e.Action == "skip" {
				fmt.Fprintf(out, "-     %s (no tests)\n", e.Package)
			} else {
				fmt.Fprintf(out, "ok    %-60s %7.1fs  (%s in)\n", e.Package, e.Elapsed, time.Since(start).Round(time.Second))
			}
			delete(outputs, key)
		case "build-fail":
			failed = true
			fmt.Fprintf(out, "FAIL  %s (build)\n%s", key, strings.Join(outputs[key], ""))
			delete(outputs, key)
		case "fail":
			failed = true
			if e.Test != "" {
				fmt.Fprintf(out, "--- FAIL: %s (%.2fs)\n%s", key, e.Elapsed, strings.Join(outputs[key], ""))
				delete(outputs, key)
				continue
			}
			fmt.Fprintf(out, "FAIL  %-60s %7.1fs\n%s", e.Package, e.Elapsed, strings.Join(outputs[key], ""))
			delete(outputs, key)
		}
	}
	sort.Slice(times, func(i, j int) bool { return times[i].elapsed > times[j].elapsed })
	fmt.Fprintf(out, "\nthe %d slowest tests:\n", min(slowest, len(times)))
	for _, tt := range times[:min(slowest, len(times))] {
		fmt.Fprintf(out, "  %7.1fs  %s\n", tt.elapsed, tt.name)
	}
	if failed {
		return 1
	}
	if packages == 0 {
		fmt.Fprintln(out, "testlines: no package finished: did go test run?")
		return 1
	}
	return 0
}
