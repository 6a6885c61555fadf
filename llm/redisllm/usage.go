// Package redisllm keeps LLM usage (llm.DayUsage) in Redis, in the
// deployment of a redisstore.Store, so that the calls of every admit
// proxy of a deployment add up in one place.
package redisllm

import (
	"context"
	"strconv"
	"strings"
	"time"

	"github.com/redis/rueidis"

	"github.com/admitdev/admit"
	"github.com/admitdev/admit/internal/redishook"
	"github.com/admitdev/admit/llm"
	"github.com/admitdev/admit/redisstore"
	"github.com/admitdev/admit/units"
)

// Usage keeps a tenant's day as a hash, Prefix + "{llmusage:TENANT}:DAY",
// with a field per model and count (MODEL, NUL, the count's name: counts
// added with HINCRBY, so proxies never overwrite each other), expiring
// keepDays after the day; and the tenant's days in a sorted set,
// Prefix + "{llmusage:TENANT}", scored by the day's start. A tenant's
// keys share a Cluster hash slot.
type Usage struct {
	store    *redisstore.Store
	keepDays int
}

var _ llm.UsageStore = (*Usage)(nil)

// New returns the LLM usage of s's deployment, kept keepDays days (400
// when 0).
func New(s *redisstore.Store, keepDays int) *Usage {
	if keepDays <= 0 {
		keepDays = 400
	}
	return &Usage{store: s, keepDays: keepDays}
}

func (u *Usage) index(tenant string) string { return u.store.Prefix() + "{llmusage:" + tenant + "}" }

// counts names a DayUsage's counts in the hash: requests, unreported,
// cost, then the token kinds.
var counts = append([]string{"requests", "unreported", "cost"}, units.TokenKindNames[:]...)

// Add implements llm.UsageStore, in one round trip.
func (u *Usage) Add(ctx context.Context, recs []*llm.Record) error {
	if len(recs) == 0 {
		return nil
	}
	return redishook.Call(u.store, ctx, func(ctx context.Context, c rueidis.Client) error {
		cmds := make(rueidis.Commands, 0, len(recs)*(len(counts)+4))
		for _, r := range recs {
			day := time.Date(r.At.UTC().Year(), r.At.UTC().Month(), r.At.UTC().Day(), 0, 0, 0, 0, time.UTC)
			idx := u.index(r.Tenant)
			key := idx + ":" + llm.Day(day)
			until := strconv.FormatInt(day.AddDate(0, 0, u.keepDays+1).UnixMilli(), 10)
			unreported := int64(0)
			if !r.Reported {
				unreported = 1
			}
			values := append([]int64{1, unreported, r.Cost}, r.Usage[:]...)
			for i, name := range counts {
				if values[i] != 0 || i == 0 {
					cmds = append(cmds, c.B().Hincrby().Key(key).Field(r.Model+"\x00"+name).Increment(values[i]).Build())
				}
			}
			cmds = append(cmds,
				c.B().Arbitrary("PEXPIREAT").Keys(key).Args(until).Build(),
				c.B().Zadd().Key(idx).ScoreMember().ScoreMember(float64(day.Unix()), llm.Day(day)).Build(),
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

// Usage implements llm.UsageStore. Index entries whose day expired are
// dropped as they are met.
func (u *Usage) Usage(ctx context.Context, tenant string, from, to time.Time) ([]llm.DayUsage, error) {
	var out []llm.DayUsage
	err := redishook.Call(u.store, ctx, func(ctx context.Context, c rueidis.Client) error {
		idx := u.index(tenant)
		first := time.Date(from.UTC().Year(), from.UTC().Month(), from.UTC().Day(), 0, 0, 0, 0, time.UTC)
		lo := strconv.FormatInt(first.Unix(), 10)
		hi := "(" + strconv.FormatInt(to.Unix(), 10)
		days, err := c.Do(ctx, c.B().Zrange().Key(idx).Min(lo).Max(hi).Byscore().Build()).AsStrSlice()
		if err != nil || len(days) == 0 {
			return err
		}
		cmds := make(rueidis.Commands, len(days))
		for i, d := range days {
			cmds[i] = c.B().Hgetall().Key(idx + ":" + d).Build()
		}
		var gone []string
		for i, res := range c.DoMulti(ctx, cmds...) {
			h, err := res.AsStrMap()
			if err != nil {
				return err
			}
			if len(h) == 0 {
				gone = append(gone, days[i])
				continue
			}
			byModel := map[string]*llm.DayUsage{}
			for field, v := range h {
				model, name, ok := strings.Cut(field, "\x00")
				n, err := strconv.ParseInt(v, 10, 64)
				if !ok || err != nil {
					return admit.Errorf(admit.CodeInternal, "redisllm: %s:%s field %q is not a usage count", idx, days[i], field)
				}
				row := byModel[model]
				if row == nil {
					row = &llm.DayUsage{Tenant: tenant, Model: model, Day: days[i]}
					byModel[model] = row
				}
				switch name {
				case "requests":
					row.Requests = n
				case "unreported":
					row.Unreported = n
				case "cost":
					row.Cost = n
				default:
					for k, kn := range units.TokenKindNames {
						if kn == name {
							row.Tokens[k] = n
						}
					}
				}
			}
			for _, row := range byModel {
				out = append(out, *row)
			}
		}
		if len(gone) > 0 {
			_ = c.Do(ctx, c.B().Zrem().Key(idx).Member(gone...).Build()).Error()
		}
		return nil
	})
	llm.SortUsage(out)
	return out, err
}
