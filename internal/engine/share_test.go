package engine

import (
	"fmt"
	"testing"
	"time"

	"github.com/admitdev/admit"
	"github.com/admitdev/admit/internal/bounds"
)

// shareKey is the states a store keeps for one key of a shared rule: the
// rule's own, the pool, and each class's and sub's records.
type shareKey struct {
	p     *PreparedRule
	st    [2]State
	pool  ShareState
	recs  map[string]ShareState
	slots map[string]int64 // concurrency: slots held per class
	held  int64
}

func newShareKey(t *testing.T, r *admit.Rule) *shareKey {
	t.Helper()
	p, err := Prepare(r)
	if err != nil {
		t.Fatal(err)
	}
	return &shareKey{p: p, recs: map[string]ShareState{}, slots: map[string]int64{}}
}

// decide decides a charge of cost for share at now (ns after t0), all or
// nothing as a store does, and returns the result.
func (k *shareKey) decide(share admit.Share, now, cost int64, debit bool) admit.Result {
	var res admit.Result
	next := k.st
	if k.p.rule.Algorithm == admit.Concurrency {
		res = admit.Result{Rule: k.p.rule.Name, Limit: k.p.rule.Max}
		if k.held+cost <= k.p.rule.Max {
			res.Allowed, res.Remaining = true, k.p.rule.Max-k.held-cost
		} else {
			res.Remaining, res.RetryAfter = k.p.rule.Max-k.held, time.Second
		}
	} else {
		next = k.p.StepTo(&res, k.st, now, cost, debit)
	}
	in := ShareInput{Pool: k.pool, Class: k.recs[share.Class], Share: &share, Cost: cost, Debit: debit, Held: k.slots[share.Class]}
	if share.Sub != "" {
		in.Sub = k.recs[share.Class+"/"+share.Sub]
	}
	out := k.p.DecideShare(&res, &in, now)
	admitted := (res.Allowed || debit) && cost > 0
	recs := out.Touched
	if admitted {
		recs = out.Charged
		k.st = next
		if k.p.rule.Algorithm == admit.Concurrency {
			k.held += cost
			k.slots[share.Class] += cost
		}
	}
	k.pool, k.recs[share.Class] = recs[SharePoolRecord], recs[ShareClassRecord]
	if share.Sub != "" {
		k.recs[share.Class+"/"+share.Sub] = recs[ShareSubRecord]
	}
	return res
}

const t0 = int64(1_767_225_600_000_000_000) // 2026-01-01, a second's start

// TestShareBucketTimeline: a bucket of 10 tokens and 10/s shared by equal
// classes.
func TestShareBucketTimeline(t *testing.T) {
	r := &admit.Rule{Name: "g", Algorithm: admit.TokenBucket, Rate: admit.PerSecond(10), Burst: 10}
	k := newShareKey(t, r)
	a, b := admit.Share{Class: "a", Weight: 1}, admit.Share{Class: "b", Weight: 1}
	// Alone, a takes the share ceiling of the stock at once (half): 5.
	for i := range 5 {
		if res := k.decide(a, t0, 1, false); !res.Allowed || res.Share != admit.ShareAssured {
			t.Fatalf("a's check %d alone: %+v", i, res)
		}
	}
	res := k.decide(a, t0, 1, false)
	if res.Allowed || res.Share != admit.ShareRefused || res.Shared != 5 || res.RetryAfter != 100*time.Millisecond {
		t.Fatalf("a's sixth check alone: %+v, want refused over its share, 5 left, retry 100ms (its next token)", res)
	}
	// But a takes the rule's rate: a token 100 ms later.
	if res := k.decide(a, t0+int64(100*time.Millisecond), 1, false); !res.Allowed {
		t.Fatalf("a's token 100ms later: %+v", res)
	}
	// b arrives and finds its part at once: half the burst, 5.
	for i := range 5 {
		if res := k.decide(b, t0+int64(100*time.Millisecond), 1, false); !res.Allowed || res.Share != admit.ShareAssured {
			t.Fatalf("b's check %d: %+v", i, res)
		}
	}
	// Both active: a's next token comes at its share of the rate, 5/s.
	now := t0 + int64(100*time.Millisecond)
	if res := k.decide(a, now+int64(100*time.Millisecond), 1, false); res.Allowed {
		t.Fatalf("a 100ms later, now at half the rate: %+v", res)
	}
	if res := k.decide(a, now+int64(200*time.Millisecond), 1, false); !res.Allowed {
		t.Fatalf("a 200ms later: %+v", res)
	}
}

