// Package redisstore is Admit's distributed store: the state of every
// bucket lives in Redis (standalone, Sentinel or Cluster), so any number of
// Admit servers share exact limits without replicating anything themselves.
//
//	store, err := redisstore.Open(ctx, "redis://localhost:6379/0", nil)
//	if err != nil {
//		return err // the URL is wrong, or Redis does not answer
//	}
//	defer store.Close()
//	limiter, err := admit.NewLimiter(store, admit.Bucket("user", admit.PerSecond(10), 20).Per(admit.PerUser))
//
// Open takes redis://, rediss:// (TLS), redis+sentinel:// and
// redis+cluster:// URLs (ParseURL says what each holds); Options sets the
// key prefix, the timeout of every call and the circuit breaker. Redis 7.0
// or later is needed. Every process that opens the same Redis with the
// same prefix shares the limits of the same names (admit.NewNamedLimiter
// keeps a Limiter's limits apart from others').
//
// # One round trip per decision
//
// Every algorithm runs inside Redis as one Lua function (internal/exact/lua, a
// Redis Functions library, so Redis 7.0 or later) that decides all the
// charges of a request together, all or nothing, with Redis TIME as the
// clock. It mirrors package admit's arithmetic exactly (integers only, no
// rounding); the conformance suite in storetest runs against both stores.
// A library lost to a restart or failover is loaded again, on every node,
// when Redis answers that the function is missing.
//
// Decisions made at the same time share calls: while calls for a hash
// slot are in flight, the decisions that arrive queue, and the next call
// decides them all, one after the other, each all or nothing on its own
// (see internal/exact). A lone decision is sent at once; nothing waits for a
// batch to fill.
//
// Rules of distribution admit.Counted (fixed windows whose every charge
// is a debit, as envoyproxy/ratelimit counts hits) take no function: their
// charges are plain pipelined INCRBYs, the hits that meet in a pipeline
// added together, with a PEXPIRE when this process first counts in a
// key's window (see internal/counted). Their keys are Prefix, '#' and a hash of
// the window and the charge's key.
//
// # Regions
//
// A store opened with Options.Home is one region of limits held across
// regions: its Redis is the region's own, the home Redis is shared by
// every region, and each bucket's, window's or quota's limit holds across
// all the regions together, decided from what the region holds without a
// call to the home (see Region and docs/architecture.md, "Limits across
// regions").
//
// # Keys and Cluster
//
// Redis keys are Prefix + "{" + tag + "}" + the charge's key. The tag is a
// hash of the key's tenant (see admit.Key), so every key of one tenant
// shares a hash slot and a tenant's charges are decided atomically in
// Cluster too. Keys without a tenant (the global scope) share the tag "g".
// Ping writes nothing to Prefix + "ready" (in Cluster, Prefix + "ready{N}"
// on each master), a write that makes no key: a Redis that answers but
// takes no writes is down for the store.
//
// In Cluster, a request charged both tenant and global rules touches two
// slots, which no single script can. Such decisions run group by group,
// the tenant's first: a group that refuses ends the decision, and the
// groups already charged are given back (an undo script restores exactly
// what they took). Nothing is ever admitted beyond a limit this way; the
// cost is a second round trip for those requests, and capacity held for a
// moment by requests that end up refused. docs/architecture.md measures it.
//
// # Failures
//
// Every call has a timeout (Options.Timeout). After Options.BreakerFailures
// consecutive failures the store stops calling Redis for
// Options.BreakerCooldown and fails at once; then one probe call is let
// through, and a success closes the breaker. Meanwhile a ping every tenth of
// the cooldown closes it as soon as Redis answers again. Failures are admit errors of
// code CodeUnavailable, so callers apply their on_error mode. A new
// connection is made within 4 timeouts (200 ms at least), and one left
// unanswered for 100 (5 s at least) is made again.
package redisstore

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/redis/rueidis"

	"github.com/admitdev/admit"
	"github.com/admitdev/admit/internal/bounds"
	"github.com/admitdev/admit/internal/redishook"
	"github.com/admitdev/admit/redisstore/internal/counted"
	"github.com/admitdev/admit/redisstore/internal/exact"
	"github.com/admitdev/admit/redisstore/internal/leased"
	"github.com/admitdev/admit/redisstore/internal/link"
)

