package engine

import (
	"math"
	"time"

	"github.com/admitdev/admit"
)

// SharePool counts the classes that want a shared key (or the subs that
// want a class's part), weighted, over the last two epochs, and for
// concurrency the slots refused classes claim. The zero SharePool is
// empty.
type SharePool struct {
	Epoch int64 // the epoch Cur, New and Claims count; 0: none yet
	Cur   int64 // weight of the classes seen in Epoch
	New   int64 // of that, the weight not seen in the epoch before
	Prev  int64 // weight of the classes seen in the epoch before Epoch
	// Claims and PrevClaims are the slots claimed in Epoch and in the
	// one before by classes refused below their entitled part.
	Claims, PrevClaims int64
}

// roll moves p to epoch e.
func (p *SharePool) roll(e int64) {
	switch p.Epoch {
	case e:
		return
	case e - 1:
		p.Prev, p.PrevClaims = p.Cur, p.Claims
	default:
		p.Prev, p.PrevClaims = 0, 0
	}
	p.Epoch, p.Cur, p.New, p.Claims = e, 0, 0, 0
}

// active returns the weight of the classes seen in the last two epochs.
func (p *SharePool) active() int64 { return p.Prev + p.New }

// claims returns the slots claimed in the last two epochs.
func (p *SharePool) claims() int64 { return max(p.Claims+p.PrevClaims, 0) }

// ShareState is a store's record of one class of a shared key, or of one
// sub of a class, or (Pool only) of the key's classes. The zero ShareState
// is a new one.
type ShareState struct {
	// Level is the assured units the class holds at At (Unix ns); a new
	// class's bucket is full. It is below zero after a debit or a
	// booking.
	Level float64
	At    int64
	// Rate is the class's assured rate at At (units/ns), by which a
	// store knows when its bucket is full again.
	Rate float64
	// Seen is the epoch the class was last counted in its pool, with
	// Weight.
	Seen, Weight int64
	// Claim is the slots a concurrency class claims, counted in its pool
	// in epoch ClaimSeen. Of a fixed window or a quota, whose parts come
	// back only when the period ends, Claim is the units of its part a
	// class or sub took (in the pool's record, all the classes took) in
	// the period that ends at ClaimSeen (Unix µs).
	Claim, ClaimSeen int64
	// Pool counts the key's classes (the pool's record) or the class's
	// subs (a class's record).
	Pool SharePool
	// Top are, in a fixed window's or a quota's pool record, the classes
	// that took most of the period ending at ClaimSeen: a class that took
	// more than its part (its part shrinks as classes arrive) took it
	// from the others' parts, which the others are still owed. Nil in
	// other records; never changed once set (a new one replaces it), so
	// that copies of a record may share it.
	Top *ShareTop
}

// ShareTop holds a period's largest takers, largest first.
type ShareTop [ShareTopK]ShareTaker

// keep records t, the class's taking now: in place of its last, or of the
// smallest when it took more.
func (top *ShareTop) keep(t ShareTaker) {
	i := ShareTopK - 1
	for j := range top {
		if top[j].Class == t.Class {
			i = j
			break
		}
	}
	if top[i].Class != t.Class && top[i].Taken >= t.Taken {
		return // smaller than the smallest kept
	}
	top[i] = t
	for ; i > 0 && top[i].Taken > top[i-1].Taken; i-- {
		top[i], top[i-1] = top[i-1], top[i]
	}
}

// ShareTopK is how many of a period's largest takers a pool record keeps.
const ShareTopK = 8

// ShareTaker is what one class took of a period, with its weight and the
// epoch it last took in.
type ShareTaker struct {
	// Class is a hash of the class's name (shareClassID); 0 is none.
	Class               uint32
	Weight, Taken, Seen int64
}

// shareClassID returns the 32-bit FNV-1a hash of a class's name, never 0.
func shareClassID(class string) uint32 {
	h := uint32(2166136261)
	for i := 0; i < len(class); i++ {
		h ^= uint32(class[i])
		h *= 16777619
	}
	return max(h, 1)
}

