package admit

import (
	"cmp"
	"context"
	"hash/maphash"
	"math/bits"
	"net/netip"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/admitdev/admit/internal/bounds"
	"github.com/admitdev/admit/internal/slots"
)

// Who is what a caller knows of a request: the scopes a Limit can be kept
// per. A field a limit of the Limiter is per must be set; the others are
// ignored.
type Who struct {
	Tenant, User, Action, IP string
}

// The scopes Limit.Per takes.
const (
	PerTenant = "tenant"
	PerUser   = "user"
	PerAction = "action"
	PerIP     = "ip"
)

// scope bits, in the order a key lists them.
const (
	perTenant uint8 = 1 << iota
	perUser
	perAction
	perIP
)

var scopeNames = [...]string{PerTenant, PerUser, PerAction, PerIP}

// Limit is one limit of a Limiter: a rule, and the scopes it is kept per.
// Make one with Bucket, GCRABucket, Window, Sliding, CalendarQuota or
// Concurrent; a Limit kept per no scope is one limit for everyone.
type Limit struct {
	rule Rule
	per  uint8
	v6   uint8 // IPv6 prefix bits an IP limit is kept per; 0: 64
	err  error
}

// Bucket is a token bucket: it holds up to burst tokens, refilled at rate r;
// a request of cost n is admitted when n tokens are there.
func Bucket(name string, r Rate, burst int64) Limit {
	return Limit{rule: Rule{Name: name, Algorithm: TokenBucket, Rate: r, Burst: burst}}
}

// GCRABucket decides as Bucket does, kept as GCRA keeps it: one theoretical
// arrival time per key.
func GCRABucket(name string, r Rate, burst int64) Limit {
	return Limit{rule: Rule{Name: name, Algorithm: GCRA, Rate: r, Burst: burst}}
}

// Window admits up to limit per window of the given length, windows aligned
// to the Unix epoch (a fixed window).
func Window(name string, limit int64, length time.Duration) Limit {
	return Limit{rule: Rule{Name: name, Algorithm: FixedWindow, Limit: limit, Window: length}}
}

// Sliding admits up to limit in any window of the given length, as the
// sliding window counter estimates it: the current window's count plus the
// previous one's, weighted by how much of it is still inside.
func Sliding(name string, limit int64, length time.Duration) Limit {
	return Limit{rule: Rule{Name: name, Algorithm: SlidingWindow, Limit: limit, Window: length}}
}

// CalendarQuota admits up to limit per calendar period (a day, week, month
// or year) in loc's time; nil means UTC.
func CalendarQuota(name string, limit int64, p Period, loc *time.Location) Limit {
	return Limit{rule: Rule{Name: name, Algorithm: Quota, Limit: limit, Period: p, Location: loc}}
}

// Concurrent admits up to max requests at once. An admitted Decision holds
// a lease on the slots it took, which Limiter.Release frees; a lease not
// released expires after 30 seconds.
func Concurrent(name string, max int64) Limit {
	return Limit{rule: Rule{Name: name, Algorithm: Concurrency, Max: max}}
}

// Per returns l kept per the given scopes (PerTenant, PerUser, PerAction,
// PerIP): one state per distinct value. Per(PerUser) keeps one per user ID
// whatever the tenant; Per(PerTenant, PerUser) one per user of each
// tenant.
func (l Limit) Per(scopes ...string) Limit {
	for _, s := range scopes {
		bit := uint8(0)
		for i, name := range scopeNames {
			if s == name {
				bit = 1 << i
			}
		}
		if bit == 0 {
			e := Errorf(CodeInvalid, "limit %q: Per(%q): want %q, %q, %q or %q", l.rule.Name, s, PerTenant, PerUser, PerAction, PerIP)
			e.Field = "per"
			l.err = e
			continue
		}
		l.per |= bit
	}
	return l
}

