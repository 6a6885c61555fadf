package simulate

import (
	"bytes"
	"encoding/xml"
	"errors"
	"image/gif"
	"image/png"
	"strings"
	"testing"
	"time"

	"github.com/admitdev/admit/policy"
)

func rulesOf(t testing.TB, specs ...string) []*policy.Rule {
	t.Helper()
	var rs []policy.RuleSpec
	for _, s := range specs {
		r, err := ParseRule(s)
		if err != nil {
			t.Fatal(err)
		}
		rs = append(rs, r)
	}
	rules, err := Compile(rs)
	if err != nil {
		t.Fatal(err)
	}
	return rules
}

// seed004 are the three rules of seed 004's animations, all at 1 request
// a second on average.
func seed004(t testing.TB) []*policy.Rule {
	return rulesOf(t,
		"fixed_window limit=5 window=5s",
		"sliding_log limit=5 window=5s",
		"token_bucket rate=2/2s burst=5",
	)
}

func events(t testing.TB, pattern string) []Event {
	t.Helper()
	p, err := ParsePattern(pattern)
	if err != nil {
		t.Fatal(err)
	}
	ev, err := p.Events(Identity{}, 0)
	if err != nil {
		t.Fatal(err)
	}
	return ev
}

// outcomes writes a lane's outcomes as a string, A admitted, R refused,
// O refused by another rule, a space between instants.
func outcomes(l *Lane) string {
	var b strings.Builder
	for i, o := range l.Outcomes {
		if i > 0 && l.At[i] != l.At[i-1] {
			b.WriteByte(' ')
		}
		b.WriteByte("ARO"[o])
	}
	return b.String()
}

// levelAt is the lane's last sample at or before at, taken before any
// request at that instant.
func levelAt(l *Lane, at time.Duration) float64 {
	v := -1.0
	for _, p := range l.Points {
		if p.At > at {
			break
		}
		if p.At == at {
			return p.Level
		}
		v = p.Level
	}
	return v
}

// TestSeed004Scene is the seed's scene: one request a second for 20 s
// through each of its three rules, which all come to 1 request a second.
// Each admits every request; the bucket never holds fewer than 4 tokens.
func TestSeed004Scene(t *testing.T) {
	r, err := Run(seed004(t), events(t, "seed004"), Options{Independent: true, Samples: 21})
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range r.Lanes {
		if l.Summary.Requests != 20 || l.Summary.Admitted != 20 || l.Summary.Refused != 0 {
			t.Errorf("%s: %+v, want all 20 admitted", l.Rule.Name, l.Summary)
		}
	}
	bucket := r.Lanes[2]
	for _, p := range bucket.Points {
		if p.Level < 4 || p.Level > 5 {
			t.Errorf("bucket at %v holds %v tokens, want 4 to 5", p.At, p.Level)
		}
	}
	if got := r.Lanes[0].Summary.MostInPeriod; got != 5 {
		t.Errorf("fixed window: most admitted in 5 s %d, want 5", got)
	}
}

// TestTwiceTheRate sends two requests a second, twice what each rule
// allows on average, and checks each rule's decisions request by request.
func TestTwiceTheRate(t *testing.T) {
	r, err := Run(seed004(t), events(t, "bursts n=2 every=1s"), Options{Independent: true, Duration: 20 * time.Second, Samples: 21})
	if err != nil {
		t.Fatal(err)
	}
	fixed, log, bucket := r.Lanes[0], r.Lanes[1], r.Lanes[2]
	// A fixed window admits its 5 in the first 2.5 s of each window,
	// then refuses until it ends.
	if got, want := outcomes(fixed), strings.Repeat("AA AA AR RR RR ", 4); got != strings.TrimSpace(want) {
		t.Errorf("fixed window:\n got %s\nwant %s", got, want)
	}
	// The seed: "At time 5, the logs counter reduced from 5 to 3 because
	// the first 2 requests have expired."
	if got := levelAt(log, 5*time.Second); got != 3 {
		t.Errorf("sliding log at 5 s holds %v, want 3", got)
	}
	if got, want := outcomes(log), "AA AA AR RR RR AA AA AR RR RR AA AA AR RR RR AA AA AR RR RR"; got != want {
		t.Errorf("sliding log:\n got %s\nwant %s", got, want)
	}
	// The bucket starts with 5 tokens and gains 1 a second: it loses one
	// a second until it is empty at 3 s, then admits one request a second.
	if got, want := outcomes(bucket), "AA AA AA AA"+strings.Repeat(" AR", 16); got != want {
		t.Errorf("token bucket:\n got %s\nwant %s", got, want)
	}
	if s := bucket.Summary; s.Admitted != 24 || s.Refused != 16 || s.LongestRefusedStreak != 1 || s.MostInPeriod != 4 {
		t.Errorf("token bucket summary %+v", s)
	}
}

