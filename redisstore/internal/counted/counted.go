package counted

import (
	"context"
	"crypto/sha256"
	_ "embed"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/rueidis"

	"github.com/admitdev/admit"
	"github.com/admitdev/admit/internal/bounds"
	"github.com/admitdev/admit/internal/engine"
	"github.com/admitdev/admit/redisstore/internal/exact"
	"github.com/admitdev/admit/redisstore/internal/link"
)

// Counted rules. A rule of distribution admit.Counted counts every charge
// on its own, whatever the count holds, as envoyproxy/ratelimit counts
// hits: nothing is all or nothing, so nothing needs a script. Its charges
// are plain commands, pipelined: one INCRBY per key of the window, the hits
// of every decision that meet in a batch added together (each decision
// then reads its own place from the total), and a PEXPIRE when this
// server first counts in the key's window, not on every hit. A function
// call costs Redis about half again what a client's INCRBY does, and the
// peer sends an EXPIRE with every INCRBY: Redis does less than half the
// peer's work per hit this way.
//
// A counted key is Prefix, '#' and 22 characters: the first 128 bits of
// the SHA-256 of the rule's window, the window's end and the charge's key,
// in base64url. Two counts share a key only if SHA-256 collides there; a
// client cannot aim at another's count (that is a second preimage). The
// key is shorter than envoyproxy/ratelimit's own (domain, entries and
// window start), so a live counter costs Redis less memory than the
// peer's. The window is the server's clock's, as in the peer: servers
// whose clocks disagree count a window's last moments in different keys.
const (
	// maxTallyBatch bounds the decisions one pipeline carries.
	maxTallyBatch = 256
	// maxPipelines bounds the pipelines in flight, as the exact path
	// bounds its calls per slot.
	maxPipelines = 4
	// expiryEntries is the size of the table of keys whose expiry this
	// server has set in their window: a key whose entry another key took
	// since has its expiry set again, which costs a command and nothing
	// else.
	expiryEntries = 1 << 16
	// countedSlack is how long a counted key outlives its window, for a
	// Redis clock a little ahead of the server's and the command's
	// transit.
	countedSlack = 2 * time.Second
)

// Room is the counted room of the Redis store: the counts of rules of
// distribution admit.Counted, kept with plain pipelined commands. The
// charges of a decision that are not counted are decided by the room
// below (Rest), and refusals are learned and answered there too.
type Room struct {
	link     *link.Link
	rest     Decider
	refusals Refusals

	tallier  tallier
	expiries expiryTable
	fixMu    sync.Mutex
	fixes    []expiryFix
	fixing   bool
}

// A Decider decides the charges of a decision that are not counted.
type Decider interface {
	Decide(ctx context.Context, charges []admit.Charge, d *admit.Decision) error
}

// Refusals are the store's refusals (see the exact path's): a key Redis
// refused is refused without a call until it could admit again.
type Refusals interface {
	RefuseLocally(charges []admit.Charge, now time.Time, d *admit.Decision) bool
	LearnRefusals(charges []admit.Charge, d *admit.Decision, sent time.Time)
}

// New returns the counted room of a store calling Redis through l, its
// other charges decided by rest, its refusals kept by refusals.
func New(l *link.Link, rest Decider, refusals Refusals) *Room {
	return &Room{link: l, rest: rest, refusals: refusals}
}

// tally is one decision's counted charges waiting for a pipeline: their
// keys, costs and expiries (ms from now), and after the pipeline each
// charge's count after it.
type tally struct {
	ctx    context.Context
	keys   []string
	hashes [][2]uint64
	costs  []int64
	ttls   []int64
	counts []int64
	err    error
	failed []int         // charges whose key Redis refused to count (err says why)
	done   chan struct{} // closed when counts or err are set; nil when its caller sends it
}

// tallier batches tallies as batcher does decisions: a tally goes at once
// while fewer than maxPipelines are in flight, else it waits and the
// next pipeline takes every tally waiting.
type tallier struct {
	mu     sync.Mutex
	queue  []*tally
	flying int
}

// expiryTable remembers, for each of its entries, the last key whose
// expiry this server set.
type expiryTable struct {
	mu sync.Mutex
	e  [][2]uint64
}

