package limitador

import (
	"context"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/admitdev/admit"
	"github.com/admitdev/admit/internal/bounds"
	"github.com/admitdev/admit/policy"
)

// counterIndex remembers the counters this server charged, by namespace,
// until their windows end: the stores keep counts by key and cannot list
// them, and GET /counters lists a namespace's. What a counter holds is
// read from the store when listed, so it is what every server sharing the
// store counted.
type counterIndex struct {
	mu    sync.Mutex
	max   int
	n     int
	bytes int // what the counters hold, about: see sizeOf
	byNS  map[string]map[string]*seenCounter
}

type seenCounter struct {
	key      string
	identity string
	values   []string
	end      time.Time // when the window last seen ends
}

func newCounterIndex(max int) *counterIndex {
	return &counterIndex{max: max, byNS: map[string]map[string]*seenCounter{}}
}

// add notes a counter until end, and reports whether it is new to the
// index or in a window the index had not seen (its end was past).
func (x *counterIndex) add(ns, key, identity string, values []string, now, end time.Time) bool {
	x.mu.Lock()
	defer x.mu.Unlock()
	m := x.byNS[ns]
	if c := m[key]; c != nil {
		renewed := !c.end.After(now)
		if end.After(c.end) {
			c.end = end
		}
		return renewed
	}
	size := sizeOf(key, values)
	if x.n >= x.max || x.bytes+size > MaxIndexBytes {
		x.sweep(now)
		if x.n >= x.max || x.bytes+size > MaxIndexBytes {
			return false
		}
	}
	if m == nil {
		m = map[string]*seenCounter{}
		x.byNS[ns] = m
	}
	m[key] = &seenCounter{key: key, identity: identity, values: slices.Clone(values), end: end}
	x.n++
	x.bytes += size
	return true
}

// MaxIndexBytes bounds what the counters a server remembers for Counters
// hold, about: a caller who names long values makes fewer of them.
const MaxIndexBytes = 64 << 20

// sizeOf is about what a remembered counter costs: its key, its values
// and the maps' overhead.
func sizeOf(key string, values []string) int {
	n := 128 + 2*len(key)
	for _, v := range values {
		n += 16 + len(v)
	}
	return n
}

// sweep forgets the counters whose windows ended before now.
func (x *counterIndex) sweep(now time.Time) {
	for ns, m := range x.byNS {
		for k, c := range m {
			if !c.end.After(now) {
				delete(m, k)
				x.n--
				x.bytes -= sizeOf(c.key, c.values)
			}
		}
		if len(m) == 0 {
			delete(x.byNS, ns)
		}
	}
}

func (x *counterIndex) list(ns string) []seenCounter {
	x.mu.Lock()
	defer x.mu.Unlock()
	out := make([]seenCounter, 0, len(x.byNS[ns]))
	for _, c := range x.byNS[ns] {
		out = append(out, *c)
	}
	return out
}

func (x *counterIndex) forget(ns, key string) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if c, ok := x.byNS[ns][key]; ok {
		delete(x.byNS[ns], key)
		x.n--
		x.bytes -= sizeOf(c.key, c.values)
	}
}

// MaxCountersListed bounds what Counters returns, in the bytes of its
// counters' limits and values, about, and MaxCountersAnswered in
// counters (each read from the store): truncated says when it left some
// out.
const (
	MaxCountersListed   = 16 << 20
	MaxCountersAnswered = 10_000
)

// Counters returns the live counters of namespace ns: those this server
// charged (or reported to) whose windows have not ended, and with a
// shared index every server's, with what each holds now in the store,
// sorted by limit and variables. A counter of a limit no longer in force
// is not listed. truncated says the list stopped at MaxCountersListed.
func (l *Limiter) Counters(ctx context.Context, ns string) (counters []Counter, truncated bool, err error) {
	ls := l.limits.Load()
	byIdentity := map[string]*Limit{}
	for _, lim := range ls.Namespace(ns) {
		byIdentity[lim.identity] = lim
	}
	seen := l.seen.list(ns)
	now := l.opts.Now()
	if idx := l.opts.Shared; idx != nil {
		shared, err := idx.List(ctx, ns, now, MaxCountersAnswered)
		if err != nil {
			return nil, false, err
		}
		known := make(map[string]bool, len(seen))
		for _, c := range seen {
			known[c.key] = true
		}
		for _, e := range shared {
			lim := byIdentity[e.Identity]
			if lim == nil || len(e.Values) != len(lim.Variables) {
				continue
			}
			key := counterKey(ns, lim, e.Values)
			if !known[key] {
				known[key] = true
				seen = append(seen, seenCounter{key: key, identity: e.Identity, values: e.Values, end: e.End})
			}
		}
	}
	slices.SortFunc(seen, func(a, b seenCounter) int { return strings.Compare(a.key, b.key) })
	var out []Counter
	listed := 0
	for len(seen) > 0 {
		n := min(len(seen), bounds.MaxCharges)
		batch := seen[:n]
		seen = seen[n:]
		res := policy.Resolution{}
		var lims []*Limit
		var kept []seenCounter
		for _, c := range batch {
			lim := byIdentity[c.identity]
			if lim == nil {
				l.seen.forget(ns, c.key)
				continue
			}
			res.Charges = append(res.Charges, admit.Charge{Key: c.key, Rule: &lim.rule.Rule, DryRun: true})
			res.Rules = append(res.Rules, lim.rule)
			lims = append(lims, lim)
			kept = append(kept, c)
		}
		if len(res.Charges) == 0 {
			continue
		}
		var dec admit.Decision
		o, err := l.opts.Decider.Decide(ctx, &res, &dec)
		if err != nil {
			return nil, false, err
		}
		if o != policy.Stored {
			return nil, false, admit.Errorf(admit.CodeUnavailable, "limitador: the store is not answering; counters are read from it")
		}
		for i, r := range dec.Results {
			c, lim := kept[i], lims[i]
			// A counter that holds nothing is over, unless its window
			// still runs by what was last seen of it.
			if r.Remaining >= lim.rule.Capacity() && !c.end.After(now) {
				l.seen.forget(ns, c.key)
				continue
			}
			size := 256
			for _, c := range lim.Conditions {
				size += len(c)
			}
			for i, v := range c.values {
				size += len(lim.Variables[i]) + len(v)
			}
			if len(out) >= MaxCountersAnswered || listed+size > MaxCountersListed {
				return out, true, nil
			}
			listed += size
			out = append(out, Counter{Limit: lim, Variables: variables(lim, c.values), Remaining: max(r.Remaining, 0), ExpiresIn: r.ResetAfter, key: c.key})
		}
	}
	return out, false, nil
}

// Status is what GET /status reports: when the server started, when the
// limits in force were loaded, how many loads succeeded, and how many
// failed since the last that did.
type Status struct {
	StartedAt       time.Time
	ConfigAppliedAt time.Time
	ConfigVersion   uint64
	ConfigErrSince  uint64
}

// Status returns the limiter's Status.
func (l *Limiter) Status() Status {
	l.status.mu.Lock()
	defer l.status.mu.Unlock()
	return Status{StartedAt: l.started, ConfigAppliedAt: l.status.appliedAt, ConfigVersion: l.status.version, ConfigErrSince: l.status.errSince}
}
