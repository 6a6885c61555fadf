package policy

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/admitdev/admit"
	"github.com/admitdev/admit/internal/bounds"
)

// The scopes of a ban: what identifies the requests it refuses.
const (
	BanIP     = "ip"      // a client address, or a network (203.0.113.0/24)
	BanAPIKey = "api_key" // an API key, kept as its SHA-256
	BanUser   = "user"    // a user of a tenant
	BanTenant = "tenant"  // every request of a tenant
)

// MaxBans bounds the bans in force at once, and MaxBanHistory the
// identifiers whose past bans escalation rules remember: past them an
// escalation bans no one more (counted) and an operator's ban is refused,
// so that a flood of identifiers costs bounded memory on every server.
const (
	MaxBans       = 10_000
	MaxBanHistory = 10_000
)

// MaxEscalatedBans bounds the bans escalation rules may have in force: the
// rest of MaxBans is the operators', so that a flood of escalated
// identifiers never leaves an operator unable to ban. MaxEscalatedPerTenant
// bounds those of one tenant's users, so that one tenant inventing users
// cannot take them all.
// Past MaxEscalatedBans, an escalation's new ban replaces the one of
// theirs that would end soonest, so that a flood of identifiers cannot
// stop escalation for everyone. MaxEscalatedPerNetwork bounds those of
// one network's addresses (an IPv4 /16, an IPv6 /32), so that one network
// cannot take them all either.
const (
	MaxEscalatedBans       = MaxBans - 1_000
	MaxEscalatedPerTenant  = 1_000
	MaxEscalatedPerNetwork = 1_000
)

// MaxBanTTL bounds how long one ban lasts.
const MaxBanTTL = 365 * 24 * time.Hour

// A Ban refuses every request of one identifier, on every front end, until
// it expires.
type Ban struct {
	ID    string `json:"id"`
	Scope string `json:"scope"`
	// Value is the identifier: a canonical address or network for ip
	// (an IPv6 address stands for its /64, as its buckets do), the
	// key's hash as "sha256:" and 64 hex digits for api_key, the user
	// for user (of Tenant), the tenant's id for tenant.
	Value  string `json:"value"`
	Tenant string `json:"tenant,omitempty"`
	Reason string `json:"reason,omitempty"`
	// Source is "admin" for a ban set through the admin API, or
	// "escalation:" and the escalation rule's name.
	Source string `json:"source"`
	// Strike is, for an escalation's ban, which ban of its identifier
	// this is (from 1): its length doubled Strike-1 times.
	Strike  int       `json:"strike,omitempty"`
	Created time.Time `json:"created_at"`
	Expires time.Time `json:"expires_at"`
}