// first reports whether the key of hash h has no entry, and gives it one.
func (t *expiryTable) first(h [2]uint64) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.e == nil {
		t.e = make([][2]uint64, expiryEntries)
	}
	i := h[0] % expiryEntries
	if t.e[i] == h {
		return false
	}
	t.e[i] = h
	return true
}

// forget drops the entries of keys whose pipeline failed: their expiry
// may not be set.
func (t *expiryTable) forget(hs [][2]uint64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, h := range hs {
		if t.e != nil && t.e[h[0]%expiryEntries] == h {
			t.e[h[0]%expiryEntries] = [2]uint64{}
		}
	}
}

// Is reports whether c is decided by counting (see admit.Counted).
func Is(c *admit.Charge) bool {
	return c.Rule != nil && c.Rule.Distribution == admit.Counted
}

// Any reports whether some of charges are counted.
func Any(charges []admit.Charge) bool {
	for i := range charges {
		if Is(&charges[i]) {
			return true
		}
	}
	return false
}

// Key returns the key of c's count in the window ending at end (ns
// since the epoch), and its hash.
func (s *Room) Key(c *admit.Charge, end int64) (string, [2]uint64) {
	var scratch [256]byte
	b := binary.LittleEndian.AppendUint64(scratch[:0], uint64(c.Rule.Window))
	b = binary.LittleEndian.AppendUint64(b, uint64(end))
	b = append(b, c.Key...)
	sum := sha256.Sum256(b)
	var key [64]byte
	k := append(key[:0], s.link.Prefix...)
	k = append(k, '#')
	k = base64.RawURLEncoding.AppendEncode(k, sum[:16])
	return string(k), [2]uint64{binary.LittleEndian.Uint64(sum[:8]), binary.LittleEndian.Uint64(sum[8:16])}
}

