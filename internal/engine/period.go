package engine

import (
	"sync/atomic"
	"time"

	"github.com/admitdev/admit"
)

// span is a period [start, end) in Unix nanoseconds.
type span struct{ start, end int64 }

// periods keeps a quota rule's current period, so that its time zone
// arithmetic runs once a period, not once a decision.
type periods struct{ current atomic.Pointer[span] }

// at returns the period that now (Unix ns) falls in.
func (ps *periods) at(r *admit.Rule, now int64) span {
	if ps != nil {
		if c := ps.current.Load(); c != nil && c.start <= now && now < c.end {
			return *c
		}
	}
	start, end := PeriodAt(r, time.Unix(0, now))
	sp := span{start.UnixNano(), end.UnixNano()}
	if ps != nil {
		ps.current.Store(&sp)
	}
	return sp
}

// stepQuota is stepFixed over calendar periods. A state whose period has
// not ended keeps its end, even if the anchor changed since; only a new
// period is looked up.
func stepQuota(r *admit.Rule, ps *periods, s State, now, cost int64, res *admit.Result, debit bool) State {
	end := s.Expiry
	if end <= now {
		end = ps.at(r, now).end
	}
	return stepCount(r.Limit, s, now, end, cost, res, debit)
}

// QuotaEnds returns the end of the period now falls in and of the one
// after it, for a store that decides with a clock of its own (Redis): it
// takes the first of the two that is after its now. r must be a valid
// Quota rule; the period in progress is cached with r's preparation.
func (p *PreparedRule) QuotaEnds(now time.Time) (end, next time.Time) {
	sp := p.b.period.at(p.rule, now.UnixNano())
	_, n := PeriodAt(p.rule, time.Unix(0, sp.end))
	return time.Unix(0, sp.end), n
}

// PeriodAt is p.Rule().PeriodAt(now), from the period kept with the
// preparation while now is in it.
func (p *PreparedRule) PeriodAt(now time.Time) (start, end time.Time) {
	sp := p.b.period.at(p.rule, now.UnixNano())
	return time.Unix(0, sp.start).In(now.Location()), time.Unix(0, sp.end).In(now.Location())
}

// PeriodAt returns the calendar period of a Quota rule that t falls in,
// [start, end). Periods are counted in r.Location's time (UTC when nil)
// from r.Anchor's position in its period: its time of day for a day, its
// weekday and time for a week, its day of the month and time for a month,
// its date and time for a year. The zero Anchor is the calendar's:
// midnight, Monday, the 1st, the 1st of January. An anchor day that a
// month lacks (the 31st, or the 29th of February) falls back to that
// month's last day. Periods follow the zone's clock, so a day across a
// daylight saving change lasts 23 or 25 hours.
func PeriodAt(r *admit.Rule, t time.Time) (start, end time.Time) {
	loc := r.Location
	if loc == nil {
		loc = time.UTC
	}
	lt := t.In(loc)
	a := r.Anchor.In(loc)
	if r.Anchor.IsZero() {
		a = time.Date(2001, time.January, 1, 0, 0, 0, 0, loc) // a Monday
	}
	h, mi, s := a.Clock()
	at := func(y int, m time.Month, d int) time.Time { return time.Date(y, m, d, h, mi, s, 0, loc) }
	y, m, d := lt.Date()
	switch r.Period {
	case admit.Day:
		start = at(y, m, d)
		if start.After(lt) {
			start = at(y, m, d-1)
		}
		sy, sm, sd := start.Date()
		return start, at(sy, sm, sd+1)
	case admit.Week:
		back := (int(lt.Weekday()) - int(a.Weekday()) + 7) % 7
		start = at(y, m, d-back)
		if start.After(lt) {
			start = at(y, m, d-back-7)
		}
		sy, sm, sd := start.Date()
		return start, at(sy, sm, sd+7)
	case admit.Month:
		day := a.Day()
		of := func(y int, m time.Month) time.Time { return at(y, m, min(day, daysIn(y, m))) }
		start = of(y, m)
		if start.After(lt) {
			return of(y, m-1), start
		}
		return start, of(y, m+1)
	case admit.Year:
		am, day := a.Month(), a.Day()
		of := func(y int) time.Time { return at(y, am, min(day, daysIn(y, am))) }
		start = of(y)
		if start.After(lt) {
			return of(y - 1), start
		}
		return start, of(y + 1)
	}
	return t, t
}

// daysIn returns the number of days of month m of year y (m may be out of
// range: month 0 is December of the year before).
func daysIn(y int, m time.Month) int {
	return time.Date(y, m+1, 0, 0, 0, 0, 0, time.UTC).Day()
}
