// Package redisbans keeps bans in Redis, in the deployment of a
// redisstore.Store, so that a ban set on one server refuses on every
// server of the deployment.
package redisbans

import (
	"context"
	_ "embed"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/redis/rueidis"

	"github.com/admitdev/admit"
	"github.com/admitdev/admit/internal/redishook"
	"github.com/admitdev/admit/policy"
	"github.com/admitdev/admit/redisstore"
)

// Store keeps bans in Redis: each ban a field of the hash Prefix +
// "{bans}list" (its JSON), its expiry in the sorted set "{bans}expiry"
// (and an escalation's in "{bans}escalated" too), the escalation history
// in "{bans}history" (with "{bans}forget", by when each entry is
// forgotten, and "{bans}rank", by strikes), and a revision in "{bans}revision" that every
// change increments and publishes on the Prefix + "bans" channel, on which
// the other servers load the bans again. Each change is one script: the
// bound (policy.MaxBans) and an escalation's doubling hold however many
// servers change the bans at once. Expired bans and forgotten history are
// removed as changes are made.
type Store struct {
	store   *redisstore.Store
	keys    []string
	channel string
	timeout time.Duration
	// seen is the highest revision a load found: one lower, or none,
	// means Redis lost the bans.
	seen atomic.Int64
}

var _ policy.BanStore = (*Store)(nil)

// New returns the bans of s's deployment.
func New(s *redisstore.Store) *Store {
	p := s.Prefix()
	return &Store{
		store: s, channel: p + "bans",
		keys: []string{p + "{bans}list", p + "{bans}expiry", p + "{bans}history", p + "{bans}forget", p + "{bans}revision",
			p + "{bans}escalated", p + "{bans}rank"},
		// Bans are rare and matter more than they are urgent.
		timeout: max(s.Timeout(), 2*time.Second),
	}
}

// stored is a ban as Redis keeps it: times in Unix milliseconds, which
// the script computes with.
type stored struct {
	ID      string `json:"id"`
	Scope   string `json:"scope"`
	Value   string `json:"value"`
	Tenant  string `json:"tenant,omitempty"`
	Reason  string `json:"reason,omitempty"`
	Source  string `json:"source"`
	Strike  int    `json:"strike,omitempty"`
	Created int64  `json:"created_ms"`
	Expires int64  `json:"expires_ms"`
}

func toStored(b policy.Ban) stored {
	return stored{ID: b.ID, Scope: b.Scope, Value: b.Value, Tenant: b.Tenant, Reason: b.Reason, Source: b.Source,
		Strike: b.Strike, Created: b.Created.UnixMilli(), Expires: b.Expires.UnixMilli()}
}

func (s stored) ban() policy.Ban {
	return policy.Ban{ID: s.ID, Scope: s.Scope, Value: s.Value, Tenant: s.Tenant, Reason: s.Reason, Source: s.Source,
		Strike: s.Strike, Created: time.UnixMilli(s.Created).UTC(), Expires: time.UnixMilli(s.Expires).UTC()}
}

// call makes f's calls through the store's breaker and timeout.
func (s *Store) call(ctx context.Context, f func(ctx context.Context, c rueidis.Client) error) error {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	client := redishook.Client(s.store)
	if client == nil {
		return admit.Errorf(admit.CodeUnavailable, "redisbans: no connection to Redis yet")
	}
	if err := f(ctx, client); err != nil {
		if _, reply := rueidis.IsRedisErr(err); reply {
			return fmt.Errorf("redisbans: %w", err)
		}
		return admit.Errorf(admit.CodeUnavailable, "redisbans: %v", err)
	}
	return nil
}