// Expiry returns when st is indistinguishable from a new record, for a
// store to forget it: its bucket full again and its epochs and claims
// past. p is the rule the record is for.
func (st *ShareState) Expiry(p *PreparedRule) int64 {
	sp := &p.share
	last := max(st.Seen, st.Pool.Epoch)
	if sp.family != shareWindow {
		last = max(last, st.ClaimSeen)
	}
	e := (last + 2) * sp.epoch
	if sp.family == shareWindow {
		e = max(e, st.ClaimSeen*1000) // what was taken counts until its period ends
	}
	if st.At > 0 && st.Rate > 0 {
		// Full again at the share it was last charged at (a day at most):
		// forgotten sooner, a class in debt would start afresh, full.
		capacity := st.Rate / sp.rate * sp.burst
		if st.Level < capacity {
			e = max(e, st.At+int64(min((capacity-st.Level)/st.Rate, float64(24*time.Hour))))
		}
	}
	return e
}

// share families: how a rule's capacity comes back, which says what the
// other classes may still claim of it.
const (
	shareRefill  uint8 = iota + 1 // buckets: capacity refills continuously
	shareWindow                   // fixed windows and quotas: it comes back when the period ends
	shareSliding                  // sliding windows and logs: it comes back as old counts slide out
	shareSlots                    // concurrency: slots held, then released
)

// shareParams is what deciding a share derives from a rule.
type shareParams struct {
	family uint8
	rate   float64 // units per nanosecond
	burst  float64 // the units a share's bucket holds at most, for shares summing to 1
	pace   float64 // windows: the burst of the pace borrowers draw from
	// once is the most one class takes of the rule at once: its share
	// ceiling of the rule's capacity. A class whose part is full may take
	// up to it in one charge, and owes what it took beyond its part.
	once    float64
	epoch   int64 // ns
	ceiling int64 // concurrency: slots one class holds at most beyond its part
	// top is the part of the rule a class takes at once (its assured
	// bucket's burst, and so what it leaves the others) while it is the
	// only one asking: the share ceiling over the rule's capacity.
	top float64
}

// Bounds on a share's epoch: the time over which a class that asked
// counts as wanting the limit.
const (
	minShareEpoch = int64(time.Second)
	maxShareEpoch = int64(time.Hour)
)

// nominalPeriod is the length a quota's share counts a period as.
var nominalPeriod = [...]time.Duration{admit.Day: 24 * time.Hour, admit.Week: 7 * 24 * time.Hour, admit.Month: 30 * 24 * time.Hour, admit.Year: 365 * 24 * time.Hour}

