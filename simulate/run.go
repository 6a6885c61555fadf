package simulate

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/admitdev/admit"
	"github.com/admitdev/admit/internal/engine"
	"github.com/admitdev/admit/policy"
)

// Outcome is what happened to one request in one rule's lane.
type Outcome uint8

const (
	// Admitted: the request was admitted.
	Admitted Outcome = iota
	// Refused: this rule refused the request.
	Refused
	// RefusedByOther: this rule had room, another rule refused the
	// request, so nothing was charged (rules decided together only).
	RefusedByOther
)

// Options tune a run.
type Options struct {
	// Start is the instant the run begins: quotas count calendar periods
	// from it. The zero Time means 2026-01-01T00:00:00Z.
	Start time.Time
	// Duration is the span drawn; zero means up to the last request and
	// a tenth more.
	Duration time.Duration
	// Independent decides each rule alone, as if it were the only one (to
	// compare algorithms side by side). Otherwise the rules decide every
	// request together, all or nothing, as a server decides a tier's.
	Independent bool
	// Hold is how long an admitted request keeps a concurrency rule's
	// slots; zero means 1 s.
	Hold time.Duration
	// Samples is how many times each lane's state is read over the run;
	// zero means 600.
	Samples int
	// Progress, if not nil, is called now and then with the requests
	// decided so far and the total.
	Progress func(done, total int)
	// MaxKeys, if above 0, bounds the keys (tenants, users, addresses)
	// the lanes keep state for, all lanes together: a run that needs
	// more stops with an error wrapping ErrTooManyKeys. A keyed rule
	// keeps a state per key, so a log whose every request is another
	// user's costs a state per request and rule.
	MaxKeys int
	// Context, if not nil, ends a run early when it is done: Run then
	// returns its error.
	Context context.Context
}

// ErrTooManyKeys is the error Run returns, wrapped, when its lanes need
// state for more keys than Options.MaxKeys.
var ErrTooManyKeys = errors.New("too many keys")

// Point is a lane's state at one instant.
type Point struct {
	At    time.Duration
	Level float64
}

// Summary is what a lane's rule did over the run.
type Summary struct {
	Requests       int64 `json:"requests"`
	Admitted       int64 `json:"admitted"`
	Refused        int64 `json:"refused"`
	RefusedByOther int64 `json:"refused_by_other_rules,omitempty"`
	// LongestRefusedStreak is the most requests in a row this rule refused.
	LongestRefusedStreak int64 `json:"longest_refused_streak"`
	// MostInPeriod is the most requests one key (the tenant, a user...)
	// was admitted within any Period of the run: a sliding span, a
	// quota's calendar periods; for concurrency the most slots held at
	// once, and Period is 0.
	MostInPeriod int64         `json:"most_admitted_in_period"`
	Period       time.Duration `json:"-"`
}

// Lane is one rule's part of a run.
type Lane struct {
	Rule *policy.Rule
	// Unit names what Points count: tokens, requests in the window, ...
	Unit string
	// Focus says whose state Points follow when the rule keeps one per
	// tenant, user or IP: the sender of the most requests.
	Focus string
	// At and Outcomes are the requests the rule applied to.
	At       []time.Duration
	Outcomes []Outcome
	Points   []Point
	Summary  Summary
}

// Result is a run.
type Result struct {
	Start    time.Time
	Duration time.Duration
	Requests int
	Lanes    []*Lane
}

// keyState is the state of one key of one rule, whichever algorithm.
type keyState struct {
	st     [2]engine.State
	log    *engine.Log
	leases *engine.LeaseSet
	// recent are the key's admitted requests within the last period, for
	// Summary.MostInPeriod; periodStart is the quota period they are in.
	recent      []time.Duration
	periodStart time.Time
	inPeriod    int64
}

type lane struct {
	*Lane
	prep   *engine.PreparedRule
	keys   map[string]*keyState
	focus  string // the key Points follow
	streak int64
	res    admit.Result
	next   [2]engine.State
	ks     *keyState
	made   *int // keys given a state, in all lanes
	// applies and allowed are this request's, between decide and commit.
	applies, allowed bool
}

