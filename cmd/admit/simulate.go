package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime/debug"
	"strings"
	"time"

	"github.com/admitdev/admit/internal/engine"
	"github.com/admitdev/admit/policy"
	"github.com/admitdev/admit/simulate"
)

const simulateUsage = `Usage:
  admit simulate [--rule SPEC]... [--config FILE --tenant T [--action A]]
                 [--pattern P | --log FILE] [--out FILE.svg|FILE.png] [--gif FILE.gif]
                 [--format text|csv|json]

Runs requests through rules with Admit's own algorithms, time passed in
(nothing sleeps), and draws what they do: each request admitted (green) or
refused (red), and under it the state of the limit over time.

Rules: --rule "token_bucket rate=2/2s burst=5" (repeatable; the
configuration's parameters as key=value, plus name= and scope=), or the
rules a tenant's requests meet in a configuration: --config FILE --tenant T
[--action A]. Several rules decide each request together, all or nothing,
as a server does; --independent runs each alone, to compare them.

Requests: --pattern "constant rate=1/s", "bursts n=5 every=10s",
"poisson rate=3/s seed=7", "onoff rate=5/s on=10s off=20s",
"ramp from=1/s to=20/s", or "seed004" (one a second for 20 s; the default),
sent by --tenant/--user with --cost; or --log FILE, a recorded log: CSV with
a header (time, and any of tenant, user, ip, action, cost) or JSON lines
with those fields; time is RFC 3339 or Unix seconds. With --tenant only
that tenant's requests are replayed; --action is the action of requests
the log gives none.

A run stays within about 1 GB of memory: at most 2,000,000 requests, 8
rules, state for 1,000,000 keys (tenants, users, addresses) in all rules
together, pictures of at most 4096 × 4096 pixels and animations of at
most 200 frames and 128 million pixels in all. Past a bound it stops with
exit code 2, naming it.

Exit codes: 0 done, 2 usage or input error.

Flags:
`

// The bounds of an admit simulate run, which keep it within about 1 GB
// (docs/simulate.md has the measurements): simulate.MaxEvents requests,
// and these.
const (
	simMaxRules     = 8
	simMaxKeys      = 1_000_000
	simMaxSide      = 4096      // pixels of a picture's width or height
	simMinSide      = 100       // pixels: room for the axes
	simMaxFrames    = 200       // of an animation
	simMaxGIFPixels = 128 << 20 // of an animation's frames, all kept until it is written
	simMemoryLimit  = 900 << 20 // the collector's soft limit (GOMEMLIMIT overrides it)
)