func shareParamsOf(r *admit.Rule) shareParams {
	var sp shareParams
	sp.top = 0.5
	if c := r.Capacity(); r.ShareCeiling > 0 && c > 0 {
		sp.top = min(float64(r.ShareCeiling)/float64(c), 1)
	}
	perNs := func(n int64, per time.Duration) float64 { return float64(n) / float64(per) }
	// A class's part of a fixed window or a quota is its part of the
	// limit, which it may take at once: the count comes back only when
	// the period ends, then for everyone at once. A sliding window's
	// comes back as old counts slide out, a little at a time, and a
	// class's part of that is a twentieth of the limit, refilled at its
	// rate, or classes whose parts are full would take what comes back
	// first come, first served. What a class borrows beyond its part
	// comes through the pace, which holds a twentieth of the limit: what
	// the pace keeps from the borrowers for the others' bursts is lost
	// when the window ends.
	windowPace := func(limit int64) float64 { return max(1, float64(limit)/20) }
	switch r.Algorithm {
	case admit.TokenBucket, admit.GCRA:
		sp.family, sp.rate, sp.burst = shareRefill, perNs(r.Rate.N, r.Rate.Per), float64(r.Burst)
	case admit.Combination:
		sp.family = shareRefill
		sp.rate = perNs(r.Rate.N, r.Rate.Per) + perNs(r.Floor.N, r.Floor.Per)
		sp.burst = float64(r.Burst + r.Floor.N)
	case admit.FixedWindow, admit.FirstHitWindow:
		sp.family, sp.rate, sp.burst, sp.epoch = shareWindow, perNs(r.Limit, r.Window), float64(r.Limit), int64(r.Window)
		sp.pace = windowPace(r.Limit)
	case admit.Quota:
		p := nominalPeriod[min(int(r.Period), len(nominalPeriod)-1)]
		sp.family, sp.rate, sp.burst, sp.epoch = shareWindow, perNs(r.Limit, p), float64(r.Limit), int64(p)
		sp.pace = windowPace(r.Limit)
	case admit.SlidingWindow, admit.SlidingLog:
		sp.family, sp.rate, sp.burst, sp.epoch = shareSliding, perNs(r.Limit, r.Window), windowPace(r.Limit), int64(r.Window)
		sp.pace = windowPace(r.Limit)
	case admit.Concurrency:
		sp.family, sp.burst = shareSlots, float64(r.Max)
		sp.ceiling = r.ShareCeiling
		if sp.ceiling == 0 {
			sp.ceiling = max(1, r.Max/2)
		}
		// A class's holdings outlast its asking: what it holds counts in
		// the rule whatever the epoch, and its claims stand two epochs,
		// kept short so that a class that gave up stops holding back the
		// others soon.
		sp.epoch = min(max(int64(LeaseTTL(r)/10), minShareEpoch), int64(10*time.Second))
		sp.epoch -= sp.epoch % int64(time.Microsecond)
		sp.once = float64(sp.ceiling)
		return sp
	}
	if sp.family == shareRefill {
		sp.epoch = int64(sp.burst / sp.rate)
		sp.pace = sp.burst
	}
	sp.once = max(math.Floor(sp.top*float64(r.Capacity())), 1)
	sp.epoch = min(max(sp.epoch, minShareEpoch), maxShareEpoch)
	sp.epoch -= sp.epoch % int64(time.Microsecond) // whole µs, as Redis keeps time
	return sp
}

// ShareParams is what deciding the shares of a rule derives from it, for
// a store that decides shares elsewhere (the Redis store's library): see
// DecideShare, which a store must decide exactly as.
type ShareParams struct {
	// Family is how the rule's capacity comes back: 1 it refills (buckets),
	// 2 at a window's or period's end, 3 as a window slides, 4 slots are
	// released (concurrency).
	Family uint8
	// Rate (units per nanosecond) and Burst are the rule's, for shares
	// summing to one; Pace is the burst of a window's pace.
	Rate, Burst, Pace float64
	// Epoch is how long a class that asked counts as active (two epochs
	// at most), a whole number of microseconds.
	Epoch time.Duration
	// Ceiling is a concurrency rule's share ceiling.
	Ceiling int64
	// Top is the part of the rule a class takes at once while it is the
	// only one asking (the share ceiling over the rule's capacity); Once
	// the most of the rule one class takes in one charge.
	Top, Once float64
}

// ShareParams returns p's share parameters.
func (p *PreparedRule) ShareParams() ShareParams {
	sp := &p.share
	return ShareParams{Family: sp.family, Rate: sp.rate, Burst: sp.burst, Pace: sp.pace, Epoch: time.Duration(sp.epoch), Ceiling: sp.ceiling, Top: sp.top, Once: sp.once}
}

// ShareInput is what a store knows of a fair charge when it decides it.
type ShareInput struct {
	// Pool, Class and Sub are the stored records of the key's classes,
	// of the charge's class, and of its sub (when Share.Sub is set);
	// zero when the store has none.
	Pool, Class, Sub ShareState
	Share            *admit.Share
	Cost             int64
	Debit            bool
	// Prepaid says the class's part was paid when the request was
	// booked (see Reserve): only the rule decides.
	Prepaid bool
	// Held and SubHeld are the slots of a concurrency key that the class
	// and its sub hold now, with what this decision took before.
	Held, SubHeld int64
}

// ShareOutcome is the decision of a fair charge's share, and the records a
// store keeps.
type ShareOutcome struct {
	Path admit.SharePath
	// Touched are the records to keep whether the decision is admitted
	// or refused (a class counted, a claim made); Charged those to keep
	// when it is admitted. Each Dirty bit (pool, class, sub) says which
	// differ from the input.
	Touched, Charged [3]ShareState
	TouchedDirty     uint8
	ChargedDirty     uint8
}