// Run runs events, sorted by At, through rules. A rule applies to a
// request as on a server: the request's action is among its actions, and
// the request carries the rule's scope (a user rule needs a user).
// Concurrency rules hold an admitted request's slots for opt.Hold.
func Run(rules []*policy.Rule, events []Event, opt Options) (*Result, error) {
	if len(rules) == 0 {
		return nil, fmt.Errorf("no rules to simulate")
	}
	if opt.Start.IsZero() {
		opt.Start = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	}
	if opt.Hold <= 0 {
		opt.Hold = time.Second
	}
	if opt.Samples <= 1 {
		opt.Samples = 600
	}
	if opt.Duration <= 0 {
		opt.Duration = time.Second
		if n := len(events); n > 0 {
			opt.Duration = max(events[n-1].At+events[n-1].At/10, time.Second)
		}
	}
	focusID := busiest(events)
	keys := 0 // the keys all lanes keep state for
	out := &Result{Start: opt.Start, Duration: opt.Duration, Requests: len(events)}
	lanes := make([]*lane, len(rules))
	for i, r := range rules {
		prep, err := engine.Prepare(&r.Rule)
		if err != nil {
			return nil, fmt.Errorf("rule %s: %v", r.Name, err)
		}
		// A lane records at most a mark per request: room for all of
		// them at once, rather than twice as much in the last doubling.
		l := &lane{Lane: &Lane{Rule: r, Unit: unit(r), At: make([]time.Duration, 0, len(events)), Outcomes: make([]Outcome, 0, len(events))},
			prep: prep, keys: map[string]*keyState{}, made: &keys}
		l.Summary.Period = period(r)
		if focusID != nil {
			l.focus = keyOf(r, focusID)
			l.Focus = describeKey(r, focusID)
		}
		lanes[i] = l
		out.Lanes = append(out.Lanes, l.Lane)
	}

	start := opt.Start.UnixNano()
	step := opt.Duration / time.Duration(opt.Samples-1)
	nextSample := time.Duration(0)
	sample := func(until time.Duration) {
		for ; nextSample <= until && nextSample <= opt.Duration; nextSample += step {
			for _, l := range lanes {
				l.sample(start, nextSample)
			}
		}
	}
	markEvents := len(events) <= 20_000
	var lease uint64
	for i := range events {
		e := &events[i]
		if opt.Progress != nil && i&0xffff == 0 {
			opt.Progress(i, len(events))
		}
		if opt.Context != nil && i&0x3ff == 0 && opt.Context.Err() != nil {
			return nil, opt.Context.Err()
		}
		if e.At < 0 || (i > 0 && e.At < events[i-1].At) {
			return nil, fmt.Errorf("request %d: events must be sorted by time", i)
		}
		sample(e.At) // the state just before the request
		now := start + int64(e.At)
		all := true
		for _, l := range lanes {
			l.decide(e, now)
			if l.applies && !l.allowed && !l.Rule.Shadow {
				all = false
			}
		}
		if opt.MaxKeys > 0 && keys > opt.MaxKeys {
			return nil, fmt.Errorf("request %d: %w: the rules keep state for more than %d keys (tenants, users, addresses) in all", i+1, ErrTooManyKeys, opt.MaxKeys)
		}
		lease++
		for _, l := range lanes {
			if !l.applies {
				continue
			}
			admitted := l.allowed || l.Rule.Shadow
			if !opt.Independent {
				admitted = all
			}
			// A shadow rule that refused is not charged; the request
			// is admitted all the same.
			l.commit(e, now, admitted && l.allowed, lease, int64(opt.Hold))
			outcome := Admitted
			switch {
			case !l.allowed:
				outcome = Refused
			case !admitted:
				outcome = RefusedByOther
			}
			l.record(e, outcome)
			if outcome == Admitted {
				l.countAdmitted(opt.Start, e.At, now)
			}
			if markEvents && l.focus == keyOf(l.Rule, e) {
				l.Points = append(l.Points, Point{At: e.At, Level: l.peek(l.ks, now)})
			}
		}
	}
	sample(opt.Duration)
	if opt.Progress != nil {
		opt.Progress(len(events), len(events))
	}
	for _, l := range lanes {
		l.finish()
	}
	return out, nil
}