// IPv6Prefix returns l, when kept per IP, kept per IPv6 network of the
// given prefix length (1 to 128) rather than per /64, the default: one
// host of IPv6 usually holds a whole /64, so a client could otherwise
// take as many limits as it has addresses. IPv4 addresses are kept
// whole.
func (l Limit) IPv6Prefix(bits int) Limit {
	if bits < 1 || bits > 128 {
		e := Errorf(CodeInvalid, "limit %q: IPv6Prefix(%d): want 1 to 128", l.rule.Name, bits)
		e.Field = "ip"
		l.err = e
		return l
	}
	l.v6 = uint8(bits)
	return l
}

// FailOpen returns l admitting requests, uncounted, while its store
// cannot be reached (an error of CodeUnavailable), rather than failing
// the decision with that error, as limits do by default. A decision is
// admitted so only when every limit it charges fails open; the Decision
// then says FailedOpen.
func (l Limit) FailOpen() Limit {
	l.rule.OnError = FailOpen
	return l
}

// MaxDebt returns l, a Bucket or GCRABucket, owing at most n after debits
// (see Limiter.Debit) rather than one burst: what a debit takes beyond
// what it holds is owed, repaid at its rate, up to n; past n it is not
// counted. Set it to the most a debit may cost (tokens an LLM call may
// use) so that none goes uncounted.
func (l Limit) MaxDebt(n int64) Limit {
	l.rule.MaxDebt = n
	return l
}

// Leased returns l decided from allowances each server withdraws from a
// shared store in batches (Distribution Leased): far fewer calls to the
// store for a hot key, at the price of units held by one server being
// unavailable to the others for a moment. It changes nothing on a store of
// one process.
func (l Limit) Leased() Limit {
	l.rule.Distribution = Leased
	return l
}

// Shadow returns l decided and reported, never refusing: a limit being
// tried out.
func (l Limit) Shadow() Limit {
	l.rule.Shadow = true
	return l
}

// maxLimitName bounds a limit's name, which is part of every key of it.
const maxLimitName = 128

// keyPrefix starts every key a Limiter makes, so that its keys and those
// of policies or of callers of Store.Decide never meet in a store.
const keyPrefix = "per:"

// Limiter decides requests against its limits, all or nothing, in a Store:
// a request is admitted only if every limit admits it, and then every one
// is charged. Its limits never share state with each other. It is safe for
// concurrent use.
type Limiter struct {
	store  Store
	prefix string // keyPrefix, or a named Limiter's
	closed atomic.Bool
	rules  []*Rule
	pers   []uint8
	v6     []uint8 // per limit: the IPv6 prefix its IP is kept per
	debits bool    // some limit takes debits
	// reservable: every limit is a token bucket or GCRA, which WaitN
	// books its place in.
	reservable bool
	seed       maphash.Seed
	keys       []atomic.Pointer[cachedKey] // keyCacheSize per limit, a power of two in all
	// scratch holds Decisions whose buffers Allow, AllowN, Peek and Debit
	// decide into, so that they allocate nothing: the Decision they
	// return gets the summary alone, without Results.
	scratch sync.Pool
}

// keyCacheSize is how many recent keys a Limiter keeps per limit, with
// their hashes, so that deciding for a known Who makes no key: a fixed
// array (8,192 per limit, rounded up to a power of two in all), which a
// caller sending endless new names can only cycle through.
const keyCacheSize = 1 << 13

type cachedKey struct {
	who      whoKey
	key      string
	prepared slots.Key
}

// NewLimiter returns a Limiter deciding limits in s. It checks every limit
// now: a limit's parameters, its scopes, and that no two limits share a
// name (each name keeps its own state).
//
// A limit's state in s is found by its name and scopes: Limiters in other
// processes on the same shared store with a limit of the same name share
// its state, as servers of one service should. Within one process, a
// second Limiter on s with a limit of a name a live Limiter already keeps
// is an error, since the two would share that state unknowingly: give
// the limits names of their own, keep one Limiter, name the Limiters
// apart with NewNamedLimiter, or Close the first.
//
// A Limiter keeps the keys of the callers it saw last, 8,192 per limit
// (64 KiB of pointers per limit, and the keys themselves), so that a
// known caller's decision builds no key.
//
// The check knows a store by its value: two handles opened on one Redis,
// or a store and a wrapper around it, are two stores to it, and a store of
// a type that cannot be compared (a struct holding a slice) is not checked.
//
// A store that cannot decide every valid rule says so (its CheckRule): a
// limit it cannot decide is an error here, not at every request.
func NewLimiter(s Store, limits ...Limit) (*Limiter, error) {
	return newLimiter(s, "", limits)
}

