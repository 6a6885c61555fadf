// Package redisstore is Admit's distributed store: the state of every
// bucket lives in Redis (standalone, Sentinel or Cluster), so any number of
// Admit servers share exact limits without replicating anything themselves.
//
// # One round trip per decision
//
// Every algorithm runs inside Redis as one Lua function (admit.lua, a
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
// (see batch.go). A lone decision is sent at once; nothing waits for a
// batch to fill.
//
// # Keys and Cluster
//
// Redis keys are Prefix + "{" + tag + "}" + the charge's key. The tag is a
// hash of the key's tenant (see admit.Key), so every key of one tenant
// shares a hash slot and a tenant's charges are decided atomically in
// Cluster too. Keys without a tenant (the global scope) share the tag "g".
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
// code CodeUnavailable, so callers apply their on_error mode.
package redisstore

import (
	"context"
	"crypto/rand"
	_ "embed"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/rueidis"

	"github.com/admitdev/admit"
)

//go:embed admit.lua
var scriptSource string

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
	// production every server must read the same clock, Redis's.
	Clock func() time.Time
}

// Store is the Redis admit.Store. It is safe for concurrent use.
type Store struct {
	conn    atomic.Pointer[connection] // nil until a lazily dialed store connects
	own     bool                       // Close closes the client
	cluster bool
	mode    string // for String: standalone, sentinel or cluster
	prefix  string
	timeout time.Duration
	clock   func() time.Time
	breaker breaker

	calls, failures, undoFailures atomic.Int64
	closeOnce                     sync.Once
	connMu                        sync.Mutex    // orders a lazy connect with Close
	closed                        chan struct{} // closed by Close
	probing                       atomic.Bool   // a probe of an open breaker runs
	views                         clusterViews  // see cluster.go

	batchers []atomic.Pointer[batcher] // see batch.go
}

var _ admit.Store = (*Store)(nil)

// connection holds the store's client, so that a store dialed lazily can
// set it once, when it connects.
type connection struct{ client rueidis.Client }

// New returns a Store that uses client, which the caller keeps and closes.
func New(client rueidis.Client, opts *Options) *Store {
	mode := "standalone"
	switch client.Mode() {
	case rueidis.ClientModeCluster:
		mode = "cluster"
	case rueidis.ClientModeSentinel:
		mode = "sentinel"
	}
	s := newStore(mode == "cluster", mode, opts)
	s.conn.Store(&connection{client})
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
	return &Store{
		cluster:  cluster,
		mode:     mode,
		batchers: batchersFor(cluster),
		prefix:   o.Prefix,
		timeout:  o.Timeout,
		clock:    o.Clock,
		breaker:  breaker{threshold: int64(o.BreakerFailures), cooldown: o.BreakerCooldown},
		closed:   make(chan struct{}),
	}
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
	client, err := rueidis.NewClient(cfg.clientOption())
	if err != nil {
		return nil, admit.Errorf(admit.CodeUnavailable, "redisstore: connecting to %s: %w", cfg, err)
	}
	s := New(client, opts)
	s.own = true
	if err := s.Ping(ctx); err != nil {
		client.Close()
		return nil, err
	}
	return s, nil
}

// DialLazy returns a store for cfg without waiting for Redis to answer, so
// that a server can start while Redis is down and decide by its failure
// modes until Redis answers. A standalone connection is made, and made
// again, as calls need it. Sentinel and Cluster clients need their
// topology first: the store asks for it in the background, every 100 ms
// at first and then every 500 ms, and fails its calls with CodeUnavailable
// until it has it.
func DialLazy(cfg Config, opts *Options) (*Store, error) {
	if cfg.Mode == Standalone {
		client, err := rueidis.NewClient(cfg.clientOption())
		if client == nil {
			return nil, admit.Errorf(admit.CodeUnavailable, "redisstore: connecting to %s: %w", cfg, err)
		}
		s := New(client, opts)
		s.own = true
		return s, nil
	}
	s := newStore(cfg.Mode == Cluster, string(cfg.Mode), opts)
	s.own = true
	go s.connect(cfg)
	return s, nil
}