// decide evaluates e against l's rule without charging it.
func (l *lane) decide(e *Event, now int64) {
	r := l.Rule
	l.applies = r.Applies(e.Action) && carries(r, e)
	if !l.applies {
		return
	}
	k := keyOf(r, e)
	ks := l.keys[k]
	if ks == nil {
		ks = &keyState{}
		switch r.Algorithm {
		case admit.SlidingLog:
			ks.log = &engine.Log{}
		case admit.Concurrency:
			ks.leases = &engine.LeaseSet{}
		}
		l.keys[k] = ks
		*l.made++
	}
	l.ks = ks
	cost := e.Cost
	switch {
	case ks.log != nil:
		ks.log.EvalTo(&l.res, &r.Rule, now, cost, 0)
	case ks.leases != nil:
		ks.leases.EvalTo(&l.res, &r.Rule, now, cost, 0)
	default:
		l.next = l.prep.StepTo(&l.res, ks.st, now, cost, false)
	}
	l.allowed = l.res.Allowed
}

// commit charges the request when it was admitted; otherwise it keeps
// what a store keeps of a refused decision, the states of a peek.
func (l *lane) commit(e *Event, now int64, admitted bool, lease uint64, hold int64) {
	ks, r := l.ks, &l.Rule.Rule
	switch {
	case ks.log != nil:
		if admitted {
			ks.log.Commit(r, now, e.Cost)
		}
	case ks.leases != nil:
		if admitted {
			ks.leases.Commit(now, lease, e.Cost, now+hold)
		}
	default:
		if admitted {
			ks.st = l.next
		} else {
			var peek admit.Result
			ks.st = l.prep.StepTo(&peek, ks.st, now, 0, false)
		}
	}
}

func (l *lane) record(e *Event, o Outcome) {
	s := &l.Summary
	s.Requests++
	l.At = append(l.At, e.At)
	l.Outcomes = append(l.Outcomes, o)
	switch o {
	case Admitted:
		s.Admitted++
		l.streak = 0
	case Refused:
		s.Refused++
		l.streak++
		s.LongestRefusedStreak = max(s.LongestRefusedStreak, l.streak)
	case RefusedByOther:
		s.RefusedByOther++
	}
}

// sample reads the focus key's level at `at` without changing it.
func (l *lane) sample(start int64, at time.Duration) {
	now := start + int64(at)
	ks := l.keys[l.focus]
	if ks == nil {
		ks = &keyState{}
		switch l.Rule.Algorithm {
		case admit.SlidingLog:
			ks.log = &engine.Log{}
		case admit.Concurrency:
			ks.leases = &engine.LeaseSet{}
		}
	}
	l.Points = append(l.Points, Point{At: at, Level: l.peek(ks, now)})
}

// peek is ks's level at now, read at cost 0.
func (l *lane) peek(ks *keyState, now int64) float64 {
	var res admit.Result
	switch {
	case ks.log != nil:
		ks.log.EvalTo(&res, &l.Rule.Rule, now, 0, 0)
	case ks.leases != nil:
		ks.leases.EvalTo(&res, &l.Rule.Rule, now, 0, 0)
	default:
		l.prep.StepTo(&res, ks.st, now, 0, false)
	}
	return l.level(&res, now, ks)
}

// level is what a lane draws of a result: the tokens a bucket holds, the
// count a window, log or quota has, the slots held.
func (l *lane) level(res *admit.Result, now int64, ks *keyState) float64 {
	switch l.Rule.Algorithm {
	case admit.TokenBucket, admit.GCRA, admit.Combination:
		if res.Allowed || res.Remaining > 0 {
			return float64(res.Remaining)
		}
		return 0
	case admit.Concurrency:
		return float64(ks.leases.Live(now))
	default:
		return float64(res.Limit - res.Remaining)
	}
}

// countAdmitted counts an admitted request of the current key towards
// Summary.MostInPeriod: the most requests one key (one user, say) was
// admitted within a period, or held at once.
func (l *lane) countAdmitted(start time.Time, at time.Duration, now int64) {
	ks, s := l.ks, &l.Summary
	switch l.Rule.Algorithm {
	case admit.Concurrency:
		s.MostInPeriod = max(s.MostInPeriod, ks.leases.Live(now))
	case admit.Quota:
		ps, _ := l.prep.PeriodAt(start.Add(at))
		if !ps.Equal(ks.periodStart) {
			ks.periodStart, ks.inPeriod = ps, 0
		}
		ks.inPeriod++
		s.MostInPeriod = max(s.MostInPeriod, ks.inPeriod)
	default:
		i := 0
		for i < len(ks.recent) && at-ks.recent[i] >= s.Period {
			i++
		}
		ks.recent = append(ks.recent[i:], at)
		s.MostInPeriod = max(s.MostInPeriod, int64(len(ks.recent)))
	}
}

