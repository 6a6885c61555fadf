// Package rediscounters keeps the index of Limitador counters in a
// redisstore.Store's deployment, so that every server sharing the store
// lists the counters all of them charged (GET /counters/{namespace}).
package rediscounters

import (
	"context"
	"encoding/json"
	"strconv"
	"time"

	"github.com/redis/rueidis"

	"github.com/admitdev/admit/internal/redishook"
	"github.com/admitdev/admit/limitador"
	"github.com/admitdev/admit/redisstore"
)

// Index keeps each namespace's counters in a sorted set, Prefix +
// "limitador:counters:" + the namespace, scored by when each counter's
// window ends (Unix ms). A counter's member is the JSON array of its
// limit's identity and its variables' values. The set lives until its
// last counter's end, and holds at most Max counters: past it, those that
// end soonest go.
type Index struct {
	store  *redisstore.Store
	prefix string
	// Max bounds a namespace's counters (default 100,000).
	Max int
}

var _ limitador.SharedIndex = (*Index)(nil)

// New returns the index of s's deployment.
func New(s *redisstore.Store) *Index {
	return &Index{store: s, prefix: s.Prefix() + "limitador:counters:", Max: 100_000}
}

func (x *Index) key(ns string) string { return x.prefix + ns }

// MaxMember bounds a counter's member (its identity and values, as JSON)
// in the index: a counter of longer values is listed by the servers that
// charged it only, so that a namespace's index holds at most Max × 4 KiB.
const MaxMember = 4096

// Add implements limitador.SharedIndex: one round trip for the entries.
func (x *Index) Add(ctx context.Context, ns string, entries []limitador.IndexEntry) error {
	if len(entries) == 0 {
		return nil
	}
	return redishook.Call(x.store, ctx, func(ctx context.Context, c rueidis.Client) error {
		k := x.key(ns)
		add := c.B().Zadd().Key(k).Gt().ScoreMember()
		last := int64(0)
		n := 0
		for _, e := range entries {
			m, err := json.Marshal(append([]string{e.Identity}, e.Values...))
			if err != nil {
				return err
			}
			if len(m) > MaxMember {
				continue // listed by the servers that charged it only
			}
			n++
			end := e.End.UnixMilli()
			last = max(last, end)
			add = add.ScoreMember(float64(end), string(m))
		}
		if n == 0 {
			return nil
		}
		now := strconv.FormatInt(time.Now().UnixMilli(), 10)
		for _, r := range c.DoMulti(ctx,
			add.Build(),
			c.B().Zremrangebyscore().Key(k).Min("-inf").Max(now).Build(),
			c.B().Zremrangebyrank().Key(k).Start(0).Stop(int64(-x.Max-1)).Build(),
			// A new set takes the end of its last counter; an older one
			// keeps the later of both.
			c.B().Pexpireat().Key(k).MillisecondsTimestamp(last).Nx().Build(),
			c.B().Pexpireat().Key(k).MillisecondsTimestamp(last).Gt().Build(),
		) {
			if err := r.Error(); err != nil {
				return err
			}
		}
		return nil
	})
}

// List implements limitador.SharedIndex.
func (x *Index) List(ctx context.Context, ns string, now time.Time, n int) ([]limitador.IndexEntry, error) {
	var out []limitador.IndexEntry
	err := redishook.Call(x.store, ctx, func(ctx context.Context, c rueidis.Client) error {
		from := "(" + strconv.FormatInt(now.UnixMilli(), 10)
		zs, err := c.Do(ctx, c.B().Zrange().Key(x.key(ns)).Min(from).Max("+inf").Byscore().Limit(0, int64(n)).Withscores().Build()).AsZScores()
		if err != nil {
			return err
		}
		for _, z := range zs {
			var fields []string
			if json.Unmarshal([]byte(z.Member), &fields) != nil || len(fields) == 0 {
				continue // not one of ours
			}
			out = append(out, limitador.IndexEntry{Identity: fields[0], Values: fields[1:], End: time.UnixMilli(int64(z.Score))})
		}
		return nil
	})
	return out, err
}