// connect makes the client of a lazily dialed store, trying again until it
// succeeds or the store is closed.
func (s *Store) connect(cfg Config) {
	wait := 100 * time.Millisecond
	for {
		client, err := rueidis.NewClient(cfg.clientOption())
		if err == nil {
			s.connMu.Lock()
			defer s.connMu.Unlock()
			select {
			case <-s.closed:
				client.Close()
			default:
				s.conn.Store(&connection{client})
			}
			return
		}
		select {
		case <-s.closed:
			return
		case <-time.After(wait):
		}
		wait = min(2*wait, 500*time.Millisecond)
	}
}

// Close closes the connection if the store opened it. It is idempotent.
func (s *Store) Close() error {
	s.closeOnce.Do(func() {
		s.connMu.Lock()
		defer s.connMu.Unlock()
		close(s.closed)
		if c := s.conn.Load(); c != nil && s.own {
			c.client.Close()
		}
	})
	return nil
}

// Client returns the store's Redis client, or nil while a store from
// DialLazy has not connected yet.
func (s *Store) Client() rueidis.Client {
	if c := s.conn.Load(); c != nil {
		return c.client
	}
	return nil
}

// client returns the store's Redis client, or CodeUnavailable while it has
// none yet.
func (s *Store) client() (rueidis.Client, error) {
	if c := s.conn.Load(); c != nil {
		return c.client, nil
	}
	return nil, admit.Errorf(admit.CodeUnavailable, "redisstore: no connection to Redis %s yet", s.mode)
}

// Prefix returns the prefix of the store's keys; packages that keep their
// own data in the store's Redis (gateway sessions, the shared catalog) put
// theirs under it too.
func (s *Store) Prefix() string { return s.prefix }

// Timeout returns the bound of every call the store makes.
func (s *Store) Timeout() time.Duration { return s.timeout }

// Call makes one call to Redis, f, as the store makes its own: through its
// circuit breaker (refused at once, with CodeUnavailable, while it is
// open), within its timeout, and counted in Health. It is for packages
// that keep their own data in the store's Redis, such as gateway sessions,
// so that they fail as fast as decisions during an outage. An error f
// returns is CodeUnavailable, unless it is a Redis reply, which f should
// keep to itself: Call counts it as a bug (CodeInternal).
func (s *Store) Call(ctx context.Context, f func(ctx context.Context, client rueidis.Client) error) error {
	return s.do(ctx, f)
}

// Ping checks that Redis answers (every master, in Cluster) within the
// timeout. It does not go through the breaker, so readiness probes see the
// store's real state.
func (s *Store) Ping(ctx context.Context) error {
	client, err := s.client()
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	nodes := map[string]rueidis.Client{"redis": client}
	if s.cluster {
		nodes = client.Nodes()
		if masters := s.clusterMasters(ctx, nodes); masters != nil {
			nodes = masters
		}
	}
	for addr, c := range nodes {
		if err := c.Do(ctx, c.B().Ping().Build()).Error(); err != nil {
			return admit.Errorf(admit.CodeUnavailable, "redisstore: ping %s: %w", addr, err)
		}
	}
	return nil
}

// Health is the store's state for readiness checks and metrics.
type Health struct {
	Breaker      string // "closed", "open" or "half-open"
	Calls        int64  // calls to Redis
	Failures     int64  // calls that failed or timed out
	UndoFailures int64  // Cluster decisions whose give-back failed
}

// Health returns the store's current state.
func (s *Store) Health() Health {
	return Health{
		Breaker: s.breaker.state(time.Now()), Calls: s.calls.Load(), Failures: s.failures.Load(),
		UndoFailures: s.undoFailures.Load(),
	}
}

