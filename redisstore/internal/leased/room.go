package leased

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/admitdev/admit"
	"github.com/admitdev/admit/redisstore/internal/exact"
	"github.com/admitdev/admit/redisstore/internal/link"
)

// Room is the leased room of the Redis store: allowances of leased rules'
// keys, withdrawn from Redis by the exact path and spent here without a
// call (leased.go); and, for a store that is one region of limits held
// across regions, the same allowances filled from the region's pool,
// which an agent refills from the home (region.go).
type Room struct {
	link       *link.Link
	exact      Exact
	region     *region // nil unless the store has a home
	allowances allowances

	// Decisions counts the decisions made here, LocalDecisions those made
	// without a call; Withdrawals the calls that withdrew allowances, and
	// of their units Withdrawn, Refunded (given back), Expired (unspent
	// when their time ended) and Lost (given back in a call that failed).
	Decisions, LocalDecisions        atomic.Int64
	Withdrawals, Withdrawn, Refunded atomic.Int64
	Expired, Lost                    atomic.Int64
}

// Exact is what allowances need of the exact path below them: deciding
// the charges no allowance holds, withdrawing units and giving them back.
type Exact interface {
	Decide(ctx context.Context, charges []admit.Charge, d *admit.Decision) error
	Withdraw(ctx context.Context, c admit.Charge, tag string) (exact.Reply, error)
	GiveBack(ctx context.Context, c admit.Charge, tag string, nu, nsub int64) error
}

// RegionOptions make a store one region of limits held across regions:
// the region's name, the home Redis's link, and whether a region cut from
// its home fails its decisions (rather than refuse them) once it has
// spent what it holds.
type RegionOptions struct {
	Name        string
	Home        *link.Link
	FailWhenCut bool
}

// New returns the leased room of a store calling Redis through l, the
// exact path x below it; with ro, that of one region of a home.
func New(l *link.Link, x Exact, ro *RegionOptions) *Room {
	s := &Room{link: l, exact: x}
	if ro != nil {
		s.region = &region{name: ro.Name, home: ro.Home, failWhenCut: ro.FailWhenCut,
			refills: make(chan struct{}, maxRefills), coldRefills: make(chan struct{}, maxColdRefills)}
	}
	return s
}

// InRegion reports whether the store is one region of a home, and names
// the region.
func (s *Room) InRegion() (string, bool) {
	if s.region == nil {
		return "", false
	}
	return s.region.name, true
}

// Held returns the units s holds of key's allowance, due or booked, and
// whether a withdrawal for it is in flight: for the store's tests.
func (s *Room) Held(key string) (units int64, fetching bool) {
	s.allowances.mu.RLock()
	p := s.allowances.m[allowanceKey{key: key}]
	s.allowances.mu.RUnlock()
	if p == nil {
		return 0, false
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.avail + p.future, p.fetch != nil
}

// Sweep runs s's sweep of its allowances at now: for the store's tests.
func (s *Room) Sweep(now time.Time) { s.sweep(now) }
