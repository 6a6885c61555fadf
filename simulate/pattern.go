// Package simulate runs arrival patterns through rate limit rules with
// Admit's own algorithms, time passed in, and draws what they do: each
// request admitted or refused, and the state of the limit over time.
//
// It is what `admit simulate` and the dashboard's simulator run: the same
// state transitions the stores use (engine.PreparedRule.StepTo, engine.Log,
// engine.LeaseSet), so a picture shows what a server would decide.
package simulate

import (
	"bufio"
	"cmp"
	"encoding/csv"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/admitdev/admit"
	"github.com/admitdev/admit/internal/bounds"
)

// Event is one request: when it arrives, counted from the start of the
// run, who sends it, and what it costs.
type Event struct {
	At     time.Duration
	Tenant string
	User   string
	IP     string
	Action string
	Cost   int64
}

// Identity is who sends a pattern's requests.
type Identity struct {
	Tenant, User, IP, Action string
	Cost                     int64 // 0 means 1
}

// A Pattern generates the arrival times of requests over a run.
type Pattern struct {
	// Kind is constant, bursts, poisson, onoff, ramp or seed004.
	Kind string
	// Rate: constant, poisson, onoff (while on); ramp goes From → To.
	Rate, From, To admit.Rate
	// Bursts: N requests at once, Every apart.
	N     int64
	Every time.Duration
	// OnOff: On at Rate, then Off silent, repeated.
	On, Off time.Duration
	// Seed makes poisson repeatable.
	Seed uint64
	// Duration is how long the pattern runs; seed004 runs 20 s.
	Duration time.Duration
}

// MaxEvents bounds what one pattern may generate, and a log replay, so
// that a typo (1000000/s for a day) fails fast instead of filling memory:
// a run holds every request, and each rule a mark for each (9.9 million
// requests once took 3.5 GB).
const MaxEvents = 2_000_000

// ParsePattern parses a pattern as `admit simulate --pattern` takes it: a
// kind, then key=value parameters, separated by spaces or commas:
//
//	constant rate=1/s
//	bursts n=5 every=10s
//	poisson rate=3/s seed=7
//	onoff rate=5/s on=10s off=20s
//	ramp from=1/s to=20/s
//	seed004                      (one request a second for 20 s)
//
// duration=D sets the run's length (default 20s).
func ParsePattern(s string) (Pattern, error) {
	fields := strings.FieldsFunc(s, func(r rune) bool { return r == ' ' || r == ',' })
	if len(fields) == 0 {
		return Pattern{}, errors.New("empty pattern; want e.g. \"constant rate=1/s\"")
	}
	p := Pattern{Kind: fields[0], Duration: 20 * time.Second, Seed: 1}
	seen := map[string]bool{}
	for _, f := range fields[1:] {
		k, v, ok := strings.Cut(f, "=")
		if !ok || v == "" {
			return p, fmt.Errorf("pattern %q: %q is not key=value", s, f)
		}
		seen[k] = true
		var err error
		switch k {
		case "rate":
			p.Rate, err = admit.ParseRate(v)
		case "from":
			p.From, err = rampRate(v)
		case "to":
			p.To, err = rampRate(v)
		case "n":
			p.N, err = strconv.ParseInt(v, 10, 64)
			if err == nil && (p.N < 1 || p.N > 1_000_000) {
				err = errors.New("want 1 to 1000000")
			}
		case "every":
			p.Every, err = admit.ParseDuration(v)
		case "on":
			p.On, err = admit.ParseDuration(v)
		case "off":
			p.Off, err = admit.ParseDuration(v)
		case "seed":
			p.Seed, err = strconv.ParseUint(v, 10, 64)
		case "duration":
			p.Duration, err = admit.ParseDuration(v)
		default:
			err = errors.New("unknown parameter")
		}
		if err != nil {
			return p, fmt.Errorf("pattern %q: %s: %v", s, k, err)
		}
	}
	need := map[string][]string{
		"constant": {"rate"}, "poisson": {"rate"}, "bursts": {"n", "every"},
		"onoff": {"rate", "on", "off"}, "ramp": {"from", "to"}, "seed004": nil,
	}
	req, ok := need[p.Kind]
	if !ok {
		return p, fmt.Errorf("pattern %q: unknown kind %q; want constant, bursts, poisson, onoff, ramp or seed004", s, p.Kind)
	}
	for _, k := range req {
		if !seen[k] {
			return p, fmt.Errorf("pattern %q: %s needs %s=", s, p.Kind, k)
		}
	}
	if p.Kind == "seed004" {
		p.Rate, p.Duration = admit.Rate{N: 1, Per: time.Second}, 20*time.Second
	}
	if p.Duration <= 0 {
		return p, fmt.Errorf("pattern %q: duration must be positive", s)
	}
	if (p.Kind == "bursts" && p.Every <= 0) || (p.Kind == "onoff" && (p.On <= 0 || p.Off < 0)) {
		return p, fmt.Errorf("pattern %q: periods must be positive", s)
	}
	if n := p.expected(); n > MaxEvents {
		return p, fmt.Errorf("pattern %q: %w: about %.0f; at most %d", s, ErrTooManyEvents, n, MaxEvents)
	}
	return p, nil
}