// tagOf returns the hash tag of a charge key: a hash of its tenant, "g" for
// keys without one. Keys not made by admit.Key are their own tenant.
func tagOf(key string) string {
	tenant := key
	if k, err := admit.ParseKey(key); err == nil {
		tenant = k.Tenant
	}
	if tenant == "" {
		return "g"
	}
	// FNV-1a, 64 bits: stable across processes and versions, as a tag
	// must be; a collision only puts two tenants in one slot.
	h := uint64(14695981039346656037)
	for i := 0; i < len(tenant); i++ {
		h ^= uint64(tenant[i])
		h *= 1099511628211
	}
	var b [16]byte
	const digits = "0123456789abcdef"
	for i := range b {
		b[15-i] = digits[h&15]
		h >>= 4
	}
	return string(b[:])
}

func (s *Store) redisKey(tag, key string) string {
	return s.prefix + "{" + tag + "}" + key
}

// group is the charges of one decision that share a hash tag, with their
// Redis keys.
type group struct {
	tag  string
	idx  []int
	keys []string
}

// groups splits charges into the groups one call each can decide: by tag
// when split (in Cluster, where a call reaches one slot), in order of first
// appearance with the global tag last; otherwise all in one group, tagged
// like its first charge. Each charge's tag and key are computed here once
// for the whole decision.
func (s *Store) groups(charges []admit.Charge, split bool) []group {
	var gs []group
	for i := range charges {
		tag := tagOf(charges[i].Key)
		j := len(gs) - 1
		if split {
			j = slices.IndexFunc(gs, func(g group) bool { return g.tag == tag })
		}
		if j < 0 {
			gs = append(gs, group{tag: tag})
			j = len(gs) - 1
		}
		gs[j].idx = append(gs[j].idx, i)
		gs[j].keys = append(gs[j].keys, s.redisKey(tag, charges[i].Key))
	}
	if split {
		slices.SortStableFunc(gs, func(a, b group) int {
			switch {
			case a.tag == "g" && b.tag != "g":
				return 1
			case b.tag == "g" && a.tag != "g":
				return -1
			}
			return 0
		})
	}
	return gs
}

// validate checks charges and returns the arguments of each one's rule.
func validate(charges []admit.Charge, reserve bool) ([]*ruleArgs, error) {
	if len(charges) > admit.MaxCharges {
		return nil, admit.Errorf(admit.CodeInvalid, "%d charges in one decision; at most %d", len(charges), admit.MaxCharges)
	}
	ras := make([]*ruleArgs, len(charges))
	for i := range charges {
		c := &charges[i]
		if c.Rule == nil {
			return nil, admit.Errorf(admit.CodeInvalid, "charge %d has no rule", i)
		}
		ras[i] = argsOf(c.Rule)
		if err := ras[i].err; err != nil {
			return nil, err
		}
		if err := c.Rule.CheckCost(c.Cost); err != nil {
			return nil, err
		}
		if reserve && !c.Rule.Algorithm.Reservable() {
			return nil, admit.Errorf(admit.CodeInvalid, "rule %q: %v cannot reserve; only token_bucket and gcra can", c.Rule.Name, c.Rule.Algorithm)
		}
	}
	return ras, nil
}

// call is one script call: its keys and arguments.
type call struct {
	keys, args []string
}

// newCall starts a call of op on the charges of g; rec, if set, is the
// record key the script writes (a lease or a reservation).
func (s *Store) newCall(op, aux1, aux2, id string, charges []admit.Charge, g group, rec string) call {
	c := call{
		keys: make([]string, 0, len(g.keys)+1),
		args: make([]string, 7, 7+stride*len(g.idx)),
	}
	c.args[0], c.args[3], c.args[4], c.args[5], c.args[6] = op, aux1, aux2, id, itoa(int64(len(g.idx)))
	c.args[1], c.args[2] = s.nowArgs()
	c.keys = append(c.keys, g.keys...)
	for _, i := range g.idx {
		ch := &charges[i]
		a := argsOf(ch.Rule)
		n := len(c.args)
		c.args = append(c.args, a.fixed[:]...)
		c.args[n+1] = itoa(ch.Cost)
		if ch.LeaseTTL > 0 {
			c.args[n+3] = micros(min(ch.LeaseTTL, maxSpan))
		}
	}
	if rec != "" {
		c.keys = append(c.keys, rec)
	}
	return c
}