// NormalizeBan checks b's scope, value and tenant, and writes its value in
// the one spelling requests are matched in: an address made canonical, a
// network masked (an IPv6 one no longer than /64), an API key hashed.
// Errors are admit.CodeInvalid, with the field they are about.
func NormalizeBan(b *Ban) error {
	bad := func(field, format string, args ...any) error {
		e := admit.Errorf(admit.CodeInvalid, format, args...)
		e.Field = field
		return e
	}
	if b.Value == "" {
		return bad("value", "a ban needs a value: the address, key, user or tenant it refuses")
	}
	if len(b.Value) > bounds.MaxValueLen || len(b.Tenant) > bounds.MaxValueLen {
		return bad("value", "values are at most %d bytes", bounds.MaxValueLen)
	}
	if len(b.Reason) > 512 {
		return bad("reason", "a reason is at most 512 bytes")
	}
	if b.Scope != BanUser && b.Tenant != "" {
		return bad("tenant", "only a user's ban names a tenant")
	}
	switch b.Scope {
	case BanIP:
		if strings.Contains(b.Value, "/") {
			p, err := netip.ParsePrefix(b.Value)
			if err != nil {
				return bad("value", "%.64q is not a network like 203.0.113.0/24", b.Value)
			}
			a := p.Addr().Unmap()
			bits := p.Bits()
			if p.Addr().Is4In6() {
				bits -= 96
			}
			if a.Is4() && bits < 8 || a.Is6() && bits < 16 {
				return bad("value", "%s is wider than a ban may be (/8 for IPv4, /16 for IPv6)", b.Value)
			}
			if a.Is6() {
				bits = min(bits, 64) // an IPv6 client is its /64
			}
			q, _ := a.Prefix(bits)
			if q.Bits() == a.BitLen() || a.Is6() && q.Bits() == 64 {
				v, _ := CanonicalIP(q.Addr().String())
				b.Value = v
				return nil
			}
			b.Value = q.String()
			return nil
		}
		v, err := CanonicalIP(b.Value)
		if err != nil {
			return bad("value", "%.64q is not an IP address or network", b.Value)
		}
		b.Value = v
	case BanAPIKey:
		if h, ok := strings.CutPrefix(b.Value, "sha256:"); ok {
			if len(h) != 64 || strings.Trim(strings.ToLower(h), "0123456789abcdef") != "" {
				return bad("value", "sha256: takes the key's hash, 64 hex digits")
			}
			b.Value = "sha256:" + strings.ToLower(h)
		} else {
			b.Value = "sha256:" + HashKey(b.Value)
		}
	case BanUser:
		if b.Tenant == "" {
			return bad("tenant", "a user's ban names the user's tenant")
		}
		if err := CheckName(b.Tenant); err != nil {
			return bad("tenant", "%.64q: %v", b.Tenant, err)
		}
	case BanTenant:
		if err := CheckName(b.Value); err != nil {
			return bad("value", "%.64q is no tenant id: %v", b.Value, err)
		}
	default:
		return bad("scope", "%.32q: want ip, api_key, user or tenant", b.Scope)
	}
	return nil
}

// identity is what a resolution's bans are matched against: the
// request's tenant, user, client address and API key.
type identity struct {
	tenant, user, ip, apiKey string
	// client is the address the request came from as the front end saw
	// it (Request.Client), which a ban of its address refuses too: a
	// caller that names no ip, or another one, is still the client.
	client  string
	keyHash string // the key's hash, once made
	auth    *authenticated
	// untrusted says a caller Admit does not trust named the values
	// (Request.Untrusted); unvouched that nothing vouches for the tenant
	// (neither a trusted caller nor one of its keys); keyed that the
	// request presented a key a tenant holds.
	untrusted, unvouched, keyed bool
}

// keyHex returns the hash of id's API key, "" without one.
func (id *identity) keyHex() string {
	switch {
	case id.apiKey == "":
		return ""
	case id.keyHash != "":
	case id.auth != nil && id.auth.hashed:
		id.keyHash = string(id.auth.hash[:])
	default:
		id.keyHash = HashKey(id.apiKey)
	}
	return id.keyHash
}

// banEntry is a ban in force, with the rule its refusals are reported
// under (named "ban:" and its id, so that every front end names it).
type banEntry struct {
	Ban
	rule *Rule
}

// banSet is the bans in force, indexed for matching. It is immutable.
type banSet struct {
	all      []*banEntry // by id
	ips      map[string]*banEntry
	nets     []netBans // longest first
	keys     map[string]*banEntry
	users    map[userKey]*banEntry
	tenants  map[string]*banEntry
	earliest time.Time // the first expiry
	// escalated counts the escalations' bans per group: a tenant's users
	// (by the tenant's id), a network's addresses (networkOf).
	escalated map[string]int
}

// userKey names a user of a tenant.
type userKey struct{ tenant, user string }

type netBans struct {
	bits int
	v6   bool
	bans map[netip.Prefix]*banEntry
}

