package redisstore

import (
	"context"
	"slices"
	"time"

	"github.com/admitdev/admit"
	"github.com/admitdev/admit/internal/engine"
	"github.com/admitdev/admit/redisstore/internal/exact"
)

// Decide implements admit.Store. Counted charges are counted with plain
// commands (see counted.go); decisions with a leased charge go through
// allowances (see leased.go); the others are decided in Redis.
func (s *Store) Decide(ctx context.Context, charges []admit.Charge, d *admit.Decision) error {
	if s.region != nil {
		return s.decideRegion(ctx, charges, d)
	}
	if anyCounted(charges) {
		return s.decideCounted(ctx, charges, d)
	}
	return s.decideOthers(ctx, charges, d)
}

// decideOthers decides charges of which none is counted.
func (s *Store) decideOthers(ctx context.Context, charges []admit.Charge, d *admit.Decision) error {
	var err error
	if anyLeasable(charges) {
		err = s.decideLeased(ctx, charges, d)
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
// their window's count (see counted.go), the others in Redis by the exact
// path, and a region's to its pool.
func (s *Store) Refund(ctx context.Context, charges []admit.Charge, at time.Time) error {
	if s.region != nil {
		s.refundRegion(charges)
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
		if isCounted(&c) {
			if err := s.refundCounted(&c, at); err != nil {
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
	if s.region != nil {
		return s.resetRegion(ctx, charges)
	}
	if anyCounted(charges) {
		var others []admit.Charge
		for i := range charges {
			if !isCounted(&charges[i]) {
				others = append(others, charges[i])
			} else if err := s.resetCounted(ctx, &charges[i]); err != nil {
				return err
			}
		}
		if len(others) == 0 {
			return nil
		}
		charges = others
	}
	s.forget(charges)
	return s.exact.Reset(ctx, charges)
}

// Reserve implements admit.Store.
func (s *Store) Reserve(ctx context.Context, charges []admit.Charge, maxWait time.Duration) (admit.Reservation, error) {
	if s.region != nil && len(charges) > 0 {
		return admit.Reservation{}, admit.Errorf(admit.CodeInvalid, "redisstore: reservations are not made across regions yet: this store is region %s of a home", s.region.name)
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