// nowArgs returns the clock arguments of a call: empty for Redis TIME, or
// the injected clock's microseconds and the nanoseconds beyond.
func (s *Store) nowArgs() (us, ns string) {
	if s.clock == nil {
		return "", ""
	}
	now := s.clock()
	u := now.UnixMicro()
	return itoa(u), itoa(now.UnixNano() - u*1000)
}

// do makes one call to Redis, f, through the breaker and with the timeout,
// and classifies its failure.
func (s *Store) do(ctx context.Context, f func(ctx context.Context, client rueidis.Client) error) error {
	if !s.breaker.allow(time.Now()) {
		return admit.Errorf(admit.CodeUnavailable, "redisstore: circuit breaker open after %d consecutive failures", s.breaker.threshold)
	}
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	s.calls.Add(1)
	client, err := s.client()
	if err == nil {
		err = f(ctx, client)
	}
	if err != nil {
		return s.fail(ctx, err)
	}
	s.breaker.success()
	return nil
}

// run makes a call of the library's function.
func (s *Store) run(ctx context.Context, c call) ([]int64, error) {
	var v []int64
	err := s.do(ctx, func(ctx context.Context, client rueidis.Client) (err error) {
		v, err = s.fcall(ctx, client, c)
		return err
	})
	return v, err
}

// fcall calls the library's function. A server without the library — a new
// deployment, a restart without persistence, a failover to a node that
// never had it — gets it loaded, on every node, and the call is made again.
func (s *Store) fcall(ctx context.Context, client rueidis.Client, c call) ([]int64, error) {
	loaded := false
	for {
		cmd := client.B().Fcall().Function(FunctionName).Numkeys(int64(len(c.keys))).Key(c.keys...).Arg(c.args...).Build()
		v, err := client.Do(ctx, cmd).AsIntSlice()
		if _, reply := rueidis.IsRedisErr(err); err != nil && !reply && s.cluster && ctx.Err() == nil {
			// The slot's master, as the client knows it, is not there:
			// after a failover, its replica may serve the slot already.
			if node := s.slotOwner(ctx, client, c.keys[0]); node != nil {
				nv, nerr := node.Do(ctx, node.B().Fcall().Function(FunctionName).Numkeys(int64(len(c.keys))).Key(c.keys...).Arg(c.args...).Build()).AsIntSlice()
				if re, ok := rueidis.IsRedisErr(nerr); !ok || !isRedirect(re) {
					// A redirect means the cluster's account was
					// already old: the first failure stands.
					v, err = nv, nerr
				}
			}
		}
		re, ok := rueidis.IsRedisErr(err)
		switch {
		case ok && !loaded && strings.Contains(re.Error(), "Function not found"):
			if err := s.LoadFunctions(ctx); err != nil {
				return nil, err
			}
			loaded = true
			continue
		case ok && re.IsTryAgain():
			// A slot being migrated holds some of the call's keys and
			// not the others: nothing ran. Redis asks to try again in
			// a moment; do, within the call's timeout.
			select {
			case <-ctx.Done():
				return nil, err
			case <-time.After(2 * time.Millisecond):
			}
			continue
		}
		return v, err
	}
}

// FunctionName is the library's function; a new library version that
// changes the arguments gets a new name, so that servers of two versions
// can share a deployment during an upgrade (the states they keep are the
// same). admit_v2 added batches (op "b"); admit_v3 the flag x, a
// decision another Cluster group refused.
const FunctionName = "admit_v3"

// LoadFunctions loads the decision engine library on every node (FUNCTION
// LOAD REPLACE). Replicas refuse writes and get it from their master. The
// store calls it by itself when Redis says the function is missing.
func (s *Store) LoadFunctions(ctx context.Context) error {
	client, err := s.client()
	if err != nil {
		return err
	}
	nodes := map[string]rueidis.Client{"redis": client}
	if s.cluster {
		nodes = client.Nodes()
	}
	loaded := 0
	var last error
	for _, c := range nodes {
		err := c.Do(ctx, c.B().FunctionLoad().Replace().FunctionCode(scriptSource).Build()).Error()
		if re, ok := rueidis.IsRedisErr(err); ok && strings.HasPrefix(re.Error(), "READONLY") {
			continue
		}
		if err != nil {
			last = err
			continue
		}
		loaded++
	}
	if loaded == 0 && last != nil {
		return last
	}
	return nil
}