func newBanSet(bans []Ban, now time.Time) *banSet {
	s := &banSet{ips: map[string]*banEntry{}, keys: map[string]*banEntry{}, users: map[userKey]*banEntry{}, tenants: map[string]*banEntry{}}
	for _, b := range bans {
		if !b.Expires.After(now) {
			continue
		}
		e := &banEntry{Ban: b, rule: banRule(b)}
		s.all = append(s.all, e)
		if g := escalationGroup(b); g != "" {
			if s.escalated == nil {
				s.escalated = map[string]int{}
			}
			s.escalated[g]++
		}
		if s.earliest.IsZero() || b.Expires.Before(s.earliest) {
			s.earliest = b.Expires
		}
		switch b.Scope {
		case BanIP:
			if !strings.Contains(b.Value, "/") {
				putLongest(s.ips, b.Value, e)
				continue
			}
			p, err := netip.ParsePrefix(b.Value)
			if err != nil {
				continue
			}
			i := slices.IndexFunc(s.nets, func(n netBans) bool { return n.bits == p.Bits() && n.v6 == p.Addr().Is6() })
			if i < 0 {
				s.nets = append(s.nets, netBans{bits: p.Bits(), v6: p.Addr().Is6(), bans: map[netip.Prefix]*banEntry{}})
				i = len(s.nets) - 1
			}
			if old := s.nets[i].bans[p]; old == nil || old.Expires.Before(e.Expires) {
				s.nets[i].bans[p] = e
			}
		case BanAPIKey:
			putLongest(s.keys, strings.TrimPrefix(b.Value, "sha256:"), e)
		case BanUser:
			putLongest(s.users, userKey{b.Tenant, b.Value}, e)
		case BanTenant:
			putLongest(s.tenants, b.Value, e)
		}
	}
	slices.SortFunc(s.all, func(a, b *banEntry) int { return strings.Compare(a.ID, b.ID) })
	slices.SortFunc(s.nets, func(a, b netBans) int { return b.bits - a.bits })
	return s
}

// escalationGroup names the group an escalation's ban counts in against
// its bound: its tenant's users, or its address's network; "" for an
// operator's ban, or one of no group (a tenant's own, an API key's).
func escalationGroup(b Ban) string {
	if !strings.HasPrefix(b.Source, "escalation:") {
		return ""
	}
	switch {
	case b.Scope == BanUser:
		return "tenant " + b.Tenant
	case b.Scope == BanIP:
		return networkOf(b.Value)
	}
	return ""
}

// networkOf names the network of a canonical address for the escalations'
// bound: its IPv4 /16, its IPv6 /32 (an ISP's allocation: a /48 is a
// site's, of which one holder may have thousands).
func networkOf(ip string) string {
	a, err := netip.ParseAddr(strings.TrimSuffix(ip, "/64"))
	if err != nil {
		return ""
	}
	bits := 16
	if a.Is6() {
		bits = 32
	}
	p, _ := a.Prefix(bits)
	return "net " + p.String()
}

// putLongest indexes e under k, unless a ban that lasts longer is there:
// of overlapping bans, the longest decides.
func putLongest[K comparable](m map[K]*banEntry, k K, e *banEntry) {
	if old := m[k]; old == nil || old.Expires.Before(e.Expires) {
		m[k] = e
	}
}

// banRule is the rule a ban's refusals are reported under.
func banRule(b Ban) *Rule {
	r := &Rule{Scope: b.Scope}
	r.Name = "ban:" + b.ID
	r.Algorithm = admit.FixedWindow
	r.Window = max(b.Expires.Sub(b.Created), time.Second)
	return r
}

// match returns the ban in force over id at now, nil if none.
func (s *banSet) match(id *identity, now time.Time) *banEntry {
	found := func(e *banEntry) bool { return e != nil && e.Expires.After(now) }
	if id.tenant != "" && len(s.tenants) > 0 {
		if e := s.tenants[id.tenant]; found(e) {
			return e
		}
	}
	if id.user != "" && id.tenant != "" && len(s.users) > 0 {
		if e := s.users[userKey{id.tenant, id.user}]; found(e) {
			return e
		}
	}
	if id.apiKey != "" && len(s.keys) > 0 {
		if e := s.keys[id.keyHex()]; found(e) {
			return e
		}
	}
	if len(s.ips) == 0 && len(s.nets) == 0 {
		return nil
	}
	if e := s.matchAddr(id.ip, now); e != nil {
		return e
	}
	if id.client != "" && id.client != id.ip {
		if c, err := CanonicalIP(id.client); err == nil && c != id.ip {
			return s.matchAddr(c, now)
		}
	}
	return nil
}

