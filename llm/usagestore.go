package llm

import (
	"context"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/admitdev/admit/units"
)

// DayUsage is what one tenant's calls to one model used in one UTC day:
// a billing record, summed.
type DayUsage struct {
	Tenant     string       `json:"tenant"`
	Model      string       `json:"model"`
	Day        string       `json:"day"` // 2006-01-02, UTC
	Requests   int64        `json:"requests"`
	Unreported int64        `json:"unreported"`
	Tokens     units.Tokens `json:"-"`
	// Cost is in millionths of the prices' currency.
	Cost int64 `json:"-"`
}

// UsageStore keeps LLM usage by tenant, model and day, so that every
// proxy of a deployment adds to the same records. Add sums records into
// their days; Usage returns a tenant's days that overlap [from, to),
// sorted by day, then model.
type UsageStore interface {
	Add(ctx context.Context, recs []*Record) error
	Usage(ctx context.Context, tenant string, from, to time.Time) ([]DayUsage, error)
}

// Day returns the UTC day of t as Usage and DayUsage name it.
func Day(t time.Time) string { return t.UTC().Format(time.DateOnly) }

// Add adds r's call into u, which must be its tenant's, model's and day's.
func (u *DayUsage) Add(r *Record) {
	u.Requests++
	if !r.Reported {
		u.Unreported++
	}
	for k, n := range r.Usage {
		u.Tokens[k] += n
	}
	u.Cost += r.Cost
}

// SortUsage sorts days by tenant, day, then model.
func SortUsage(days []DayUsage) {
	slices.SortFunc(days, func(a, b DayUsage) int {
		if c := strings.Compare(a.Tenant, b.Tenant); c != 0 {
			return c
		}
		if c := strings.Compare(a.Day, b.Day); c != 0 {
			return c
		}
		return strings.Compare(a.Model, b.Model)
	})
}

// MemoryUsage is a UsageStore in the process's memory, for the memory
// store: it keeps keepDays days, and at most maxRows tenant × model ×
// day rows (past it, the oldest days go first).
type MemoryUsage struct {
	mu       sync.Mutex
	rows     map[usageKey]*DayUsage
	keepDays int
	maxRows  int
	swept    string // the day old days were last dropped
}

type usageKey struct{ tenant, model, day string }

var _ UsageStore = (*MemoryUsage)(nil)

// NewMemoryUsage returns a MemoryUsage keeping keepDays days (400 when
// 0) and at most maxRows rows (1,000,000 when 0).
func NewMemoryUsage(keepDays, maxRows int) *MemoryUsage {
	if keepDays <= 0 {
		keepDays = 400
	}
	if maxRows <= 0 {
		maxRows = 1_000_000
	}
	return &MemoryUsage{rows: map[usageKey]*DayUsage{}, keepDays: keepDays, maxRows: maxRows}
}

// Add implements UsageStore.
func (m *MemoryUsage) Add(_ context.Context, recs []*Record) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, r := range recs {
		k := usageKey{r.Tenant, r.Model, Day(r.At)}
		row := m.rows[k]
		if row == nil {
			m.makeRoom(r.At)
			row = &DayUsage{Tenant: k.tenant, Model: k.model, Day: k.day}
			m.rows[k] = row
		}
		row.Add(r)
	}
	return nil
}

// makeRoom drops the days past keepDays before now, and the oldest day
// while the rows are at their bound.
func (m *MemoryUsage) makeRoom(now time.Time) {
	if today := Day(now); today != m.swept {
		m.swept = today
		oldest := Day(now.AddDate(0, 0, -m.keepDays))
		for k := range m.rows {
			if k.day < oldest {
				delete(m.rows, k)
			}
		}
	}
	for len(m.rows) >= m.maxRows {
		first := ""
		for k := range m.rows {
			if first == "" || k.day < first {
				first = k.day
			}
		}
		for k := range m.rows {
			if k.day == first {
				delete(m.rows, k)
			}
		}
	}
}

// Usage implements UsageStore.
func (m *MemoryUsage) Usage(_ context.Context, tenant string, from, to time.Time) ([]DayUsage, error) {
	lo, hi := Day(from), Day(to.Add(-time.Nanosecond))
	m.mu.Lock()
	var out []DayUsage
	for k, row := range m.rows {
		if k.tenant == tenant && k.day >= lo && k.day <= hi {
			out = append(out, *row)
		}
	}
	m.mu.Unlock()
	SortUsage(out)
	return out, nil
}