// Decide decides charges of which some are counted. Counted debits
// are counted whatever they find. A counted charge that is not a debit is
// counted too, at once, and taken back if it does not fit, or if the
// decision is refused: the others are decided after the counts, as a dry
// run when a count refused, all or nothing among themselves. A count taken
// back was visible to other decisions for that moment, which may refuse
// one of them (never admit one too many: a decision is admitted only by
// counts within the limit, counts that were taken back included).
func (s *Room) Decide(ctx context.Context, charges []admit.Charge, d *admit.Decision) error {
	if len(charges) > bounds.MaxCharges {
		return admit.Errorf(admit.CodeInvalid, "%d charges in one decision; at most %d", len(charges), bounds.MaxCharges)
	}
	if err := engine.CheckDebits(charges); err != nil {
		return err
	}
	dry := false
	var idx []int
	var others []admit.Charge
	for i := range charges {
		// Every charge is checked before any is counted.
		if err := exact.Check(i, &charges[i]); err != nil {
			return err
		}
		if Is(&charges[i]) {
			idx = append(idx, i)
		} else {
			others = append(others, charges[i])
		}
		dry = dry || charges[i].DryRun
	}
	if dry {
		// A decision is a dry run as a whole, whichever charge says so.
		for i := range others {
			others[i].DryRun = true
		}
	}
	now := s.link.Now()
	if !dry && s.refusals.RefuseLocally(charges, now, d) {
		// A counted key refused a moment ago (see learnRefusals): its
		// traffic touches none of the request's shared counts.
		return nil
	}
	t := &tally{ctx: ctx}
	for _, i := range idx {
		c := &charges[i]
		w := int64(c.Rule.Window)
		n := now.UnixNano()
		end := n - n%w + w
		key, h := s.Key(c, end)
		t.keys, t.hashes, t.costs = append(t.keys, key), append(t.hashes, h), append(t.costs, c.Cost)
		t.ttls = append(t.ttls, (end-n+int64(time.Millisecond)-1)/int64(time.Millisecond)+s.countedSlack().Milliseconds())
	}
	// Checks count in two steps when their limits differ: the widest
	// (largest limit: a tenant's, a route's) only once the others fit,
	// so that a request refused by its own narrow count (a user's) never
	// raises a shared one, even for a moment, for others to be refused
	// by. The widest are then read, to report them.
	first, wide := countSteps(charges, idx, dry)
	t.counts = make([]int64, len(idx))
	if err := s.countPart(t, first, dry); err != nil {
		return errors.Join(err, s.takeBack(t, countedChecks(t, charges, idx, first)))
	}
	// A check counted past its limit is taken back; a refusing one
	// refuses the decision.
	refusing := func(ks []int) bool {
		r := false
		for _, k := range ks {
			if c := &charges[idx[k]]; !dry && !c.Debit && t.counts[k] > c.Rule.Limit {
				r = r || !c.Rule.Shadow
			}
		}
		return r
	}
	refused := refusing(first)
	steps := first
	if len(wide) > 0 {
		if !refused {
			steps = idxs(len(idx))
		}
		if err := s.countPart(t, wide, refused); err != nil {
			return errors.Join(err, s.takeBack(t, countedChecks(t, charges, idx, steps)))
		}
		refused = refused || refusing(wide)
	}
	// counted: the checks that counted something, to take back.
	counted := countedChecks(t, charges, idx, steps)
	if dry {
		counted = nil
	}
	var back []int
	for _, k := range counted {
		if t.counts[k] > charges[idx[k]].Rule.Limit {
			back = append(back, k)
		}
	}
	// The others, decided as ever; when a count refused already, as a
	// dry run to report what they hold, their debits apart and for real.
	var rest, debits admit.Decision
	var restOf, debitOf []int // the charges' places in rest and debits
	othersDry := false
	if len(others) > 0 {
		part := others
		if refused {
			othersDry = true
			var owed []admit.Charge
			part = nil
			for i := range others {
				if others[i].Debit {
					owed = append(owed, others[i])
				} else {
					c := others[i]
					c.DryRun = true
					part = append(part, c)
				}
			}
			if len(owed) > 0 {
				if err := s.rest.Decide(ctx, owed, &debits); err != nil {
					return errors.Join(err, s.takeBack(t, counted))
				}
			}
		}
		if len(part) > 0 {
			if err := s.rest.Decide(ctx, part, &rest); err != nil {
				return errors.Join(err, s.takeBack(t, counted))
			}
			refused = refused || !rest.Allowed
		}
		for i := range charges {
			switch {
			case Is(&charges[i]):
			case refused && charges[i].Debit && len(part) < len(others):
				debitOf = append(debitOf, i)
			default:
				restOf = append(restOf, i)
			}
		}
	}
	if refused {
		back = counted
	}
	if err := s.takeBack(t, back); err != nil {
		return err
	}
	d.Reset()
	d.Results = slices.Grow(d.Results, len(charges))[:len(charges)]
	d.Lease, d.At = rest.Lease, now
	if !rest.At.IsZero() {
		d.At = rest.At
	}
	for o, i := range restOf {
		d.Results[i] = rest.Results[o]
		if r := &d.Results[i]; r.Allowed && othersDry && charges[i].Cost > 0 {
			// Decided as a dry run to report them: what they hold, as
			// a refused decision reports, not what would remain.
			r.Remaining += charges[i].Cost
		}
	}
	for o, i := range debitOf {
		d.Results[i] = debits.Results[o]
	}
	for k, i := range idx {
		res := &d.Results[i]
		countedResult(res, &charges[i], t.counts[k], now)
		if c := &charges[i]; refused && !dry && !c.Debit {
			// Refused, the check reports what its key holds without the
			// decision's checks, as memstore does.
			held := t.counts[k]
			for j := range k + 1 {
				if t.keys[j] == t.keys[k] && !charges[idx[j]].Debit {
					held -= t.costs[j]
				}
			}
			res.Remaining = max(c.Rule.Limit-held, 0)
		}
	}
	engine.Summarize(d)
	if !d.Allowed && !dry {
		s.learnCountedRefusals(charges, d, now)
	}
	return nil
}

