package redisstore

import (
	"time"

	"github.com/admitdev/admit"
	"github.com/admitdev/admit/redisstore/internal/leased"
)

// CutPolicy says what a region cut from its home does once it has spent
// what it holds.
type CutPolicy int

const (
	// RefuseWhenCut refuses, with the time the next unit would unlock as
	// the retry.
	RefuseWhenCut CutPolicy = iota
	// FailWhenCut fails the decision with CodeUnavailable: the caller's
	// failure mode (on_error) decides.
	FailWhenCut
)

// RegionHealth is what a region's store reports about its home.
type RegionHealth struct {
	Region       string
	HomeCalls    int64 // calls to the home Redis
	HomeFailures int64 // calls that failed or timed out
	Granted      int64 // units the home granted this region
	GivenBack    int64 // units this region gave back home
	Owed         int64 // units of debits it could not pay, sent home
	Share        float64
	Held         int64         // units the region's pool held when last looked at
	RTT          time.Duration // home calls' round trip, a moving average
	Cut          bool          // the last call to the home failed
	LastError    string        // and why
}

// Region reports the region's state, or false when the store has no home.
func (s *Store) Region() (RegionHealth, bool) {
	h, ok := s.leased.Region()
	return RegionHealth(h), ok
}

// CheckRegionRule reports whether rule r can be held across regions:
// token buckets, GCRA, fixed windows and quotas can; sliding windows and
// logs, floor + burst combinations and concurrency limits not yet.
func CheckRegionRule(r *admit.Rule) error { return leased.CheckRegionRule(r) }