// TestWindowBoundary is the seed's drawback of fixed windows: 5 requests
// at the end of one window and 5 at the start of the next are all
// admitted, twice the limit within a second; the log and the bucket do not
// let that through.
func TestWindowBoundary(t *testing.T) {
	var ev []Event
	for _, at := range []time.Duration{4500 * time.Millisecond, 5500 * time.Millisecond} {
		for range 5 {
			ev = append(ev, Event{At: at, Cost: 1})
		}
	}
	r, err := Run(seed004(t), ev, Options{Independent: true})
	if err != nil {
		t.Fatal(err)
	}
	for i, want := range []struct {
		admitted, most int64
	}{{10, 10}, {5, 5}, {6, 6}} {
		s := r.Lanes[i].Summary
		if s.Admitted != want.admitted || s.MostInPeriod != want.most {
			t.Errorf("%s: admitted %d, most in a period %d; want %d, %d", r.Lanes[i].Rule.Name, s.Admitted, s.MostInPeriod, want.admitted, want.most)
		}
	}
}

// TestTogether decides the rules as a server does, all or nothing: a
// request the window refuses is not charged to the bucket.
func TestTogether(t *testing.T) {
	rules := rulesOf(t, "fixed_window limit=2 window=10s name=window", "token_bucket rate=1/s burst=10 name=bucket")
	r, err := Run(rules, events(t, "constant rate=1/s duration=5s"), Options{Duration: 5 * time.Second, Samples: 6})
	if err != nil {
		t.Fatal(err)
	}
	if got := outcomes(r.Lanes[0]); got != "A A R R R" {
		t.Errorf("window %s", got)
	}
	if got := outcomes(r.Lanes[1]); got != "A A O O O" {
		t.Errorf("bucket %s", got)
	}
	// Two tokens taken, refilled at 1 a second: full again after 2 s.
	if got := levelAt(r.Lanes[1], 4*time.Second); got != 10 {
		t.Errorf("bucket at 4 s holds %v, want 10: refused requests were charged", got)
	}
}