// fail classifies err: Redis refusing the script is a bug (CodeInternal),
// anything else — a timeout, a lost connection, a cluster in failover —
// is the store being unavailable, which also counts against the breaker.
func (s *Store) fail(ctx context.Context, err error) error {
	if re, ok := rueidis.IsRedisErr(err); ok && !re.IsClusterDown() && !re.IsLoading() && !re.IsTryAgain() && !isTransient(re.Error()) {
		s.breaker.success() // Redis answered
		return admit.Errorf(admit.CodeInternal, "redisstore: script: %w", err)
	}
	if ctx.Err() != nil && errors.Is(err, context.Canceled) && !errors.Is(ctx.Err(), context.DeadlineExceeded) {
		// The caller gave up; that says nothing about Redis.
		return admit.Errorf(admit.CodeUnavailable, "redisstore: %w", err)
	}
	s.failures.Add(1)
	if s.breaker.failure(time.Now()) {
		go s.probe()
	}
	if admit.ErrorCode(err) == admit.CodeUnavailable {
		return err // the store's own: no connection yet
	}
	return admit.Errorf(admit.CodeUnavailable, "redisstore: %w", err)
}

// probe pings Redis while the breaker is open, every tenth of its cooldown,
// and closes the breaker at the first answer: decisions are Redis's again
// within moments of its return, not a cooldown later. One probe runs at a
// time; it stops when the breaker closes or the store does.
func (s *Store) probe() {
	if !s.probing.CompareAndSwap(false, true) {
		return
	}
	defer s.probing.Store(false)
	every := max(s.breaker.cooldown/10, 10*time.Millisecond)
	t := time.NewTicker(every)
	defer t.Stop()
	for s.breaker.openAt.Load() != 0 {
		select {
		case <-s.closed:
			return
		case <-t.C:
		}
		if s.Ping(context.Background()) == nil {
			s.breaker.success()
		}
	}
}

// isTransient reports Redis errors that say "not now" rather than "wrong":
// a master that is gone or read-only after a failover, a server at its
// maxmemory that takes no more writes.
func isTransient(msg string) bool {
	for _, p := range []string{"READONLY", "MASTERDOWN", "NOREPLICAS", "BUSY", "NOTBUSY", "OOM"} {
		if strings.HasPrefix(msg, p) {
			return true
		}
	}
	return false
}

func newID() string {
	var b [12]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails (Go 1.24+)
	return hex.EncodeToString(b[:])
}

// A lease or reservation ID is a random part, then the tag of every group
// that holds part of it: "<random>.<tag>[.<tag>]".
func joinID(id string, tags []string) string { return id + "." + strings.Join(tags, ".") }

func splitID(id string) (string, []string, bool) {
	parts := strings.Split(id, ".")
	if len(parts) < 2 || len(parts[0]) != 24 {
		return "", nil, false
	}
	for _, t := range parts[1:] {
		if t != "g" && len(t) != 16 {
			return "", nil, false
		}
	}
	return parts[0], parts[1:], true
}

func (s *Store) leaseKey(tag, id string) string { return s.prefix + "{" + tag + "}lease:" + id }
func (s *Store) resKey(tag, id string) string   { return s.prefix + "{" + tag + "}res:" + id }

// reply is one decision's part of the reply of a decide or undo call
// (admit.lua, reply): allowed, four values per charge (allowed + 2 × how,
// remaining, reset, retry) and the lease's expiry; with the call's now.
type reply struct {
	nu, nsub int64
	v        []int64
}

// callReply splits the reply of a call about one decision: now, then the
// decision's part.
func callReply(v []int64) reply {
	if len(v) < 2 {
		return reply{v: v} // fill reports the length
	}
	return reply{nu: v[0], nsub: v[1], v: v[2:]}
}

