// Package top finds the heaviest callers of each rule: the identifiers a
// rule refused and admitted most over the last minutes, counted in bounded
// sketches (space-saving, Capacity counters per rule and minute), merged
// across the servers that share a Shared store without a store call per
// decision.
//
// A space-saving sketch of m counters over n hits counts every identifier
// seen more than n/m times, and overcounts an identifier by at most the
// count it took over when it came in (its Error, at most n/m): an
// identifier's true count is from Count-Error to Count.
package top

import (
	"cmp"
	"context"
	"encoding/binary"
	"errors"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/admitdev/admit"
	"github.com/admitdev/admit/policy"
)

// Capacity is the counters of one sketch: one rule's refusals (or
// admissions) in one minute.
const Capacity = 64

// Minutes is how many minutes of sketches are kept: the longest window
// asked for.
const Minutes = 15

// MaxRules bounds the rules counted: a rule past it (a catalog that grew)
// is not counted, so that memory stays bounded, at most MaxRules ×
// Minutes × 2 sketches of Capacity counters.
const MaxRules = 1024

// entry is one counter of a sketch.
type entry struct {
	key          string
	count, error int64
}

// sketch is a space-saving sketch.
type sketch struct {
	entries []entry
	index   map[string]int
	hits    int64
}

func newSketch() *sketch { return &sketch{index: make(map[string]int, Capacity)} }

// add counts a hit of key.
func (s *sketch) add(key string, n int64) {
	s.hits += n
	if i, ok := s.index[key]; ok {
		s.entries[i].count += n
		return
	}
	if len(s.entries) < Capacity {
		s.index[key] = len(s.entries)
		s.entries = append(s.entries, entry{key: key, count: n})
		return
	}
	low := 0
	for i := range s.entries {
		if s.entries[i].count < s.entries[low].count {
			low = i
		}
	}
	e := &s.entries[low]
	delete(s.index, e.key)
	s.index[key] = low
	e.key, e.error, e.count = key, e.count, e.count+n
}

// min is the count an identifier the sketch does not hold may have had:
// 0 until it is full.
func (s *sketch) min() int64 {
	if len(s.entries) < Capacity {
		return 0
	}
	m := s.entries[0].count
	for _, e := range s.entries {
		m = min(m, e.count)
	}
	return m
}

// minute is one minute's sketches of one rule.
type minute struct {
	at                int64 // Unix minute
	refused, admitted *sketch
}

// ruleSketches are one rule's last Minutes minutes.
type ruleSketches struct {
	mu      sync.Mutex
	minutes [Minutes]minute
}

func (r *ruleSketches) at(m int64) *minute {
	slot := &r.minutes[m%Minutes]
	if slot.at != m {
		*slot = minute{at: m, refused: newSketch(), admitted: newSketch()}
	}
	return slot
}

// Callers counts the callers of every rule. It is a policy.Observer: give
// it to the Decider (policy.Decider.Observe), and it counts each charge of
// each decision the store made, by the charge's identifier.
//
// Callers is safe for concurrent use. Create it with New.
type Callers struct {
	server string
	shared Shared
	now    func() time.Time

	// rules are read with one atomic load per decision, and copied when
	// a rule is added (under mu).
	mu    sync.Mutex
	rules atomic.Pointer[map[string]*ruleSketches]
}

var _ policy.Observer = (*Callers)(nil)

// New returns the callers of this server, named server among those that
// share shared (nil: this server's alone).
func New(server string, shared Shared) *Callers {
	c := &Callers{server: server, shared: shared, now: time.Now}
	c.rules.Store(&map[string]*ruleSketches{})
	return c
}

// Observe implements policy.Observer: every non-shadow charge of a
// decision the store made (or a failure mode) counts its identifier under
// its rule, as refused or admitted; a ban's refusal counts nowhere.
func (c *Callers) Observe(res *policy.Resolution, dec *admit.Decision, out policy.Outcome) {
	if out == policy.Banned || len(dec.Results) == 0 {
		return
	}
	m := c.now().Unix() / 60
	for i := range min(len(res.Rules), len(res.Charges), len(dec.Results)) {
		r, result := res.Rules[i], &dec.Results[i]
		if r.Shadow || result.Debit {
			continue
		}
		rs := c.rule(r.Name)
		if rs == nil {
			continue
		}
		key := res.Charges[i].Key
		rs.mu.Lock()
		slot := rs.at(m)
		if result.Allowed && dec.Allowed {
			slot.admitted.add(key, 1)
		} else if !result.Allowed {
			slot.refused.add(key, 1)
		}
		rs.mu.Unlock()
	}
}