// finish puts the points in time order: samples and post-request points
// interleave, a request's point after the sample at the same instant.
func (l *lane) finish() {
	sortPoints(l.Points)
}

func sortPoints(p []Point) {
	// Insertion-friendly: the points are nearly sorted already.
	for i := 1; i < len(p); i++ {
		for j := i; j > 0 && p[j].At < p[j-1].At; j-- {
			p[j], p[j-1] = p[j-1], p[j]
		}
	}
}

// period is the span "most admitted in a period" slides over.
func period(r *policy.Rule) time.Duration {
	switch r.Algorithm {
	case admit.TokenBucket, admit.GCRA, admit.Combination:
		return r.Rate.Per
	case admit.FixedWindow, admit.SlidingWindow, admit.SlidingLog:
		return r.Window
	}
	return 0
}

func unit(r *policy.Rule) string {
	switch r.Algorithm {
	case admit.TokenBucket, admit.Combination:
		return "tokens"
	case admit.GCRA:
		return "requests that would pass now"
	case admit.FixedWindow:
		return "count in the window"
	case admit.SlidingWindow:
		return "weighted count in the window"
	case admit.SlidingLog:
		return "requests in the log"
	case admit.Concurrency:
		return "slots held"
	case admit.Quota:
		return "used this " + r.Period.String()
	}
	return "level"
}

// Describe says what a rule is in a few words: "token_bucket 2/2s burst 5".
func Describe(r *policy.Rule) string {
	switch r.Algorithm {
	case admit.TokenBucket, admit.GCRA:
		s := fmt.Sprintf("%s %s burst %d", r.Algorithm, r.Rate, r.Burst)
		if r.Initial != nil && *r.Initial != r.Burst {
			s += fmt.Sprintf(" initial %d", *r.Initial)
		}
		return s
	case admit.Combination:
		return fmt.Sprintf("combination floor %s + %s burst %d", r.Floor, r.Rate, r.Burst)
	case admit.FixedWindow, admit.SlidingWindow, admit.SlidingLog:
		return fmt.Sprintf("%s %d per %s", r.Algorithm, r.Limit, fmtDuration(r.Window))
	case admit.Concurrency:
		return fmt.Sprintf("concurrency max %d", r.Max)
	case admit.Quota:
		return fmt.Sprintf("quota %d per %s", r.Limit, r.Period)
	}
	return r.Algorithm.String()
}

func fmtDuration(d time.Duration) string {
	switch {
	case d%time.Hour == 0:
		return fmt.Sprintf("%dh", d/time.Hour)
	case d%time.Minute == 0:
		return fmt.Sprintf("%dm", d/time.Minute)
	}
	return d.String()
}

// carries reports whether e has what r's scope keys by, as Resolve asks.
func carries(r *policy.Rule, e *Event) bool {
	switch r.Scope {
	case policy.ScopeTenant:
		return e.Tenant != ""
	case policy.ScopeUser:
		return e.User != ""
	case "ip":
		return e.IP != ""
	}
	return true
}

// keyOf is the key of e's bucket of r.
func keyOf(r *policy.Rule, e *Event) string {
	var k string
	switch r.Scope {
	case policy.ScopeTenant:
		k = e.Tenant
	case policy.ScopeUser:
		k = e.Tenant + "\x00" + e.User
	case "ip":
		k = e.IP
	}
	if r.PerAction {
		k += "\x00" + e.Action
	}
	return k
}

func describeKey(r *policy.Rule, e *Event) string {
	switch r.Scope {
	case policy.ScopeTenant:
		return "tenant " + e.Tenant
	case policy.ScopeUser:
		return "user " + e.User
	case "ip":
		return "ip " + e.IP
	}
	return ""
}

// busiest returns an event of the sender of the most requests.
func busiest(events []Event) *Event {
	if len(events) == 0 {
		return nil
	}
	type id struct{ tenant, user, ip, action string }
	counts := map[id]int{}
	best, most := 0, 0
	for i := range events {
		e := &events[i]
		k := id{e.Tenant, e.User, e.IP, e.Action}
		counts[k]++
		if counts[k] > most {
			best, most = i, counts[k]
		}
	}
	return &events[best]
}
