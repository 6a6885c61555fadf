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
// subscription is made again. changed runs on a goroutine of its own,
// never on the connection's (the catalog's lock may wait for Redis); a
// call that fails is made again at every poll until one succeeds.
func (c *Store) Watch(ctx context.Context, poll time.Duration, changed func() error) {
	redishook.Follow(ctx, c.store, c.channel, c.revKey, c.timeout, poll, changed)
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