// learnCountedRefusals remembers the refusals of d, a refused decision of
// charges with counted ones (see learnRefusals), but of its refused counts
// only the one of the smallest limit. A count may stand raised by the
// checks of others' refused decisions, about to be taken back: remembering
// a wide count (a tenant's) refused while a user hammers its own spent one
// would refuse the whole tenant. The narrowest refused count is the one
// the request's own traffic most likely filled.
func (s *Room) learnCountedRefusals(charges []admit.Charge, d *admit.Decision, now time.Time) {
	narrow := -1
	for i := range charges {
		if c, r := &charges[i], &d.Results[i]; Is(c) && !r.Allowed && !r.Shadow && !c.Debit &&
			(narrow < 0 || c.Rule.Limit < charges[narrow].Rule.Limit) {
			narrow = i
		}
	}
	var learn []admit.Charge
	var of admit.Decision
	for i := range charges {
		if !Is(&charges[i]) || i == narrow {
			learn = append(learn, charges[i])
			of.Results = append(of.Results, d.Results[i])
		}
	}
	s.refusals.LearnRefusals(learn, &of, now)
}

// countSteps splits the places of the counted charges of a decision into
// the first step and the wide one (see decideCounted): the checks of the
// largest limit, when the checks' limits differ, count last.
func countSteps(charges []admit.Charge, idx []int, dry bool) (first, wide []int) {
	widest, narrower := int64(-1), false
	for _, i := range idx {
		if c := &charges[i]; !c.Debit && !dry {
			if widest >= 0 && c.Rule.Limit != widest {
				narrower = true
			}
			widest = max(widest, c.Rule.Limit)
		}
	}
	for k, i := range idx {
		if c := &charges[i]; narrower && !c.Debit && c.Rule.Limit == widest {
			wide = append(wide, k)
		} else {
			first = append(first, k)
		}
	}
	return first, wide
}

// countPart counts (or, with read, reads) t's charges at places ks, in a
// tally of their own, and writes their counts into t's.
func (s *Room) countPart(t *tally, ks []int, read bool) error {
	if len(ks) == 0 {
		return nil
	}
	p := &tally{ctx: t.ctx}
	for _, k := range ks {
		p.keys, p.hashes, p.costs, p.ttls = append(p.keys, t.keys[k]), append(p.hashes, t.hashes[k]), append(p.costs, t.costs[k]), append(p.ttls, t.ttls[k])
	}
	var err error
	if read {
		err = s.readTally(p)
	} else {
		err = s.tallyCall(p)
	}
	for j, k := range ks {
		if j < len(p.counts) {
			t.counts[k] = p.counts[j]
		}
	}
	for _, j := range p.failed {
		t.failed = append(t.failed, ks[j])
	}
	return err
}

// countedChecks returns, of the places steps, those of checks that
// counted something (not those whose key Redis refused to count).
func countedChecks(t *tally, charges []admit.Charge, idx, steps []int) []int {
	var ks []int
	for _, k := range steps {
		if c := &charges[idx[k]]; !c.Debit && c.Cost > 0 && !slices.Contains(t.failed, k) {
			ks = append(ks, k)
		}
	}
	return ks
}

// idxs returns 0..n-1.
func idxs(n int) []int {
	ks := make([]int, n)
	for i := range ks {
		ks[i] = i
	}
	return ks
}

// takeBack takes back the counts of t's charges at places ks, each by
// takeBackScript: never below zero, and never on a key that is gone (it
// expired, or Redis lost it), which a plain DECRBY would make anew,
// negative and without an expiry. It is not tried again when Redis fails:
// one whose reply was lost may have been applied, and applying it twice
// could admit past the limit. A count left refuses more until its window
// ends, never less.
func (s *Room) takeBack(t *tally, ks []int) error {
	if len(ks) == 0 {
		return nil
	}
	keys := make([]string, len(ks))
	costs := make([]int64, len(ks))
	for j, k := range ks {
		keys[j], costs[j] = t.keys[k], t.costs[k]
	}
	return s.lower(keys, costs)
}

// takeBackScript lowers the count in KEYS[1] by ARGV[1], to no less than
// zero, if the key is there; its expiry stays.
var takeBackScript = rueidis.NewLuaScript(takeBackSource)

//go:embed lua/take_back.lua
var takeBackSource string