// TestShareWindowTimeline: a fixed window of 100 a 10 s window shared by
// two classes. A class's part of the window is not refilled while the
// window runs (refilled at its rate, a class would take its part once at
// the start and again over the window); a class asking steadily within its
// part gets all it asks beside one flooding; what it leaves is lent as the
// window runs out; the parts come back when the window ends.
func TestShareWindowTimeline(t *testing.T) {
	r := &admit.Rule{Name: "w", Algorithm: admit.FixedWindow, Limit: 100, Window: 10 * time.Second}
	k := newShareKey(t, r)
	a, b := admit.Share{Class: "a", Weight: 1}, admit.Share{Class: "b", Weight: 1}
	for i := range 50 {
		if res := k.decide(a, t0, 1, false); res.Share != admit.ShareAssured {
			t.Fatalf("a's check %d alone: %+v", i, res)
		}
	}
	if res := k.decide(a, t0+int64(5*time.Second), 1, false); res.Share == admit.ShareAssured {
		t.Errorf("half a window later, a's part of the window came back: %+v", res)
	}
	if res := k.decide(a, t0+int64(10*time.Second), 1, false); res.Share != admit.ShareAssured {
		t.Errorf("the next window, a's part: %+v", res)
	}

	k = newShareKey(t, r)
	const start = 2 * int64(10*time.Second) // a window's start
	got := map[string]int{}
	for at := int64(0); at < int64(10*time.Second); at += int64(10 * time.Millisecond) {
		if k.decide(a, t0+start+at, 1, false).Allowed {
			got["a"]++
		}
		if at%int64(200*time.Millisecond) == 0 {
			if res := k.decide(b, t0+start+at, 1, false); res.Allowed {
				got["b"]++
			} else {
				t.Errorf("b, asking half its part, refused at %v: %+v", time.Duration(at), res)
			}
		}
	}
	if got["a"]+got["b"] > 100 || got["b"] != 50 || got["a"] < 45 {
		t.Errorf("a flooding took %d, b at half its part %d of 50; want b all, a at least 45 (its part, and some of what b left), 100 in all at most", got["a"], got["b"])
	}
}

// TestShareWindowNoOverdraw: a class takes no more than its part of a
// window as its own. Two classes asking the share ceiling (300 of 600)
// at each window's start once took all of it while a third, active and
// asking little, got nothing for the whole window: with three active,
// a charge beyond a part of 200 is borrowed only from what the others
// will not need, so each of the two takes 200 and the third its own.
func TestShareWindowNoOverdraw(t *testing.T) {
	r := &admit.Rule{Name: "w", Algorithm: admit.FixedWindow, Limit: 600, Window: 10 * time.Second}
	k := newShareKey(t, r)
	v, a, b := admit.Share{Class: "victim", Weight: 1}, admit.Share{Class: "a", Weight: 1}, admit.Share{Class: "b", Weight: 1}
	const w = int64(10 * time.Second)
	start := 2 * w // a window's start
	for _, c := range []admit.Share{v, a, b} {
		k.decide(c, t0+start-w+1, 1, false) // all three want the window
	}
	for _, c := range []admit.Share{a, b} {
		if res := k.decide(c, t0+start, 300, false); res.Allowed {
			t.Errorf("%s took 300 of a window whose part is 200 at its start: %+v", c.Class, res)
		}
		if res := k.decide(c, t0+start, 200, false); !res.Allowed || res.Share != admit.ShareAssured {
			t.Errorf("%s, its part of 200: %+v", c.Class, res)
		}
	}
	got := 0
	for i := range 200 {
		if k.decide(v, t0+start+int64(i)*int64(10*time.Millisecond), 1, false).Allowed {
			got++
		}
	}
	if got < 190 {
		t.Errorf("the victim got %d of its part of 200 after the others took theirs", got)
	}
}