// groupReply is the decoded reply of a decide or undo call.
type groupReply struct {
	nu, nsub int64
	allowed  bool
	hows     []string
	lease    int64 // the lease's expiry in µs, or 0
}

// fill decodes reply rp into the results of g's charges.
func fill(rp reply, charges []admit.Charge, g group, d *admit.Decision, onlyRemaining bool) (groupReply, error) {
	v := rp.v
	if len(v) != 2+4*len(g.idx) {
		return groupReply{}, admit.Errorf(admit.CodeInternal, "redisstore: script replied %d values for %d charges", len(v), len(g.idx))
	}
	r := groupReply{nu: rp.nu, nsub: rp.nsub, allowed: v[0] == 1, lease: v[len(v)-1], hows: make([]string, len(g.idx))}
	for k, i := range g.idx {
		x := v[1+4*k:]
		res := &d.Results[i]
		if onlyRemaining {
			if res.Allowed && charges[i].Cost > 0 {
				res.Remaining, res.ResetAfter = x[1], time.Duration(x[2])
			}
			continue
		}
		rule := charges[i].Rule
		*res = admit.Result{
			Rule: rule.Name, Shadow: rule.Shadow, Limit: rule.Capacity(), Allowed: x[0]&1 == 1,
			Remaining: x[1], ResetAfter: time.Duration(x[2]), RetryAfter: time.Duration(x[3]),
		}
		r.hows[k] = itoa(x[0] >> 1)
	}
	return r, nil
}

func hasLeases(charges []admit.Charge, g group) bool {
	for _, i := range g.idx {
		if charges[i].Rule.Algorithm == admit.Concurrency && charges[i].Cost > 0 {
			return true
		}
	}
	return false
}

// Decide implements admit.Store.
func (s *Store) Decide(ctx context.Context, charges []admit.Charge, d *admit.Decision) error {
	d.Reset()
	ras, err := validate(charges, false)
	if err != nil {
		return err
	}
	dry := slices.ContainsFunc(charges, func(c admit.Charge) bool { return c.DryRun })
	if len(charges) == 0 {
		d.Allowed = true // nothing limits the request, as in memstore
		return nil
	}
	d.Results = slices.Grow(d.Results, len(charges))[:len(charges)]
	groups := s.groups(charges, s.cluster)
	leaseID := ""
	var leaseTags []string
	var done []groupDone
	refused := -1
	for gi, g := range groups {
		rec := ""
		if !dry && hasLeases(charges, g) {
			if leaseID == "" {
				leaseID = newID()
			}
			rec = s.leaseKey(g.tag, leaseID)
		}
		how := decideCharge
		if dry {
			how = decideDry
		}
		v, err := s.decideCall(g.tag, s.newJob(ctx, charges, ras, g, how, leaseID, rec))
		if err != nil {
			s.undo(charges, done, leaseID)
			return err
		}
		r, err := fill(v, charges, g, d, false)
		if err != nil {
			s.undo(charges, done, leaseID)
			return err
		}
		if r.lease > 0 {
			leaseTags = append(leaseTags, g.tag)
			d.Lease.ExpiresAt = later(d.Lease.ExpiresAt, time.UnixMicro(r.lease))
		}
		if !r.allowed && !dry {
			refused = gi
			break
		}
		done = append(done, groupDone{g: g, reply: r})
	}
	if refused >= 0 {
		d.Lease = admit.Lease{}
		if err := s.giveBack(ctx, charges, ras, d, groups, done, refused, leaseID); err != nil {
			return err
		}
	} else if len(leaseTags) > 0 {
		d.Lease.ID = joinID(leaseID, leaseTags)
	}
	d.Summarize()
	return nil
}

type groupDone struct {
	g     group
	reply groupReply
}