// TestConcurrency holds each admitted request's slot for 1.5 s: with one
// slot and a request a second, every other request finds it taken.
func TestConcurrency(t *testing.T) {
	r, err := Run(rulesOf(t, "concurrency max=1"), events(t, "constant rate=1/s duration=6s"), Options{Hold: 1500 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	l := r.Lanes[0]
	if got := outcomes(l); got != "A R A R A R" {
		t.Errorf("concurrency %s", got)
	}
	if l.Summary.MostInPeriod != 1 || levelAt(l, 1200*time.Millisecond) != 1 {
		t.Errorf("slots held: most %d", l.Summary.MostInPeriod)
	}
}

// TestScopes keys the state by the rule's scope: each user has a bucket.
func TestScopes(t *testing.T) {
	rules := rulesOf(t, "token_bucket rate=1/min burst=1 scope=user")
	ev := []Event{{At: 0, Tenant: "t", User: "a", Cost: 1}, {At: 1, Tenant: "t", User: "b", Cost: 1}, {At: 2, Tenant: "t", User: "a", Cost: 1}}
	r, err := Run(rules, ev, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if got := outcomes(r.Lanes[0]); got != "A A R" {
		t.Errorf("per-user buckets: %s", got)
	}
	if r.Lanes[0].Focus != "user a" {
		t.Errorf("focus %q, want the busiest user", r.Lanes[0].Focus)
	}
}

func TestPatterns(t *testing.T) {
	for _, c := range []struct {
		pattern string
		n       int
	}{
		{"constant rate=10/s duration=3s", 30},
		{"bursts n=5 every=10s duration=25s", 15},
		{"onoff rate=2/s on=5s off=5s duration=20s", 20},
		{"ramp from=0/s to=10/s duration=10s", 50},
		{"seed004", 20},
	} {
		ev := events(t, c.pattern)
		if d := len(ev) - c.n; d < -1 || d > 1 {
			t.Errorf("%s: %d requests, want %d", c.pattern, len(ev), c.n)
		}
	}
	// Poisson: repeatable by seed, about the rate.
	a, b := events(t, "poisson rate=100/s seed=3 duration=10s"), events(t, "poisson rate=100/s seed=3 duration=10s")
	if len(a) != len(b) || len(a) < 900 || len(a) > 1100 || a[10] != b[10] {
		t.Errorf("poisson: %d and %d requests", len(a), len(b))
	}
	for _, bad := range []string{"", "constant", "constant rate=x", "zigzag rate=1/s", "bursts n=0 every=1s", "constant rate=1000000/s duration=1000h", "constant rate=1/s speed=2"} {
		if _, err := ParsePattern(bad); err == nil {
			t.Errorf("%q was accepted", bad)
		}
	}
}

// TestPatternBounds: the estimate a pattern is checked against before it
// runs is the count its grid of requests makes, however its periods
// round; and the requests are bounded as they are generated, for a
// pattern whose estimate is only a mean. An on period of 1 ns at 1/h
// once counted as 0.015 requests, and sent 15 M (one at the start of
// each on period).
func TestPatternBounds(t *testing.T) {
	for _, pattern := range []string{
		"constant rate=3/s duration=1s", "constant rate=3/10ns duration=1ms", "bursts n=3 every=2s duration=6s",
		"onoff rate=2/s on=5s off=5s duration=20s", "onoff rate=1/h on=1ns off=1ns duration=1ms",
		"onoff rate=1/s on=2500ms off=1s duration=6s", "seed004",
	} {
		p, err := ParsePattern(pattern)
		if err != nil {
			t.Fatalf("%s: %v", pattern, err)
		}
		ev, err := p.Events(Identity{}, 0)
		if err != nil || float64(len(ev)) != p.Expected() {
			t.Errorf("%s: %d requests (%v), estimated %v", pattern, len(ev), err, p.Expected())
		}
	}
	if _, err := ParsePattern("onoff rate=1/h on=1ns off=1ns duration=30ms"); err == nil || !strings.Contains(err.Error(), "at most 2000000") {
		t.Errorf("15 M requests of 1 ns on periods: %v", err)
	}
	p, _ := ParsePattern("poisson rate=100/s seed=3 duration=10s")
	if ev, err := p.Events(Identity{}, 900); !errors.Is(err, ErrTooManyEvents) || ev != nil || !strings.Contains(err.Error(), "at most 900") {
		t.Errorf("poisson past a bound of 900: %d requests, %v", len(ev), err)
	}
	if ev, err := p.Events(Identity{}, 2000); err != nil || len(ev) < 900 {
		t.Errorf("poisson within a bound of 2000: %d requests, %v", len(ev), err)
	}
}

func TestReadLog(t *testing.T) {
	csvLog := "time,tenant,user,cost\n2026-03-01T10:00:01Z,acme,alice,2\n2026-03-01T10:00:00Z,acme,bob,\n2026-03-01T10:00:02.5Z,other,carol,1\n"
	ev, start, err := ReadLog(strings.NewReader(csvLog), "acme", nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(ev) != 2 || !start.Equal(time.Date(2026, 3, 1, 10, 0, 0, 0, time.UTC)) || ev[0].User != "bob" || ev[1].At != time.Second || ev[1].Cost != 2 || ev[0].Cost != 1 {
		t.Errorf("csv: %+v from %v", ev, start)
	}
	jsonLog := `{"time":1772359200.5,"tenant":"acme","user":"alice"}
{"time":"2026-03-01T10:00:03Z","tenant":"acme","cost":4}
`
	ev, _, err = ReadLog(strings.NewReader(jsonLog), "", nil)
	if err != nil || len(ev) != 2 || ev[1].At != 2500*time.Millisecond || ev[1].Cost != 4 {
		t.Errorf("json lines: %+v %v", ev, err)
	}
	for _, bad := range []string{"", "tenant,user\nacme,alice\n", "time,colour\n1,red\n", "time\nyesterday\n", "time,cost\n1,-3\n", `{"time":"x"}`, "time\n1\n", "time,tenant\n99999999999,ghost\n"} {
		if _, _, err := ReadLog(strings.NewReader(bad), "ghost", nil); err == nil {
			t.Errorf("%q was accepted", bad)
		}
	}
}

// TestPictures checks that the SVG is XML of the right size, the PNG
// decodes at the size asked, and the GIF has its frames.
func TestPictures(t *testing.T) {
	r, err := Run(seed004(t), events(t, "bursts n=2 every=1s"), Options{Independent: true})
	if err != nil {
		t.Fatal(err)
	}
	size := DefaultSize(len(r.Lanes))
	var svg bytes.Buffer
	if err := SVG(&svg, r, size); err != nil {
		t.Fatal(err)
	}
	var root struct {
		XMLName xml.Name
		Width   string `xml:"width,attr"`
		Height  string `xml:"height,attr"`
	}
	if err := xml.Unmarshal(svg.Bytes(), &root); err != nil || root.XMLName.Local != "svg" {
		t.Fatalf("SVG does not parse: %v %v", err, root.XMLName)
	}
	if root.Width != "1000px" && root.Width != "750pt" {
		t.Errorf("SVG width %q, want 1000 px", root.Width)
	}
	for _, text := range []string{"token_bucket 2/2s burst 5", "24 admitted, 16 refused", "time (s)", "refused"} {
		if !strings.Contains(svg.String(), text) && !strings.Contains(svg.String(), strings.ReplaceAll(text, " ", "&#32;")) {
			t.Errorf("the SVG does not say %q", text)
		}
	}
	var pngBuf bytes.Buffer
	if err := PNG(&pngBuf, r, size); err != nil {
		t.Fatal(err)
	}
	img, err := png.Decode(&pngBuf)
	if err != nil {
		t.Fatal(err)
	}
	if b := img.Bounds(); b.Dx() != size.Width || b.Dy() != size.Height {
		t.Errorf("PNG %v, want %dx%d", b, size.Width, size.Height)
	}
	var g bytes.Buffer
	if err := GIF(&g, r, Size{Width: 600, Height: 500}, 5); err != nil {
		t.Fatal(err)
	}
	anim, err := gif.DecodeAll(&g)
	if err != nil {
		t.Fatal(err)
	}
	if len(anim.Image) != 5 || anim.Image[0].Bounds().Dx() != 600 || anim.Delay[4] <= anim.Delay[0] {
		t.Errorf("GIF: %d frames of %v", len(anim.Image), anim.Image[0].Bounds())
	}
}

func TestSummaryFormats(t *testing.T) {
	r, err := Run(seed004(t), events(t, "bursts n=2 every=1s"), Options{Independent: true})
	if err != nil {
		t.Fatal(err)
	}
	for format, want := range map[string]string{
		FormatText: "token_bucket  token_bucket 2/2s burst 5  24",
		FormatCSV:  "token_bucket,token_bucket,token_bucket 2/2s burst 5,40,24,16,0,1,4,2000",
		FormatJSON: `"most_admitted_in_period": 4`,
	} {
		var b bytes.Buffer
		if err := WriteSummary(&b, r, format); err != nil || !strings.Contains(b.String(), want) {
			t.Errorf("%s: %v\n%s\nwant it to hold %q", format, err, b.String(), want)
		}
	}
	if err := WriteSummary(&bytes.Buffer{}, r, "yaml"); err == nil {
		t.Error("yaml was accepted")
	}
}

func BenchmarkRun(b *testing.B) {
	rules := rulesOf(b, "token_bucket rate=100/s burst=50 scope=user", "sliding_window limit=1000 window=1m scope=tenant", "quota limit=1000000 period=month scope=tenant")
	ev := make([]Event, 100_000)
	for i := range ev {
		ev[i] = Event{At: time.Duration(i) * time.Millisecond, Tenant: "t", User: string(rune('a' + i%26)), Cost: 1}
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Run(rules, ev, Options{}); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(ev)), "ns/request")
}