// The records of a ShareOutcome, by index and Dirty bit.
const (
	SharePoolRecord = iota
	ShareClassRecord
	ShareSubRecord
)

// DecideShare decides the share of a fair charge at now: res is the
// rule's own result for the charge at its cost (as StepTo or the log and
// lease set decided it), which DecideShare refuses when the class is over
// its share while others want theirs (Share ShareRefused, with the wait
// until it could pass), and whose Remaining becomes what the class may
// still take. A charge the rule refuses stays refused; a debit is never
// refused and is taken from the class's part first. in.Share must be
// valid and p's rule the charge's.
func (p *PreparedRule) DecideShare(res *admit.Result, in *ShareInput, now int64) ShareOutcome {
	sp := &p.share
	e := now/sp.epoch + 1
	var out ShareOutcome
	pool, cls, sub := in.Pool, in.Class, in.Sub
	hasSub := in.Share.Sub != ""
	w := in.Share.Weight
	pool.Pool.roll(e)
	markActive(&pool.Pool, &cls, e, w)
	n := int64(1)
	if hasSub {
		cls.Pool.roll(e)
		markActive(&cls.Pool, &sub, e, 1)
		n = max(cls.Pool.active(), 1)
	}
	s := min(float64(w)/float64(max(pool.Pool.active(), w)), 1)
	c := in.Cost
	res.Shared = res.Remaining
	if sp.family == shareSlots {
		decideSlots(res, sp, &pool, &cls, &sub, in, s, n, e, now, &out)
	} else {
		decideRate(res, sp, &pool, &cls, &sub, in, s, n, e, now, &out)
	}
	if c == 0 {
		// A look counts no class: it keeps nothing.
		out.Touched = [3]ShareState{in.Pool, in.Class, in.Sub}
		out.Charged, out.TouchedDirty, out.ChargedDirty = out.Touched, 0, 0
		return out
	}
	out.TouchedDirty = dirtyBits(&out.Touched, in)
	out.ChargedDirty = dirtyBits(&out.Charged, in)
	if !hasSub {
		out.TouchedDirty &^= 1 << ShareSubRecord
		out.ChargedDirty &^= 1 << ShareSubRecord
	}
	return out
}

func dirtyBits(recs *[3]ShareState, in *ShareInput) uint8 {
	var d uint8
	for i, was := range [3]*ShareState{&in.Pool, &in.Class, &in.Sub} {
		if recs[i] != *was {
			d |= 1 << i
		}
	}
	return d
}

// markActive counts the class st of weight w in pool p at epoch e.
func markActive(p *SharePool, st *ShareState, e, w int64) {
	switch {
	case st.Seen == e:
		if st.Weight != w { // its weight changed within the epoch
			p.Cur += w - st.Weight
			if p.New > 0 {
				p.New = max(p.New+w-st.Weight, 0)
			}
		}
	case st.Seen == e-1 && p.Prev >= st.Weight:
		p.Cur += w
	default: // new, or its pool forgot the epoch it was seen in
		p.Cur += w
		p.New += w
	}
	st.Seen, st.Weight = e, w
}

// level returns st's assured units at now, for a bucket of the given rate
// (units/ns) and cap; a new record is full.
func (st *ShareState) level(now int64, rate, cap float64) float64 {
	if st.At == 0 {
		return cap
	}
	l := st.Level
	if now > st.At {
		l += float64(now-st.At) * rate
	}
	return min(l, cap)
}