// lower runs takeBackScript on each key, by its cost.
func (s *Room) lower(keys []string, costs []int64) error {
	// Not the caller's context: a count must be taken back even when the
	// caller has gone.
	return s.link.Do(context.Background(), func(ctx context.Context, client rueidis.Client) error {
		execs := make([]rueidis.LuaExec, len(keys))
		for j, k := range keys {
			execs[j] = rueidis.LuaExec{Keys: []string{k}, Args: []string{strconv.FormatInt(costs[j], 10)}}
		}
		for _, r := range takeBackScript.ExecMulti(ctx, client, execs...) {
			if err := r.Error(); err != nil {
				return err
			}
		}
		return nil
	})
}

// maxExpiryFixes bounds the keys waiting for their expiry to be set again.
const maxExpiryFixes = 1 << 16

// fixExpiries sets again, in the background, the expiry of keys a failed
// pipeline counted in: its INCRBY may have landed and made a key, with no
// PEXPIRE after it. Setting an expiry is idempotent, so it is tried every
// second until Redis answers (or the store closes); a key gone stays gone,
// and one whose window has ended expires at once.
func (s *Room) fixExpiries(ops []countOp) {
	s.fixMu.Lock()
	for _, op := range ops {
		if len(s.fixes) < maxExpiryFixes && op.total > 0 {
			s.fixes = append(s.fixes, expiryFix{key: op.key, at: time.Now().Add(time.Duration(op.ttl) * time.Millisecond)})
		}
	}
	start := !s.fixing && len(s.fixes) > 0
	s.fixing = s.fixing || start
	s.fixMu.Unlock()
	if start {
		go s.retryExpiries()
	}
}

// retryExpiries runs fixExpiries' retries until none is left.
func (s *Room) retryExpiries() {
	for {
		select {
		case <-s.link.Closed:
			return
		case <-time.After(time.Second):
		}
		s.fixMu.Lock()
		fixes := s.fixes
		s.fixes = nil
		s.fixMu.Unlock()
		err := s.link.Do(context.Background(), func(ctx context.Context, client rueidis.Client) error {
			cmds := make(rueidis.Commands, len(fixes))
			for i, f := range fixes {
				cmds[i] = client.B().Pexpire().Key(f.key).Milliseconds(max(time.Until(f.at).Milliseconds(), 1)).Build()
			}
			for _, r := range client.DoMulti(ctx, cmds...) {
				if err := r.Error(); err != nil {
					return err
				}
			}
			return nil
		})
		s.fixMu.Lock()
		if err != nil {
			s.fixes = append(fixes, s.fixes...)
			s.fixes = s.fixes[:min(len(s.fixes), maxExpiryFixes)]
		}
		if len(s.fixes) == 0 {
			s.fixing = false
			s.fixMu.Unlock()
			return
		}
		s.fixMu.Unlock()
	}
}

// expiryFix is a key whose expiry is to be set again, to at.
type expiryFix struct {
	key string
	at  time.Time
}

// countedSlack is how long past its window a counted key lives: with a
// clock of the store's own (tests), as long as the script's keys get.
func (s *Room) countedSlack() time.Duration {
	if s.link.Clock != nil {
		return 10 * time.Minute
	}
	return countedSlack
}

// countedResult is what a fixed window decides of debit c when its count
// after it is count, as admit's engine decides it: within the limit, what
// remains; past it, refused until the window ends, and how far past.
func countedResult(res *admit.Result, c *admit.Charge, count int64, now time.Time) {
	r := c.Rule
	w := int64(r.Window)
	n := now.UnixNano()
	left := time.Duration(w - n%w)
	*res = admit.Result{Rule: r.Name, Shadow: r.Shadow, Debit: c.Debit, Limit: r.Capacity(), ResetAfter: left}
	if count <= r.Limit {
		res.Allowed, res.Remaining = true, r.Limit-count
		return
	}
	if !c.Debit { // a dry run's check: what it meets, before its cost
		res.Remaining = max(r.Limit-(count-c.Cost), 0)
	}
	res.RetryAfter = left
	if c.Debit {
		res.Over = min(count, bounds.MaxCount) - r.Limit
	}
}

