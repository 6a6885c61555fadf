package policy

import (
	"context"
	"sync"

	"github.com/admitdev/admit"
	"github.com/admitdev/admit/internal/weakmap"
	"github.com/admitdev/admit/memstore"
)

// Outcome says how a Decider reached a decision.
type Outcome uint8

const (
	// Stored: the store decided.
	Stored Outcome = iota
	// FailedOpen: the store was unavailable and every rule fails open, so
	// the request was admitted without a decision.
	FailedOpen
	// FailedLocal: the store was unavailable and a rule fails local, so
	// the in-process limiter decided, with each limit divided among the
	// servers.
	FailedLocal
)

// A Decider decides resolved requests against a store and applies the
// rules' failure modes (on_error) when the store cannot answer: a rule that
// fails closed refuses with the store's error, one that fails local sends
// the request to an in-process limiter, and otherwise the request is
// admitted. The HTTP API, the middleware and the proxy share it, so that a
// rule fails the same way wherever it is checked.
//
// A Decider is safe for concurrent use. Create it with NewDecider.
type Decider struct {
	store     admit.Store
	instances int64

	localOnce sync.Once
	local     *memstore.Store
	// shares caches each rule's local share; weakly keyed, so rules of
	// past policies leave it.
	shares weakmap.Map[admit.Rule, *admit.Rule]
}

// NewDecider returns a Decider over store. instances is the number of
// servers sharing the limits (at least 1): with on_error local each takes
// limit ÷ instances.
func NewDecider(store admit.Store, instances int64) *Decider {
	return &Decider{store: store, instances: max(1, instances)}
}

// Decide decides the charges of res into dec. A resolution without charges
// is admitted. The error is the store's when it is not an outage, or the
// outage itself when a rule fails closed.
func (d *Decider) Decide(ctx context.Context, res *Resolution, dec *admit.Decision) (Outcome, error) {
	if len(res.Charges) == 0 {
		dec.Reset()
		dec.Allowed = true
		return Stored, nil
	}
	err := d.store.Decide(ctx, res.Charges, dec)
	if err == nil || admit.ErrorCode(err) != admit.CodeUnavailable {
		return Stored, err
	}
	return d.Failover(ctx, res, dec, err)
}

// Failover decides res when the store failed with cause (an
// admit.CodeUnavailable error): cause itself if any rule fails closed, the
// local limiter's decision if any fails local, admitted otherwise.
func (d *Decider) Failover(ctx context.Context, res *Resolution, dec *admit.Decision, cause error) (Outcome, error) {
	def := admit.FailOpen
	if res.Policy != nil {
		def = res.Policy.OnError()
	}
	local := false
	for _, r := range res.Rules {
		mode := r.OnError
		if mode == admit.FailDefault {
			mode = def
		}
		switch mode {
		case admit.FailClosed:
			return Stored, cause
		case admit.FailLocal:
			local = true
		}
	}
	if !local {
		dec.Reset()
		dec.Allowed = true
		return FailedOpen, nil
	}
	d.localOnce.Do(func() { d.local = memstore.New(nil) })
	if d.local == nil {
		return Stored, cause // closed
	}
	charges := make([]admit.Charge, len(res.Charges))
	for i, ch := range res.Charges {
		ch.Rule = d.shares.Get(ch.Rule, d.share)
		if err := ch.Rule.CheckCost(ch.Cost); err != nil {
			ch.Cost = ch.Rule.Capacity()
		}
		charges[i] = ch
	}
	return FailedLocal, d.local.Decide(ctx, charges, dec)
}

// share returns r with its limits divided among the servers, for the local
// limiter; at least 1 of everything is kept.
func (d *Decider) share(r *admit.Rule) *admit.Rule {
	l := *r
	n := d.instances
	div := func(v int64) int64 { return max(1, v/n) }
	l.Burst, l.Limit, l.Max = div(l.Burst), div(l.Limit), div(l.Max)
	if l.Initial != nil {
		v := min(*l.Initial, l.Burst)
		l.Initial = &v
	}
	if l.Rate.N > 0 {
		l.Rate.N = div(l.Rate.N)
	}
	if l.Floor.N > 0 {
		l.Floor.N = div(l.Floor.N)
	}
	if err := l.Validate(); err != nil {
		l = *r // a share too small to be valid: keep the whole limit
	}
	return &l
}

// Close stops the local limiter, if it ever ran. It does not close the
// store, which the caller owns.
func (d *Decider) Close() error {
	var err error
	d.localOnce.Do(func() {}) // no local limiter starts after Close
	if d.local != nil {
		err = d.local.Close()
	}
	return err
}
