package leased

import (
	"context"

	"github.com/admitdev/admit"
	"github.com/admitdev/admit/redisstore/internal/link"
	"github.com/redis/rueidis"
)

// What the tests of the Redis store reach inside its leased room.

// Consts of leased allowances.
const (
	LeaseIdle  = leaseIdle
	BucketHold = bucketHold
)

// HomeCall runs the home's script on key with args (homeScript's ARGV),
// as a region's agent does, and returns its reply's integers (the text
// ones as 0).
func HomeCall(l *link.Link, key string, args ...string) ([]int64, error) {
	return scriptCall(l, homeScript, key, args)
}

// PoolCall runs a pool's script on key with args (poolScript's ARGV).
func PoolCall(l *link.Link, key string, args ...string) ([]int64, error) {
	return scriptCall(l, poolScript, key, args)
}

func scriptCall(l *link.Link, script *rueidis.Lua, key string, args []string) ([]int64, error) {
	var out []int64
	err := l.Do(context.Background(), func(ctx context.Context, client rueidis.Client) error {
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
func HomeKey(home *link.Link, c admit.Charge) string {
	return homeKey(home, &allowance{rule: c.Rule, key: c.Key, tag: link.Tag(&c)})
}