// rampRate parses a ramp's end, which may be 0/s (silence).
func rampRate(v string) (admit.Rate, error) {
	if n, unit, ok := strings.Cut(v, "/"); ok && n == "0" {
		r, err := admit.ParseRate("1/" + unit)
		return admit.Rate{Per: r.Per}, err
	}
	return admit.ParseRate(v)
}

// perSecond is r in requests per second.
func perSecond(r admit.Rate) float64 {
	if r.Per <= 0 {
		return 0
	}
	return float64(r.N) / r.Per.Seconds()
}

// Expected returns about how many requests Events generates (a Poisson
// pattern's mean), without generating them.
func (p Pattern) Expected() float64 { return p.expected() }

// expected is how many requests p generates: exactly for constant,
// bursts and onoff patterns, whose requests fall on a grid; the mean of a
// poisson pattern; the integral of the rate of a ramp.
func (p Pattern) expected() float64 {
	d := p.Duration.Seconds()
	switch p.Kind {
	case "constant", "seed004":
		return ticks(p.Duration, interval(p.Rate))
	case "bursts":
		return float64(p.N) * ticks(p.Duration, p.Every)
	case "ramp":
		return (perSecond(p.From) + perSecond(p.To)) / 2 * d
	case "onoff":
		// Every on period sends one request at its start, however short
		// it is and however slow the rate: counted per period, not as
		// the rate times the time spent on.
		gap, period := interval(p.Rate), p.On+p.Off
		full := p.Duration / period
		n := float64(full) * ticks(p.On, gap)
		if rest := p.Duration - full*period; rest > 0 {
			n += ticks(min(rest, p.On), gap)
		}
		return n
	}
	return perSecond(p.Rate) * d
}

// ticks is how many of 0, gap, 2×gap, … come before d.
func ticks(d, gap time.Duration) float64 {
	if gap <= 0 || d <= 0 {
		return 0
	}
	return float64((d-1)/gap + 1)
}

// ErrTooManyEvents is the error ParsePattern and Events return, wrapped,
// when a pattern sends more requests than MaxEvents or the bound Events
// was given.
var ErrTooManyEvents = errors.New("too many requests")

// Events generates p's requests, all sent by id, in order of arrival: at
// most limit of them (MaxEvents when limit is 0 or more than that). Past the
// bound it stops, as soon as it is passed, and returns an error wrapping
// ErrTooManyEvents, so that a pattern whose estimate was wrong costs no
// more memory than the bound.
func (p Pattern) Events(id Identity, limit int) ([]Event, error) {
	if limit <= 0 || limit > MaxEvents {
		limit = MaxEvents
	}
	cost := id.Cost
	if cost == 0 {
		cost = 1
	}
	var out []Event
	// add appends a request at at and reports whether there is room for
	// more.
	add := func(at time.Duration) bool {
		if len(out) == limit {
			return false
		}
		out = append(out, Event{At: at, Tenant: id.Tenant, User: id.User, IP: id.IP, Action: id.Action, Cost: cost})
		return true
	}
	tooMany := func() ([]Event, error) {
		return nil, fmt.Errorf("%w: at most %d", ErrTooManyEvents, limit)
	}
	switch p.Kind {
	case "constant", "seed004":
		gap := interval(p.Rate)
		for t := time.Duration(0); t < p.Duration; t += gap {
			if !add(t) {
				return tooMany()
			}
		}
	case "bursts":
		for t := time.Duration(0); t < p.Duration; t += p.Every {
			for range p.N {
				if !add(t) {
					return tooMany()
				}
			}
		}
	case "poisson":
		rng := rand.New(rand.NewPCG(p.Seed, 0x5eed))
		rate := perSecond(p.Rate)
		for t := time.Duration(0); ; {
			t += time.Duration(rng.ExpFloat64() / rate * float64(time.Second))
			if t >= p.Duration {
				break
			}
			if !add(t) {
				return tooMany()
			}
		}
	case "onoff":
		gap := interval(p.Rate)
		for start := time.Duration(0); start < p.Duration; start += p.On + p.Off {
			for t := start; t < start+p.On && t < p.Duration; t += gap {
				if !add(t) {
					return tooMany()
				}
			}
		}
	case "ramp":
		// The rate grows linearly; the n-th request arrives when the
		// integral of the rate reaches n.
		a, b, d := perSecond(p.From), perSecond(p.To), p.Duration.Seconds()
		k := (b - a) / d
		for n := 0.0; ; n++ {
			var s float64
			if k == 0 {
				s = n / a
			} else {
				s = (-a + math.Sqrt(a*a+2*k*n)) / k
			}
			if math.IsNaN(s) || s >= d {
				break
			}
			if !add(time.Duration(s * float64(time.Second))) {
				return tooMany()
			}
		}
	}
	return out, nil
}