// NewNamedLimiter is NewLimiter for a Limiter named name (letters,
// digits, '-', '_' and '.', at most 64 bytes), whose limits keep state
// apart from those of Limiters of other names, and of unnamed ones, on
// the same store: two parts of a program may each have a limit called
// "api".
func NewNamedLimiter(s Store, name string, limits ...Limit) (*Limiter, error) {
	if name == "" || len(name) > 64 || strings.IndexFunc(name, func(r rune) bool {
		return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_' || r == '.')
	}) >= 0 {
		e := Errorf(CodeInvalid, "admit.NewNamedLimiter: name %q: want 1 to 64 letters, digits, '-', '_' or '.'", name)
		e.Field = "name"
		return nil, e
	}
	return newLimiter(s, name, limits)
}

func newLimiter(s Store, name string, limits []Limit) (*Limiter, error) {
	if s == nil {
		return nil, Errorf(CodeInvalid, "admit.NewLimiter: the store is nil; use memstore.New(nil) for one process")
	}
	if v := reflect.ValueOf(s); v.Kind() == reflect.Pointer && v.IsNil() {
		// A store whose constructor failed, its error unread.
		return nil, Errorf(CodeInvalid, "admit.NewLimiter: the store is a nil %T; check the error of the call that made it", s)
	}
	if len(limits) == 0 {
		return nil, Errorf(CodeInvalid, "admit.NewLimiter: no limits; a Limiter with none would admit everything")
	}
	if len(limits) > bounds.MaxCharges {
		return nil, Errorf(CodeInvalid, "admit.NewLimiter: %d limits, at most %d", len(limits), bounds.MaxCharges)
	}
	l := &Limiter{store: s, seed: maphash.MakeSeed(), prefix: keyPrefix}
	if name != "" {
		l.prefix = "per@" + name + ":"
	}
	seen := make(map[string]bool, len(limits))
	for i := range limits {
		lim := &limits[i]
		if lim.err != nil {
			return nil, lim.err
		}
		name := lim.rule.Name
		switch {
		case name == "":
			e := Errorf(CodeInvalid, "limit %d has no name; the name keeps its state apart from the others'", i+1)
			e.Field = "name"
			return nil, e
		case len(name) > maxLimitName:
			e := Errorf(CodeInvalid, "limit %q: name of %d bytes, at most %d", name[:32]+"…", len(name), maxLimitName)
			e.Field = "name"
			return nil, e
		case seen[name]:
			e := Errorf(CodeInvalid, "two limits are named %q; limits never share state, so give each its own name", name)
			e.Field = "name"
			return nil, e
		}
		seen[name] = true
		r := lim.rule // a copy the Limiter owns
		if err := r.Validate(); err != nil {
			return nil, err
		}
		if rc, ok := s.(interface{ CheckRule(*Rule) error }); ok {
			if err := rc.CheckRule(&r); err != nil {
				return nil, err
			}
		}
		l.rules = append(l.rules, &r)
		l.pers = append(l.pers, lim.per)
		l.v6 = append(l.v6, cmp.Or(lim.v6, 64))
		l.debits = l.debits || takesDebits(r.Algorithm)
		l.reservable = (i == 0 || l.reservable) && (r.Algorithm == TokenBucket || r.Algorithm == GCRA)
	}
	// Each (Who, limit) pair takes an entry: the cache grows with the
	// limits, so that as many callers stay cached with eight as with one.
	l.keys = make([]atomic.Pointer[cachedKey], keyCacheSize<<bits.Len(uint(len(l.rules)-1)))
	if err := limiterNames.claim(l); err != nil {
		return nil, err
	}
	return l, nil
}

// Close ends l: the names of its limits may be kept by another Limiter on
// its store. Their state stays in the store. l decides nothing more
// (CodeInvalid); Close does not close the store.
func (l *Limiter) Close() error {
	if l.closed.CompareAndSwap(false, true) {
		limiterNames.release(l)
	}
	return nil
}