// decideRate decides the share of a charge of a rule whose capacity is
// spent: buckets, windows, quotas, sliding windows and logs.
func decideRate(res *admit.Result, sp *shareParams, pool, cls, sub *ShareState, in *ShareInput, s float64, n int64, e, now int64, out *ShareOutcome) {
	c := in.Cost
	fc := float64(c)
	hasSub := in.Share.Sub != ""
	// A class alone takes the rule's rate, but of its stock (a bucket's
	// burst, a window's pace) only the share ceiling at once: what it
	// leaves is there for a class that comes.
	alone := s >= 1
	top := s
	if alone {
		top = sp.top
	}
	rate, capC := s*sp.rate, top*sp.burst
	subRate, capS := rate/float64(n), capC/float64(n)
	// A fixed window's or a quota's part is counted in its period: what a
	// class took of it comes back when the period ends, for everyone at
	// once. (A bucket refilled at the class's rate would give it its part
	// once at the start and again over the period.)
	windowed := sp.family == shareWindow
	var period int64 // the period's end, Unix µs
	if windowed {
		period = (now + int64(res.ResetAfter)) / 1000
	}
	taken := func(st *ShareState) float64 {
		if st.ClaimSeen == period {
			return float64(st.Claim)
		}
		return 0
	}
	level := func(st *ShareState, rate, cap float64) float64 {
		if windowed {
			return cap - taken(st)
		}
		return st.level(now, rate, cap)
	}
	// Parts shrink as classes come: a class that took its part of a
	// period when fewer wanted it may hold more than its part now, taken
	// from the others' parts. What is left is divided by water-filling:
	// the classes that hold more than the level they would share keep it
	// (a taking is not given back), and the others share the rest by
	// weight, each up to the same level per unit of weight. The period's
	// largest takers (the pool's Top) are the ones that may hold more;
	// the others are taken to hold less. Without it, classes arriving one
	// after another each took their whole part out of an earlier one's.
	lc := level(cls, rate, capC)
	owed := 0.0 // what the other active classes may still take as theirs
	id := uint32(0)
	if windowed && !alone {
		id = shareClassID(in.Share.Class)
		lc, owed = waterFill(sp.burst, float64(in.Share.Weight)/s, float64(in.Share.Weight), taken(cls), taken(pool), pool, id, e, period)
	}
	ls := 0.0
	if hasSub {
		ls = level(sub, subRate, capS)
	}
	// What the other active classes may still claim of the rule, which a
	// class borrowing beyond its share must leave: their buckets' worth.
	// A bucket's tokens come back at its rate, so the rule's own
	// remaining measures it; a window's count comes back only when the
	// window ends or slides, so the key's pool keeps a pace, a bucket of
	// the rule's rate and burst that every admission draws from, and a
	// class borrows only from the pace.
	reserve := (1 - top) * sp.pace
	paced := sp.family != shareRefill
	room := func(rem, fc float64) float64 { return rem }
	var pace float64
	if paced {
		pace = pool.level(now, sp.rate, sp.pace)
		room = func(rem, fc float64) float64 { return min(rem, pace-fc) }
	}
	unpaced := alone && top >= 1 // a ceiling of the whole rule: first come, first served
	// What a class borrowing leaves the other active classes of a period,
	// which comes back only when it ends: what they have yet to take of
	// their parts, but no more than their parts of what is left of the
	// period. A class asking steadily within its part is never short,
	// and what the others leave of theirs is lent as the period runs out.
	// What the others have yet to take of their parts: a class that
	// holds more than its part holds it out of theirs.
	keep, keepTime := 0.0, 0.0
	if windowed && !alone {
		keepTime = (1 - s) * sp.rate * float64(res.ResetAfter)
		keep = max(min(owed, keepTime), 0)
	}
	borrowable := func(rem, fc float64) float64 { return min(room(rem, fc)-reserve, rem-keep) }
	// need is what a part of cap must hold to take cost x as its own: a
	// bucket's, a full one, x or less (the class owes the rest, repaid at
	// its rate); a period's, x itself, for what a class takes beyond its
	// part of a period is the others' until it ends (two classes taking
	// the ceiling at a window's start once left a third nothing). A part
	// smaller than a unit admits one unit when untouched.
	need := func(x, cap float64) float64 {
		if windowed && cap >= 1 {
			return x
		}
		return min(x, cap)
	}
	// What the class's sub may take of the class's part beyond its own,
	// leaving the other subs theirs.
	subLend := func(l float64) float64 { return l - (1-1/float64(n))*capC }

	out.Touched = [3]ShareState{*pool, *cls, *sub}
	path := admit.ShareNone
	takeC, takeS := 0.0, 0.0
	switch {
	case c == 0:
	case in.Prepaid:
		if res.Allowed {
			path = admit.ShareAssured
		}
	case in.Debit:
		path, takeC, takeS = admit.ShareAssured, fc, fc
	case !res.Allowed:
	default:
		// Within the class's part: its bucket holds the cost, or is full
		// and the cost is more than its part but no more than one class
		// takes at once (then it owes the rest, repaid at its rate).
		assured := fc <= sp.once && lc >= need(fc, capC)
		subOwn := true
		if hasSub && assured {
			subOwn = ls >= need(fc, capS)
			assured = subOwn || subLend(lc)-fc >= 0
		}
		switch {
		case assured:
			path, takeC = admit.ShareAssured, fc
			if hasSub && subOwn {
				takeS = fc
			}
		case unpaced || borrowable(float64(res.Remaining), fc) >= 0:
			path = admit.ShareBorrowed
		default:
			path = admit.ShareRefused
		}
	}
	out.Path = path
	res.Share = path
	out.Charged = out.Touched
	if paced && c > 0 && (path == admit.ShareAssured || path == admit.ShareBorrowed) {
		pc := &out.Charged[SharePoolRecord]
		pc.Level, pc.At, pc.Rate = max(pace-fc, -sp.pace), now, sp.rate
	}
	if takeC > 0 && windowed {
		charge := func(st *ShareState, take, most float64) {
			st.Claim, st.ClaimSeen = int64(min(taken(st)+take, most)), period
		}
		pc := &out.Charged[SharePoolRecord]
		var top ShareTop
		if pc.ClaimSeen == period && pc.Top != nil {
			top = *pc.Top
		}
		charge(pc, takeC, 2*sp.burst)
		charge(&out.Charged[ShareClassRecord], takeC, capC+sp.burst)
		if id == 0 {
			id = shareClassID(in.Share.Class)
		}
		top.keep(ShareTaker{Class: id, Weight: in.Share.Weight, Taken: out.Charged[ShareClassRecord].Claim, Seen: e})
		pc.Top = &top
		if takeS > 0 {
			charge(&out.Charged[ShareSubRecord], takeS, capS+sp.burst)
		}
	} else if takeC > 0 {
		floor := -sp.burst
		ch := &out.Charged[ShareClassRecord]
		ch.Level, ch.At, ch.Rate = max(lc-takeC, floor), now, rate
		if takeS > 0 {
			ch := &out.Charged[ShareSubRecord]
			ch.Level, ch.At, ch.Rate = max(ls-takeS, floor), now, subRate
		}
	}

	// What the class may take next: its assured units, or what it may
	// borrow, never more than the rule has.
	after := out.Touched
	if path == admit.ShareAssured || path == admit.ShareBorrowed {
		after = out.Charged
	}
	lcA := level(&after[ShareClassRecord], rate, capC)
	if windowed && !alone {
		lcA = lc - takeC // what it took, if it was charged
	}
	own := lcA
	if hasSub {
		own = min(lcA, max(level(&after[ShareSubRecord], subRate, capS), subLend(lcA)))
	}
	rem := float64(res.Remaining)
	left := rem // what the rule holds after the decision
	if path == admit.ShareRefused {
		left += fc // nothing was charged
	}
	if paced && (path == admit.ShareAssured || path == admit.ShareBorrowed) {
		pace -= fc
	}
	vis := min(left, max(math.Floor(max(own, 0)), math.Floor(borrowable(left, 0))))
	if unpaced {
		vis = left
	}
	if path != admit.ShareNone || c == 0 {
		res.Remaining = max(int64(vis), 0)
	}
	if path != admit.ShareRefused {
		return
	}
	res.Allowed = false
	res.Shared += c // the rule holds what it held: nothing was charged
	// Over its part as a class (every sub would be refused), or only as
	// a sub; the wait is the class's then, what each sub waits at least.
	whole := !(fc <= sp.once && lc >= need(fc, capC))
	res.ShareWhole = whole && hasSub
	// The earliest the class could pass: its share refilled, the rule
	// holding enough beyond the others' claims, or the next epoch, when
	// classes that stopped asking no longer count.
	wait := float64(now - now%sp.epoch + sp.epoch - now) // to the epoch's end
	if windowed && fc <= sp.once {
		wait = min(wait, float64(res.ResetAfter)) // its part comes back
	} else if rate > 0 && fc <= sp.once {
		need := (min(fc, capC) - lc) / rate
		if hasSub && !whole {
			own := (min(fc, capS) - ls) / subRate
			lend := ((1-1/float64(n))*capC + fc - lc) / rate
			need = max(need, min(own, lend))
		}
		wait = min(wait, max(need, 0))
	}
	// The rule's remaining and the pace come back at most at the rule's
	// rate.
	if sp.rate > 0 {
		back := (reserve - room(rem, fc)) / sp.rate
		if rem < keep {
			// What is left is the others' until their parts of the
			// period left are no more than it.
			back = max(back, (keepTime-rem)/((1-s)*sp.rate))
		}
		wait = min(wait, back)
	}
	res.RetryAfter = time.Duration(math.Ceil(max(wait, 1)))
}

