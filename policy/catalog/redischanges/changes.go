// Package redischanges keeps the tenant catalog's changes in Redis, in the
// deployment of a redisstore.Store, so that every server of the deployment
// shares one catalog.
package redischanges

import (
	_ "embed"

	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/redis/rueidis"

	"github.com/admitdev/admit"
	"github.com/admitdev/admit/internal/redishook"
	"github.com/admitdev/admit/policy/catalog"
	"github.com/admitdev/admit/redisstore"
)

// Store keeps the tenant catalog's changes (tenants, tiers,
// overrides, API key hashes) in Redis, shared by every server of a
// deployment: one JSON document under Prefix + "{catalog}changes", saved
// only on top of the revision it holds (catalog.ErrStale otherwise), its
// revision under Prefix + "{catalog}revision" (what Watch polls), and a
// message on the Prefix + "catalog" channel after each save, on which the
// other servers load it again (Watch). Redis persistence (RDB/AOF) is what
// makes the changes survive Redis restarting; without it, the servers'
// catalogs restore what a Redis that came back empty lost (see
// catalog.Catalog.Sync).
type Store struct {
	store   *redisstore.Store
	key     string
	revKey  string
	channel string
	timeout time.Duration
}

var _ catalog.Store = (*Store)(nil)

// New returns the catalog changes of s's deployment.
func New(s *redisstore.Store) *Store {
	return &Store{
		store: s, key: s.Prefix() + "{catalog}changes", revKey: s.Prefix() + "{catalog}revision", channel: s.Prefix() + "catalog",
		// Admin changes are rare and matter more than they are urgent.
		timeout: max(s.Timeout(), 2*time.Second),
	}
}

// Load implements catalog.Store.
func (c *Store) Load(ctx context.Context) (*catalog.Changes, error) {
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	client, err := c.client()
	if err != nil {
		return nil, err
	}
	b, err := client.Do(ctx, client.B().Get().Key(c.key).Build()).AsBytes()
	if _, reply := rueidis.IsRedisErr(err); err != nil && !reply && ctx.Err() == nil {
		// A connection a Redis restart broke fails the first call made
		// on it; a read is safe to make again, on one made anew.
		b, err = client.Do(ctx, client.B().Get().Key(c.key).Build()).AsBytes()
	}
	if rueidis.IsRedisNil(err) {
		return &catalog.Changes{Version: 1}, nil
	}
	if err != nil {
		return nil, admit.Errorf(admit.CodeUnavailable, "redischanges: loading the catalog: %w", err)
	}
	var ch catalog.Changes
	if err := json.Unmarshal(b, &ch); err != nil {
		return nil, fmt.Errorf("redischanges: %s does not hold a catalog: %w", c.key, err)
	}
	if ch.Version != 1 {
		return nil, fmt.Errorf("redischanges: %s: catalog version %d; this build reads version 1", c.key, ch.Version)
	}
	return &ch, nil
}

// saveScript replaces the catalog only if it holds the revision the new
// one was made on, keeps its revision apart, and tells the other servers.
var saveScript = rueidis.NewLuaScript(saveSource)

// Save implements catalog.Store.
func (c *Store) Save(ctx context.Context, ch *catalog.Changes) error {
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
	ok, err := saveScript.Exec(ctx, client, []string{c.key, c.revKey},
		[]string{string(b), strconv.FormatInt(ch.Base, 10), c.channel, rev}).AsInt64()
	if err != nil {
		return admit.Errorf(admit.CodeUnavailable, "redischanges: saving the catalog: %w", err)
	}
	if ok != 1 {
		return fmt.Errorf("redischanges: saving catalog revision %d: %w", ch.Revision, catalog.ErrStale)
	}
	return nil
}

// Watch calls changed whenever a server saves the catalog, until ctx
// ends: on the save's message, and when a poll of the saved revision
// every poll interval finds it changed (a message published while this
// server was disconnected is lost; a Redis that came back empty has
// none). It also calls it after each lost subscription, and once each
// subscription is made again.
//
// changed runs on a goroutine of its own, never on the connection's: the
// subscription's callback only marks that a call is due, so a changed
// that waits (for the catalog's lock, which an admin write holds while it
// waits for Redis) never holds up the replies of the connection the
// store's decisions share. Calls due while one runs are made once, after
// it; a call that fails is made again at every poll until one succeeds.
func (c *Store) Watch(ctx context.Context, poll time.Duration, changed func() error) {
	due := make(chan struct{}, 1)
	kick := func() {
		select {
		case due <- struct{}{}:
		default:
		}
	}
	var failed atomic.Bool
	go func() {
		for {
			select {
			case <-ctx.Done():
				return
			case <-due:
				failed.Store(changed() != nil)
			}
		}
	}()
	go c.pollRevision(ctx, poll, kick, &failed)
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
			kick()
		}
	})
	for ctx.Err() == nil {
		began := time.Now()
		client, err := c.client()
		if err == nil {
			err = client.Receive(hooked, client.B().Subscribe().Channel(c.channel).Build(), func(rueidis.PubSubMessage) {
				kick()
			})
		}
		if ctx.Err() != nil {
			return
		}
		_ = err // the connection dropped: subscribe again, and catch up
		if time.Since(began) > maxWait {
			wait = minWait
		}
		kick()
		select {
		case <-ctx.Done():
		case <-time.After(wait):
		}
		wait = min(2*wait, maxWait)
	}
}

// pollRevision reads the saved revision every poll interval and calls
// kick when it is not the one it read last (absent included: a Redis that
// lost the catalog), cannot be read, or the last call failed, and every
// 30 polls whatever it reads: a catalog saved by a server that does not
// keep the revision apart is seen then.
func (c *Store) pollRevision(ctx context.Context, poll time.Duration, kick func(), failed *atomic.Bool) {
	t := time.NewTicker(poll)
	defer t.Stop()
	last := ""
	for n := 1; ; n++ {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		rev := "?"
		if client, err := c.client(); err == nil {
			pctx, cancel := context.WithTimeout(ctx, c.timeout)
			v, err := client.Do(pctx, client.B().Get().Key(c.revKey).Build()).ToString()
			cancel()
			switch {
			case err == nil:
				rev = v
			case rueidis.IsRedisNil(err):
				rev = ""
			}
		}
		if rev != last || rev == "?" || failed.Load() || n%30 == 0 {
			kick()
		}
		last = rev
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

//go:embed lua/save.lua
var saveSource string