// ReadLog reads a recorded log of requests, CSV or JSON lines (one object
// per line), and returns its events sorted by time with At counted from
// the first, and the first's time.
//
// A CSV log has a header naming its columns: time (required), and any of
// tenant, user, ip, action, cost. A JSON line has the same fields. time is
// an RFC 3339 time, or Unix seconds (with a fraction). onlyTenant, when
// not empty, keeps that tenant's requests only. progress, if not nil, is
// called with the bytes read so far now and then.
func ReadLog(r io.Reader, onlyTenant string, progress func(read int64)) ([]Event, time.Time, error) {
	br := bufio.NewReaderSize(&countingReader{r: r, progress: progress}, 1<<16)
	first, err := br.Peek(1)
	if err != nil {
		return nil, time.Time{}, fmt.Errorf("the log is empty")
	}
	var out []Event // At in Unix nanoseconds, until sorted
	if first[0] == '{' {
		out, err = readJSONLines(br, onlyTenant)
	} else {
		out, err = readCSV(br, onlyTenant)
	}
	if err != nil {
		return nil, time.Time{}, err
	}
	if len(out) == 0 {
		return nil, time.Time{}, fmt.Errorf("the log has no requests%s", map[bool]string{true: " of tenant " + strconv.Quote(onlyTenant)}[onlyTenant != ""])
	}
	byTime := func(a, b Event) int { return cmp.Compare(a.At, b.At) }
	if !slices.IsSortedFunc(out, byTime) {
		slices.SortStableFunc(out, byTime)
	}
	first0 := out[0].At
	for i := range out {
		out[i].At -= first0
	}
	return slices.Clip(out), time.Unix(0, int64(first0)).UTC(), nil
}

// interner shares the strings a log repeats (its tenants, actions, the
// users and addresses of a busy one), up to a bound of distinct ones:
// each line's own copy was most of a log's memory.
type interner map[string]string

func (in interner) get(b string) string {
	if s, ok := in[b]; ok {
		return s
	}
	s := strings.Clone(b)
	if len(in) < 1<<16 {
		in[s] = s
	}
	return s
}

// event makes a log line's event, its At the time in Unix nanoseconds.
func (in interner) event(at time.Time, tenant, user, ip, action string, cost int64) (Event, error) {
	if at.Year() < 1970 || at.Year() > 2261 {
		return Event{}, fmt.Errorf("time %s: want a time from 1970 to 2261", at.Format(time.RFC3339))
	}
	return Event{At: time.Duration(at.UnixNano()), Tenant: in.get(tenant), User: in.get(user), IP: in.get(ip), Action: in.get(action), Cost: cost}, nil
}

type countingReader struct {
	r        io.Reader
	n, last  int64
	progress func(int64)
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	if c.progress != nil && c.n-c.last >= 4<<20 {
		c.last = c.n
		c.progress(c.n)
	}
	return n, err
}