// decideSlots decides the share of a concurrency charge: the class takes
// slots within its entitled part (its weighted share of the slots), or
// borrows beyond it up to the rule's ceiling while no other class claims
// the free slots. A class refused below its entitled part claims what it
// lacks, for two epochs.
func decideSlots(res *admit.Result, sp *shareParams, pool, cls, sub *ShareState, in *ShareInput, s float64, n int64, e, now int64, out *ShareOutcome) {
	c := in.Cost
	hasSub := in.Share.Sub != ""
	entitled := max(1, int64(math.Floor(s*sp.burst)))
	ceiling := sp.ceiling
	if s < 1 {
		ceiling = max(ceiling, entitled)
	}
	subCap := ceiling
	if hasSub {
		subCap = max(1, (ceiling+n-1)/n)
	}
	own := int64(0)
	if cls.ClaimSeen == e || cls.ClaimSeen == e-1 {
		own = cls.Claim
	}
	others := max(pool.Pool.claims()-own, 0)
	h, hs := in.Held, in.SubHeld

	path := admit.ShareNone
	claim := int64(-1) // unchanged
	switch {
	case c == 0:
	case !res.Allowed:
		if h+c <= entitled {
			claim = min(entitled-h, max(c, own))
		}
	case h+c > ceiling || hasSub && hs+c > subCap:
		path = admit.ShareRefused
	case h+c <= entitled:
		path = admit.ShareAssured
		claim = max(own-c, 0)
	case res.Remaining >= others:
		path = admit.ShareBorrowed
	default:
		path = admit.ShareRefused
	}
	if claim >= 0 && claim != own {
		setClaim(&pool.Pool, cls, e, claim)
	}
	out.Touched = [3]ShareState{*pool, *cls, *sub}
	out.Charged = out.Touched
	out.Path = path
	res.Share = path

	hA := h
	if path == admit.ShareAssured || path == admit.ShareBorrowed {
		hA = h + c
	}
	left := res.Remaining // what the rule holds after the decision
	if path == admit.ShareRefused {
		left += c // nothing was charged
	}
	vis := min(left, ceiling-hA, max(entitled-hA, left-others))
	if hasSub {
		hsA := hs
		if hA > h {
			hsA += c
		}
		vis = min(vis, subCap-hsA)
	}
	if path != admit.ShareNone || c == 0 {
		res.Remaining = max(vis, 0)
	}
	if path == admit.ShareRefused {
		res.Allowed = false
		res.Shared += c
		res.RetryAfter = max(res.RetryAfter, time.Duration(now-now%sp.epoch+sp.epoch-now))
	}
}