// TestShareQuotaLateClass: a class that took its part of a day's quota
// when two classes wanted it holds more than its part once a third comes
// (500 of parts of 333). The third does not take its whole new part out
// of the first's, which that one has yet to use (once the first ended the
// day with 163 of its 333): the two share the shortfall, 83 each.
func TestShareQuotaLateClass(t *testing.T) {
	r := &admit.Rule{Name: "q", Algorithm: admit.Quota, Limit: 1000, Period: admit.Day}
	k := newShareKey(t, r)
	v, a, n := admit.Share{Class: "victim", Weight: 1}, admit.Share{Class: "a", Weight: 1}, admit.Share{Class: "n", Weight: 1}
	m := int64(time.Minute)
	if res := k.decide(v, t0+m, 1, false); !res.Allowed {
		t.Fatalf("the victim's first: %+v", res)
	}
	if res := k.decide(a, t0+m, 500, false); !res.Allowed || res.Share != admit.ShareAssured {
		t.Fatalf("a's part beside the victim: %+v", res)
	}
	if res := k.decide(n, t0+10*m, 333, false); res.Allowed {
		t.Errorf("a third class took 333 while the victim has 332 of its part to take and 499 remain: %+v", res)
	}
	if res := k.decide(n, t0+10*m, 167, false); !res.Allowed {
		t.Errorf("the third class, its part less its half of the shortfall: %+v", res)
	}
	got := int64(0)
	for i := range 33 {
		if k.decide(v, t0+20*m+int64(i)*int64(time.Second), 10, false).Allowed {
			got += 10
		}
	}
	if got < 240 {
		t.Errorf("the victim got %d more of its part of 333 (1 taken, 83 its half of the shortfall)", got)
	}
}

// TestShareQuotaSuccessiveArrivals: attacker classes arrive one after
// another in a day's quota, each taking all it may, while the victim,
// there first, keeps asking a unit; then the victim takes all it may.
// Each newcomer shares what is left with the classes below their level,
// so the victim ends with its part of what was left when the last came
// (once 84 where that was 125, and 4 of 1,000 against six attackers, 16
// their fair end).
func TestShareQuotaSuccessiveArrivals(t *testing.T) {
	for _, c := range []struct {
		attackers int
		want      int64 // the victim's fair end: its share of what was left
	}{{3, 125}, {6, 16}} {
		r := &admit.Rule{Name: "q", Algorithm: admit.Quota, Limit: 1000, Period: admit.Day}
		k := newShareKey(t, r)
		v := admit.Share{Class: "victim", Weight: 1}
		at := t0 + int64(time.Minute)
		most := func(sh admit.Share) int64 {
			took := int64(0)
			for cost := int64(500); cost >= 1; {
				if k.decide(sh, at, cost, false).Allowed {
					took += cost
				} else {
					cost /= 2
				}
				at += int64(time.Millisecond)
			}
			return took
		}
		victim := int64(0)
		if k.decide(v, at, 1, false).Allowed {
			victim++
		}
		var took []int64
		for i := range c.attackers {
			took = append(took, most(admit.Share{Class: fmt.Sprintf("a%d", i), Weight: 1}))
			if k.decide(v, at, 1, false).Allowed { // still wants it
				victim++
			}
		}
		victim += most(v)
		t.Logf("%d attackers took %v; the victim %d", c.attackers, took, victim)
		if victim < c.want*9/10 {
			t.Errorf("%d attackers arriving one after another left the victim %d, want about %d (its part of what was left)", c.attackers, victim, c.want)
		}
	}
}

