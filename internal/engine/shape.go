package engine

import (
	"math"
	"sync"

	"github.com/admitdev/admit/internal/bounds"
)

// A bucket's state is its theoretical arrival time, which means tokens only
// under the interval and burst it was written with: read under another
// rule's, the same time would hold another number of tokens (a drained
// 1000/day bucket read under 100/s would wait a quarter of an hour). So
// every bucket state names the shape it was written under, and a bucket
// reading a state of another shape first takes the tokens that state held
// under its own shape, then keeps them under the new one (see adopt).
//
// The name is a small number kept in the state's Prev, which a bucket does
// not otherwise use: an id given to each shape the process has prepared.
// Ids are above bounds.MaxCount, which no count reaches, so a bucket tells
// its own states from a sliding window's (whose Prev is a count), and 0
// means a state written before shapes were named, read as the rule's own.

// shape is what a bucket's time means: its interval (per/n), its burst and
// how long it is remembered once full.
type shape struct {
	n, per          uint64
	burst, remember int64
}

// maxShapes bounds the shapes a process names. Past it a new shape goes
// unnamed (0): its states are read as any rule's own, as before shapes
// were named. Each is a few dozen bytes; every reload or admin change that
// makes new rule parameters may add one.
const maxShapes = 1 << 20

// firstShapeID is the first id; ids run up from it.
const firstShapeID = uint32(bounds.MaxCount) + 1

var shapes struct {
	mu    sync.Mutex
	ids   map[shape]uint32 // under mu: every shape named, and the count
	named sync.Map         // shape → uint32, as ids
	byID  sync.Map         // uint32 → shape
}

// shapeID returns the id of sh, naming it on first use (0 once maxShapes
// are named). A shape already named is found without the lock: rules not
// kept prepared (reservations, refunds) name their shape on every call.
func shapeID(sh shape) uint32 {
	if id, ok := shapes.named.Load(sh); ok {
		return id.(uint32)
	}
	shapes.mu.Lock()
	defer shapes.mu.Unlock()
	if id, ok := shapes.ids[sh]; ok {
		return id
	}
	if len(shapes.ids) >= maxShapes {
		return 0
	}
	if shapes.ids == nil {
		shapes.ids = map[shape]uint32{}
	}
	id := firstShapeID + uint32(len(shapes.ids))
	shapes.ids[sh] = id
	shapes.byID.Store(id, sh)
	shapes.named.Store(sh, id)
	return id
}

// shapeOf returns the shape named id.
func shapeOf(id uint32) (shape, bool) {
	v, ok := shapes.byID.Load(id)
	if !ok {
		return shape{}, false
	}
	return v.(shape), true
}

// bucket returns a bucket of shape sh, named id: enough of one to read and
// write states of that shape (no initial balance, no debt bound).
func (sh shape) bucket(id uint32) bucket {
	b := bucket{n: sh.n, per: sh.per, burst: sh.burst, remember: sh.remember, stamp: id}
	if q := b.per / b.n; q*b.n == b.per {
		b.whole = int64(q)
	}
	return b
}

// isShapeID reports whether a state's Prev names a bucket's shape.
func isShapeID(prev uint32) bool { return prev >= firstShapeID }

// adopt returns the theoretical arrival time, under b, of a live state s
// written under shape old. A bucket holding tokens keeps them at now (whole
// tokens plus the part of the next already refilled), capped at b's burst,
// and refills from now on at b's rate; the part of a token is scaled to
// b's interval rounded down, so a state read under two shapes in turn
// never gains. A bucket in debt keeps the debt as the time the old rate
// takes to repay it (within keptDebt): a change never makes a debt take
// longer or shorter to repay, however often the rule changes.
func (b *bucket) adopt(old shape, s State, now int64) fine {
	o := old.bucket(s.Prev)
	e := o.before(o.own(s), fine{ns: now}) // old TAT − now
	if !(fine{}).less(e) {
		return fine{ns: now} // full under the old shape: full, at b's burst
	}
	if drained := o.span(o.burst); drained.less(e) {
		owed := min(o.before(e, drained).ceil(), b.span(b.keptDebt()).ns)
		return b.after(b.after(fine{ns: now}, b.span(b.burst)), fine{ns: owed})
	}
	// m tokens are missing, the last of them refilled for part tokens'
	// time; the bucket holds burst − m whole tokens.
	m := o.tokens(e)
	if o.span(m).less(e) {
		m++
	}
	part := o.before(o.span(m), e)
	held := o.burst - m
	if held >= b.burst {
		return fine{ns: now}
	}
	p := int64(0)
	if (fine{}).less(part) && b.per/b.n >= 2 {
		// part · T_b / T_o, in doubles computed identically by the Redis
		// store's script: rounded down, and short of a whole token.
		ratio := intervalOf(b.n, b.per) / intervalOf(o.n, o.per)
		whole := float64(float64(part.ns) + float64(float64(part.frac)/float64(o.n)))
		p = int64(math.Floor(float64(whole * ratio)))
		p = max(min(p, int64(b.per/b.n)-1), 0)
	}
	return b.before(b.after(fine{ns: now}, b.span(b.burst-held)), fine{ns: p})
}

// intervalOf returns per/n as a double: q + r/n, in that order, as the
// Redis store's script computes it.
func intervalOf(n, per uint64) float64 {
	q, r := per/n, per%n
	return float64(float64(q) + float64(float64(r)/float64(n)))
}

// keptDebt returns the most debt, in tokens, a state adopted by b keeps:
// all of it up to what b repays in 2^52 ns (the Redis store's span bound;
// a debt of longer would not be exact there), and never less than b's own
// debt bound. A debt is kept, not capped at b's bound: what a server books
// ahead (a leased bucket's refill) comes back from it as a give-back, and
// giving back what a cap forgot would hand out tokens nobody paid for.
func (b *bucket) keptDebt() int64 {
	most := int64(bounds.MaxCount)
	if b.per/b.n >= 1<<20 { // as the script computes it, whose spans stop at 2^32 tokens
		most = min(b.tokens(fine{ns: 1 << 52})-b.burst, most)
	}
	return max(b.debt, most)
}