// setClaim makes st's claim amount slots, counted in pool p at epoch e.
func setClaim(p *SharePool, st *ShareState, e, amount int64) {
	switch st.ClaimSeen {
	case e:
		p.Claims -= st.Claim
	case e - 1:
		p.PrevClaims = max(p.PrevClaims-st.Claim, 0)
	}
	st.Claim, st.ClaimSeen = 0, 0
	if amount > 0 {
		st.Claim, st.ClaimSeen = amount, e
		p.Claims += amount
	}
	p.Claims = max(p.Claims, 0)
}

// CheckShareCost reports whether a check of cost can ever be admitted by
// p's rule when its charge carries a share: no class takes more than the
// rule's share ceiling at once, so a larger cost is a request error, never
// a silent refusal. Debits are not bounded by it.
func (p *PreparedRule) CheckShareCost(cost int64) error {
	if float64(cost) <= p.share.once {
		return nil
	}
	e := admit.Errorf(admit.CodeInvalid, "cost %d is more than one class of callers takes of rule %q, which tenants share, at once (%d, its share ceiling)", cost, p.rule.Name, int64(p.share.once))
	e.Field = "cost"
	return e
}

// ShareYields reports whether a class holding held slots of p's
// concurrency rule, of record cls in the key's pool record pool, must
// yield them at now rather than renew its lease: it holds more than its
// entitled part while another class, refused below its own, claims slots.
// A class that holds its part, or borrows what no one claims, renews.
func (p *PreparedRule) ShareYields(pool, cls ShareState, held, now int64) bool {
	sp := &p.share
	if sp.family != shareSlots || held <= 0 {
		return false
	}
	e := now/sp.epoch + 1
	pp := pool.Pool
	pp.roll(e)
	w := max(cls.Weight, 1)
	active := pp.active()
	if cls.Seen < e-1 || pp.Prev < w && cls.Seen == e-1 {
		active += w // renewing does not count a class; it wants what it holds
	}
	s := min(float64(w)/float64(max(active, w)), 1)
	entitled := max(1, int64(math.Floor(s*sp.burst)))
	own := int64(0)
	if cls.ClaimSeen == e || cls.ClaimSeen == e-1 {
		own = cls.Claim
	}
	return held > entitled && pp.claims()-own > 0
}