// Options configure a Store. The zero Options is valid.
type Options struct {
	// Prefix starts every key the store writes; default "admit:".
	Prefix string
	// Timeout bounds every call to Redis; default 50ms.
	Timeout time.Duration
	// BreakerFailures is how many consecutive failures open the circuit
	// breaker; default 5.
	BreakerFailures int
	// BreakerCooldown is how long an open breaker fails calls at once
	// before it lets a probe through; default 1s.
	BreakerCooldown time.Duration
	// Clock, if set, replaces Redis TIME as the clock. Tests use it; in
	// production every server must read the same clock, Redis's. Keys
	// then expire 10 minutes later than Clock says they may, since Redis
	// expires them by its own clock, which a stepped one can lag.
	Clock func() time.Time
	// ExactRefusals sends every decision to Redis. By default a decision
	// that charges a key Redis refused, at least the refused cost, until
	// the time Redis said the key could admit it, is refused locally,
	// reporting the refusing charge only (the others' Remaining is what
	// Redis holds, unknown here). Set it to report every charge of every
	// refusal as the memory store does.
	ExactRefusals bool
	// TenantsPerDecision bounds, in Cluster, the tenants whose keys the
	// charges of a decision that takes a lease, or of a reservation,
	// name (keys without a tenant aside). Such a decision is held in
	// one record per hash-tag group, and its id names every group, so
	// renewing, releasing or cancelling an id costs two commands a
	// group it names, before the store can tell that a client made the
	// id up. A store whose callers decide for one tenant at a time, as
	// admit serve and the middleware do, sets 1: an id naming more than
	// one tenant's group and the global one is then not found at no
	// cost, and a decision or reservation for more tenants is invalid.
	// Zero allows as many tenants as a decision has charges. Outside
	// Cluster a decision is one group whatever it names.
	TenantsPerDecision int
	// Home, if set, makes the store one region of limits held across
	// regions: every region's store whose Home is the same Redis (with
	// the same prefix) shares each bucket's limit, never admitting more
	// than it, and decides from what its region holds without a call to
	// the home (see Region). Only token buckets and GCRA can be held
	// across regions yet (CheckRegionRule). The caller keeps and closes
	// Home; its Timeout bounds the calls to the home, which are made in
	// the background and may well take 100ms or more.
	Home *Store
	// Region names the store's region; every region sharing a home
	// needs its own name. Required with Home.
	Region string
	// Cut is what a region cut from its home does once it has spent
	// what it holds; default RefuseWhenCut.
	Cut CutPolicy
}

// check reports whether o (nil is valid) can open a store.
func (o *Options) check() error {
	if o == nil || o.Home == nil {
		return nil
	}
	if o.Region == "" || len(o.Region) > 64 {
		return admit.Errorf(admit.CodeInvalid, "redisstore: a store with a home needs its region's name, of at most 64 bytes")
	}
	if _, ok := o.Home.leased.InRegion(); ok {
		return admit.Errorf(admit.CodeInvalid, "redisstore: a home is a plain store, not a region of another home")
	}
	if o.Clock != nil {
		// The pools' times are the Redises' clocks mapped through this
		// one: a stepped clock would map them wrong.
		return admit.Errorf(admit.CodeInvalid, "redisstore: a store with a home reads the real clock; Options.Clock cannot be set")
	}
	return nil
}

// Store is the Redis admit.Store. It is safe for concurrent use.
type Store struct {
	link    *link.Link    // the connection room
	exact   *exact.Room   // the exact path: every decision made in Redis
	leased  *leased.Room  // leased rules' allowances, and a region's
	counted *counted.Room // counted rules' plain counts

	closeOnce sync.Once
}

var _ admit.Store = (*Store)(nil)

// withClient returns a Store that uses client, which the caller keeps and
// closes (tests wrap a client of their own).
func withClient(client rueidis.Client, opts *Options) *Store {
	if client == nil {
		panic("redisstore: nil rueidis.Client; Open takes a URL")
	}
	mode := "standalone"
	switch client.Mode() {
	case rueidis.ClientModeCluster:
		mode = "cluster"
	case rueidis.ClientModeSentinel:
		mode = "sentinel"
	}
	s := newStore(mode == "cluster", mode, opts)
	s.link.SetClient(client)
	return s
}

