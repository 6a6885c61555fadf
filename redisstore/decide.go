package redisstore

import (
	"context"
	"slices"
	"time"

	"github.com/admitdev/admit"
	"github.com/admitdev/admit/internal/engine"
	"github.com/admitdev/admit/redisstore/internal/counted"
	"github.com/admitdev/admit/redisstore/internal/exact"
	"github.com/admitdev/admit/redisstore/internal/leased"
)

// Decide implements admit.Store. Counted charges are counted with plain
// commands (see internal/counted); decisions with a leased charge go through
// allowances (see internal/leased); the others are decided in Redis.
func (s *Store) Decide(ctx context.Context, charges []admit.Charge, d *admit.Decision) error {
	if _, ok := s.leased.InRegion(); ok {
		return s.leased.DecideRegion(ctx, charges, d)
	}
	if counted.Any(charges) {
		return s.counted.Decide(ctx, charges, d)
	}
	return s.decideOthers(ctx, charges, d)
}

// othersOf is the Decider of the charges of a decision its counted ones
// leave (see counted.Room).
type othersOf struct{ s *Store }

func (o othersOf) Decide(ctx context.Context, charges []admit.Charge, d *admit.Decision) error {
	return o.s.decideOthers(ctx, charges, d)
}

// decideOthers decides charges of which none is counted.
func (s *Store) decideOthers(ctx context.Context, charges []admit.Charge, d *admit.Decision) error {
	var err error
	if leased.Leasable(charges) {
		err = s.leased.Decide(ctx, charges, d)
	} else {
		err = s.exact.Decide(ctx, charges, d)
	}
	if s.exact.HasRefusals() && slices.ContainsFunc(charges, func(c admit.Charge) bool { return c.Debit }) {
		// A debit moves a key's wait: a refusal remembered before it
		// would answer the old one. The next decision asks Redis.
		s.exact.ForgetRefusals(charges, true)
	}
	return err
}

// Refund implements engine.Refunder. Counted charges are given back in
// their window's count (see internal/counted), the others in Redis by the exact
// path, and a region's to its pool.
func (s *Store) Refund(ctx context.Context, charges []admit.Charge, at time.Time) error {
	if _, ok := s.leased.InRegion(); ok {
		s.leased.RefundRegion(charges)
		return nil
	}
	keep := make([]admit.Charge, 0, len(charges))
	for i := range charges {
		c := charges[i]
		c.Debit = true // a refund is bounded as a debit is
		if err := exact.Check(i, &c); err != nil {
			return err
		}
		if err := engine.CheckRefund(c.Rule, c.Cost); err != nil {
			return err
		}
		if c.Cost == 0 {
			continue
		}
		if counted.Is(&c) {
			if err := s.counted.Refund(&c, at); err != nil {
				return err
			}
			continue
		}
		keep = append(keep, c)
	}
	return s.exact.Refund(ctx, keep, at)
}

var _ engine.Refunder = (*Store)(nil)

// Reset implements admit.Store.
func (s *Store) Reset(ctx context.Context, charges []admit.Charge) error {
	if _, ok := s.leased.InRegion(); ok {
		return s.leased.ResetRegion(ctx, charges)
	}
	if counted.Any(charges) {
		var others []admit.Charge
		for i := range charges {
			if !counted.Is(&charges[i]) {
				others = append(others, charges[i])
			} else if err := s.counted.Reset(ctx, &charges[i]); err != nil {
				return err
			}
		}
		if len(others) == 0 {
			return nil
		}
		charges = others
	}
	s.leased.Forget(charges)
	return s.exact.Reset(ctx, charges)
}

// Reserve implements admit.Store.
func (s *Store) Reserve(ctx context.Context, charges []admit.Charge, maxWait time.Duration) (admit.Reservation, error) {
	if name, ok := s.leased.InRegion(); ok && len(charges) > 0 {
		return admit.Reservation{}, admit.Errorf(admit.CodeInvalid, "redisstore: reservations are not made across regions yet: this store is region %s of a home", name)
	}
	return s.exact.Reserve(ctx, charges, maxWait)
}

// CancelReservation implements admit.Store.
func (s *Store) CancelReservation(ctx context.Context, id string) error {
	return s.exact.CancelReservation(ctx, id)
}

// RenewLease implements admit.Store.
func (s *Store) RenewLease(ctx context.Context, id string) (admit.Lease, error) {
	return s.exact.RenewLease(ctx, id)
}

// ReleaseLease implements admit.Store.
func (s *Store) ReleaseLease(ctx context.Context, id string) error {
	return s.exact.ReleaseLease(ctx, id)
}

// CheckRule reports whether the Redis store can decide r exactly: r must
// be valid, its spans and windows at most about 52 days, and its windows
// and lease TTL whole microseconds (Redis TIME's resolution).
func CheckRule(r *admit.Rule) error { return exact.CheckRule(r) }

// CheckRule is the package's CheckRule, so that admit.NewLimiter refuses
// at wiring a limit this store cannot decide (engine.RuleChecker).
func (s *Store) CheckRule(r *admit.Rule) error { return exact.CheckRule(r) }

var _ engine.RuleChecker = (*Store)(nil)
