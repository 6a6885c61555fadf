// Package redischanges keeps the tenant catalog's changes in Redis, in the
// deployment of a redisstore.Store, so that every server of the deployment
// shares one catalog.
package redischanges

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/rueidis"

	"github.com/admitdev/admit"
	"github.com/admitdev/admit/internal/redishook"
	"github.com/admitdev/admit/policy"
	"github.com/admitdev/admit/redisstore"
)

// Store keeps the tenant catalog's changes (tenants, tiers,
// overrides, API key hashes) in Redis, shared by every server of a
// deployment: one JSON document under Prefix + "{catalog}changes", saved
// only on top of the revision it holds (policy.ErrStale otherwise), and a
// message on the Prefix + "catalog" channel after each save, on which the
// other servers load it again (Watch). Redis persistence (RDB/AOF) is what
// makes the changes survive every server and Redis restarting.
type Store struct {
	store   *redisstore.Store
	key     string
	channel string
	timeout time.Duration
}

var _ policy.ChangeStore = (*Store)(nil)

// New returns the catalog changes of s's deployment.
func New(s *redisstore.Store) *Store {
	return &Store{
		store: s, key: s.Prefix() + "{catalog}changes", channel: s.Prefix() + "catalog",
		// Admin changes are rare and matter more than they are urgent.
		timeout: max(s.Timeout(), 2*time.Second),
	}
}

// Load implements policy.ChangeStore.
func (c *Store) Load(ctx context.Context) (*policy.Changes, error) {
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	client, err := c.client()
	if err != nil {
		return nil, err
	}
	b, err := client.Do(ctx, client.B().Get().Key(c.key).Build()).AsBytes()
	if rueidis.IsRedisNil(err) {
		return &policy.Changes{Version: 1}, nil
	}
	if err != nil {
		return nil, admit.Errorf(admit.CodeUnavailable, "redischanges: loading the catalog: %w", err)
	}
	var ch policy.Changes
	if err := json.Unmarshal(b, &ch); err != nil {
		return nil, fmt.Errorf("redischanges: %s does not hold a catalog: %w", c.key, err)
	}
	if ch.Version != 1 {
		return nil, fmt.Errorf("redischanges: %s: catalog version %d; this build reads version 1", c.key, ch.Version)
	}
	return &ch, nil
}

// saveScript replaces the catalog only if it holds the revision before the
// new one, and tells the other servers.
var saveScript = rueidis.NewLuaScript(`
local cur = redis.call('GET', KEYS[1])
local rev = 0
if cur then rev = cjson.decode(cur).revision or 0 end
if rev ~= tonumber(ARGV[2]) then return 0 end
redis.call('SET', KEYS[1], ARGV[1])
redis.call('PUBLISH', ARGV[3], ARGV[4])
return 1`)

// Save implements policy.ChangeStore.
func (c *Store) Save(ctx context.Context, ch *policy.Changes) error {
	b, err := json.Marshal(ch)
	if err != nil {
		return fmt.Errorf("redischanges: encoding the catalog: %w", err)
	}
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	rev := strconv.FormatInt(ch.Revision, 10)
	client, err := c.client()
	if err != nil {
		return err
	}
	ok, err := saveScript.Exec(ctx, client, []string{c.key},
		[]string{string(b), strconv.FormatInt(ch.Revision-1, 10), c.channel, rev}).AsInt64()
	if err != nil {
		return admit.Errorf(admit.CodeUnavailable, "redischanges: saving the catalog: %w", err)
	}
	if ok != 1 {
		return fmt.Errorf("redischanges: saving catalog revision %d: %w", ch.Revision, policy.ErrStale)
	}
	return nil
}

// Watch calls changed whenever a server saves the catalog, until ctx ends.
// It also calls it every poll interval (a message published while this
// server was disconnected is lost), after each lost subscription, and
// once each subscription is made again.
func (c *Store) Watch(ctx context.Context, poll time.Duration, changed func()) {
	go func() {
		t := time.NewTicker(poll)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				changed()
			}
		}
	}()
	// While Redis is down, subscribing fails at once: wait longer after
	// each failure (200 ms doubling to 5 s), and start again from 200 ms
	// after a subscription that held.
	const minWait, maxWait = 200 * time.Millisecond, 5 * time.Second
	wait := minWait
	// Each (re)subscription catches up at once: messages published while
	// this server was away are lost, and Redis may have come back empty
	// (the catalog then saves its copy back).
	hooked := rueidis.WithOnSubscriptionHook(ctx, func(s rueidis.PubSubSubscription) {
		if s.Kind == "subscribe" {
			go changed()
		}
	})
	for ctx.Err() == nil {
		began := time.Now()
		client, err := c.client()
		if err == nil {
			err = client.Receive(hooked, client.B().Subscribe().Channel(c.channel).Build(), func(rueidis.PubSubMessage) {
				changed()
			})
		}
		if ctx.Err() != nil {
			return
		}
		_ = err // the connection dropped: subscribe again, and catch up
		if time.Since(began) > maxWait {
			wait = minWait
		}
		changed()
		select {
		case <-ctx.Done():
		case <-time.After(wait):
		}
		wait = min(2*wait, maxWait)
	}
}

// client returns the store's client, or CodeUnavailable while it has none
// yet (a store dialed lazily).
func (c *Store) client() (rueidis.Client, error) {
	if client := redishook.Client(c.store); client != nil {
		return client, nil
	}
	return nil, admit.Errorf(admit.CodeUnavailable, "redischanges: no connection to Redis yet")
}