func newStore(cluster bool, mode string, opts *Options) *Store {
	var o Options
	if opts != nil {
		o = *opts
	}
	if o.Prefix == "" {
		o.Prefix = "admit:"
	}
	if o.Timeout <= 0 {
		o.Timeout = 50 * time.Millisecond
	}
	if o.BreakerFailures <= 0 {
		o.BreakerFailures = 5
	}
	if o.BreakerCooldown <= 0 {
		o.BreakerCooldown = time.Second
	}
	if o.TenantsPerDecision <= 0 || o.TenantsPerDecision > bounds.MaxCharges {
		o.TenantsPerDecision = bounds.MaxCharges
	}
	var ro *leased.RegionOptions
	if o.Home != nil {
		ro = &leased.RegionOptions{Name: o.Region, Home: o.Home.link, FailWhenCut: o.Cut == FailWhenCut}
	}
	l := &link.Link{Cluster: cluster, Mode: mode, Prefix: o.Prefix, Timeout: o.Timeout, Clock: o.Clock, Library: exact.Library,
		Breaker: link.Breaker{Threshold: int64(o.BreakerFailures), Cooldown: o.BreakerCooldown}, Closed: make(chan struct{})}
	x := exact.New(l, o.TenantsPerDecision, o.ExactRefusals)
	s := &Store{link: l, exact: x, leased: leased.New(l, x, ro)}
	s.counted = counted.New(l, othersOf{s}, s.exact)
	return s
}

// Open connects to the Redis deployment that url names (see ParseURL) and
// returns a Store that owns the connection.
func Open(ctx context.Context, url string, opts *Options) (*Store, error) {
	cfg, err := ParseURL(url)
	if err != nil {
		return nil, err
	}
	return Dial(ctx, cfg, opts)
}

// Dial connects to the deployment cfg describes and checks that it answers.
func Dial(ctx context.Context, cfg Config, opts *Options) (*Store, error) {
	if ctx == nil {
		return nil, admit.Errorf(admit.CodeInvalid, "redisstore: the context is nil; use context.Background()")
	}
	if err := opts.check(); err != nil {
		return nil, err
	}
	co, err := cfg.clientOption()
	if err != nil {
		return nil, err
	}
	boundConnections(&co, opts)
	client, err := rueidis.NewClient(co)
	if link.RefusedCredentials(err) {
		return nil, admit.Errorf(admit.CodeInvalid, "redisstore: %s refused the credentials: %w", cfg, err)
	}
	if err != nil {
		return nil, admit.Errorf(admit.CodeUnavailable, "redisstore: connecting to %s: %w", cfg, err)
	}
	s := withClient(client, opts)
	s.link.Own = true
	if err := s.Ping(ctx); err != nil {
		client.Close()
		return nil, err
	}
	return s, nil
}

// boundConnections bounds how long the client waits on a connection by
// the store's timeout. A call that needs a new connection waits for the
// one being made, whoever asked for it and however long its caller's
// context: made under a dial timeout of 4 timeouts (200 ms at least, 5 s
// at most), a frozen Redis holds such a call that long, not the 5 s of
// the client's default or the seconds of a background caller's context.
// A connection that has not been answered for 100 timeouts (5 s at least,
// 10 s at most) is closed and made again, rather than after 10 s.
func boundConnections(co *rueidis.ClientOption, opts *Options) {
	t := 50 * time.Millisecond
	if opts != nil && opts.Timeout > 0 {
		t = opts.Timeout
	}
	co.Dialer.Timeout = min(max(4*t, 200*time.Millisecond), 5*time.Second)
	co.ConnWriteTimeout = min(max(100*t, 5*time.Second), 10*time.Second)
}

