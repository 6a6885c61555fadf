package limitador

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/admitdev/admit"
	"github.com/admitdev/admit/internal/bounds"
	"github.com/admitdev/admit/policy"
)

// Mode is what a call does with the counters of the limits that apply.
type Mode uint8

const (
	// CheckAndReport counts delta on every counter if all of them can
	// take it, and nothing otherwise: Envoy's ShouldRateLimit, and
	// Limitador's POST /check_and_report.
	CheckAndReport Mode = iota
	// Check answers whether every counter could take delta, counting
	// nothing: Kuadrant's CheckRateLimit, POST /check.
	Check
	// Report counts delta on every counter, within its limit or not:
	// Kuadrant's Report (the tokens a response used), POST /report.
	Report
)

var modeNames = [...]string{CheckAndReport: "check_and_report", Check: "check", Report: "report"}

func (m Mode) String() string { return modeNames[m] }

// Result is what one call found.
type Result struct {
	// Limited says a limit refused the request; LimitName is its name
	// ("" if it has none).
	Limited   bool
	LimitName string
	// Counters are the counters of the limits that applied, as the call
	// left them, when asked for (Limiter.Decide's withCounters).
	Counters []Counter
	// Applied is how many limits applied.
	Applied int
	// Outcome is how the store answered (policy.Stored, or a failure
	// mode's outcome when it did not).
	Outcome policy.Outcome
}

// Counter is one counter of a limit: the limit, the values of its
// variables (by the variable's expression), and what it has left.
type Counter struct {
	Limit     *Limit
	Variables map[string]string
	// Remaining is what the counter has left after the call, as
	// Limitador reports it: 0 once it is over.
	Remaining int64
	// ExpiresIn is the time until the counter's window ends (for a
	// bucket, until it is full again).
	ExpiresIn time.Duration

	key string // its store key
}

// Options configure a Limiter.
type Options struct {
	// Decider decides the counters' charges in the store, applying the
	// deployment's failure mode. Required.
	Decider *policy.Decider
	// Limits are the limits to start with; SetLimits replaces them.
	Limits *Limits
	// MaxCounters bounds how many counters the limiter remembers for
	// Counters (GET /counters/{namespace}); default 100,000.
	MaxCounters int
	// Now reads the clock; default time.Now.
	Now func() time.Time
	// Metrics, if set, counts the calls as Limitador's metrics do.
	Metrics *Metrics
	// Shared, if set, keeps the counters every server charged, for
	// Counters. Close stops writing to it.
	Shared SharedIndex
}

// Limiter decides requests against Limitador's limits. It is safe for
// concurrent use; create it with New.
type Limiter struct {
	opts    Options
	limits  atomic.Pointer[Limits]
	seen    *counterIndex
	started time.Time
	status  loadStatus
	calls   sync.Pool

	// shareQ carries new counters to the shared index (see share).
	shareQ    chan indexed
	stopShare context.CancelFunc
	shareDone chan struct{}
}

// loadStatus is what GET /status reports of the limits' loading.
type loadStatus struct {
	mu        sync.Mutex
	appliedAt time.Time
	version   uint64
	errSince  uint64
}