// matchAddr returns the ban in force over a canonical address, nil if
// none.
func (s *banSet) matchAddr(ip string, now time.Time) *banEntry {
	found := func(e *banEntry) bool { return e != nil && e.Expires.After(now) }
	if ip == "" {
		return nil
	}
	if e := s.ips[ip]; found(e) {
		return e
	}
	if len(s.nets) == 0 {
		return nil
	}
	a, err := netip.ParseAddr(strings.TrimSuffix(ip, "/64"))
	if err != nil {
		return nil
	}
	for _, n := range s.nets {
		if n.v6 != a.Is6() {
			continue
		}
		p, err := a.Prefix(n.bits)
		if err == nil {
			if e := n.bans[p]; found(e) {
				return e
			}
		}
	}
	return nil
}

func (s *banSet) empty() bool { return len(s.all) == 0 }

// BanState is what a BanStore holds: the bans, and per identifier how many
// times an escalation rule banned it and when its last ban ended.
type BanState struct {
	Bans    []Ban                 `json:"bans"`
	History map[string]BanStrikes `json:"history,omitempty"`
	// Lost says a shared store lost what it held since it was last
	// changed (a Redis that came back empty): the servers put back the
	// bans they hold.
	Lost bool `json:"-"`
}

// BanStrikes is an identifier's past bans by one escalation rule.
type BanStrikes struct {
	Strikes int       `json:"strikes"`
	Until   time.Time `json:"until"`     // when the last one ended (or ends)
	Forget  time.Time `json:"forget_at"` // when they are forgotten
}

// ErrBansFull is the error (admit.CodeConflict) a BanStore's Add and
// Escalate wrap when MaxBans bans are in force.
var ErrBansFull error = admit.Errorf(admit.CodeConflict, "the most bans there may be are in force")

// An Escalated is a ban an escalation rule makes: the ban for Key (the
// rule and the identifier) whose length is Base doubled once per earlier
// ban of Key remembered, at most Max. An earlier ban is forgotten Forget
// after it ended.
type Escalated struct {
	Key               string
	Ban               Ban // without Strike and Expires
	Base, Max, Forget time.Duration
	// Evicted, if set, is told of the escalation's ban the new one
	// replaced (past MaxEscalatedBans), by id.
	Evicted func(id string)
}

// BanStore keeps bans and their history across restarts, shared by every
// server that uses it.
type BanStore interface {
	// Load returns the bans in force at now and the history.
	Load(ctx context.Context, now time.Time) (*BanState, error)
	// Add saves b unless a ban of its id is in force at now, which it
	// returns instead (and false). Past MaxBans in force it fails with an
	// error wrapping ErrBansFull.
	Add(ctx context.Context, b Ban, now time.Time) (Ban, bool, error)
	// Escalate saves e's ban at now, unless a ban of its id is in force
	// (returned, with false), and counts it in e.Key's history. Past
	// MaxEscalatedBans escalations' bans in force the new ban replaces
	// the one of theirs that would end soonest; past MaxBans bans in all
	// it fails with an error wrapping ErrBansFull.
	Escalate(ctx context.Context, e Escalated, now time.Time) (Ban, bool, error)
	// Remove deletes the ban of id, reporting whether one was in force.
	Remove(ctx context.Context, id string, now time.Time) (bool, error)
	// Watch calls changed when another server changes the bans, until
	// ctx ends, and again while it fails; a store of one server returns
	// at once.
	Watch(ctx context.Context, changed func() error)
}

