package redisstore

import (
	"context"
	"time"

	"github.com/admitdev/admit"
	"github.com/admitdev/admit/internal/redishook"
	"github.com/admitdev/admit/redisstore/internal/exact"
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
func Held(s *Store, key string) (units int64, fetching bool) {
	s.leased.mu.RLock()
	p := s.leased.m[allowanceKey{key: key}]
	s.leased.mu.RUnlock()
	if p == nil {
		return 0, false
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.avail + p.future, p.fetch != nil
}

// Sweep runs s's sweep of its allowances at now.
func Sweep(s *Store, now time.Time) { s.sweep(now) }

// Consts of leased allowances.
const (
	LeaseIdle  = leaseIdle
	BucketHold = bucketHold
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
	key, _ := s.countedKey(c, n-n%w+w)
	return key
}

// HomeCall runs the home's script on key with args (homeScript's ARGV),
// as a region's agent does, and returns its reply's integers (the text
// ones as 0).
func HomeCall(s *Store, key string, args ...string) ([]int64, error) {
	return scriptCall(s, homeScript, key, args)
}

// PoolCall runs a pool's script on key with args (poolScript's ARGV).
func PoolCall(s *Store, key string, args ...string) ([]int64, error) {
	return scriptCall(s, poolScript, key, args)
}

func scriptCall(s *Store, script *rueidis.Lua, key string, args []string) ([]int64, error) {
	var out []int64
	err := s.link.Do(context.Background(), func(ctx context.Context, client rueidis.Client) error {
		v, err := script.Exec(ctx, client, []string{key}, args).ToArray()
		if err != nil {
			return err
		}
		for _, x := range v {
			n, err := x.AsInt64()
			if err != nil {
				n = 0
			}
			out = append(out, n)
		}
		return nil
	})
	return out, err
}

// HomeKey returns the key at home of c's limit held across regions.
func HomeKey(s *Store, c admit.Charge) string {
	return s.homeKey(&allowance{rule: c.Rule, key: c.Key, tag: link.Tag(&c)})
}
