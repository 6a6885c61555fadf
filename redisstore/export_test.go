package redisstore

import (
	"context"
	"time"

	"github.com/admitdev/admit"
	"github.com/admitdev/admit/internal/redishook"
	"github.com/admitdev/admit/redisstore/internal/exact"
	"github.com/admitdev/admit/redisstore/internal/leased"
	"github.com/admitdev/admit/redisstore/internal/link"
	"github.com/redis/rueidis"
)

// HoldBatches makes the decisions s is asked for outside Cluster queue
// until release, which sends the queue as one batch and returns once it
// is answered.
func HoldBatches(s *Store) (release func()) { return exact.HoldBatches(s.exact) }

// Queued returns how many decisions wait in s's queue outside Cluster.
func Queued(s *Store) int { return exact.Queued(s.exact) }

// Held returns the units s holds of key's allowance, due or booked, and
// whether a withdrawal for it is in flight.
func Held(s *Store, key string) (units int64, fetching bool) { return s.leased.Held(key) }

// Sweep runs s's sweep of its allowances at now.
func Sweep(s *Store, now time.Time) { s.leased.Sweep(now) }

// Consts of leased allowances.
const (
	LeaseIdle  = leased.LeaseIdle
	BucketHold = leased.BucketHold
)

// SetMaxRefusals sets the bound of the refusals a store remembers, and
// returns a function that restores it.
func SetMaxRefusals(n int) func() { return exact.SetMaxRefusals(n) }

// Refusals returns how many refusals s remembers.
func Refusals(s *Store) int { return exact.Refusals(s.exact) }

// TagOf returns the hash tag of c's Redis keys.
func TagOf(c admit.Charge) string { return link.Tag(&c) }

// New returns a Store that uses client, which the test keeps and closes.
func New(client rueidis.Client, opts *Options) *Store { return withClient(client, opts) }

// LoadFunctions loads the store's function library on every node.
func (s *Store) LoadFunctions(ctx context.Context) error { return s.link.LoadFunctions(ctx) }

// Command is redishook.Command.
func (s *Store) Command(charges []admit.Charge) (keys, args []string) {
	return s.exact.Command(charges)
}

// Client is redishook.Client.
func (s *Store) Client() rueidis.Client { return redishook.Client(s) }

// CountedKey returns the key of c's count now, as s names it.
func CountedKey(s *Store, c *admit.Charge) string {
	w := int64(c.Rule.Window)
	n := s.link.Now().UnixNano()
	key, _ := s.counted.Key(c, n-n%w+w)
	return key
}

// HomeCall runs the home's script on key with args (homeScript's ARGV),
// as a region's agent does, and returns its reply's integers (the text
// ones as 0).
func HomeCall(s *Store, key string, args ...string) ([]int64, error) {
	return leased.HomeCall(s.link, key, args...)
}

// PoolCall runs a pool's script on key with args (poolScript's ARGV).
func PoolCall(s *Store, key string, args ...string) ([]int64, error) {
	return leased.PoolCall(s.link, key, args...)
}

// HomeKey returns the key at home of c's limit held across regions.
func HomeKey(s *Store, c admit.Charge) string { return leased.HomeKey(s.link, c) }