func simulateCmd(ctx context.Context, args []string, e *env) int {
	fs := flag.NewFlagSet("admit simulate", flag.ContinueOnError)
	var rules multiFlag
	fs.Var(&rules, "rule", "a rule `SPEC` such as \"token_bucket rate=2/2s burst=5\" (repeatable)")
	config := fs.String("config", "", "take the rules of --tenant from this configuration `file`")
	tenant := fs.String("tenant", "", "the `tenant` sending the requests (and whose rules --config gives)")
	user := fs.String("user", "", "the `user` sending the pattern's requests")
	action := fs.String("action", "", "the `action` of the pattern's requests")
	cost := fs.Int64("cost", 1, "the `cost` of each of the pattern's requests")
	pattern := fs.String("pattern", "seed004", "the arrival `pattern`")
	logFile := fs.String("log", "", "replay this recorded `log` (CSV or JSON lines) instead of a pattern")
	duration := fs.Duration("duration", 0, "how long the pattern runs (default: the pattern's duration=, 20s)")
	independent := fs.Bool("independent", false, "decide each rule alone rather than all together")
	hold := fs.Duration("hold", time.Second, "how long an admitted request holds a concurrency rule's slots")
	out := fs.String("out", "", "write the picture to this `file`: .svg or .png")
	gifOut := fs.String("gif", "", "write an animation to this `file` (.gif)")
	frames := fs.Int("frames", 40, "frames of the animation")
	width := fs.Int("width", 0, "picture width in `pixels` (default 1000)")
	height := fs.Int("height", 0, "picture height in `pixels` (default 40 + 250 per rule)")
	format := fs.String("format", "text", "the summary on standard output: text, csv or json")
	if code, done := parseFlags(fs, simulateUsage, args, e); done {
		return code
	}
	fail := func(format string, args ...any) int {
		fmt.Fprintf(e.stderr, "admit simulate: "+format+"\n", args...)
		return 2
	}
	if os.Getenv("GOMEMLIMIT") == "" {
		// The bounds keep what a run holds under about 700 MB; the
		// collector, told so, keeps the process's garbage from taking it
		// past 1 GB.
		debug.SetMemoryLimit(simMemoryLimit)
	}
	if *format != simulate.FormatText && *format != simulate.FormatCSV && *format != simulate.FormatJSON {
		return fail("--format %q: want text, csv or json", *format)
	}
	for _, f := range []struct {
		name string
		v    int
	}{{"--width", *width}, {"--height", *height}} {
		if f.v != 0 && (f.v < simMinSide || f.v > simMaxSide) {
			return fail("%s %d: a picture is from %d to %d pixels wide and high", f.name, f.v, simMinSide, simMaxSide)
		}
	}
	if *frames > simMaxFrames {
		return fail("--frames %d: an animation has at most %d frames", *frames, simMaxFrames)
	}
	if len(rules) > simMaxRules {
		return fail("%d rules: at most %d", len(rules), simMaxRules)
	}
	for _, f := range []struct{ name, file string }{{"--out", *out}, {"--gif", *gifOut}} {
		ext := strings.ToLower(filepath.Ext(f.file))
		if f.file != "" && ((f.name == "--out" && ext != ".svg" && ext != ".png") || (f.name == "--gif" && ext != ".gif")) {
			return fail("%s %s: want a file ending in %s", f.name, f.file, map[bool]string{true: ".svg or .png", false: ".gif"}[f.name == "--out"])
		}
	}

	// The rules.
	var specs []policy.RuleSpec
	for _, s := range rules {
		rs, err := simulate.ParseRule(s)
		if err != nil {
			return fail("%v", err)
		}
		specs = append(specs, rs)
	}
	var compiled []*policy.Rule
	if len(specs) > 0 {
		var err error
		if compiled, err = simulate.Compile(specs); err != nil {
			return fail("%v", err)
		}
	}
	if *config != "" {
		if *tenant == "" {
			return fail("--config needs --tenant: whose rules to run")
		}
		cfg, err := LoadConfig(*config)
		if err != nil {
			return fail("%v", err)
		}
		p, err := policy.Compile(cfg.Spec())
		if err != nil {
			return fail("%s: %v", *config, err)
		}
		rs, err := simulate.TenantRules(p, *tenant, *action)
		if err != nil {
			return fail("%s: %v", *config, err)
		}
		compiled = append(compiled, rs...)
	}
	if len(compiled) == 0 {
		return fail("no rules: give --rule SPEC or --config FILE --tenant T")
	}
	if len(compiled) > simMaxRules {
		return fail("%d rules: at most %d", len(compiled), simMaxRules)
	}
	// The picture's size, known now, before any request is made.
	size := simulate.DefaultSize(len(compiled))
	if *width > 0 {
		size.Width = *width
	}
	if *height > 0 {
		size.Height = *height
	}
	if size.Height > simMaxSide {
		return fail("a picture of %d rules is %d pixels high: at most %d (--height)", len(compiled), size.Height, simMaxSide)
	}
	if px := int64(*frames) * int64(size.Width) * int64(size.Height); *gifOut != "" && px > simMaxGIFPixels {
		return fail("--gif: %d frames of %d × %d pixels are %d pixels: at most %d (fewer --frames, or a smaller --width and --height)",
			*frames, size.Width, size.Height, px, simMaxGIFPixels)
	}

	// The requests.
	progress := progressPrinter(e.stderr)
	var events []simulate.Event
	opt := simulate.Options{Independent: *independent, Hold: *hold, MaxKeys: simMaxKeys, Context: ctx}
	if *logFile != "" {
		f, err := os.Open(*logFile)
		if err != nil {
			return fail("%v", err)
		}
		size := int64(0)
		if st, err := f.Stat(); err == nil {
			size = st.Size()
		}
		var readProgress func(int64)
		if progress != nil && size > 0 {
			readProgress = func(n int64) { progress("reading", int(n>>10), int(size>>10)) }
		}
		events, opt.Start, err = simulate.ReadLog(bufio.NewReader(f), *tenant, readProgress)
		f.Close()
		if err != nil {
			return fail("%s: %v", *logFile, err)
		}
		if *action != "" { // a log without actions: all are --action
			for i := range events {
				if events[i].Action == "" {
					events[i].Action = *action
				}
			}
		}
	} else {
		p, err := simulate.ParsePattern(*pattern)
		if err != nil {
			return fail("%v", err)
		}
		if *duration > 0 {
			p.Duration = *duration
			if n := p.Expected(); n > simulate.MaxEvents {
				return fail("--duration %v: about %.0f requests; at most %d", p.Duration, n, simulate.MaxEvents)
			}
		}
		events, err = p.Events(simulate.Identity{Tenant: *tenant, User: *user, Action: *action, Cost: *cost}, simulate.MaxEvents)
		if err != nil {
			return fail("%v", err)
		}
		opt.Duration = p.Duration
	}
	for _, r := range compiled {
		for i := range events {
			if err := engine.CheckCost(&r.Rule, events[i].Cost); err != nil && r.Applies(events[i].Action) {
				return fail("request %d costs %d: rule %s: %v", i+1, events[i].Cost, r.Name, err)
			}
		}
	}
	if progress != nil {
		opt.Progress = func(done, total int) { progress("deciding", done, total) }
	}
	res, err := simulate.Run(compiled, events, opt)
	if errors.Is(err, context.Canceled) {
		return fail("interrupted")
	}
	if err != nil {
		return fail("%v", err)
	}
	if progress != nil {
		fmt.Fprint(e.stderr, "\r\033[K")
	}

	write := func(file string, draw func(io.Writer) error) error {
		f, err := os.Create(file)
		if err != nil {
			return err
		}
		if err := draw(f); err != nil {
			f.Close()
			return err
		}
		return f.Close()
	}
	if *out != "" {
		draw := func(w io.Writer) error { return simulate.SVG(w, res, size) }
		if strings.EqualFold(filepath.Ext(*out), ".png") {
			draw = func(w io.Writer) error { return simulate.PNG(w, res, size) }
		}
		if err := write(*out, draw); err != nil {
			return fail("%s: %v", *out, err)
		}
	}
	if *gifOut != "" {
		if err := write(*gifOut, func(w io.Writer) error { return simulate.GIF(w, res, size, *frames) }); err != nil {
			return fail("%s: %v", *gifOut, err)
		}
	}
	if err := simulate.WriteSummary(e.stdout, res, *format); err != nil {
		return fail("%v", err)
	}
	return 0
}

// multiFlag is a flag that may be given several times.
type multiFlag []string

func (m *multiFlag) String() string     { return strings.Join(*m, "; ") }
func (m *multiFlag) Set(v string) error { *m = append(*m, v); return nil }

// progressPrinter returns a function printing progress on w when w is a
// terminal, or nil: scripts and pipes get no progress lines.
func progressPrinter(w io.Writer) func(what string, done, total int) {
	f, ok := w.(*os.File)
	if !ok {
		return nil
	}
	st, err := f.Stat()
	if err != nil || st.Mode()&os.ModeCharDevice == 0 {
		return nil
	}
	return func(what string, done, total int) {
		if total > 0 {
			fmt.Fprintf(w, "\r\033[K%s %d%%", what, done*100/total)
		}
	}
}