// DialLazy returns a store for cfg without waiting for Redis to answer, so
// that a server can start while Redis is down and decide by its failure
// modes until Redis answers. A standalone connection is made, and made
// again, as calls need it. Sentinel and Cluster clients need their
// topology first: the store asks for it in the background, every 100 ms
// at first and then every 500 ms, and fails its calls with CodeUnavailable
// until it has it.
func DialLazy(cfg Config, opts *Options) (*Store, error) {
	if err := opts.check(); err != nil {
		return nil, err
	}
	co, err := cfg.clientOption()
	if err != nil {
		return nil, err
	}
	boundConnections(&co, opts)
	if cfg.Mode == Standalone {
		client, err := rueidis.NewClient(co)
		if client == nil {
			return nil, admit.Errorf(admit.CodeUnavailable, "redisstore: connecting to %s: %w", cfg, err)
		}
		s := withClient(client, opts)
		s.link.Own = true
		return s, nil
	}
	s := newStore(cfg.Mode == Cluster, string(cfg.Mode), opts)
	s.link.Own = true
	go s.link.Connect(co)
	return s, nil
}

// Close closes the connection if the store opened it. It is idempotent.
func (s *Store) Close() error {
	s.closeOnce.Do(func() {
		s.leased.ReturnAll()
		s.link.Close()
	})
	return nil
}

// Prefix returns the prefix of the store's keys; packages that keep their
// own data in the store's Redis (gateway sessions, the shared catalog) put
// theirs under it too.
func (s *Store) Prefix() string { return s.link.Prefix }

// Timeout returns the bound of every call the store makes.
func (s *Store) Timeout() time.Duration { return s.link.Timeout }

// Ping checks that Redis answers (every master, in Cluster) within the
// timeout. It does not go through the breaker, so readiness probes see the
// store's real state.
func (s *Store) Ping(ctx context.Context) error { return s.link.Ping(ctx) }

// Health is the store's state for readiness checks and metrics.
type Health struct {
	Breaker      string // "closed", "open" or "half-open"
	Calls        int64  // calls to Redis
	Failures     int64  // calls that failed or timed out
	UndoFailures int64  // Cluster decisions whose give-back failed
	Decisions    int64  // decisions asked for (Decide)
	// Decisions made without a call: from leased allowances (see
	// admit.Leased), or refused until a time Redis gave (LocalRefusals,
	// counted in LocalDecisions too). Then, for leased allowances,
	// withdrawal calls, and units withdrawn, given back, expired unused
	// and lost (a give-back that failed).
	LocalDecisions int64
	LocalRefusals  int64
	Withdrawals    int64
	Withdrawn      int64
	Refunded       int64
	Expired        int64
	Lost           int64
	// Evicts names the maxmemory-policy of a Redis that may evict keys
	// (a maxmemory and a policy other than noeviction), as the last ping
	// found it: evicted keys are limits reset and idempotency keys lost.
	Evicts string
}

// Health returns the store's current state.
func (s *Store) Health() Health {
	h := Health{
		Breaker: s.link.Breaker.State(time.Now()), Calls: s.link.Calls.Load(), Failures: s.link.Failures.Load(),
		UndoFailures: s.exact.UndoFailures.Load(), LocalRefusals: s.exact.LocalRefusals.Load(),
		Decisions:      s.exact.Decisions.Load() + s.leased.Decisions.Load(),
		LocalDecisions: s.exact.LocalDecisions.Load() + s.leased.LocalDecisions.Load(),
		Withdrawals:    s.leased.Withdrawals.Load(), Withdrawn: s.leased.Withdrawn.Load(), Refunded: s.leased.Refunded.Load(),
		Expired: s.leased.Expired.Load(), Lost: s.leased.Lost.Load(),
	}
	if e := s.link.Evicts.Load(); e != nil {
		h.Evicts = *e
	}
	return h
}

// String describes the store for logs.
func (s *Store) String() string {
	return fmt.Sprintf("redis (%s)", s.link.Mode)
}

func init() {
	redishook.Call = func(store any, ctx context.Context, f func(ctx context.Context, client rueidis.Client) error) error {
		return store.(*Store).link.Do(ctx, f)
	}
	redishook.Client = func(store any) rueidis.Client {
		c, _ := store.(*Store).link.Client() // nil while it has none
		return c
	}
	redishook.Command = func(store any, charges []admit.Charge) (keys, args []string) {
		return store.(*Store).exact.Command(charges)
	}
}