// TestShareQuotaRecords: what a class took of a month's quota counts until
// the month ends: its record is not forgotten with its epochs (an hour),
// or it would take its part again.
func TestShareQuotaRecords(t *testing.T) {
	r := &admit.Rule{Name: "q", Algorithm: admit.Quota, Limit: 1000, Period: admit.Month}
	k := newShareKey(t, r)
	a := admit.Share{Class: "a", Weight: 1}
	k.decide(a, t0, 10, false)
	end := time.Date(2026, 2, 1, 0, 0, 0, 0, time.UTC).UnixNano()
	rec := k.recs["a"]
	if got := rec.Expiry(k.p); got != end {
		t.Errorf("the class's record expires at %v, want the month's end %v", time.Unix(0, got).UTC(), time.Unix(0, end).UTC())
	}
	if got := k.pool.Expiry(k.p); got != end {
		t.Errorf("the pool's record expires at %v, want the month's end", time.Unix(0, got).UTC())
	}
}

// TestShareWeights: classes of weights 3 and 1 take 3/4 and 1/4 of the
// burst.
func TestShareWeights(t *testing.T) {
	r := &admit.Rule{Name: "g", Algorithm: admit.TokenBucket, Rate: admit.PerSecond(1), Burst: 40}
	k := newShareKey(t, r)
	heavy, light := admit.Share{Class: "heavy", Weight: 3}, admit.Share{Class: "light", Weight: 1}
	k.decide(light, t0, 0, false) // a look counts no one
	k.decide(light, t0, 1, false) // light is active
	got := 0
	for k.decide(heavy, t0, 1, false).Allowed {
		got++
	}
	if got != 30 {
		t.Errorf("heavy took %d of 40 beside light, want 30 (3/4)", got)
	}
	got = 1
	for k.decide(light, t0, 1, false).Allowed {
		got++
	}
	if got != 10 {
		t.Errorf("light took %d of 40 beside heavy, want 10 (1/4)", got)
	}
}

// TestShareEpochs: a class that stops asking counts for two epochs, then
// no longer, and the other takes the whole rate again.
func TestShareEpochs(t *testing.T) {
	r := &admit.Rule{Name: "g", Algorithm: admit.TokenBucket, Rate: admit.PerSecond(10), Burst: 10} // epoch 1 s
	k := newShareKey(t, r)
	a, b := admit.Share{Class: "a", Weight: 1}, admit.Share{Class: "b", Weight: 1}
	k.decide(b, t0, 1, false)
	for k.decide(a, t0, 1, false).Allowed {
	}
	// b stays counted through the next epoch: a's share is half.
	if s := shareOf(k, a, t0+int64(1500*time.Millisecond)); s != 0.5 {
		t.Errorf("a's share 1.5 s after b asked: %v, want 0.5", s)
	}
	if s := shareOf(k, a, t0+int64(2500*time.Millisecond)); s != 1 {
		t.Errorf("a's share 2.5 s after b asked: %v, want 1", s)
	}
}

// shareOf returns share's part of k at now, as a look sees it.
func shareOf(k *shareKey, share admit.Share, now int64) float64 {
	in := ShareInput{Pool: k.pool, Class: k.recs[share.Class], Share: &share}
	pool, cls := in.Pool, in.Class
	e := now/k.p.share.epoch + 1
	pool.Pool.roll(e)
	markActive(&pool.Pool, &cls, e, share.Weight)
	return min(float64(share.Weight)/float64(max(pool.Pool.active(), share.Weight)), 1)
}

// TestShareDebitsAndLooks: a debit is taken from the class's part first
// and is never refused; a look (cost 0) reports what the class may take
// and keeps nothing.
func TestShareDebitsAndLooks(t *testing.T) {
	r := &admit.Rule{Name: "g", Algorithm: admit.TokenBucket, Rate: admit.PerSecond(1), Burst: 20}
	k := newShareKey(t, r)
	a, b := admit.Share{Class: "a", Weight: 1}, admit.Share{Class: "b", Weight: 1}
	k.decide(b, t0, 1, false)
	pool := k.pool
	look := k.decide(a, t0, 0, false)
	if k.pool != pool || look.Remaining != 10 {
		t.Errorf("a look: pool changed %v, remaining %d, want unchanged and 10 (a's part)", k.pool != pool, look.Remaining)
	}
	if res := k.decide(a, t0, 15, true); res.Share != admit.ShareAssured {
		t.Fatalf("a's debit of 15: %+v", res)
	}
	if lv := k.recs["a"].Level; lv != -5 {
		t.Errorf("a's part after a debit of 15: %v, want -5", lv)
	}
	// a is in debt: nothing of its own, and the rule's 4 left are b's.
	if res := k.decide(a, t0, 1, false); res.Allowed || res.Share != admit.ShareRefused {
		t.Errorf("a in debt: %+v, want refused over its share", res)
	}
}