// Bans are the bans a Decider enforces, loaded from a BanStore and kept
// current: a ban added on any server of the store is in force on this one
// once Watch tells of it (within a second with Redis), and refuses with no
// store call.
//
// Bans are safe for concurrent use. Create them with NewBans, and Start
// them before use.
type Bans struct {
	store BanStore
	set   atomic.Pointer[banSet]
	// history is the store's, as last loaded: the dashboard and the
	// admin API read it, escalation asks the store.
	history  atomic.Pointer[map[string]BanStrikes]
	reloadMu sync.Mutex
	// lifted remembers the bans this server lifted, by id, with when,
	// until they would have ended (under reloadMu): a ban another server
	// saved back into a store that lost it, made before its lift, is
	// lifted again.
	lifted map[string]liftedBan

	listenMu  sync.Mutex
	listeners []func()

	// version counts the changes of the bans in force; loaded says the
	// last load succeeded.
	version atomic.Int64
	loaded  atomic.Bool

	esc atomic.Pointer[escalations]
	// protected are the addresses no escalation bans: the trusted
	// proxies', whose own address a request without a forwarding header
	// carries.
	protected atomic.Pointer[[]netip.Prefix]
	queue     chan refusal
	// counter decides the escalation rules' refusal counts.
	counter admit.Store
	stats   BanStats
}

// BanStats counts what Bans did.
type BanStats struct {
	Refused   atomic.Int64 // requests a ban refused
	Escalated atomic.Int64 // bans escalation rules made
	Dropped   atomic.Int64 // refusals not counted: the queue was full
	Full      atomic.Int64 // escalations not made: MaxBans in force
	Failures  atomic.Int64 // store calls that failed
	Restored  atomic.Int64 // bans saved back into a store that lost them
	Evicted   atomic.Int64 // escalations' bans replaced by newer ones past MaxEscalatedBans
}

// NewBans returns the bans of store.
func NewBans(store BanStore) *Bans {
	b := &Bans{store: store, queue: make(chan refusal, 4096)}
	b.set.Store(newBanSet(nil, time.Now()))
	b.esc.Store(&escalations{})
	return b
}

// liftedBan is a ban lifted: when, and when it would have ended.
type liftedBan struct{ at, expires time.Time }

// Stats returns b's counters.
func (b *Bans) Stats() *BanStats { return &b.stats }

// Start loads the bans and keeps them current until ctx ends: it follows
// the store's changes, drops bans as they expire, and counts the
// escalation rules' refusals in counter. An error loading them the first
// time is returned; later failures are retried each second.
func (b *Bans) Start(ctx context.Context, counter admit.Store) error {
	b.counter = counter
	err := b.Reload(ctx)
	// Another server's change reloads every ban: at most five times a
	// second, changes meanwhile coalesced, so that a flood of bans made
	// elsewhere costs each server a bounded number of loads.
	var last time.Time
	go b.store.Watch(ctx, func() error {
		if wait := reloadEvery - time.Since(last); wait > 0 {
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(wait):
			}
		}
		last = time.Now()
		return b.Reload(ctx)
	})
	go b.maintain(ctx, err != nil)
	go b.escalate(ctx)
	return err
}

// reloadEvery is the least time between two loads of the bans that other
// servers' changes make.
const reloadEvery = 200 * time.Millisecond

// maintain drops expired bans, and reloads each second while the last
// load failed and every 10 s whatever (a change whose message was lost).
func (b *Bans) maintain(ctx context.Context, failed bool) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for n := 1; ; n++ {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			s := b.set.Load()
			if failed || n%10 == 0 {
				failed = b.Reload(ctx) != nil
				continue
			}
			if !s.earliest.IsZero() && !s.earliest.After(now) {
				b.swap(s.live(now))
			}
		}
	}
}

