package link

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/rueidis"

	"github.com/admitdev/admit"
	"github.com/admitdev/admit/internal/engine"
	"github.com/admitdev/admit/internal/redishook"
)

// Link is the store's connection room: the client, dialed at once or
// lazily, the prefix of its keys, the bound of every call, the circuit
// breaker, the clock a test may set and the Cluster's own account of its
// masters. Every other room of the store — the exact path, leased,
// counted and region allowances — calls Redis through a link and never
// through the Store.
type Link struct {
	conn    atomic.Pointer[connection] // nil until a lazily dialed store connects
	Own     bool                       // Close closes the client
	Cluster bool
	Mode    string // for String: standalone, sentinel or cluster
	Prefix  string
	Timeout time.Duration
	Clock   func() time.Time
	Breaker Breaker
	// Library is the Functions library Redis loads, whose function every
	// call of Run calls; it is loaded again where Redis lacks it.
	Library string

	Calls, Failures atomic.Int64
	connMu          sync.Mutex    // orders a lazy connect with Close
	Closed          chan struct{} // closed by Close
	probing         atomic.Bool   // a probe of an open breaker runs
	views           clusterViews  // see cluster.go
	// evicts is the maxmemory-policy of a Redis that may evict keys, as
	// the last ping found it ("" when none may).
	Evicts atomic.Pointer[string]
}

// connection holds the store's client, so that a store dialed lazily can
// set it once, when it connects.
type connection struct{ client rueidis.Client }

// Close closes the client if the store opened it. The store calls it once.
func (l *Link) Close() {
	l.connMu.Lock()
	defer l.connMu.Unlock()
	close(l.Closed)
	if c := l.conn.Load(); c != nil && l.Own {
		c.client.Close()
	}
}

// Connect makes the client of a lazily dialed store, trying again until it
// succeeds or the store is closed.
func (l *Link) Connect(co rueidis.ClientOption) {
	wait := 100 * time.Millisecond
	for {
		client, err := rueidis.NewClient(co)
		if err == nil {
			l.connMu.Lock()
			defer l.connMu.Unlock()
			select {
			case <-l.Closed:
				client.Close()
			default:
				l.conn.Store(&connection{client})
			}
			return
		}
		select {
		case <-l.Closed:
			return
		case <-time.After(wait):
		}
		wait = min(2*wait, 500*time.Millisecond)
	}
}

// Client returns the store's Redis client, or CodeUnavailable while it has
// none yet.
func (l *Link) Client() (rueidis.Client, error) {
	if c := l.conn.Load(); c != nil {
		return c.client, nil
	}
	return nil, admit.Errorf(admit.CodeUnavailable, "redisstore: no connection to Redis %s yet", l.Mode)
}

// NowArgs returns the clock arguments of a call: empty for Redis TIME, or
// the injected clock's microseconds and the nanoseconds beyond.
func (l *Link) NowArgs() (us, ns string) {
	if l.Clock == nil {
		return "", ""
	}
	now := l.Clock()
	u := now.UnixMicro()
	return strconv.FormatInt(u, 10), strconv.FormatInt(now.UnixNano()-u*1000, 10)
}

// Do makes one call to Redis, f, through the breaker and with the timeout,
// and classifies its failure.
func (l *Link) Do(ctx context.Context, f func(ctx context.Context, client rueidis.Client) error) error {
	if !l.Breaker.allow(time.Now()) {
		return admit.Errorf(admit.CodeUnavailable, "redisstore: circuit breaker open after %d consecutive failures", l.Breaker.Threshold)
	}
	ctx, cancel := context.WithTimeout(ctx, l.Timeout)
	defer cancel()
	l.Calls.Add(1)
	client, err := l.Client()
	if err == nil {
		err = f(ctx, client)
	}
	if err != nil {
		return l.fail(ctx, err)
	}
	l.Breaker.success()
	return nil
}

// Run makes a call of the library's function.
func (l *Link) Run(ctx context.Context, c Call) ([]int64, error) {
	var v []int64
	err := l.Do(ctx, func(ctx context.Context, client rueidis.Client) (err error) {
		v, err = l.fcall(ctx, client, c)
		return err
	})
	return v, err
}

