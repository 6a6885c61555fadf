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
	start, end := r.PeriodAt(time.Unix(0, now))
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
	_, n := p.rule.PeriodAt(time.Unix(0, sp.end))
	return time.Unix(0, sp.end), n
}

// PeriodAt is p.Rule().PeriodAt(now), from the period kept with the
// preparation while now is in it.
func (p *PreparedRule) PeriodAt(now time.Time) (start, end time.Time) {
	sp := p.b.period.at(p.rule, now.UnixNano())
	return time.Unix(0, sp.start).In(now.Location()), time.Unix(0, sp.end).In(now.Location())
}
