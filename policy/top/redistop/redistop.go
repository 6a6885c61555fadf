// Package redistop keeps the heaviest callers' sketches in Redis, in the
// deployment of a redisstore.Store, so that the top callers of a rule are
// every server's.
package redistop

import (
	"context"
	"strconv"
	"time"

	"github.com/redis/rueidis"

	"github.com/admitdev/admit"
	"github.com/admitdev/admit/internal/redishook"
	"github.com/admitdev/admit/policy/top"
	"github.com/admitdev/admit/redisstore"
)

// Store keeps each server's sketches of one rule's minute as a field of
// the hash Prefix + "top:" + rule + ":" + the Unix minute, which expires
// a while after top.Minutes.
type Store struct {
	store  *redisstore.Store
	prefix string
}

var _ top.Shared = (*Store)(nil)

// New returns the sketches of s's deployment.
func New(s *redisstore.Store) *Store { return &Store{store: s, prefix: s.Prefix() + "top:"} }

// keep is how long a minute's sketches are kept.
const keep = (top.Minutes + 5) * time.Minute

func (s *Store) key(rule string, minute int64) string {
	return s.prefix + rule + ":" + strconv.FormatInt(minute, 10)
}

func (s *Store) client() (rueidis.Client, error) {
	if c := redishook.Client(s.store); c != nil {
		return c, nil
	}
	return nil, admit.Errorf(admit.CodeUnavailable, "redistop: no connection to Redis yet")
}

// Publish implements top.Shared.
func (s *Store) Publish(ctx context.Context, server, rule string, minute int64, data []byte) error {
	c, err := s.client()
	if err != nil {
		return err
	}
	k := s.key(rule, minute)
	for _, r := range c.DoMulti(ctx,
		c.B().Hset().Key(k).FieldValue().FieldValue(server, rueidis.BinaryString(data)).Build(),
		c.B().Expire().Key(k).Seconds(int64(keep/time.Second)).Build()) {
		if err := r.Error(); err != nil {
			return admit.Errorf(admit.CodeUnavailable, "redistop: %v", err)
		}
	}
	return nil
}

// Fetch implements top.Shared.
func (s *Store) Fetch(ctx context.Context, rule string, from, to int64) ([]top.Published, error) {
	c, err := s.client()
	if err != nil {
		return nil, err
	}
	var cmds rueidis.Commands
	for m := from; m <= to; m++ {
		cmds = append(cmds, c.B().Hgetall().Key(s.key(rule, m)).Build())
	}
	var out []top.Published
	var failed error
	for i, r := range c.DoMulti(ctx, cmds...) {
		fields, err := r.AsStrMap()
		if err != nil {
			failed = admit.Errorf(admit.CodeUnavailable, "redistop: %v", err)
			continue
		}
		for server, data := range fields {
			out = append(out, top.Published{Server: server, Minute: from + int64(i), Data: []byte(data)})
		}
	}
	return out, failed
}
