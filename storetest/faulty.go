package storetest

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/admitdev/admit"
	"github.com/admitdev/admit/internal/engine"
)

// Faulty wraps a store and fails as a broken one does, so that what sits
// on a store can be tried on its failure paths: with Down set every call
// answers admit.CodeUnavailable, as a store that cannot be reached; with
// Short set Decide answers one result fewer than it was given charges, as
// a store with a bug.
type Faulty struct {
	admit.Store
	Down  atomic.Bool
	Short atomic.Bool
	// Late makes Decide apply its charges and then fail as unavailable,
	// as a store that answered after the caller's timeout does.
	Late atomic.Bool
}

var _ admit.Store = (*Faulty)(nil)

func (f *Faulty) down() error {
	if f.Down.Load() {
		return admit.Errorf(admit.CodeUnavailable, "store down (storetest.Faulty)")
	}
	return nil
}

// Decide implements admit.Store.
func (f *Faulty) Decide(ctx context.Context, charges []admit.Charge, d *admit.Decision) error {
	if err := f.down(); err != nil {
		return err
	}
	if err := f.Store.Decide(ctx, charges, d); err != nil {
		return err
	}
	if f.Late.Load() {
		d.Reset()
		return admit.Errorf(admit.CodeUnavailable, "store answered too late (storetest.Faulty)")
	}
	if f.Short.Load() && len(d.Results) > 0 {
		d.Results = d.Results[:len(d.Results)-1]
	}
	return nil
}

// Reserve implements admit.Store.
func (f *Faulty) Reserve(ctx context.Context, charges []admit.Charge, maxWait time.Duration) (admit.Reservation, error) {
	if err := f.down(); err != nil {
		return admit.Reservation{}, err
	}
	return f.Store.Reserve(ctx, charges, maxWait)
}

// CancelReservation implements admit.Store.
func (f *Faulty) CancelReservation(ctx context.Context, id string) error {
	if err := f.down(); err != nil {
		return err
	}
	return f.Store.CancelReservation(ctx, id)
}

// RenewLease implements admit.Store.
func (f *Faulty) RenewLease(ctx context.Context, id string) (admit.Lease, error) {
	if err := f.down(); err != nil {
		return admit.Lease{}, err
	}
	return f.Store.RenewLease(ctx, id)
}

// ReleaseLease implements admit.Store.
func (f *Faulty) ReleaseLease(ctx context.Context, id string) error {
	if err := f.down(); err != nil {
		return err
	}
	return f.Store.ReleaseLease(ctx, id)
}

// Reset implements admit.Store.
func (f *Faulty) Reset(ctx context.Context, charges []admit.Charge) error {
	if err := f.down(); err != nil {
		return err
	}
	return f.Store.Reset(ctx, charges)
}

// Refund implements engine.Refunder when the wrapped store does.
func (f *Faulty) Refund(ctx context.Context, charges []admit.Charge, at time.Time) error {
	if err := f.down(); err != nil {
		return err
	}
	r, ok := f.Store.(engine.Refunder)
	if !ok {
		return admit.Errorf(admit.CodeInvalid, "storetest.Faulty: %T takes no refunds", f.Store)
	}
	return r.Refund(ctx, charges, at)
}
