// Package usage keeps the quotas' usage records: what each tenant did with
// each quota in each period, for billing. A Meter, told of every decision
// a policy.Decider makes, counts them in memory and writes them to a
// Store every interval: in memory, in a journal file, or (package
// redisusage) in Redis, where every server's records add up.
package usage

import (
	"context"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/admitdev/admit"
	"github.com/admitdev/admit/internal/engine"
	"github.com/admitdev/admit/policy"
)

// Record is what one tenant did with one quota in one of its periods:
// the requests admitted and refused, and the cost charged (debits
// included). Records are what a billing job reads at the end of a period.
// Admitted and Cost are what the quota counted; requests admitted without
// the store (its rule's on_error, open or local, while it was down), which
// the quota did not count, are apart in Failover and FailoverCost.
type Record struct {
	Tenant       string    `json:"tenant"`
	Rule         string    `json:"rule"`
	PeriodStart  time.Time `json:"period_start"`
	PeriodEnd    time.Time `json:"period_end"`
	Admitted     int64     `json:"admitted"`
	Refused      int64     `json:"refused"`
	Cost         int64     `json:"cost"`
	Failover     int64     `json:"failover"`
	FailoverCost int64     `json:"failover_cost"`
}

// Store keeps usage records: AddUsage adds the counts of recs to
// those of the same tenant, rule and period; Usage returns a tenant's
// records whose period overlaps [from, to), by period, then rule.
type Store interface {
	AddUsage(ctx context.Context, recs []Record) error
	Usage(ctx context.Context, tenant string, from, to time.Time) ([]Record, error)
}

// DefaultKeepPeriods is how many ended periods a usage store keeps of each
// quota by default: a year of monthly quotas.
const DefaultKeepPeriods = 12

// Retention returns until when a record of the period [start, end) is
// kept: keep periods of its length after its end.
func Retention(start, end time.Time, keep int) time.Time {
	return end.Add(time.Duration(keep) * end.Sub(start))
}

type usageKey struct {
	tenant, rule string
	start        int64
}

// Memory is a Store in the process's memory, for the memory
// store. It keeps a record until keep periods of its length after its
// period ended, and at most max records: past it, the records of the
// oldest periods go first.
type Memory struct {
	mu   sync.Mutex
	recs map[usageKey]*Record
	keep int
	max  int
	now  func() time.Time
}

var _ Store = (*Memory)(nil)

// NewMemory returns a Memory keeping keep ended periods
// (DefaultKeepPeriods when 0) and at most max records (1,000,000 when 0).
func NewMemory(keep, max int) *Memory {
	if keep <= 0 {
		keep = DefaultKeepPeriods
	}
	if max <= 0 {
		max = 1_000_000
	}
	return &Memory{recs: map[usageKey]*Record{}, keep: keep, max: max, now: time.Now}
}

// AddUsage implements Store.
func (m *Memory) AddUsage(_ context.Context, recs []Record) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, r := range recs {
		merge(m.recs, r)
	}
	if len(m.recs) > m.max {
		m.trim()
	}
	return nil
}

// merge adds r's counts to the record of its tenant, rule and period.
func merge(recs map[usageKey]*Record, r Record) {
	k := usageKey{r.Tenant, r.Rule, r.PeriodStart.UnixNano()}
	if have := recs[k]; have != nil {
		have.Admitted += r.Admitted
		have.Refused += r.Refused
		have.Cost += r.Cost
		have.Failover += r.Failover
		have.FailoverCost += r.FailoverCost
		return
	}
	recs[k] = &r
}

// trim drops expired records, then the oldest periods' until max hold.
func (m *Memory) trim() {
	now := m.now()
	for k, r := range m.recs {
		if !Retention(r.PeriodStart, r.PeriodEnd, m.keep).After(now) {
			delete(m.recs, k)
		}
	}
	if over := len(m.recs) - m.max; over > 0 {
		keys := make([]usageKey, 0, len(m.recs))
		for k := range m.recs {
			keys = append(keys, k)
		}
		slices.SortFunc(keys, func(a, b usageKey) int { return int(min(max(a.start-b.start, -1), 1)) })
		for _, k := range keys[:over] {
			delete(m.recs, k)
		}
	}
}

// Usage implements Store.
func (m *Memory) Usage(_ context.Context, tenant string, from, to time.Time) ([]Record, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	now := m.now()
	var out []Record
	for k, r := range m.recs {
		if k.tenant == tenant && r.PeriodEnd.After(from) && r.PeriodStart.Before(to) &&
			Retention(r.PeriodStart, r.PeriodEnd, m.keep).After(now) {
			out = append(out, *r)
		}
	}
	Sort(out)
	return out, nil
}