// TestShareSubs: the anonymous callers' part is divided among their
// addresses equally.
func TestShareSubs(t *testing.T) {
	r := &admit.Rule{Name: "g", Algorithm: admit.TokenBucket, Rate: admit.PerSecond(1), Burst: 40}
	k := newShareKey(t, r)
	tenant := admit.Share{Class: "tenant:x", Weight: 1}
	k.decide(tenant, t0, 1, false)
	one, two := admit.Share{Class: "anonymous", Weight: 1, Sub: "192.0.2.1"}, admit.Share{Class: "anonymous", Weight: 1, Sub: "192.0.2.2"}
	k.decide(two, t0, 1, false) // the second address is active
	got := 0
	for k.decide(one, t0, 1, false).Share == admit.ShareAssured {
		got++
	}
	if got != 10 {
		t.Errorf("one address took %d of the anonymous part's 20 beside another, want 10", got)
	}
}

// TestShareSlots: concurrency slots held within the entitled part, beyond
// it up to the ceiling, and not while a class below its part has claimed.
func TestShareSlots(t *testing.T) {
	r := &admit.Rule{Name: "slots", Algorithm: admit.Concurrency, Max: 10}
	k := newShareKey(t, r)
	a, b := admit.Share{Class: "a", Weight: 1}, admit.Share{Class: "b", Weight: 1}
	// Alone, a holds at most the ceiling: 5.
	for i := range 5 {
		if res := k.decide(a, t0, 1, false); !res.Allowed {
			t.Fatalf("a's slot %d: %+v", i, res)
		}
	}
	if res := k.decide(a, t0, 1, false); res.Allowed || res.Share != admit.ShareRefused {
		t.Fatalf("a's sixth slot alone: %+v, want refused at the ceiling", res)
	}
	// b takes its 5; the rule is full; b asks for a sixth (beyond its
	// part, no claim), a frees one and b borrows it.
	for i := range 5 {
		if res := k.decide(b, t0, 1, false); !res.Allowed || res.Share != admit.ShareAssured {
			t.Fatalf("b's slot %d: %+v", i, res)
		}
	}
	// A third class, refused while the rule is full, claims its part (3).
	c := admit.Share{Class: "c", Weight: 1}
	if res := k.decide(c, t0, 1, false); res.Allowed {
		t.Fatalf("c on a full rule: %+v", res)
	}
	if cl := k.recs["c"].Claim; cl != 1 {
		t.Errorf("c's claim: %d, want 1", cl)
	}
	// a frees a slot: b may not borrow it (c claims it); c takes it.
	k.held--
	k.slots["a"]--
	if res := k.decide(b, t0, 1, false); res.Allowed {
		t.Errorf("b borrowed the slot c claimed: %+v", res)
	}
	if res := k.decide(c, t0, 1, false); !res.Allowed || res.Share != admit.ShareAssured {
		t.Errorf("c's claimed slot: %+v", res)
	}
	if cl := k.recs["c"].Claim; cl != 0 {
		t.Errorf("c's claim after its slot: %d, want 0", cl)
	}
}