// live returns s less the bans expired at now.
func (s *banSet) live(now time.Time) *banSet {
	bans := make([]Ban, 0, len(s.all))
	for _, e := range s.all {
		bans = append(bans, e.Ban)
	}
	return newBanSet(bans, now)
}

// Reload loads the bans from the store.
func (b *Bans) Reload(ctx context.Context) error {
	b.reloadMu.Lock()
	defer b.reloadMu.Unlock()
	now := time.Now()
	st, err := b.store.Load(ctx, now)
	b.loaded.Store(err == nil)
	if err != nil {
		return err
	}
	if st.Lost {
		b.restore(ctx, now)
		if st, err = b.store.Load(ctx, now); err != nil {
			return err
		}
	}
	st.Bans = b.liftAgain(ctx, st.Bans, now)
	h := st.History
	b.history.Store(&h)
	b.swap(newBanSet(st.Bans, now))
	return nil
}

// liftAgain returns bans less those this server lifted after they were
// made, which it lifts from the store again: another server, which missed
// the lift, saved them back into a store that had lost them. The caller
// holds reloadMu.
func (b *Bans) liftAgain(ctx context.Context, bans []Ban, now time.Time) []Ban {
	if len(b.lifted) == 0 {
		return bans
	}
	kept := bans[:0]
	for _, x := range bans {
		l, ok := b.lifted[x.ID]
		if ok && !x.Created.After(l.at) {
			if _, err := b.store.Remove(ctx, x.ID, now); err != nil {
				b.stats.Failures.Add(1)
			}
			continue
		}
		kept = append(kept, x)
	}
	for id, l := range b.lifted {
		if !l.expires.After(now) {
			delete(b.lifted, id)
		}
	}
	return kept
}

// restore saves back into a store that lost them the bans this server
// holds (their history is lost with the store's); the caller holds
// reloadMu.
func (b *Bans) restore(ctx context.Context, now time.Time) {
	n := 0
	for _, e := range b.set.Load().all {
		if !e.Expires.After(now) {
			continue
		}
		if _, made, err := b.store.Add(ctx, e.Ban, now); err != nil {
			b.stats.Failures.Add(1)
		} else if made {
			n++
		}
	}
	b.stats.Restored.Add(int64(n))
}

// put puts bans saved in the store in force here, without loading the
// others again.
func (b *Bans) put(bans ...Ban) {
	b.reloadMu.Lock()
	defer b.reloadMu.Unlock()
	s := b.set.Load()
	list := make([]Ban, 0, len(s.all)+len(bans))
	for _, e := range s.all {
		if !slices.ContainsFunc(bans, func(x Ban) bool { return x.ID == e.ID }) {
			list = append(list, e.Ban)
		}
	}
	b.swap(newBanSet(append(list, bans...), time.Now()))
}

// drop lifts the bans of ids here, without loading the others again.
func (b *Bans) drop(ids ...string) {
	b.reloadMu.Lock()
	defer b.reloadMu.Unlock()
	s := b.set.Load()
	list := make([]Ban, 0, len(s.all))
	for _, e := range s.all {
		if !slices.Contains(ids, e.ID) {
			list = append(list, e.Ban)
		}
	}
	b.swap(newBanSet(list, time.Now()))
}

// swap puts s in force, and tells the listeners of a change.
func (b *Bans) swap(s *banSet) {
	old := b.set.Swap(s)
	if sameBans(old, s) {
		return
	}
	b.version.Add(1)
	b.listenMu.Lock()
	ls := slices.Clone(b.listeners)
	b.listenMu.Unlock()
	for _, f := range ls {
		f()
	}
}

func sameBans(a, b *banSet) bool {
	return slices.EqualFunc(a.all, b.all, func(x, y *banEntry) bool { return x.Ban == y.Ban })
}

// Loaded reports whether the last load of the bans from the store
// succeeded: while it has not, the bans in force are the last loaded (none
// for a server that never loaded them).
func (b *Bans) Loaded() bool { return b.loaded.Load() }