// parseTime reads an RFC 3339 time or Unix seconds.
func parseTime(s string) (time.Time, error) {
	if t, err := time.Parse(time.RFC3339Nano, s); err == nil {
		return t, nil
	}
	f, err := strconv.ParseFloat(s, 64)
	if err != nil || f < 0 || f > 1e11 {
		return time.Time{}, fmt.Errorf("time %q: want an RFC 3339 time or Unix seconds", s)
	}
	sec, frac := math.Modf(f)
	return time.Unix(int64(sec), int64(frac*1e9)).UTC(), nil
}

func parseCost(s string) (int64, error) {
	if s == "" {
		return 1, nil
	}
	c, err := strconv.ParseInt(s, 10, 64)
	if err != nil || c < 0 || c > bounds.MaxCount {
		return 0, fmt.Errorf("cost %q: want a whole number from 0 to %d", s, int64(bounds.MaxCount))
	}
	return c, nil
}

func readCSV(r io.Reader, onlyTenant string) ([]Event, error) {
	cr := csv.NewReader(r)
	cr.ReuseRecord = true
	header, err := cr.Read()
	if err != nil {
		return nil, fmt.Errorf("log: reading the CSV header: %v", err)
	}
	col := map[string]int{}
	for i, h := range header {
		name := strings.ToLower(strings.TrimSpace(h))
		switch name {
		case "time", "tenant", "user", "ip", "action", "cost":
			col[name] = i
		default:
			return nil, fmt.Errorf("log: column %q: want time, tenant, user, ip, action or cost", h)
		}
	}
	if _, ok := col["time"]; !ok {
		return nil, errors.New("log: the CSV header has no time column")
	}
	get := func(rec []string, name string) string {
		if i, ok := col[name]; ok && i < len(rec) {
			return rec[i]
		}
		return ""
	}
	var out []Event
	in := interner{}
	for line := 2; ; line++ {
		rec, err := cr.Read()
		if err == io.EOF {
			return out, nil
		}
		if err != nil {
			return nil, fmt.Errorf("log: %v", err)
		}
		at, err := parseTime(get(rec, "time"))
		if err == nil {
			var cost int64
			cost, err = parseCost(get(rec, "cost"))
			if err == nil && (onlyTenant == "" || get(rec, "tenant") == onlyTenant) {
				var e Event
				if e, err = in.event(at, get(rec, "tenant"), get(rec, "user"), get(rec, "ip"), get(rec, "action"), cost); err == nil {
					out = append(out, e)
				}
			}
		}
		if err != nil {
			return nil, fmt.Errorf("log line %d: %v", line, err)
		}
		if len(out) > MaxEvents {
			return nil, fmt.Errorf("log: more than %d requests", MaxEvents)
		}
	}
}

func readJSONLines(r *bufio.Reader, onlyTenant string) ([]Event, error) {
	var out []Event
	in := interner{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for line := 1; sc.Scan(); line++ {
		b := sc.Bytes()
		if len(strings.TrimSpace(string(b))) == 0 {
			continue
		}
		var j struct {
			Time   json.RawMessage `json:"time"`
			Tenant string          `json:"tenant"`
			User   string          `json:"user"`
			IP     string          `json:"ip"`
			Action string          `json:"action"`
			Cost   *int64          `json:"cost"`
		}
		if err := json.Unmarshal(b, &j); err != nil {
			return nil, fmt.Errorf("log line %d: %v", line, err)
		}
		ts := strings.Trim(string(j.Time), `"`)
		at, err := parseTime(ts)
		if err != nil {
			return nil, fmt.Errorf("log line %d: %v", line, err)
		}
		cost := int64(1)
		if j.Cost != nil {
			if cost, err = parseCost(strconv.FormatInt(*j.Cost, 10)); err != nil {
				return nil, fmt.Errorf("log line %d: %v", line, err)
			}
		}
		if onlyTenant != "" && j.Tenant != onlyTenant {
			continue // checked, not kept
		}
		e, err := in.event(at, j.Tenant, j.User, j.IP, j.Action, cost)
		if err != nil {
			return nil, fmt.Errorf("log line %d: %v", line, err)
		}
		out = append(out, e)
		if len(out) > MaxEvents {
			return nil, fmt.Errorf("log: more than %d requests", MaxEvents)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("log: %v", err)
	}
	return out, nil
}

// interval returns the time between two events of r, rounded down to the
// nanosecond.
func interval(r admit.Rate) time.Duration {
	if r.N <= 0 {
		return 0
	}
	return r.Per / time.Duration(r.N)
}