// limiterNames are the names of the limits live Limiters keep in each
// store of this process.
var limiterNames = nameRegistry{m: map[nameKey]*Limiter{}}

type nameRegistry struct {
	mu sync.Mutex
	m  map[nameKey]*Limiter
}

// nameKey is a limit's name in a store, under a Limiter's key prefix.
type nameKey struct {
	store        any
	prefix, name string
}

// comparableStore reports whether s can key a map: a store that cannot (a
// struct holding a slice, or holding an interface whose value does) is
// not checked for shared names.
func comparableStore(s Store) bool { return reflect.ValueOf(s).Comparable() }

func (r *nameRegistry) claim(l *Limiter) error {
	if !comparableStore(l.store) {
		return nil
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, rule := range l.rules {
		if _, taken := r.m[nameKey{l.store, l.prefix, rule.Name}]; taken {
			e := Errorf(CodeInvalid, "limit %q is kept by another Limiter on this store: the two would share its state; give the limit a name of its own, keep one Limiter, name the Limiters apart (NewNamedLimiter), or Close the other", rule.Name)
			e.Field = "name"
			return e
		}
	}
	for _, rule := range l.rules {
		r.m[nameKey{l.store, l.prefix, rule.Name}] = l
	}
	return nil
}

func (r *nameRegistry) release(l *Limiter) {
	if !comparableStore(l.store) {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, rule := range l.rules {
		if k := (nameKey{l.store, l.prefix, rule.Name}); r.m[k] == l {
			delete(r.m, k)
		}
	}
}

// Rules returns the rules of l's limits, in the order NewLimiter was given
// them, which is the order of a Decision's Results. They are l's: read
// them, never change them.
func (l *Limiter) Rules() []*Rule { return l.rules }

// Allow decides a request of cost 1 from w. The Decision says whether it
// was admitted and, from the limit closest to refusing (or the refusing
// one), what remains and when to retry; its Results are nil: Decide
// reports every limit.
func (l *Limiter) Allow(ctx context.Context, w Who) (d Decision, err error) {
	err = l.summary(ctx, w, 1, charging, &d)
	return d, err
}

// AllowN decides a request of cost n ≥ 1 from w, as Allow does.
func (l *Limiter) AllowN(ctx context.Context, w Who, n int64) (d Decision, err error) {
	if n < 1 {
		return Decision{}, costError("AllowN", n)
	}
	err = l.summary(ctx, w, n, charging, &d)
	return d, err
}

// Peek reports what Allow would decide for w now, charging nothing: a
// request of cost 1 (a dry run, see Charge.DryRun), admitted or refused
// as Allow would, with when to retry. Its Remaining is what Allow would
// leave: one less than the limit holds now when it would admit. Unlike
// Allow's, its Results say every limit's level (Decision.Result), the
// limits that would admit as well as the one that would refuse.
// Its Results are a new slice, the one allocation Peek makes.
func (l *Limiter) Peek(ctx context.Context, w Who) (d Decision, err error) {
	err = l.summary(ctx, w, 1, peeking, &d)
	return d, err
}

// Debit charges n ≥ 1, known only after the work (tokens an LLM call
// took, bytes sent), to every limit of l that takes debits — all but
// Concurrent ones — whether it fits or not: a limit goes into debt, and
// later requests are refused until it is repaid. A bucket owes at most
// its MaxDebt (one burst unless Limit.MaxDebt sets more): what a debit
// takes beyond it is not counted. A window's count may pass its limit by
// any amount, refusing until the window ends.
//
// The debit is applied whatever the Decision says: Allowed reports
// whether it fitted. When it did not, DeniedBy names the limit it put
// furthest into debt, which holds nothing (Remaining 0) until RetryAfter,
// when a request of cost 1 passes it again.
func (l *Limiter) Debit(ctx context.Context, w Who, n int64) (d Decision, err error) {
	if n < 1 {
		return Decision{}, costError("Debit", n)
	}
	if !l.debits {
		e := Errorf(CodeInvalid, "admit.Limiter.Debit: none of the limiter's limits takes debits (concurrency limits count requests in flight, not costs)")
		e.Field = "debit"
		return Decision{}, e
	}
	err = l.summary(ctx, w, n, debiting, &d)
	return d, err
}

// summary decides into a scratch Decision and writes its summary to out,
// without Results but for a peek, whose Results are a copy.
func (l *Limiter) summary(ctx context.Context, w Who, cost int64, how chargeHow, out *Decision) error {
	d, _ := l.scratch.Get().(*Decision)
	if d == nil {
		d = new(Decision)
	}
	err := l.decide(ctx, w, cost, how, d)
	if how == debiting && err == nil {
		// Whether it fitted, from the debit that did not fit worst.
		for i := range d.Results {
			r := &d.Results[i]
			if !r.Allowed && !r.Shadow && (d.Allowed || r.RetryAfter > d.RetryAfter) {
				d.Allowed, d.DeniedBy, d.Limit, d.Remaining, d.ResetAfter, d.RetryAfter = false, r.Rule, r.Limit, r.Remaining, r.ResetAfter, r.RetryAfter
			}
		}
	}
	// The summary alone: the buffers stay with d, and the next decision
	// into d resets the rest.
	out.Allowed, out.Limit, out.Remaining, out.ResetAfter, out.RetryAfter, out.DeniedBy = d.Allowed, d.Limit, d.Remaining, d.ResetAfter, d.RetryAfter, d.DeniedBy
	out.Lease, out.At, out.FailedOpen = d.Lease, d.At, d.FailedOpen
	if how == peeking && err == nil {
		out.Results = slices.Clone(d.Results)
	}
	l.scratch.Put(d)
	return err
}

// Decide is AllowN writing its decision into d, whose Results it reuses:
// a caller that keeps d makes no allocation per decision on the memory
// store.
func (l *Limiter) Decide(ctx context.Context, w Who, n int64, d *Decision) error {
	if d == nil {
		return nilArgument("Decide", "d", "the *Decision to write into")
	}
	if n < 1 {
		d.Reset()
		return costError("AllowN", n)
	}
	return l.decide(ctx, w, n, charging, d)
}

// Release frees the concurrency slots an admitted decision holds, if any.
func (l *Limiter) Release(ctx context.Context, d *Decision) error {
	if d == nil {
		return nilArgument("Release", "d", "the admitted *Decision")
	}
	if d.Lease.ID == "" {
		return nil
	}
	err := l.store.ReleaseLease(ctx, d.Lease.ID)
	d.Lease = Lease{}
	return err
}

// nilArgument is the error of a nil argument name to Limiter's method.
func nilArgument(method, name, want string) error {
	e := Errorf(CodeInvalid, "admit.Limiter.%s: %s is nil; want %s", method, name, want)
	e.Field = name
	return e
}

func costError(method string, n int64) error {
	e := Errorf(CodeInvalid, "admit.Limiter.%s: cost %d; want 1 or more (Peek charges nothing)", method, n)
	e.Field = "cost"
	return e
}

// chargeHow is how a decision charges its limits.
type chargeHow uint8

const (
	charging chargeHow = iota // admitted or refused, all or nothing
	debiting                  // charged whether it fits or not (Debit)
	peeking                   // decided and reported, nothing charged (Peek)
)

func (l *Limiter) decide(ctx context.Context, w Who, cost int64, how chargeHow, d *Decision) error {
	if l.closed.Load() {
		d.Reset()
		return Errorf(CodeInvalid, "admit.Limiter: closed")
	}
	// The charges and the key's bytes live in d, which a caller reuses,
	// so that a decision allocates nothing once d has them: the charges
	// escape to the heap, passed to a Store.
	if cap(d.charges) < len(l.rules) {
		d.charges = make([]Charge, len(l.rules))
	}
	charges := d.charges[:len(l.rules)]
	n := 0
	for i, r := range l.rules {
		if how == debiting && !takesDebits(r.Algorithm) {
			continue
		}
		c := &charges[n]
		if err := l.charge(c, d, i, &w); err != nil {
			d.Reset()
			return err
		}
		c.Rule, c.Cost, c.Debit, c.DryRun = r, cost, how == debiting, how == peeking
		n++
	}
	err := l.store.Decide(ctx, charges[:n], d)
	if err == nil {
		d.keyed = n
	}
	if err != nil && ErrorCode(err) == CodeUnavailable && failsOpen(charges[:n]) {
		// Admitted without the store: each limit reports its whole
		// capacity, since nothing is known of its level, and the decision
		// the smallest of the non-shadow limits'.
		d.Reset()
		d.Allowed, d.FailedOpen = true, true
		best := -1
		for _, c := range charges[:n] {
			capacity := c.Rule.Capacity()
			d.Results = append(d.Results, Result{Rule: c.Rule.Name, Allowed: true, Shadow: c.Rule.Shadow, Debit: c.Debit, Limit: capacity, Remaining: capacity})
			if !c.Rule.Shadow && (best < 0 || capacity < d.Results[best].Remaining) {
				best = len(d.Results) - 1
			}
		}
		if best >= 0 {
			d.Limit, d.Remaining = d.Results[best].Limit, d.Results[best].Remaining
		}
		d.keyed = n
		return nil
	}
	return err
}

// failsOpen reports whether every charge's rule fails open.
func failsOpen(charges []Charge) bool {
	for _, c := range charges {
		if c.Rule.OnError != FailOpen {
			return false
		}
	}
	return len(charges) > 0
}

// charge sets c's key (and its prepared hashes) for limit i and w, from the
// cache when w was seen lately.
func (l *Limiter) charge(c *Charge, d *Decision, i int, w *Who) error {
	per, r := l.pers[i], l.rules[i]
	// The Who's fields this limit is per, and nothing else: what its key
	// is made of, and what the cache is looked up by, so that a decision
	// for a known Who builds no key at all.
	k := whoKey{limit: i}
	if per&perTenant != 0 {
		k.tenant = w.Tenant
		if err := whoField(r, "tenant", k.tenant); err != nil {
			return err
		}
	}
	if per&perUser != 0 {
		k.user = w.User
		if err := whoField(r, "user", k.user); err != nil {
			return err
		}
	}
	if per&perAction != 0 {
		k.action = w.Action
		if err := whoField(r, "action", k.action); err != nil {
			return err
		}
	}
	if per&perIP != 0 {
		k.ip = w.IP
		if err := whoField(r, "ip", k.ip); err != nil {
			return err
		}
	}
	h := l.hashWho(&k)
	// A key may sit in any of the 8 slots of its set (a cache line of
	// pointers): a thousand callers in 1,024 sets of eight overflow one
	// with a chance near one in a thousand per Limiter, where sets of
	// four overflowed in about a quarter of them, a caller there
	// building its key every time.
	set := l.keys[h&uint64(len(l.keys)-1)&^7:][:8]
	for j := range set {
		if e := set[j].Load(); e != nil && e.who == k {
			c.Key, c.Prepared = e.key, e.prepared
			return nil
		}
	}
	if per&perIP != 0 {
		// The cache holds the IP as the caller spelled it; the key, the
		// address it names.
		ip, err := normalIP(r, k.ip, int(l.v6[i]))
		if err != nil {
			return err
		}
		built := k
		built.ip = ip
		d.key = l.appendKey(d.key[:0], per, &built, r.Name)
	} else {
		d.key = l.appendKey(d.key[:0], per, &k, r.Name)
	}
	key := string(d.key)
	e := &cachedKey{who: k, key: key}
	e.prepared = slots.Of(key, k.tenant)
	victim := &set[(h>>32)&7]
	for j := range set {
		if set[j].Load() == nil {
			victim = &set[j]
			break
		}
	}
	victim.Store(e)
	c.Key, c.Prepared = e.key, e.prepared
	return nil
}

// hashWho hashes k for the key cache: the fields a limit is per, each
// hashed alone and mixed in (hashing the struct whole costs more, its
// empty fields included).
func (l *Limiter) hashWho(k *whoKey) uint64 {
	h := uint64(k.limit+1) * 0x9e3779b97f4a7c15
	if k.tenant != "" {
		h = l.mix(h, k.tenant)
	}
	if k.user != "" {
		h = l.mix(h, k.user)
	}
	if k.action != "" {
		h = l.mix(h, k.action)
	}
	if k.ip != "" {
		h = l.mix(h, k.ip)
	}
	return h
}

// mix mixes the hash of field f into h.
func (l *Limiter) mix(h uint64, f string) uint64 {
	h = (h ^ maphash.String(l.seed, f)) * 0xff51afd7ed558ccd
	return h ^ h>>33
}

// whoKey is what a charge of limit number limit is keyed by: the fields of
// a Who the limit is per, the others empty.
type whoKey struct {
	limit                    int
	tenant, user, action, ip string
}

// appendKey appends the key of a limit kept per the scopes per: a Key
// (see Key.String) whose Scope is l's prefix and the scopes, joined by
// "+".
func (l *Limiter) appendKey(b []byte, per uint8, k *whoKey, name string) []byte {
	scope, n := len(l.prefix), 0
	for i, s := range scopeNames {
		if per&(1<<i) != 0 {
			scope += len(s)
			n++
		}
	}
	if n > 1 {
		scope += n - 1
	}
	b = strconv.AppendInt(b, int64(scope), 10)
	b = append(b, ':')
	b = append(b, l.prefix...)
	n = 0
	for i, s := range scopeNames {
		if per&(1<<i) != 0 {
			if n > 0 {
				b = append(b, '+')
			}
			b = append(b, s...)
			n++
		}
	}
	b = appendField(b, k.tenant)
	if per&(perUser|perIP) == perUser|perIP {
		// Both in the subject, each length-prefixed, so that no user and
		// IP pair reads as another.
		size := digits(len(k.user)) + 1 + len(k.user) + digits(len(k.ip)) + 1 + len(k.ip)
		b = strconv.AppendInt(b, int64(size), 10)
		b = append(b, ':')
		b = appendField(b, k.user)
		b = appendField(b, k.ip)
	} else {
		b = appendField(b, k.user+k.ip) // one of them, or neither
	}
	b = appendField(b, k.action)
	return appendField(b, name)
}

// digits returns how many decimal digits n ≥ 0 has.
func digits(n int) int {
	d := 1
	for n >= 10 {
		n /= 10
		d++
	}
	return d
}

func appendField(b []byte, f string) []byte {
	b = strconv.AppendInt(b, int64(len(f)), 10)
	b = append(b, ':')
	return append(b, f...)
}

// whoField reports a scope value that a limit of rule r needs and w lacks,
// or that is too long to be a key.
// normalIP returns the address s names, as limit r keeps it: an IPv4
// address whole (also written IPv4-mapped, ::ffff:198.51.100.7), an IPv6
// address as its network of v6 bits. s may carry a port (host:port,
// [v6]:port, as http.Request.RemoteAddr has it), which is dropped, and an
// IPv6 zone, also dropped. Anything else is an error.
func normalIP(r *Rule, s string, v6 int) (string, error) {
	a, err := netip.ParseAddr(s)
	if err != nil {
		ap, perr := netip.ParseAddrPort(s)
		if perr != nil {
			e := Errorf(CodeInvalid, "limit %q is per IP and the request's IP %q is not an IP address (nor host:port)", r.Name, s)
			e.Field = "ip"
			return "", e
		}
		a = ap.Addr()
	}
	a = a.Unmap().WithZone("")
	if a.Is6() && v6 < 128 {
		p, _ := a.Prefix(v6)
		return p.String(), nil
	}
	return a.String(), nil
}

func whoField(r *Rule, field, v string) error {
	switch {
	case v == "":
		e := Errorf(CodeInvalid, "limit %q is per %s and the request's Who has no %s", r.Name, field, field)
		e.Field = field
		return e
	case len(v) > bounds.MaxWhoLen:
		e := Errorf(CodeInvalid, "the request's %s is %d bytes long, at most %d", field, len(v), bounds.MaxWhoLen)
		e.Field = field
		return e
	}
	return nil
}