// SetProtected sets the networks no escalation rule bans an address of
// (the trusted proxies: a request that one forwards without naming its
// client comes from its address). An operator may still ban them.
func (b *Bans) SetProtected(prefixes []netip.Prefix) {
	p := slices.Clone(prefixes)
	b.protected.Store(&p)
}

// isProtected reports whether an escalation may not ban ip.
func (b *Bans) isProtected(ip string) bool {
	p := b.protected.Load()
	if p == nil || len(*p) == 0 {
		return false
	}
	// An IPv6 address is banned as its /64: protected when that network
	// holds a protected address, not only when it is one.
	var q netip.Prefix
	if v, ok := strings.CutSuffix(ip, "/64"); ok {
		a, err := netip.ParseAddr(v)
		if err != nil {
			return true
		}
		q = netip.PrefixFrom(a, 64)
	} else {
		a, err := netip.ParseAddr(ip)
		if err != nil {
			return true
		}
		q = netip.PrefixFrom(a, a.BitLen())
	}
	return slices.ContainsFunc(*p, func(n netip.Prefix) bool { return n.Overlaps(q) })
}

// Any reports whether any ban is in force.
func (b *Bans) Any() bool { return !b.set.Load().empty() }

// Version counts the changes of the bans in force: a front end that
// decided with them decides again once it changed.
func (b *Bans) Version() int64 { return b.version.Load() }

// OnChange has f called after each change of the bans in force (a ban
// added, removed or expired), on the goroutine that made it: the WebSocket
// gateway closes the connections a new ban refuses.
func (b *Bans) OnChange(f func()) {
	b.listenMu.Lock()
	b.listeners = append(b.listeners, f)
	b.listenMu.Unlock()
}

// Add puts a ban in force for ttl: normalized, with an id made from its
// identifier (so that one identifier's ban is replaced by the next one the
// operator sets), saved in the store and in force here before Add returns.
func (b *Bans) Add(ctx context.Context, ban Ban, ttl time.Duration) (Ban, error) {
	if ttl < time.Second || ttl > MaxBanTTL {
		e := admit.Errorf(admit.CodeInvalid, "ttl %s: want from 1s to %s", ttl, MaxBanTTL)
		e.Field = "ttl"
		return Ban{}, e
	}
	if err := NormalizeBan(&ban); err != nil {
		return Ban{}, err
	}
	now := time.Now()
	ban.ID = banID("admin", ban.Scope, ban.Tenant, ban.Value)
	ban.Source = "admin"
	ban.Strike = 0
	ban.Created = now.UTC().Truncate(time.Millisecond)
	ban.Expires = now.Add(ttl).UTC().Truncate(time.Millisecond)
	// An operator's ban replaces the identifier's earlier one, longer
	// or shorter: the operator's word is the last.
	if _, err := b.store.Remove(ctx, ban.ID, now); err != nil {
		return Ban{}, err
	}
	saved, _, err := b.store.Add(ctx, ban, now)
	if err != nil {
		return Ban{}, err
	}
	b.put(saved)
	return saved, nil
}

// Remove lifts the ban of id, reporting whether one was in force.
func (b *Bans) Remove(ctx context.Context, id string) (bool, error) {
	x, had := b.Get(id)
	now := time.Now()
	ok, err := b.store.Remove(ctx, id, now)
	if err != nil {
		return false, err
	}
	if had {
		b.remember(x, now)
	}
	b.drop(id)
	return ok, nil
}

// remember keeps that x was lifted at now, until it would have ended.
func (b *Bans) remember(x Ban, now time.Time) {
	b.reloadMu.Lock()
	defer b.reloadMu.Unlock()
	if b.lifted == nil {
		b.lifted = map[string]liftedBan{}
	}
	b.lifted[x.ID] = liftedBan{at: now, expires: x.Expires}
}