// readTally reads t's counts for a dry run: what each key holds, plus the
// costs of t's charges before it and its own.
func (s *Room) readTally(t *tally) error {
	return s.link.Do(t.ctx, func(ctx context.Context, client rueidis.Client) error {
		cmds := make(rueidis.Commands, len(t.keys))
		for i, k := range t.keys {
			cmds[i] = client.B().Get().Key(k).Build()
		}
		t.counts = make([]int64, len(t.keys))
		for i, r := range client.DoMulti(ctx, cmds...) {
			v, err := r.AsInt64()
			if err != nil && !rueidis.IsRedisNil(err) {
				return err
			}
			t.counts[i] = v
			for j := range i + 1 {
				if t.keys[j] == t.keys[i] {
					t.counts[i] += t.costs[j]
				}
			}
		}
		return nil
	})
}

// tallyCall counts t in a pipeline of its own or, while pipelines are in
// flight, in the next one.
func (s *Room) tallyCall(t *tally) error {
	b := &s.tallier
	b.mu.Lock()
	if b.flying < maxPipelines && len(b.queue) == 0 {
		b.flying++
		b.mu.Unlock()
		s.sendTallies([]*tally{t})
		s.tallied()
		return t.err
	}
	t.done = make(chan struct{})
	b.queue = append(b.queue, t)
	b.mu.Unlock()
	// No giving up on the caller's context here: a tally taken into a
	// pipeline is counted, and its caller must know, to take back what
	// it counted. One whose caller gave up before that is dropped, and
	// answered so (nextTallies); each pipeline ahead of it ends within
	// the timeout.
	<-t.done
	return t.err
}

// tallied ends a pipeline: the tallies queued meanwhile go in the next,
// sent by a new goroutine.
func (s *Room) tallied() {
	if next := s.nextTallies(); next != nil {
		go func() {
			for batch := next; batch != nil; batch = s.nextTallies() {
				s.sendTallies(batch)
			}
		}()
	}
}

// nextTallies takes the next batch from the queue, answering the tallies
// whose callers gave up, or, when none is left, ends the pipeline that
// just landed.
func (s *Room) nextTallies() []*tally {
	b := &s.tallier
	b.mu.Lock()
	defer b.mu.Unlock()
	for len(b.queue) > 0 {
		k := min(len(b.queue), maxTallyBatch)
		batch := make([]*tally, 0, k)
		for _, t := range b.queue[:k] {
			if err := t.ctx.Err(); err != nil {
				t.err = admit.Errorf(admit.CodeUnavailable, "redisstore: %w", err)
				t.finish()
				continue
			}
			batch = append(batch, t)
		}
		n := copy(b.queue, b.queue[k:])
		clear(b.queue[n:])
		b.queue = b.queue[:n]
		if len(batch) > 0 {
			return batch
		}
	}
	b.flying--
	return nil
}

func (t *tally) finish() {
	if t.done != nil {
		close(t.done)
	}
}

// countOp is one key's command in a pipeline: the hits of every tally on
// it, added together.
type countOp struct {
	key    string
	hash   [2]uint64
	total  int64
	ttl    int64
	expire bool // a PEXPIRE follows the INCRBY
}

// countCeiling is where a counted key's count is held: far past any limit
// (bounds.MaxCount), and far from the int64 Redis counts in, so that a
// count's take-backs never bring it under a limit again.
const countCeiling = 1 << 62