// FuzzShare drives a shared rule of arbitrary parameters with arbitrary
// classes, costs and times, and checks what every decision must hold: a
// share refuses only what the rule admits, and then says when to come
// back; what a class may take is never negative nor more than the rule
// has; every record stays finite and expires.
func FuzzShare(f *testing.F) {
	f.Add(uint8(1), uint32(10), uint32(10), []byte{0, 1, 2, 3, 4, 5, 6, 7, 8, 9})
	f.Add(uint8(3), uint32(600), uint32(6000), []byte{9, 200, 3, 1, 0, 255, 17})
	f.Add(uint8(7), uint32(4), uint32(1), []byte{1, 1, 1, 2, 2, 2, 3, 3})
	f.Fuzz(func(t *testing.T, alg uint8, n, size uint32, steps []byte) {
		algs := []admit.Algorithm{admit.TokenBucket, admit.GCRA, admit.FixedWindow, admit.SlidingWindow, admit.SlidingLog, admit.Combination, admit.Concurrency, admit.Quota}
		r := &admit.Rule{Name: "g", Algorithm: algs[int(alg)%len(algs)]}
		n, size = n%1000+1, size%10_000+1
		switch r.Algorithm {
		case admit.TokenBucket, admit.GCRA:
			r.Rate, r.Burst = admit.PerSecond(int64(n)), int64(size)
		case admit.Combination:
			r.Rate, r.Burst, r.Floor = admit.PerSecond(int64(n)), int64(size), admit.PerSecond(int64(n))
		case admit.FixedWindow, admit.SlidingWindow:
			r.Limit, r.Window = int64(size), time.Duration(n)*time.Second
		case admit.SlidingLog:
			r.Limit, r.Window = min(int64(size), bounds.MaxSlidingLogLimit), time.Duration(n)*time.Second
		case admit.Concurrency:
			r.Max = min(int64(size), 1000)
		case admit.Quota:
			r.Limit, r.Period = int64(size), admit.Day
		}
		if err := r.Validate(); err != nil {
			t.Skip(err)
		}
		if r.Algorithm == admit.SlidingLog {
			t.Skip("a log's state is a Log, not a State") // decided by the stores' suites
		}
		k := newShareKey(t, r)
		now := t0
		for i := 0; i+1 < len(steps); i += 2 {
			op, arg := steps[i], steps[i+1]
			now += int64(arg) * int64(time.Millisecond) * int64(op%7)
			share := admit.Share{Class: string(rune('a' + op%4)), Weight: int64(op%5) + 1}
			if op%11 == 0 {
				share = admit.Share{Class: "anonymous", Weight: 2, Sub: string(rune('0' + arg%5))}
			}
			cost := int64(arg % 4)
			most := MostAtOnce(r)
			if cost > most {
				cost = most
			}
			debit := op%13 == 0 && CheckDebit(r, 0) == nil
			res := k.decide(share, now, cost, debit)
			switch {
			case res.Share == admit.ShareRefused && res.RetryAfter <= 0:
				t.Fatalf("step %d: a share refusal without a wait: %+v", i, res)
			case res.Remaining < 0, res.Shared < 0:
				t.Fatalf("step %d: negative: %+v", i, res)
			case res.Share != admit.ShareNone && res.Remaining > res.Shared+cost:
				t.Fatalf("step %d: the class may take %d of a rule holding %d: %+v", i, res.Remaining, res.Shared, res)
			}
			for name, st := range k.recs {
				if st.Level != st.Level || st.Level > 1e15 || st.Level < -1e15 {
					t.Fatalf("step %d: %s's level %v", i, name, st.Level)
				}
				if st.At > 0 && st.Expiry(k.p) <= 0 {
					t.Fatalf("step %d: %s's record never expires", i, name)
				}
			}
		}
	})
}

// TestShareTopKeep: a period's largest takers, largest first, each class
// once.
func TestShareTopKeep(t *testing.T) {
	var top ShareTop
	tk := func(class uint32, taken int64) ShareTaker {
		return ShareTaker{Class: class, Weight: 1, Taken: taken, Seen: 7}
	}
	for _, x := range []ShareTaker{tk(1, 5), tk(2, 3), tk(3, 9), tk(1, 7), tk(4, 1), tk(5, 2), tk(6, 4), tk(2, 10)} {
		top.keep(x)
	}
	want := ShareTop{tk(2, 10), tk(3, 9), tk(1, 7), tk(6, 4), tk(5, 2), tk(4, 1)}
	if top != want {
		t.Errorf("top %v, want %v", top, want)
	}
}