// Sort sorts records by period start, then rule.
func Sort(recs []Record) {
	slices.SortFunc(recs, func(a, b Record) int {
		if c := a.PeriodStart.Compare(b.PeriodStart); c != 0 {
			return c
		}
		return strings.Compare(a.Rule, b.Rule)
	})
}

// DefaultTierRecord is the tenant of the usage records of every tenant
// the catalog does not know that got the default tier: they are counted
// together, so that invented tenants leave no records of their own.
const DefaultTierRecord = "_default_tier"

// Meter counts decisions into usage records, in memory, and writes
// them to its store every interval: a decision costs a map update, never
// a store call. Only quotas are metered, the limits that plans bill.
type Meter struct {
	store Store
	now   func() time.Time
	mu    sync.Mutex
	recs  map[usageKey]*Record
	stop  chan struct{}
	done  chan struct{}
	once  sync.Once
	// failed counts flushes the store refused; their records are kept for
	// the next one.
	failed int64
}

// NewMeter returns a meter writing to store every interval (1s when
// 0) until Close.
func NewMeter(store Store, interval time.Duration) *Meter {
	if interval <= 0 {
		interval = time.Second
	}
	m := &Meter{store: store, now: time.Now, recs: map[usageKey]*Record{}, stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(m.done)
		t := time.NewTicker(interval)
		defer t.Stop()
		for {
			select {
			case <-t.C:
				_ = m.Flush(context.Background())
			case <-m.stop:
				return
			}
		}
	}()
	return m
}

// Observe counts a decision of res, made now, with outcome out: for every
// quota charge of a tenant, an admitted or refused request (debits count
// their cost only), and the cost the decision charged; a decision made
// without the store (out is not policy.Stored), which no quota counted, is
// counted as a failover. Dry runs count nothing.
func (m *Meter) Observe(res *policy.Resolution, dec *admit.Decision, out policy.Outcome) {
	if m == nil || res.Tenant == nil || len(dec.Results) != len(res.Charges) {
		return
	}
	var locked bool
	var now time.Time
	for i, r := range res.Rules {
		ch := &res.Charges[i]
		if r.Algorithm != admit.Quota || ch.DryRun {
			continue
		}
		p, err := engine.Prepare(ch.Rule)
		if err != nil {
			continue
		}
		if !locked {
			now = m.now()
			m.mu.Lock()
			defer m.mu.Unlock()
			locked = true
		}
		start, end := p.PeriodAt(now)
		id := res.Tenant.ID
		if res.Tenant.Source == "default" {
			// Tenants the catalog does not know are anyone's to invent:
			// one record for them all, not a record each for a year.
			id = DefaultTierRecord
		}
		k := usageKey{id, r.Name, start.UnixNano()}
		rec := m.recs[k]
		if rec == nil {
			rec = &Record{Tenant: id, Rule: r.Name, PeriodStart: start, PeriodEnd: end}
			m.recs[k] = rec
		}
		switch {
		case out != policy.Stored && (ch.Debit || dec.Allowed):
			if !ch.Debit {
				rec.Failover++
			}
			rec.FailoverCost += ch.Cost
		case ch.Debit:
			rec.Cost += ch.Cost
		case dec.Allowed:
			rec.Admitted++
			rec.Cost += ch.Cost
		default:
			rec.Refused++
		}
	}
}

// Flush writes the records counted since the last flush. Records a store
// refuses are kept and added to the next flush.
func (m *Meter) Flush(ctx context.Context) error {
	m.mu.Lock()
	if len(m.recs) == 0 {
		m.mu.Unlock()
		return nil
	}
	recs := make([]Record, 0, len(m.recs))
	for _, r := range m.recs {
		recs = append(recs, *r)
	}
	m.recs = map[usageKey]*Record{}
	m.mu.Unlock()
	err := m.store.AddUsage(ctx, recs)
	if err != nil {
		m.mu.Lock()
		m.failed++
		for _, r := range recs {
			merge(m.recs, r)
		}
		m.mu.Unlock()
	}
	return err
}

// Close stops the meter and flushes what it holds.
func (m *Meter) Close(ctx context.Context) error {
	m.once.Do(func() { close(m.stop) })
	<-m.done
	return m.Flush(ctx)
}