// sendTallies counts batch in one pipeline and gives every tally its
// counts.
func (s *Room) sendTallies(batch []*tally) {
	var ops []countOp
	at := make(map[string]int, len(batch))
	// place[t][i]: the op of tally t's charge i, and the total on that
	// key after it.
	place := make([][][2]int64, len(batch))
	for ti, t := range batch {
		place[ti] = make([][2]int64, len(t.keys))
		for i, key := range t.keys {
			k, ok := at[key]
			if !ok {
				k = len(ops)
				at[key] = k
				ops = append(ops, countOp{key: key, hash: t.hashes[i], ttl: t.ttls[i]})
			}
			ops[k].total += t.costs[i]
			place[ti][i] = [2]int64{int64(k), ops[k].total}
		}
	}
	err := s.link.Do(context.Background(), func(ctx context.Context, client rueidis.Client) error {
		cmds := make(rueidis.Commands, 0, 2*len(ops))
		for i := range ops {
			op := &ops[i]
			if op.total == 0 {
				cmds = append(cmds, client.B().Get().Key(op.key).Build())
				continue
			}
			cmds = append(cmds, client.B().Incrby().Key(op.key).Increment(op.total).Build())
			if s.expiries.first(op.hash) {
				op.expire = true
				cmds = append(cmds, client.B().Pexpire().Key(op.key).Milliseconds(op.ttl).Build())
			}
		}
		resps := client.DoMulti(ctx, cmds...)
		counts := make([]int64, len(ops))
		// opErr: Redis refused that key's command (it holds no count:
		// another program wrote it), which fails only the tallies on it.
		opErr := make([]error, len(ops))
		var again rueidis.Commands
		r := 0
		for i := range ops {
			op := &ops[i]
			v, err := resps[r].AsInt64()
			r++
			switch re, isReply := rueidis.IsRedisErr(err); {
			case err == nil, op.total == 0 && rueidis.IsRedisNil(err):
			case isReply && strings.Contains(re.Error(), "overflow"):
				v = countCeiling // see below
			case isReply:
				opErr[i] = admit.Errorf(admit.CodeInternal, "redisstore: counted key %s: %v", op.key, re)
			default:
				return err
			}
			if op.expire {
				if err := resps[r].Error(); err != nil {
					if _, isReply := rueidis.IsRedisErr(err); !isReply {
						return err
					}
				}
				r++
			} else if op.total > 0 && v == op.total {
				// The key is new though this server had set its expiry:
				// Redis lost it (a restart, a failover). Set it again.
				again = append(again, client.B().Pexpire().Key(op.key).Milliseconds(op.ttl).Build())
			}
			if v >= countCeiling {
				// Far past any limit: held there, so that debits of a
				// long window never overflow Redis's integer.
				v = countCeiling
				again = append(again, client.B().Set().Key(op.key).Value(strconv.FormatInt(countCeiling, 10)).Keepttl().Build())
			}
			counts[i] = v
		}
		for _, r := range client.DoMulti(ctx, again...) {
			if err := r.Error(); err != nil {
				return err
			}
		}
		for ti, t := range batch {
			t.counts = make([]int64, len(t.keys))
			t.failed = nil
			for i := range t.keys {
				k, after := place[ti][i][0], place[ti][i][1]
				if opErr[k] != nil {
					t.err = opErr[k]
					t.failed = append(t.failed, i)
				}
				// The tallies of a batch count in their order: this
				// charge's count is the key's, less what came after it.
				t.counts[i] = counts[k] - (ops[k].total - after)
			}
		}
		return nil
	})
	if err != nil {
		// The INCRBYs may have landed all the same: their keys' expiries
		// are set again, and this server sets them with its next hit too.
		hs := make([][2]uint64, len(ops))
		for i := range ops {
			hs[i] = ops[i].hash
		}
		s.expiries.forget(hs)
		s.fixExpiries(ops)
		for _, t := range batch {
			t.err = err
		}
	}
	for _, t := range batch {
		t.finish()
	}
}

// Refund gives back charge c, counted in the window that holds at,
// if that window is the current one: its count less c's cost, never below
// zero, never on a key that is gone (see takeBack).
func (s *Room) Refund(c *admit.Charge, at time.Time) error {
	w := int64(c.Rule.Window)
	n, a := s.link.Now().UnixNano(), at.UnixNano()
	if a-a%w != n-n%w || c.Cost <= 0 {
		return nil
	}
	key, _ := s.Key(c, n-n%w+w)
	return s.lower([]string{key}, []int64{c.Cost})
}

// Reset deletes charge c's count of the current window.
func (s *Room) Reset(ctx context.Context, c *admit.Charge) error {
	w := int64(c.Rule.Window)
	n := s.link.Now().UnixNano()
	key, _ := s.Key(c, n-n%w+w)
	return s.link.Do(ctx, func(ctx context.Context, client rueidis.Client) error {
		return client.Do(ctx, client.B().Del().Key(key).Build()).Error()
	})
}