// waterFill returns what a class of weight w, which took t of a period's
// limit L, may still take as its own, and what the other active classes
// may (owed), when the active classes weigh total, all of them took taken
// (the pool's count), and pool's Top, for the period ending at period,
// names the largest takers (id is the class's own entry, e the epoch).
// The level per unit of weight, lambda, solves Σ max(t_j, lambda·w_j) =
// L: a class that took more than lambda·w_j keeps it, the others share
// the rest. A taker no longer active keeps what it took and shares nothing.
func waterFill(limit, total, w, t, taken float64, pool *ShareState, id uint32, e, period int64) (mine, owed float64) {
	type cand struct {
		w, t   float64
		active bool
		fixed  bool // holds more than its level: keeps what it took
	}
	var cs [ShareTopK + 1]cand
	cs[0] = cand{w: w, t: t, active: true}
	n := 1
	if pool.ClaimSeen == period && pool.Top != nil {
		for _, tk := range pool.Top {
			if tk.Class != 0 && tk.Class != id {
				cs[n] = cand{w: float64(tk.Weight), t: float64(tk.Taken), active: tk.Seen >= e-1}
				n++
			}
		}
	}
	fixedT, fixedW := 0.0, 0.0
	level := func() float64 {
		if total-fixedW <= 0 {
			return 0
		}
		return max(limit-fixedT, 0) / (total - fixedW)
	}
	for {
		lambda := level()
		best, bestR := -1, 0.0
		for j := range n {
			c := &cs[j]
			if c.fixed || c.active && c.t <= lambda*c.w {
				continue
			}
			r := math.Inf(1) // an inactive taker keeps what it took
			if c.active {
				r = c.t / c.w
			}
			if best < 0 || r > bestR {
				best, bestR = j, r
			}
		}
		if best < 0 {
			break
		}
		c := &cs[best]
		c.fixed, fixedT = true, fixedT+c.t
		if c.active {
			fixedW += c.w
		}
	}
	lambda := level()
	mine = lambda*w - t
	// The other active classes below their level: their weight and what
	// they took (every class the Top does not name is among them).
	restW, restT := total-fixedW, taken-fixedT
	if !cs[0].fixed {
		restW, restT = restW-w, restT-t
	}
	return mine, max(lambda*restW-restT, 0)
}
