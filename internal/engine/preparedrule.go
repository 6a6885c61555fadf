package engine

import (
	"time"

	"github.com/admitdev/admit"
	"github.com/admitdev/admit/internal/bounds"
)

// A store validates every rule it is given, on every decision, and a
// bucket's decision derives its refill interval from the rule's rate, a
// division, every time. Neither changes while the rule does not, so a rule
// prepares both once (Prepare) and keeps them with itself.

// PreparedRule is a rule that passed Validate, with what deciding by it
// derives from its parameters. Prepare returns it.
type PreparedRule struct {
	rule   *admit.Rule
	params ruleParams
	most   int64 // the largest cost a request may charge; see CheckCost
	b      buckets
	share  shareParams
}

// buckets are the buckets of a bucket rule: main for token_bucket, gcra
// and a combination's burst bucket, floor for a combination's floor.
type buckets struct {
	main, floor bucket
	period      *periods // quota: the period in progress
	capacity    int64    // the rule's Capacity, which every result reports
}

// ruleParams are the parameters of a rule that Validate reads: while they
// stay as they were, a rule stays valid and its buckets stay the same.
type ruleParams struct {
	algorithm        admit.Algorithm
	rate, floor      admit.Rate
	burst, initial   int64
	limit, max       int64
	maxCost          int64
	shareCeiling     int64
	maxDebt          int64
	window, leaseTTL time.Duration
	period           admit.Period
	location         *time.Location
	anchor           time.Time
}

func paramsOf(r *admit.Rule) ruleParams {
	return ruleParams{
		algorithm: r.Algorithm, rate: r.Rate, floor: r.Floor, burst: r.Burst, initial: initialOf(r),
		limit: r.Limit, max: r.Max, maxCost: r.MaxCost, shareCeiling: r.ShareCeiling, maxDebt: r.MaxDebt, window: r.Window, leaseTTL: r.LeaseTTL,
		period: r.Period, location: r.Location, anchor: r.Anchor,
	}
}

// holds reports whether p is r's preparation and r's parameters are still
// those p was prepared from. It compares only what r's algorithm reads,
// field by field: this runs on every decision.
func (p *PreparedRule) holds(r *admit.Rule) bool {
	q := &p.params
	if p.rule != r || r.Algorithm != q.algorithm || r.MaxCost != q.maxCost || r.ShareCeiling != q.shareCeiling {
		return false
	}
	switch r.Algorithm {
	case admit.TokenBucket, admit.GCRA:
		return r.Rate == q.rate && r.Burst == q.burst && initialOf(r) == q.initial && r.MaxDebt == q.maxDebt
	case admit.Combination:
		return r.Rate == q.rate && r.Burst == q.burst && initialOf(r) == q.initial && r.Floor == q.floor
	case admit.FixedWindow, admit.SlidingWindow, admit.SlidingLog, admit.FirstHitWindow:
		return r.Limit == q.limit && r.Window == q.window
	case admit.Quota:
		return r.Limit == q.limit && r.Period == q.period && r.Location == q.location && r.Anchor.Equal(q.anchor)
	case admit.Concurrency:
		return r.Max == q.max && r.LeaseTTL == q.leaseTTL
	}
	return false
}

func bucketsOf(r *admit.Rule) buckets {
	b := buckets{capacity: r.Capacity()}
	switch r.Algorithm {
	case admit.TokenBucket, admit.GCRA:
		b.main = mainBucket(r)
	case admit.Combination:
		b.main, b.floor = mainBucket(r), floorBucket(r)
	}
	return b
}

// prepareBuckets is bucketsOf for a rule kept prepared: a quota's period
// in progress is kept too.
func prepareBuckets(r *admit.Rule) buckets {
	b := bucketsOf(r)
	if r.Algorithm == admit.Quota {
		b.period = new(periods)
	}
	return b
}

// Prepare validates r, as Validate does, and returns it prepared for
// deciding. The preparation is kept with r: a later call, while r's
// parameters stay as they were, returns it without validating again, so
// that a store can call Prepare on every decision. A rule whose parameters
// changed is validated and prepared afresh; a copy of a rule is prepared
// on its own. Concurrent calls are safe; changing r while it is used is
// not, as for any rule.
func Prepare(r *admit.Rule) (*PreparedRule, error) {
	if r != nil {
		if p, _ := r.Prepared.Load().(*PreparedRule); p != nil && p.holds(r) {
			return p, nil
		}
	}
	if err := r.Validate(); err != nil {
		return nil, err
	}
	p := &PreparedRule{rule: r, params: paramsOf(r), b: prepareBuckets(r), most: MostAtOnce(r), share: shareParamsOf(r)}
	if r.MaxCost > 0 {
		p.most = min(p.most, r.MaxCost)
	}
	r.Prepared.Store(p)
	return p, nil
}

// Rule returns the rule p was prepared from.
func (p *PreparedRule) Rule() *admit.Rule { return p.rule }

// CheckCost is CheckCost(p.Rule(), cost).
func (p *PreparedRule) CheckCost(cost int64) error {
	if cost < 0 || cost > bounds.MaxCost || cost > p.most {
		return CheckCost(p.rule, cost) // for its error
	}
	return nil
}

// StepTo is StepTo(res, p.Rule(), st, now, cost) without deriving anything
// from the rule again; with debit, cost is a debit (see Charge.Debit), for
// the rules that take them (see CheckDebit).
func (p *PreparedRule) StepTo(res *admit.Result, st [2]State, now, cost int64, debit bool) (next [2]State) {
	return stepTo(res, p.rule, &p.b, st, now, cost, debit)
}

// StepOneTo is StepTo for the algorithms whose key has one State (see
// Slots).
func (p *PreparedRule) StepOneTo(res *admit.Result, s State, now, cost int64, debit bool) State {
	return stepOne(res, p.rule, &p.b, s, now, cost, debit)
}

// initialOf is r's initial balance: r.Initial, or a full burst.
func initialOf(r *admit.Rule) int64 {
	if r.Initial != nil {
		return *r.Initial
	}
	return r.Burst
}

// CheckCounted reports whether c may be decided under its rule's
// distribution: a charge of an admit.Counted rule takes no share.
func CheckCounted(c *admit.Charge) error {
	if c.Rule.Distribution == admit.Counted && c.Share != nil {
		return admit.Errorf(admit.CodeInvalid, "rule %q is counted with plain counts (distribution counted): it keeps no shares", c.Rule.Name)
	}
	return nil
}

// CheckDebits reports whether charges mix a check and a debit of one key,
// which a decision refuses: were the decision refused, the check would
// report what the key holds with the debits before it and not those after
// it, an answer that depends on the order of the charges. Charging one key
// twice the same way is fine.
func CheckDebits(charges []admit.Charge) error {
	for i := range charges {
		if !charges[i].Debit {
			continue
		}
		for j := range charges {
			if !charges[j].Debit && charges[j].Key == charges[i].Key {
				return admit.Errorf(admit.CodeInvalid, "key %q is both checked and debited in one decision", charges[i].Key)
			}
		}
	}
	return nil
}