func (c *Callers) rule(name string) *ruleSketches {
	if rs := (*c.rules.Load())[name]; rs != nil {
		return rs
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	rules := *c.rules.Load()
	rs := rules[name]
	if rs == nil && len(rules) < MaxRules {
		rs = &ruleSketches{}
		next := maps.Clone(rules)
		next[name] = rs
		c.rules.Store(&next)
	}
	return rs
}

// Rules returns the names of the rules counted so far, sorted.
func (c *Callers) Rules() []string {
	return slices.Sorted(maps.Keys(*c.rules.Load()))
}

// Caller is one of a rule's heaviest callers: the identifier its charges
// were keyed by, as the admin API takes it for a ban (Scope, Value and,
// for a user, Tenant), counted Count times over the window, of which at
// most Error are another identifier's (the sketches' bound).
type Caller struct {
	Key    string `json:"key"`
	Scope  string `json:"scope"`
	Value  string `json:"value"`
	Tenant string `json:"tenant,omitempty"`
	Action string `json:"action,omitempty"`
	Count  int64  `json:"count"`
	Error  int64  `json:"error"`
}

// Top is a rule's heaviest callers over a window.
type Top struct {
	Rule     string   `json:"rule"`
	WindowS  int64    `json:"window_s"`
	Servers  int      `json:"servers"`
	Refused  []Caller `json:"refused"`
	Admitted []Caller `json:"admitted"`
	// RefusedTotal and AdmittedTotal are the hits counted, all callers.
	RefusedTotal  int64 `json:"refused_total"`
	AdmittedTotal int64 `json:"admitted_total"`
	// Partial says some servers' sketches could not be read.
	Partial bool `json:"partial,omitempty"`
}

// MaxListed is the most callers a Top lists of each kind: as many as a
// sketch holds, so that every caller over a sketch's bound can be listed.
const MaxListed = Capacity

// Top returns rule's heaviest callers over the window (whole minutes, at
// most Minutes), this server's merged with the others' last published.
func (c *Callers) Top(ctx context.Context, rule string, window time.Duration, listed int) (Top, error) {
	minutes := int64(min(max((window+time.Minute-1)/time.Minute, 1), Minutes))
	listed = min(max(listed, 1), MaxListed)
	now := c.now().Unix() / 60
	var refused, admitted []*sketch
	if rs := (*c.rules.Load())[rule]; rs != nil {
		rs.mu.Lock()
		for m := now - minutes + 1; m <= now; m++ {
			if slot := rs.minutes[m%Minutes]; slot.at == m {
				refused, admitted = append(refused, slot.refused.clone()), append(admitted, slot.admitted.clone())
			}
		}
		rs.mu.Unlock()
	}
	t := Top{Rule: rule, WindowS: minutes * 60, Servers: 1}
	if c.shared != nil {
		others, err := c.shared.Fetch(ctx, rule, now-minutes+1, now)
		if err != nil {
			t.Partial = true
		}
		servers := map[string]bool{}
		for _, o := range others {
			if o.Server == c.server {
				continue
			}
			r, a, err := decodeMinute(o.Data)
			if err != nil {
				t.Partial = true
				continue
			}
			servers[o.Server] = true
			refused, admitted = append(refused, r), append(admitted, a)
		}
		t.Servers += len(servers)
	}
	t.Refused, t.RefusedTotal = merge(refused, listed)
	t.Admitted, t.AdmittedTotal = merge(admitted, listed)
	return t, nil
}

func (s *sketch) clone() *sketch {
	return &sketch{entries: slices.Clone(s.entries), hits: s.hits}
}

// merge sums sketches. A sketch that does not hold an identifier may have
// counted it up to its least count (space-saving evicts the least), so an
// identifier's merged count is the sum of its counts where held and of
// those least counts where not, and its error the sum of its errors where
// held and of the same least counts: its true count is from Count-Error to
// Count. Callers are listed by that lower bound, heaviest first, so that
// an identifier that took a counter over a moment ago (a count of the
// least count, all of it error) never pushes out one surely heavy.
func merge(sketches []*sketch, listed int) ([]Caller, int64) {
	counts := map[string]*entry{}
	var hits, mins int64
	for _, s := range sketches {
		hits += s.hits
		low := s.min()
		mins += low
		for _, e := range s.entries {
			t := counts[e.key]
			if t == nil {
				t = &entry{key: e.key}
				counts[e.key] = t
			}
			// Held here: its own count and error, less the least count
			// added below for every sketch.
			t.count += e.count - low
			t.error += e.error - low
		}
	}
	all := make([]*entry, 0, len(counts))
	for _, e := range counts {
		e.count += mins
		e.error += mins
		all = append(all, e)
	}
	slices.SortFunc(all, func(a, b *entry) int {
		if la, lb := a.count-a.error, b.count-b.error; la != lb {
			return cmp.Compare(lb, la)
		}
		if a.count != b.count {
			return cmp.Compare(b.count, a.count)
		}
		return strings.Compare(a.key, b.key)
	})
	out := []Caller{}
	for _, e := range all[:min(len(all), listed)] {
		out = append(out, callerOf(e))
	}
	return out, hits
}

// callerOf names an entry's identifier from its key's fields.
func callerOf(e *entry) Caller {
	c := Caller{Key: e.key, Count: e.count, Error: max(min(e.error, e.count), 0)}
	k, ok := parseKey(e.key)
	if !ok {
		return c
	}
	c.Action = k.Action
	switch k.Scope {
	case policy.ScopeGlobal:
		c.Scope, c.Key = "global", "global"
	case policy.ScopeTenant:
		c.Scope, c.Value, c.Key = policy.BanTenant, k.Tenant, k.Tenant
	case policy.ScopeUser:
		c.Scope, c.Value, c.Tenant, c.Key = policy.BanUser, k.Subject, k.Tenant, k.Tenant+"/"+k.Subject
	case policy.ScopeIP:
		c.Scope, c.Value, c.Key = policy.BanIP, k.Subject, k.Subject
	case policy.ScopeAPIKey:
		c.Scope, c.Value = policy.BanAPIKey, "sha256:"+k.Subject
		c.Key = "key " + k.Subject[:min(12, len(k.Subject))]
	default:
		c.Scope, c.Value, c.Key = k.Scope, k.Subject, k.Scope+"="+k.Subject
		if k.Tenant != "" {
			c.Tenant = k.Tenant
			c.Key = k.Tenant + "/" + c.Key
		}
	}
	if k.Action != "" {
		c.Key += " " + k.Action
	}
	return c
}

// parseKey reads the fields of a key admit.Key.Append wrote.
func parseKey(s string) (admit.Key, bool) {
	var f [5]string
	for i := range f {
		j := strings.IndexByte(s, ':')
		if j < 0 {
			return admit.Key{}, false
		}
		n, err := strconv.Atoi(s[:j])
		if err != nil || n < 0 || n > len(s)-j-1 {
			return admit.Key{}, false
		}
		f[i], s = s[j+1:j+1+n], s[j+1+n:]
	}
	return admit.Key{Scope: f[0], Tenant: f[1], Subject: f[2], Action: f[3], Rule: f[4]}, s == ""
}

// Shared keeps the sketches every server publishes, for Top to merge.
type Shared interface {
	// Publish saves server's sketches of rule's minute (encoded), for a
	// while longer than Minutes.
	Publish(ctx context.Context, server, rule string, minute int64, data []byte) error
	// Fetch returns every server's sketches of rule from minute from to
	// minute to.
	Fetch(ctx context.Context, rule string, from, to int64) ([]Published, error)
}

// Published is one server's sketches of one minute.
type Published struct {
	Server string
	Minute int64
	Data   []byte
}

// Publish publishes this server's sketches of the current and the last
// minute (the last one's final counts) to the Shared store, every every
// until ctx ends. Top on the other servers merges what was published
// last: up to every old.
func (c *Callers) Publish(ctx context.Context, every time.Duration) {
	if c.shared == nil {
		return
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		now := c.now().Unix() / 60
		for name, rs := range *c.rules.Load() {
			for _, m := range []int64{now - 1, now} {
				rs.mu.Lock()
				slot := rs.minutes[m%Minutes]
				var data []byte
				if slot.at == m {
					data = encodeMinute(slot.refused, slot.admitted)
				}
				rs.mu.Unlock()
				if data == nil {
					continue
				}
				pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
				_ = c.shared.Publish(pctx, c.server, name, m, data) // the next round publishes again
				cancel()
			}
		}
	}
}

// encodeMinute encodes two sketches: per sketch its hits and entries,
// each its key, count and error, as varints.
func encodeMinute(sketches ...*sketch) []byte {
	var b []byte
	for _, s := range sketches {
		b = binary.AppendUvarint(b, uint64(s.hits))
		b = binary.AppendUvarint(b, uint64(len(s.entries)))
		for _, e := range s.entries {
			b = binary.AppendUvarint(b, uint64(len(e.key)))
			b = append(b, e.key...)
			b = binary.AppendUvarint(b, uint64(e.count))
			b = binary.AppendUvarint(b, uint64(e.error))
		}
	}
	return b
}

var errBadSketch = errors.New("top: not an encoded sketch")

// decodeMinute decodes what encodeMinute encoded.
func decodeMinute(b []byte) (refused, admitted *sketch, err error) {
	read := func() uint64 {
		v, n := binary.Uvarint(b)
		if n <= 0 {
			err = errBadSketch
			return 0
		}
		b = b[n:]
		return v
	}
	var out [2]*sketch
	for i := range out {
		s := &sketch{}
		s.hits = int64(read())
		n := read()
		if err != nil || n > Capacity {
			return nil, nil, errBadSketch
		}
		for range n {
			l := read()
			if err != nil || l > uint64(len(b)) {
				return nil, nil, errBadSketch
			}
			e := entry{key: string(b[:l])}
			b = b[l:]
			e.count, e.error = int64(read()), int64(read())
			if err != nil || e.count < 0 || e.error < 0 {
				return nil, nil, errBadSketch
			}
			s.entries = append(s.entries, e)
		}
		out[i] = s
	}
	if len(b) != 0 {
		return nil, nil, errBadSketch
	}
	return out[0], out[1], nil
}