// Load implements policy.BanStore.
func (s *Store) Load(ctx context.Context, now time.Time) (*policy.BanState, error) {
	var bans, hist map[string]string
	rev := int64(-1) // absent
	err := s.call(ctx, func(ctx context.Context, c rueidis.Client) error {
		rs := c.DoMulti(ctx, c.B().Hgetall().Key(s.keys[0]).Build(), c.B().Hgetall().Key(s.keys[2]).Build(), c.B().Get().Key(s.keys[4]).Build())
		var err error
		if bans, err = rs[0].AsStrMap(); err != nil {
			return err
		}
		if hist, err = rs[1].AsStrMap(); err != nil {
			return err
		}
		switch v, err := rs[2].AsInt64(); {
		case err == nil:
			rev = v
		case !rueidis.IsRedisNil(err):
			return err
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	// A revision this store saw that Redis no longer has: Redis lost
	// what it held (it came back empty, or older).
	seen := s.seen.Load()
	lost := seen > 0 && rev < seen
	switch {
	case lost:
		s.seen.Store(max(rev, 0)) // what the servers save back counts from here
	case rev > seen:
		s.seen.CompareAndSwap(seen, rev)
	}
	st := &policy.BanState{History: make(map[string]policy.BanStrikes, len(hist)), Lost: lost}
	for id, v := range bans {
		var b stored
		if err := json.Unmarshal([]byte(v), &b); err != nil {
			return nil, fmt.Errorf("redisbans: ban %q is not a ban: %w", id, err)
		}
		if b.Expires > now.UnixMilli() {
			st.Bans = append(st.Bans, b.ban())
		}
	}
	for k, v := range hist {
		var strikes, until, forget int64
		if n, _ := fmt.Sscanf(strings.ReplaceAll(v, ":", " "), "%d %d %d", &strikes, &until, &forget); n != 3 {
			continue
		}
		st.History[k] = policy.BanStrikes{Strikes: int(strikes), Until: time.UnixMilli(until).UTC(), Forget: time.UnixMilli(forget).UTC()}
	}
	return st, nil
}

var changeScript = rueidis.NewLuaScript(changeSource)

// change runs the change script, returning its code and ban, and the id
// of the ban it replaced ("" if none).
func (s *Store) change(ctx context.Context, args []string) (int64, policy.Ban, string, error) {
	var code int64
	var out, evicted string
	err := s.call(ctx, func(ctx context.Context, c rueidis.Client) error {
		v, err := changeScript.Exec(ctx, c, s.keys, args).ToArray()
		if err != nil {
			return err
		}
		if len(v) != 2 && len(v) != 3 {
			return fmt.Errorf("the script answered %d values", len(v))
		}
		if code, err = v[0].AsInt64(); err != nil {
			return err
		}
		if len(v) == 3 {
			if evicted, err = v[2].ToString(); err != nil {
				return err
			}
		}
		out, err = v[1].ToString()
		return err
	})
	if err != nil || out == "" {
		return code, policy.Ban{}, "", err
	}
	var b stored
	if err := json.Unmarshal([]byte(out), &b); err != nil {
		return 0, policy.Ban{}, "", fmt.Errorf("redisbans: the script answered no ban: %w", err)
	}
	return code, b.ban(), evicted, nil
}

func (s *Store) args(op string, b policy.Ban, now time.Time) ([]string, error) {
	j, err := json.Marshal(toStored(b))
	if err != nil {
		return nil, err
	}
	return []string{op, strconv.FormatInt(now.UnixMilli(), 10), b.ID, string(j), strconv.Itoa(policy.MaxBans), s.channel}, nil
}

// Add implements policy.BanStore.
func (s *Store) Add(ctx context.Context, b policy.Ban, now time.Time) (policy.Ban, bool, error) {
	args, err := s.args("add", b, now)
	if err != nil {
		return policy.Ban{}, false, err
	}
	return s.saved(ctx, args, nil)
}

func (s *Store) saved(ctx context.Context, args []string, evictions func(string)) (policy.Ban, bool, error) {
	code, saved, evicted, err := s.change(ctx, args)
	if evicted != "" && evictions != nil {
		evictions(evicted)
	}
	switch {
	case err != nil:
		return policy.Ban{}, false, err
	case code < 0:
		return policy.Ban{}, false, fmt.Errorf("redisbans: %w", policy.ErrBansFull)
	}
	return saved, code == 1, nil
}

// Escalate implements policy.BanStore.
func (s *Store) Escalate(ctx context.Context, e policy.Escalated, now time.Time) (policy.Ban, bool, error) {
	args, err := s.args("esc", e.Ban, now)
	if err != nil {
		return policy.Ban{}, false, err
	}
	args = append(args, e.Key, strconv.FormatInt(e.Base.Milliseconds(), 10), strconv.FormatInt(e.Max.Milliseconds(), 10),
		strconv.FormatInt(e.Forget.Milliseconds(), 10), strconv.Itoa(policy.MaxBanHistory), strconv.Itoa(policy.MaxEscalatedBans))
	return s.saved(ctx, args, e.Evicted)
}

// Remove implements policy.BanStore.
func (s *Store) Remove(ctx context.Context, id string, now time.Time) (bool, error) {
	code, b, _, err := s.change(ctx, []string{"del", strconv.FormatInt(now.UnixMilli(), 10), id, "", "0", s.channel})
	return code == 1 && b.Expires.After(now), err
}

// Watch implements policy.BanStore: it follows the other servers' changes
// as their messages arrive, and polls the revision every half second for
// those a lost connection missed.
func (s *Store) Watch(ctx context.Context, changed func() error) {
	redishook.Follow(ctx, s.store, s.channel, s.keys[4], s.timeout, 500*time.Millisecond, changed)
}

//go:embed lua/change.lua
var changeSource string
