// Package redisusage keeps usage records (usage.Record) in Redis, in
// the deployment of a redisstore.Store, so that the records of every
// server of a deployment add up in one place.
package redisusage

import (
	"context"
	"strconv"
	"strings"
	"time"

	"github.com/redis/rueidis"

	"github.com/admitdev/admit"
	"github.com/admitdev/admit/internal/redishook"
	"github.com/admitdev/admit/policy/usage"
	"github.com/admitdev/admit/redisstore"
)

// Store keeps each record as a hash, Prefix + "{usage:TENANT}:START:RULE"
// (admitted, refused, cost, end: counts added with HINCRBY, so servers
// never overwrite each other), expiring keep periods after its period
// ends, and a tenant's records in a sorted set, Prefix + "{usage:TENANT}",
// scored by period start. A tenant's keys share a Cluster hash slot.
type Store struct {
	store *redisstore.Store
	keep  int
}

var _ usage.Store = (*Store)(nil)

// New returns the usage records of s's deployment, kept keep ended
// periods (usage.DefaultKeepPeriods when 0).
func New(s *redisstore.Store, keep int) *Store {
	if keep <= 0 {
		keep = usage.DefaultKeepPeriods
	}
	return &Store{store: s, keep: keep}
}

// maxPeriod is the longest period of a quota: a leap year.
const maxPeriod = 366 * 24 * time.Hour

func (u *Store) index(tenant string) string {
	return u.store.Prefix() + "{usage:" + tenant + "}"
}

func member(r *usage.Record) string {
	return strconv.FormatInt(r.PeriodStart.Unix(), 10) + ":" + r.Rule
}

// AddUsage implements usage.Store, in one round trip.
func (u *Store) AddUsage(ctx context.Context, recs []usage.Record) error {
	return redishook.Call(u.store, ctx, func(ctx context.Context, c rueidis.Client) error {
		cmds := make(rueidis.Commands, 0, 9*len(recs))
		for i := range recs {
			r := &recs[i]
			idx := u.index(r.Tenant)
			key := idx + ":" + member(r)
			until := strconv.FormatInt(usage.Retention(r.PeriodStart, r.PeriodEnd, u.keep).UnixMilli(), 10)
			cmds = append(cmds,
				c.B().Hincrby().Key(key).Field("admitted").Increment(r.Admitted).Build(),
				c.B().Hincrby().Key(key).Field("refused").Increment(r.Refused).Build(),
				c.B().Hincrby().Key(key).Field("cost").Increment(r.Cost).Build(),
				c.B().Hincrby().Key(key).Field("failover").Increment(r.Failover).Build(),
				c.B().Hincrby().Key(key).Field("failover_cost").Increment(r.FailoverCost).Build(),
				c.B().Hset().Key(key).FieldValue().FieldValue("end", strconv.FormatInt(r.PeriodEnd.Unix(), 10)).Build(),
				c.B().Arbitrary("PEXPIREAT").Keys(key).Args(until).Build(),
				c.B().Zadd().Key(idx).ScoreMember().ScoreMember(float64(r.PeriodStart.Unix()), member(r)).Build(),
				c.B().Arbitrary("PEXPIREAT").Keys(idx).Args(until, "GT").Build(),
			)
		}
		for _, res := range c.DoMulti(ctx, cmds...) {
			if err := res.Error(); err != nil {
				return err
			}
		}
		return nil
	})
}

// Usage implements usage.Store. Index entries whose record expired
// are dropped as they are met.
func (u *Store) Usage(ctx context.Context, tenant string, from, to time.Time) ([]usage.Record, error) {
	var out []usage.Record
	err := redishook.Call(u.store, ctx, func(ctx context.Context, c rueidis.Client) error {
		idx := u.index(tenant)
		// A period that overlaps [from, to) starts before to and at most
		// the longest period before from.
		lo := strconv.FormatInt(from.Add(-maxPeriod).Unix(), 10)
		hi := "(" + strconv.FormatInt(to.Unix(), 10)
		members, err := c.Do(ctx, c.B().Zrange().Key(idx).Min(lo).Max(hi).Byscore().Build()).AsStrSlice()
		if err != nil {
			return err
		}
		if len(members) == 0 {
			return nil
		}
		cmds := make(rueidis.Commands, len(members))
		for i, m := range members {
			cmds[i] = c.B().Hgetall().Key(idx + ":" + m).Build()
		}
		var gone []string
		for i, res := range c.DoMulti(ctx, cmds...) {
			h, err := res.AsStrMap()
			if err != nil {
				return err
			}
			if len(h) == 0 {
				gone = append(gone, members[i])
				continue
			}
			start, rule, _ := strings.Cut(members[i], ":")
			r := usage.Record{Tenant: tenant, Rule: rule}
			s, err1 := strconv.ParseInt(start, 10, 64)
			e, err2 := strconv.ParseInt(h["end"], 10, 64)
			if err1 != nil || err2 != nil {
				return admit.Errorf(admit.CodeInternal, "redisusage: %s:%s is not a usage record", idx, members[i])
			}
			r.PeriodStart, r.PeriodEnd = time.Unix(s, 0).UTC(), time.Unix(e, 0).UTC()
			r.Admitted, _ = strconv.ParseInt(h["admitted"], 10, 64)
			r.Refused, _ = strconv.ParseInt(h["refused"], 10, 64)
			r.Cost, _ = strconv.ParseInt(h["cost"], 10, 64)
			r.Failover, _ = strconv.ParseInt(h["failover"], 10, 64)
			r.FailoverCost, _ = strconv.ParseInt(h["failover_cost"], 10, 64)
			if r.PeriodEnd.After(from) {
				out = append(out, r)
			}
		}
		if len(gone) > 0 {
			_ = c.Do(ctx, c.B().Zrem().Key(idx).Member(gone...).Build()).Error()
		}
		return nil
	})
	usage.Sort(out)
	return out, err
}