// New returns a Limiter.
func New(opts Options) (*Limiter, error) {
	if opts.Decider == nil {
		return nil, admit.Errorf(admit.CodeInvalid, "limitador: a Decider is required")
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.MaxCounters <= 0 {
		opts.MaxCounters = 100_000
	}
	l := &Limiter{opts: opts, seen: newCounterIndex(opts.MaxCounters), started: opts.Now()}
	l.calls.New = func() any { return new(call) }
	l.status.appliedAt = l.started
	if opts.Limits != nil {
		l.limits.Store(opts.Limits)
	}
	if opts.Shared != nil {
		ctx, cancel := context.WithCancel(context.Background())
		l.shareQ, l.stopShare, l.shareDone = make(chan indexed, sharedQueue), cancel, make(chan struct{})
		go l.share(ctx, opts.Shared)
	}
	return l, nil
}

// Limits returns the limits in force.
func (l *Limiter) Limits() *Limits { return l.limits.Load() }

// SetLimits puts ls in force. The counters of the limits that stay (the
// same namespace, seconds, conditions and variables, or the same id) keep
// their counts, as Limitador keeps them.
func (l *Limiter) SetLimits(ls *Limits) {
	l.limits.Store(ls)
	l.status.mu.Lock()
	l.status.appliedAt, l.status.version, l.status.errSince = l.opts.Now(), l.status.version+1, 0
	l.status.mu.Unlock()
}

// LoadFailed records a reload that was refused: the limits in force
// stay, and GET /status counts the failures since the last success.
func (l *Limiter) LoadFailed() {
	l.status.mu.Lock()
	l.status.errSince++
	l.status.mu.Unlock()
}

// Owns reports whether namespace ns has limits.
func (l *Limiter) Owns(ns string) bool { return l.limits.Load().Has(ns) }

// call is one decision's working state, pooled.
type call struct {
	res     policy.Resolution
	dec     admit.Decision
	req     request
	limits  []*Limit
	values  [][]string
	flat    []string // the values' backing
	idx     []int
	keys    []string
	charges []admit.Charge
	rules   []*policy.Rule
}

// Decide applies mode to the limits of namespace ns that apply to the
// request's descriptors, at delta. withCounters fills Result.Counters.
//
// An expression that fails (other than by reading an entry or a
// descriptor the request lacks, which makes its limit not apply) is an
// error of code admit.CodeInvalid naming the limit; the store's failures
// are the Decider's.
func (l *Limiter) Decide(ctx context.Context, mode Mode, ns string, descriptors []map[string]string, delta uint64, withCounters bool) (Result, error) {
	var start time.Time
	if l.opts.Metrics != nil {
		start = l.opts.Now()
	}
	ls := l.limits.Load()
	lims := ls.Namespace(ns)
	c := l.calls.Get().(*call)
	res, err := l.decide(ctx, c, mode, ns, lims, descriptors, delta, withCounters)
	c.req.reset(nil) // the caller's descriptors are not kept
	l.calls.Put(c)
	if m := l.opts.Metrics; m != nil && res.Applied > 0 {
		m.datastoreLatency.Observe(l.opts.Now().Sub(start).Seconds())
	}
	return res, err
}

func (l *Limiter) decide(ctx context.Context, c *call, mode Mode, ns string, lims []*Limit, descriptors []map[string]string, delta uint64, withCounters bool) (Result, error) {
	if len(lims) == 0 {
		return Result{Outcome: policy.Stored}, nil
	}
	if err := c.applying(lims, descriptors); err != nil {
		return Result{}, err
	}
	out := Result{Applied: len(c.limits), Outcome: policy.Stored}
	if len(c.limits) == 0 {
		return out, nil
	}
	// A limit no counter can hold refuses without the store: max_value 0,
	// seconds 0 with more than max_value, or more than max_value at once
	// (which a store refuses as an invalid cost).
	first := -1
	for i, lim := range c.limits {
		if lim.refusesAtOnce(delta) && first < 0 {
			first = i
		}
	}
	if mode == Report {
		return out, l.report(ctx, c, ns, delta)
	}
	if first >= 0 && !withCounters {
		out.Limited, out.LimitName = true, c.limits[first].Name
		return out, nil
	}
	if first >= 0 {
		c.charge(ns, 0, true, false) // only to read the counters
	} else {
		// delta fits every limit at once (refusesAtOnce): an int64.
		c.charge(ns, int64(delta), mode == Check, false)
	}
	if len(c.charges) > 0 {
		o, err := l.opts.Decider.Decide(ctx, &c.res, &c.dec)
		if err != nil {
			return Result{}, err
		}
		out.Outcome = o
	} else {
		c.dec.Reset()
		c.dec.Allowed = true
	}
	refused := -1
	for k, i := range c.stored() {
		if !c.dec.Results[k].Allowed && !c.dec.Results[k].Shadow && refused < 0 {
			refused = i
		}
	}
	switch {
	case first >= 0:
		out.Limited, out.LimitName = true, c.limits[first].Name
	case !c.dec.Allowed && refused >= 0:
		out.Limited, out.LimitName = true, c.limits[refused].Name
	case !c.dec.Allowed:
		out.Limited = true
	}
	if mode == CheckAndReport && !out.Limited && delta > 0 {
		l.remember(c, ns)
	}
	if withCounters {
		peeked := first >= 0
		if out.Limited && !peeked && len(c.charges) > 0 {
			// A refusal's other counters may be undecided (a store that
			// refuses from a refusal it remembers does not read them):
			// read them all, counting nothing.
			c.charge(ns, 0, true, false)
			if _, err := l.opts.Decider.Decide(ctx, &c.res, &c.dec); err != nil {
				return Result{}, err
			}
			peeked = true
		}
		out.Counters = c.counters(delta, peeked)
	}
	return out, nil
}

// refusesAtOnce reports whether lim refuses delta whatever its counter
// holds.
func (l *Limit) refusesAtOnce(delta uint64) bool {
	switch {
	case l.never:
		return delta > 0
	case l.always:
		return delta > uint64(l.MaxValue)
	}
	return delta > uint64(l.rule.Capacity())
}

// applying finds the limits of lims that apply to descriptors, with their
// variables' values, in c: first those without variables, then the
// others, each in file order, as Limitador checks them.
func (c *call) applying(lims []*Limit, descriptors []map[string]string) error {
	c.limits, c.values, c.flat = c.limits[:0], c.values[:0], c.flat[:0]
	req := &c.req
	req.reset(descriptors)
	for pass := 0; pass < 2; pass++ {
		for _, lim := range lims {
			if (len(lim.vars) > 0) != (pass == 1) {
				continue
			}
			req.limit = lim.ctxLimit.limit
			applies := true
			for _, e := range lim.conds {
				ok, err := e.test(req)
				if err != nil {
					return limitError(lim, "condition", e.source, err)
				}
				if !ok {
					applies = false
					break
				}
			}
			if !applies {
				continue
			}
			start := len(c.flat)
			for _, e := range lim.vars {
				// A variable reads the descriptors only: Limitador's
				// limit.name is no variable of the request.
				if !e.reads(varDescriptors) {
					applies = false
					break
				}
				v, ok, err := e.value(req)
				if err != nil {
					return limitError(lim, "variable", e.source, err)
				}
				if !ok {
					applies = false
					break
				}
				c.flat = append(c.flat, v)
			}
			if !applies {
				c.flat = c.flat[:start]
				continue
			}
			c.limits = append(c.limits, lim)
			c.values = append(c.values, c.flat[start:len(c.flat):len(c.flat)])
		}
	}
	return nil
}

func limitError(lim *Limit, what, source string, err error) error {
	name := lim.Name
	if name == "" {
		name = fmt.Sprintf("line %d", lim.Line)
	}
	e := admit.Errorf(admit.CodeInvalid, "limit %s of namespace %q: %s %q: %v", name, lim.Namespace, what, source, err)
	e.Field = "descriptors"
	return e
}

// stored returns, by charge, the index in c.limits of the limit charged.
func (c *call) stored() []int {
	c.idx = c.idx[:0]
	for i, lim := range c.limits {
		if lim.Stored() {
			c.idx = append(c.idx, i)
		}
	}
	return c.idx
}

// charge sets up c.res with a charge of cost for every counter the store
// keeps: a dry run, or a debit, or neither.
func (c *call) charge(ns string, cost int64, dry, debit bool) {
	c.charges, c.rules, c.keys = c.charges[:0], c.rules[:0], c.keys[:0]
	for i, lim := range c.limits {
		if !lim.Stored() {
			continue
		}
		key := counterKey(ns, lim, c.values[i])
		c.keys = append(c.keys, key)
		c.charges = append(c.charges, admit.Charge{Key: key, Rule: &lim.rule.Rule, Cost: cost, DryRun: dry, Debit: debit})
		c.rules = append(c.rules, lim.rule)
	}
	c.res = policy.Resolution{Charges: c.charges, Rules: c.rules}
}

// report debits delta to every counter the store keeps: a report counts
// whether the counters can take it or not, and is never refused.
func (l *Limiter) report(ctx context.Context, c *call, ns string, delta uint64) error {
	if delta == 0 {
		return nil
	}
	c.charge(ns, int64(min(delta, uint64(bounds.MaxCost))), false, true)
	if len(c.charges) == 0 {
		return nil
	}
	if _, err := l.opts.Decider.Decide(ctx, &c.res, &c.dec); err != nil {
		return err
	}
	l.remember(c, ns)
	return nil
}

// counters returns the counters of c's decision as Limitador reports
// them: what is left after delta (0 when delta does not fit), and when
// the window ends.
func (c *call) counters(delta uint64, peeked bool) []Counter {
	out := make([]Counter, 0, len(c.limits))
	k := 0
	for i, lim := range c.limits {
		ct := Counter{Limit: lim, Variables: variables(lim, c.values[i]), key: counterKey(lim.Namespace, lim, c.values[i])}
		if !lim.Stored() {
			ct.Remaining = max(lim.MaxValue-int64(min(delta, uint64(lim.MaxValue))), 0)
			if lim.refusesAtOnce(delta) {
				ct.Remaining = 0
			}
			out = append(out, ct)
			continue
		}
		if k < len(c.dec.Results) {
			r := c.dec.Results[k]
			ct.ExpiresIn = r.ResetAfter
			switch {
			case peeked:
				// Read at cost 0: what delta would leave, 0 when it does
				// not fit.
				if rem := max(r.Remaining, 0); !lim.refusesAtOnce(delta) && uint64(rem) >= delta {
					ct.Remaining = rem - int64(delta)
				}
			case r.Allowed:
				ct.Remaining = max(r.Remaining, 0)
			}
		}
		k++
		out = append(out, ct)
	}
	return out
}

func variables(lim *Limit, values []string) map[string]string {
	m := make(map[string]string, len(values))
	for i, v := range values {
		m[lim.Variables[i]] = v
	}
	return m
}

// counterKey is the store key of lim's counter for values: in namespace
// ns's slot, so that a request's counters are decided in one Redis
// Cluster call, as Limitador keeps a namespace's counters together.
func counterKey(ns string, lim *Limit, values []string) string {
	// admit.Key's encoding (each field's length, a colon, its bytes),
	// written in one buffer: Key{Scope: "limitador", Tenant: ns, Subject:
	// the values, each so encoded, Rule: the identity}.
	subject := 0
	for _, v := range values {
		subject += decimalLen(len(v)) + 1 + len(v)
	}
	b := make([]byte, 0, len(keyScope)+decimalLen(len(ns))+1+len(ns)+decimalLen(subject)+1+subject+2+decimalLen(len(lim.identity))+1+len(lim.identity))
	b = append(b, keyScope...)
	b = appendField(b, ns)
	b = strconv.AppendInt(b, int64(subject), 10)
	b = append(b, ':')
	for _, v := range values {
		b = appendField(b, v)
	}
	b = append(b, "0:"...) // no action
	b = appendField(b, lim.identity)
	return string(b)
}

// keyScope is the encoded scope field of the counters' keys.
const keyScope = "9:limitador"

func appendField(b []byte, s string) []byte {
	b = strconv.AppendInt(b, int64(len(s)), 10)
	b = append(b, ':')
	return append(b, s...)
}

func decimalLen(n int) int {
	d := 1
	for n >= 10 {
		n /= 10
		d++
	}
	return d
}

// remember notes the counters c charged, for Counters, and sends those
// this server had not seen in their window to the shared index.
func (l *Limiter) remember(c *call, ns string) {
	now := l.opts.Now()
	k := 0
	var fresh []IndexEntry
	for i, lim := range c.limits {
		if !lim.Stored() {
			continue
		}
		if k < len(c.dec.Results) {
			reset := c.dec.Results[k].ResetAfter
			end := now.Add(reset)
			added := l.seen.add(ns, c.keys[k], lim.identity, c.values[i], now, end)
			// A first-hit window's first charge starts it (its reset is a
			// whole window): shared even when this server's index is full.
			started := lim.rule.Algorithm == admit.FirstHitWindow && reset == lim.rule.Window
			if (added || started) && l.shareQ != nil {
				fresh = append(fresh, IndexEntry{Identity: lim.identity, Values: slices.Clone(c.values[i]), End: end, key: c.keys[k]})
			}
		}
		k++
	}
	if len(fresh) > 0 {
		select {
		case l.shareQ <- indexed{ns: ns, entries: fresh}:
		default:
			// Full: forget them here, so that their next hit sends them.
			for _, e := range fresh {
				l.seen.forget(ns, e.key)
			}
		}
	}
}