// RemoveWhere lifts every ban in force that match reports true of, and
// returns how many it lifted: an operator's way out of a flood of bans
// (every ban of one escalation rule, say). It stops at the first store
// error, having lifted those before it.
func (b *Bans) RemoveWhere(ctx context.Context, match func(Ban) bool) (int, error) {
	n := 0
	for _, x := range b.List() {
		if !match(x) {
			continue
		}
		now := time.Now()
		ok, err := b.store.Remove(ctx, x.ID, now)
		if err != nil {
			return n, errors.Join(err, b.Reload(ctx))
		}
		b.remember(x, now)
		if ok {
			n++
		}
	}
	return n, b.Reload(ctx)
}

// List returns the bans in force, by id.
func (b *Bans) List() []Ban {
	now := time.Now()
	s := b.set.Load()
	out := make([]Ban, 0, len(s.all))
	for _, e := range s.all {
		if e.Expires.After(now) {
			out = append(out, e.Ban)
		}
	}
	return out
}

// Get returns the ban of id in force, false if none.
func (b *Bans) Get(id string) (Ban, bool) {
	s := b.set.Load()
	i, ok := slices.BinarySearchFunc(s.all, id, func(e *banEntry, id string) int { return strings.Compare(e.ID, id) })
	if !ok || !s.all[i].Expires.After(time.Now()) {
		return Ban{}, false
	}
	return s.all[i].Ban, true
}

// History returns how many times each identifier was banned by an
// escalation rule, as last loaded.
func (b *Bans) History() map[string]BanStrikes {
	if h := b.history.Load(); h != nil {
		return *h
	}
	return nil
}

// banID names the ban of one identifier by one source: the same
// identifier banned twice is one ban, replaced.
func banID(source, scope, tenant, value string) string {
	sum := sha256.Sum256([]byte(source + "\x00" + scope + "\x00" + tenant + "\x00" + value))
	// 96 bits: no caller can choose values (invented users, addresses)
	// whose ban takes the id of another's.
	return hex.EncodeToString(sum[:12])
}

// Matched returns the ban in force at now over the request res was
// resolved from, false if none.
func (b *Bans) Matched(res *Resolution, now time.Time) (Ban, bool) {
	s := b.set.Load()
	if s.empty() {
		return Ban{}, false
	}
	if e := s.match(&res.who, now); e != nil {
		return e.Ban, true
	}
	return Ban{}, false
}

// MatchIdentity returns the ban in force at now over a caller known by its
// tenant, user, client address (canonical) and API key hash (hex), false
// if none: what the WebSocket gateway asks of its open connections.
func (b *Bans) MatchIdentity(tenant, user, ip, keyHash string, now time.Time) (Ban, bool) {
	s := b.set.Load()
	if s.empty() {
		return Ban{}, false
	}
	id := identity{tenant: tenant, user: user, ip: ip, keyHash: keyHash}
	if keyHash != "" {
		id.apiKey = "-"
	}
	if e := s.match(&id, now); e != nil {
		return e.Ban, true
	}
	return Ban{}, false
}

// refuse makes dec the refusal of res by its ban, at no store cost: res
// holds the ban's rule alone, dec its one result, so that every front end
// names the ban where it names a refusing rule.
func (b *Bans) refuse(res *Resolution, dec *admit.Decision) bool {
	s := b.set.Load()
	if s.empty() {
		return false
	}
	now := time.Now()
	e := s.match(&res.who, now)
	if e == nil {
		return false
	}
	b.stats.Refused.Add(1)
	left := e.Expires.Sub(now)
	res.Charges = append(res.Charges[:0], admit.Charge{Key: e.rule.Name, Rule: &e.rule.Rule, Cost: 1})
	res.Rules = append(res.Rules[:0], e.rule)
	dec.Reset()
	dec.DeniedBy = e.rule.Name
	dec.RetryAfter, dec.ResetAfter = left, left
	dec.At = now
	dec.Results = append(dec.Results, admit.Result{Rule: e.rule.Name, RetryAfter: left, ResetAfter: left})
	return true
}