// fcall calls the library's function. A server without the library — a new
// deployment, a restart without persistence, a failover to a node that
// never had it — gets it loaded, on every node, and the call is made again.
func (l *Link) fcall(ctx context.Context, client rueidis.Client, c Call) ([]int64, error) {
	loaded := false
	for {
		cmd := client.B().Fcall().Function(functionName).Numkeys(int64(len(c.Keys))).Key(c.Keys...).Arg(c.Args...).Build()
		v, err := client.Do(ctx, cmd).AsIntSlice()
		if _, reply := rueidis.IsRedisErr(err); err != nil && !reply && l.Cluster && ctx.Err() == nil {
			// The slot's master, as the client knows it, is not there:
			// after a failover, its replica may serve the slot already.
			if node := l.slotOwner(ctx, client, c.Keys[0]); node != nil {
				nv, nerr := node.Do(ctx, node.B().Fcall().Function(functionName).Numkeys(int64(len(c.Keys))).Key(c.Keys...).Arg(c.Args...).Build()).AsIntSlice()
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
			if err := l.LoadFunctions(ctx); err != nil {
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

// LoadFunctions loads the decision engine library on every node (FUNCTION
// LOAD REPLACE). Replicas refuse writes and get it from their master. The
// store calls it by itself when Redis says the function is missing.
func (l *Link) LoadFunctions(ctx context.Context) error {
	client, err := l.Client()
	if err != nil {
		return err
	}
	nodes := map[string]rueidis.Client{"redis": client}
	if l.Cluster {
		nodes = client.Nodes()
	}
	loaded := 0
	var last error
	for _, c := range nodes {
		err := c.Do(ctx, c.B().FunctionLoad().Replace().FunctionCode(l.Library).Build()).Error()
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
func (l *Link) fail(ctx context.Context, err error) error {
	if re, ok := rueidis.IsRedisErr(err); ok && !re.IsClusterDown() && !re.IsLoading() && !re.IsTryAgain() && !isTransient(re.Error()) {
		l.Breaker.success() // Redis answered
		return admit.Errorf(admit.CodeInternal, "redisstore: script: %w", err)
	}
	if ctx.Err() != nil && errors.Is(err, context.Canceled) && !errors.Is(ctx.Err(), context.DeadlineExceeded) {
		// The caller gave up; that says nothing about Redis.
		return admit.Errorf(admit.CodeUnavailable, "redisstore: %w", err)
	}
	l.Failures.Add(1)
	if l.Breaker.failure(time.Now()) {
		go l.probe()
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
func (l *Link) probe() {
	if !l.probing.CompareAndSwap(false, true) {
		return
	}
	defer l.probing.Store(false)
	every := max(l.Breaker.Cooldown/10, 10*time.Millisecond)
	t := time.NewTicker(every)
	defer t.Stop()
	for l.Breaker.openAt.Load() != 0 {
		select {
		case <-l.Closed:
			return
		case <-t.C:
		}
		if l.Ping(context.Background()) == nil {
			l.Breaker.success()
		}
	}
}

// clusterView returns the cluster's account of its masters: the last one if it is
// fresh, else a new one from the first node that answers, or nil when none
// does.
func (l *Link) clusterView(ctx context.Context, nodes map[string]rueidis.Client) *clusterView {
	l.views.mu.Lock()
	defer l.views.mu.Unlock()
	if v := l.views.last; v != nil && time.Since(v.at) < clusterViewTTL {
		return v
	}
	for _, c := range nodes {
		text, err := c.Do(ctx, c.B().ClusterNodes().Build()).ToString()
		if err != nil {
			continue
		}
		v := parseClusterNodes(text)
		v.at = time.Now()
		l.views.last = v
		return v
	}
	return nil
}

// slotOwner returns a client of the node that serves key's slot now, as
// the cluster says, or nil if it cannot tell or does not know the node.
func (l *Link) slotOwner(ctx context.Context, client rueidis.Client, key string) rueidis.Client {
	nodes := client.Nodes()
	v := l.clusterView(ctx, nodes)
	if v == nil {
		return nil
	}
	return nodes[v.owner(keySlot(key))]
}

// Now is the store's clock, with a monotonic reading unless a test set
// one.
func (l *Link) Now() time.Time {
	if l.Clock != nil {
		return l.Clock()
	}
	return time.Now()
}

// Ping checks that Redis answers and takes writes (every master, in
// Cluster) within the timeout: a Redis at its maxmemory answers PING but
// refuses every decision's write, and is as good as down. In Cluster the
// masters are those the cluster itself says serve slots: after a failover
// the client may still know the failed master, which serves none and must
// not keep the store unready; while one is a master the client does not
// know yet, every known node is pinged. It does not go through the
// breaker, so readiness probes see the store's real state.
func (l *Link) Ping(ctx context.Context) error {
	client, err := l.Client()
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, l.Timeout)
	defer cancel()
	nodes := map[string]rueidis.Client{"redis": client}
	probes := map[string]string{"redis": l.Prefix + "ready"}
	if l.Cluster {
		nodes = client.Nodes()
		probes = map[string]string{}
		if v := l.clusterView(ctx, nodes); v != nil {
			masters := map[string]rueidis.Client{}
			for _, m := range v.masters {
				c, ok := nodes[m.addr]
				if !ok {
					masters = nil // one the client does not know yet: ping every node
					break
				}
				masters[m.addr] = c
				if tag, ok := tagIn(m.slots); ok {
					probes[m.addr] = l.Prefix + "ready{" + tag + "}"
				}
			}
			if len(masters) > 0 {
				nodes = masters
			}
		}
	}
	evicts := ""
	defer func() { l.Evicts.Store(&evicts) }()
	for addr, c := range nodes {
		if err := c.Do(ctx, c.B().Ping().Build()).Error(); err != nil {
			if RefusedCredentials(err) {
				// Waiting will not mend it: a configuration error.
				return admit.Errorf(admit.CodeInvalid, "redisstore: %s refused the credentials: %w", addr, err)
			}
			return admit.Errorf(admit.CodeUnavailable, "redisstore: ping %s: %w", addr, err)
		}
		if p := evictionPolicy(ctx, c); p != "" {
			evicts = p
		}
		if key, ok := probes[addr]; ok {
			// A write Redis refuses when it refuses writes (at its
			// maxmemory, a replica, too few replicas), which makes no key.
			if err := c.Do(ctx, c.B().Setrange().Key(key).Offset(0).Value("").Build()).Error(); err != nil {
				return admit.Errorf(admit.CodeUnavailable, "redisstore: %s does not take writes: %w", addr, err)
			}
		}
	}
	return nil
}

// evictionPolicy returns the maxmemory-policy of c's Redis when it may
// evict keys (a maxmemory, and a policy other than noeviction), else "":
// such a Redis forgets limits' states and idempotency keys under memory
// pressure, which resets limits.
func evictionPolicy(ctx context.Context, c rueidis.Client) string {
	info, err := c.Do(ctx, c.B().Info().Section("memory").Build()).ToString()
	if err != nil {
		return ""
	}
	var maxmemory int64
	policy := "noeviction"
	for _, line := range strings.Split(info, "\n") {
		k, v, _ := strings.Cut(strings.TrimSpace(line), ":")
		switch k {
		case "maxmemory":
			maxmemory, _ = strconv.ParseInt(v, 10, 64)
		case "maxmemory_policy":
			policy = v
		}
	}
	if maxmemory > 0 && policy != "noeviction" {
		return policy
	}
	return ""
}

// tagIn returns a hash tag whose Cluster slot is in one of slots.
func tagIn(slots [][2]int) (string, bool) {
	for i := range 1 << 17 {
		tag := strconv.Itoa(i)
		s := int(SlotOf(tag))
		for _, r := range slots {
			if r[0] <= s && s <= r[1] {
				return tag, true
			}
		}
	}
	return "", false
}

// SetClient makes client the link's, for a store made around a client of
// its caller's.
func (l *Link) SetClient(client rueidis.Client) { l.conn.Store(&connection{client}) }

// Key returns the Redis key of a charge's key under hash tag tag:
// Prefix + "{" + tag + "}" + key.
func (l *Link) Key(tag, key string) string { return l.Prefix + "{" + tag + "}" + key }

// Call is one call of the library's function: its keys and arguments.
type Call struct {
	Keys, Args []string
}

// functionName is the library's function; redishook.FunctionName says
// what each version changed.
const functionName = redishook.FunctionName

// isTransient reports Redis errors that say "not now" rather than "wrong":
// a master that is gone or read-only after a failover, a server at its
// maxmemory that takes no more writes.
func isTransient(msg string) bool {
	// WRONGPASS, NOAUTH and NOPERM: the ACL changed under a running
	// server; until it is mended, the store is as good as down, and the
	// rules' on_error decides.
	for _, p := range []string{"READONLY", "MASTERDOWN", "NOREPLICAS", "BUSY", "NOTBUSY", "OOM", "WRONGPASS", "NOAUTH", "NOPERM"} {
		if strings.HasPrefix(msg, p) {
			return true
		}
	}
	return false
}

// RefusedCredentials reports whether err is Redis refusing the username
// or password.
func RefusedCredentials(err error) bool {
	if re, ok := rueidis.IsRedisErr(err); ok {
		msg := re.Error()
		return strings.HasPrefix(msg, "WRONGPASS") || strings.HasPrefix(msg, "NOAUTH")
	}
	return false
}

// Tag returns the hash tag of a charge's key: its tenant's hash
// (engine.TenantHash, stable across processes and versions, as a tag must
// be; a collision only puts two tenants in one slot), "g" for keys without
// a tenant.
func Tag(c *admit.Charge) string {
	h, ok := engine.TenantHash(c)
	if !ok {
		return "g"
	}
	var b [16]byte
	const digits = "0123456789abcdef"
	for i := range b {
		b[15-i] = digits[h&15]
		h >>= 4
	}
	return string(b[:])
}