func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// giveBack finishes a Cluster decision that group refused after the groups
// in done were charged: they are given back and report what they hold, and
// the groups after the refusing one, never asked, report as the charges
// of a refused decision do, charging nothing.
func (s *Store) giveBack(ctx context.Context, charges []admit.Charge, ras []*ruleArgs, d *admit.Decision, groups []group, done []groupDone, refused int, leaseID string) error {
	for _, gd := range done {
		v, err := s.run(ctx, s.undoCall(charges, gd, leaseID))
		if err != nil {
			s.undoFailures.Add(1)
			return err
		}
		if _, err := fill(callReply(v), charges, gd.g, d, true); err != nil {
			return err
		}
	}
	for _, g := range groups[refused+1:] {
		v, err := s.decideCall(g.tag, s.newJob(ctx, charges, ras, g, decideRefused, "", ""))
		if err != nil {
			return err
		}
		if _, err := fill(v, charges, g, d, false); err != nil {
			return err
		}
	}
	return nil
}

func (s *Store) undoCall(charges []admit.Charge, gd groupDone, leaseID string) call {
	rec := ""
	if leaseID != "" && hasLeases(charges, gd.g) {
		rec = s.leaseKey(gd.g.tag, leaseID)
	}
	c := s.newCall("u", itoa(gd.reply.nu), itoa(gd.reply.nsub), leaseID, charges, gd.g, rec)
	for k := range gd.g.idx {
		c.args[7+stride*k+4] = gd.reply.hows[k]
	}
	return c
}

// undo gives back groups already charged when a decision fails half way.
// It runs on a context of its own: the caller's may be what expired.
func (s *Store) undo(charges []admit.Charge, done []groupDone, leaseID string) {
	if len(done) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), s.timeout)
	defer cancel()
	for _, gd := range done {
		if _, err := s.run(ctx, s.undoCall(charges, gd, leaseID)); err != nil {
			s.undoFailures.Add(1)
		}
	}
}

// Reserve implements admit.Store.
func (s *Store) Reserve(ctx context.Context, charges []admit.Charge, maxWait time.Duration) (admit.Reservation, error) {
	if _, err := validate(charges, true); err != nil {
		return admit.Reservation{}, err
	}
	if len(charges) == 0 {
		now := time.Now()
		if s.clock != nil {
			now = s.clock()
		}
		return admit.Reservation{ID: joinID(newID(), nil), OK: true, At: now}, nil
	}
	id := newID()
	var booked []string
	var res admit.Reservation
	for _, g := range s.groups(charges, s.cluster) {
		v, err := s.run(ctx, s.newCall("r", itoa(int64(maxWait)), "", id, charges, g, s.resKey(g.tag, id)))
		if err == nil && len(v) != 4 {
			err = admit.Errorf(admit.CodeInternal, "redisstore: reserve replied %d values", len(v))
		}
		if err != nil {
			s.cancelTags(id, booked)
			return admit.Reservation{}, err
		}
		now := time.UnixMicro(v[0]).Add(time.Duration(v[1]))
		if wait := time.Duration(v[3]); wait >= res.Wait {
			res.Wait, res.At = wait, now.Add(wait)
		}
		if v[2] != 1 {
			s.cancelTags(id, booked)
			return admit.Reservation{Wait: res.Wait, At: res.At}, nil
		}
		booked = append(booked, g.tag)
	}
	res.OK, res.ID = true, joinID(id, booked)
	return res, nil
}

func (s *Store) cancelTags(id string, tags []string) {
	if len(tags) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), s.timeout)
	defer cancel()
	for _, tag := range tags {
		_, _ = s.cancelOne(ctx, tag, id)
	}
}

// cancelOne cancels the part of reservation id held under tag. It reads
// the record's keys first, so that the script declares every key it
// touches, as Cluster requires.
func (s *Store) cancelOne(ctx context.Context, tag, id string) (bool, error) {
	rec := s.resKey(tag, id)
	fields, err := s.recordFields(ctx, rec)
	if err != nil {
		return false, err
	}
	keys := []string{rec}
	for _, f := range fields {
		if f != "at" {
			k, _, _ := strings.Cut(f, "\n")
			keys = append(keys, k)
		}
	}
	v, err := s.run(ctx, call{keys: keys, args: s.opArgs("c", id)})
	if err != nil {
		return false, err
	}
	return len(v) >= 3 && v[2] == 1, nil
}

func (s *Store) opArgs(op, id string) []string {
	us, ns := s.nowArgs()
	return []string{op, us, ns, "", "", id, "0"}
}

// recordFields returns the field names of a lease or reservation record.
func (s *Store) recordFields(ctx context.Context, rec string) ([]string, error) {
	var fields []string
	err := s.do(ctx, func(ctx context.Context, client rueidis.Client) (err error) {
		fields, err = client.Do(ctx, client.B().Hkeys().Key(rec).Build()).AsStrSlice()
		return err
	})
	return fields, err
}

// CancelReservation implements admit.Store.
func (s *Store) CancelReservation(ctx context.Context, id string) error {
	raw, tags, ok := splitID(id)
	if !ok {
		return admit.Errorf(admit.CodeNotFound, "reservation %q not found", id)
	}
	found := false
	for _, tag := range tags {
		f, err := s.cancelOne(ctx, tag, raw)
		if err != nil {
			return err
		}
		found = found || f
	}
	if !found {
		return admit.Errorf(admit.CodeNotFound, "reservation %q not found", id)
	}
	return nil
}

// RenewLease implements admit.Store.
func (s *Store) RenewLease(ctx context.Context, id string) (admit.Lease, error) {
	held, expiry, err := s.leaseOp(ctx, "n", id)
	if err != nil {
		return admit.Lease{}, err
	}
	if !held {
		return admit.Lease{}, admit.Errorf(admit.CodeNotFound, "lease %q not found or expired", id)
	}
	return admit.Lease{ID: id, ExpiresAt: time.UnixMicro(expiry)}, nil
}

// ReleaseLease implements admit.Store.
func (s *Store) ReleaseLease(ctx context.Context, id string) error {
	held, _, err := s.leaseOp(ctx, "l", id)
	if err != nil {
		return err
	}
	if !held {
		return admit.Errorf(admit.CodeNotFound, "lease %q not found or expired", id)
	}
	return nil
}

func (s *Store) leaseOp(ctx context.Context, op, id string) (bool, int64, error) {
	raw, tags, ok := splitID(id)
	if !ok {
		return false, 0, nil
	}
	held, expiry := false, int64(0)
	for _, tag := range tags {
		rec := s.leaseKey(tag, raw)
		fields, err := s.recordFields(ctx, rec)
		if err != nil {
			return false, 0, err
		}
		v, err := s.run(ctx, call{keys: append([]string{rec}, fields...), args: s.opArgs(op, raw)})
		if err != nil {
			return false, 0, err
		}
		if len(v) >= 4 && v[2] == 1 {
			held, expiry = true, max(expiry, v[3])
		}
	}
	return held, expiry, nil
}

// Reset implements admit.Store.
func (s *Store) Reset(ctx context.Context, charges []admit.Charge) error {
	for _, g := range s.groups(charges, s.cluster) { // a multi-key DEL stays within a slot
		err := s.do(ctx, func(ctx context.Context, client rueidis.Client) error {
			return client.Do(ctx, client.B().Del().Key(g.keys...).Build()).Error()
		})
		if err != nil {
			return err
		}
	}
	return nil
}

// String describes the store for logs.
func (s *Store) String() string {
	return fmt.Sprintf("redis (%s)", s.mode)
}

// Library returns the Lua source of the decision engine, a Redis Functions
// library, for tools such as redis-benchmark (FCALL admit_v3 …).
func Library() string { return scriptSource }

// Command returns the keys and arguments of the script call that deciding
// charges alone makes (in a single group, as outside Cluster), so that
// tools can replay a decision with FCALL. The charges must be valid and
// take no lease.
func (s *Store) Command(charges []admit.Charge) (keys, args []string) {
	ras, _ := validate(charges, false)
	return s.batchArgs([]*job{s.newJob(context.Background(), charges, ras, s.groups(charges, false)[0], decideCharge, "", "")})
}
