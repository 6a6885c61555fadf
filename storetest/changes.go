package storetest

import (
	"time"

	"github.com/admitdev/admit"
	"github.com/admitdev/admit/internal/bounds"
)

// changed returns charges of one key under each of rules in turn: a rule
// changed by a reload, an admin write or a deploy, and the key it counts in
// kept (a policy names a rule's keys after the rule, not its parameters).
func changed(timeline string, rules ...*admit.Rule) []admit.Charge {
	k := admit.Key{Scope: "test", Tenant: timeline, Subject: "u", Rule: "changed"}.String()
	cs := make([]admit.Charge, len(rules))
	for i, r := range rules {
		cs[i] = admit.Charge{Key: k, Rule: r}
	}
	return cs
}

// ruleChanges are the timelines of a rule changed under a live key: what
// the key holds survives the change. A bucket keeps its tokens, whole and
// the part of the next one refilled (scaled to the new interval, rounded
// down), capped at the new burst, and its debt, capped at the new debt
// bound; then it refills at the new rate. A window or quota keeps the
// count of its period in progress when its limit changes; a window whose
// length changes counts its new window from zero. A concurrency rule
// keeps its leases.
func ruleChanges() []Timeline {
	perDay := func(n int64) admit.Rate { return admit.Rate{N: n, Per: day} }
	slowDaily := bucketRule("daily", admit.TokenBucket, perDay(1000), 10)
	fast := bucketRule("fast", admit.TokenBucket, admit.PerSecond(100), 100)
	slowDay := bucketRule("slow", admit.TokenBucket, perDay(1000), 1000)
	narrow := bucketRule("narrow", admit.GCRA, admit.PerSecond(1), 3)
	wide := bucketRule("wide", admit.GCRA, admit.PerSecond(1), 10)
	owes := func(name string, rate admit.Rate, debt int64) *admit.Rule {
		r := bucketRule(name, admit.TokenBucket, rate, 5)
		r.MaxDebt = debt
		return r
	}
	three := windowRule("three", admit.FixedWindow, 3, time.Second)
	five := windowRule("five", admit.FixedWindow, 5, time.Second)
	longer := windowRule("longer", admit.FixedWindow, 5, 2*time.Second)
	anHour := windowRule("an-hour", admit.FixedWindow, 5, time.Hour)
	sevenMinutes := windowRule("seven-minutes", admit.FixedWindow, 5, 7*time.Minute)
	perMinute := windowRule("per-minute", admit.FixedWindow, 3, time.Minute)
	ten := windowRule("ten", admit.SlidingWindow, 10, time.Second)
	hourly := windowRule("hourly", admit.SlidingWindow, 5, time.Hour)
	hour20 := windowRule("hour-20", admit.SlidingWindow, 20, time.Hour)
	twoHours20 := windowRule("two-hours-20", admit.SlidingWindow, 20, 2*time.Hour)
	tenSeconds := windowRule("ten-seconds", admit.SlidingWindow, 20, 10*time.Second)
	twentySeconds := windowRule("twenty-seconds", admit.SlidingWindow, 20, 20*time.Second)
	twoSeconds := windowRule("two-seconds", admit.SlidingWindow, 5, 2*time.Second)
	twenty := windowRule("twenty", admit.SlidingWindow, 20, time.Second)
	twoMonthly := quotaRule("two", 2, admit.Month, "UTC", time.Time{})
	fiveMonthly := quotaRule("five", 5, admit.Month, "UTC", time.Time{})
	most := windowRule("most", admit.FixedWindow, bounds.MaxCount, time.Hour)
	perSecond := bucketRule("per-second", admit.TokenBucket, admit.PerSecond(1), 1)
	quick := bucketRule("quick", admit.TokenBucket, admit.PerSecond(10000), 100)
	comboFast := rule("combo-fast", admit.Combination, func(r *admit.Rule) {
		r.Floor, r.Rate, r.Burst = admit.Rate{N: 1, Per: time.Hour}, admit.PerSecond(100), 100
	})
	comboSlow := rule("combo-slow", admit.Combination, func(r *admit.Rule) {
		r.Floor, r.Rate, r.Burst = admit.Rate{N: 1, Per: time.Hour}, admit.Rate{N: 1, Per: time.Hour}, 1000
	})
	floorTen := rule("floor-ten", admit.Combination, func(r *admit.Rule) {
		r.Floor, r.Rate, r.Burst = admit.PerSecond(10), admit.Rate{N: 1, Per: time.Hour}, 50
	})
	floorTwenty := rule("floor-twenty", admit.Combination, func(r *admit.Rule) {
		r.Floor, r.Rate, r.Burst = admit.PerSecond(20), admit.Rate{N: 1, Per: time.Hour}, 50
	})
	two := leaseRule("two", 2, 10*time.Second)
	three3 := leaseRule("three", 3, 10*time.Second)

	return []Timeline{
		{
			// A limit raised from 1,000 a day (burst 10) to 100 a second
			// (burst 100) on a drained key: it refills at the new rate at
			// once, not after the 14 minutes its time says under the old
			// one. 1 ms into the old token's 86.4 s is 115 ns of the new
			// token's 10 ms. Lowered back, the drained key waits one
			// token of the old rate, less the 115 ns it had refilled of
			// the new one (993.6 µs of the old one's).
			Name:    "change/bucket_raised",
			Charges: changed("c1", slowDaily, fast),
			Steps: []Step{
				use(ok(0, 10, 0), 0),
				use(no(ms, 1, 10*ms-115, 0), 1),
				use(ok(11*ms, 1, 0), 1),
				use(no(11*ms, 1, 86400*ms-993600, 0), 0),
				use(ok(11*ms+86400*ms, 1, 0), 0),
			},
		},
		{
			// A limit lowered from 100 a second to 1,000 a day (burst
			// 1,000) on a drained key: it stays drained, refilling at the
			// new rate, rather than filling to the new burst. Raised back
			// 0.5 s later, the 0.5 s spent towards a daily token are
			// 57,870 ns of a 10 ms one.
			Name:    "change/bucket_lowered",
			Charges: changed("c2", fast, slowDay),
			Steps: []Step{
				use(ok(0, 100, 0), 0),
				use(no(0, 1, 86400*ms, 0), 1),
				use(no(500*ms, 1, 10*ms-57870, 0), 0),
				use(ok(600*ms, 1, 9), 0),
			},
		},
		{
			// A burst widened from 3 to 10 at the same rate: a drained
			// key holds nothing more, and fills to 10. Narrowed back
			// with 1.5 tokens, it keeps them, capped at 3 when full.
			Name:    "change/bucket_burst",
			Charges: changed("c3", narrow, wide),
			Steps: []Step{
				use(ok(0, 3, 0), 0),
				use(no(0, 1, time.Second, 0), 1),
				use(ok(1500*ms, 1, 0), 1),
				use(no(1500*ms, 1, 500*ms, 0), 0),
				use(ok(2*time.Second, 1, 0), 0),
				use(ok(20*time.Second, 10, 0), 1),
				use(ok(40*time.Second, 3, 0), 0),
				use(no(40*time.Second, 1, time.Second, 0), 0),
			},
		},
		{
			// A debt survives the change as the time it takes to repay:
			// 95 owed at 10/s (9.5 s) are 190 owed at 20/s, and 95 owed
			// at 20/s (4.75 s) are 47.5 owed at 10/s, kept beyond a debt
			// bound of 10 (what is owed was charged). A change never
			// makes a debt take longer, or shorter, to repay.
			Name:    "change/bucket_debt",
			Charges: changed("c4", owes("owes", admit.PerSecond(10), 1000), owes("owes-faster", admit.PerSecond(20), 1000), owes("owes-less", admit.PerSecond(10), 10)),
			Steps: []Step{
				debit(use(ok(0, 100, 0), 0), 0),
				use(no(0, 1, 9550*ms, 0), 1),
				use(ok(9550*ms, 1, 0), 1),
				debit(use(ok(10*time.Second, 100, 0), 1), 1),
				use(no(10*time.Second, 1, 4850*ms, 0), 2),
				use(ok(14850*ms, 1, 0), 2),
			},
		},
		{
			// A window's limit raised or lowered keeps the count of the
			// window in progress; a window of another length counts anew.
			Name:    "change/fixed_window",
			Charges: changed("c5", three, five, longer),
			Steps: []Step{
				use(ok(0, 3, 0), 0),
				use(ok(100*ms, 1, 1), 1),
				use(no(200*ms, 1, 800*ms, 0), 0),
				use(ok(300*ms, 1, 4), 2),
			},
		},
		{
			// A window whose length changes back and forth: each length
			// counts its windows apart, so the new one starts from zero
			// once and the old one's count is found again; flipping
			// gains nothing more (it once counted anew at every flip).
			Name:    "change/fixed_window_length_flips",
			Charges: changed("c14", anHour, sevenMinutes),
			Steps: []Step{
				use(ok(0, 5, 0), 0),
				use(ok(time.Second, 5, 0), 1),
				use(no(2*time.Second, 1, time.Hour-2*time.Second, 0), 0),
				use(no(3*time.Second, 1, 7*time.Minute-3*time.Second, 0), 1),
				use(no(4*time.Second, 1, time.Hour-4*time.Second, 0), 0),
				use(ok(7*time.Minute, 5, 0), 1),
				use(no(7*time.Minute, 1, 53*time.Minute, 0), 0),
			},
		},
		{
			// A clock stepped back across a window's edge finds no window
			// of its own that is fresher than the one it left: coming
			// forward again, the window it left still counts what it
			// counted.
			Name:    "change/fixed_window_clock_back",
			Charges: changed("c6", perMinute),
			Steps: []Step{
				ok(30*time.Second, 3, 0),
				no(31*time.Second, 1, 29*time.Second, 0),
			},
		},
		{
			Name:    "change/sliding_window",
			Charges: changed("c7", ten, twenty),
			Steps: []Step{
				use(ok(0, 10, 0), 0),
				use(ok(0, 5, 5), 1),
				use(no(0, 1, 1400*ms, 0), 0),
			},
		},
		{
			// A sliding window of another length reads every unit the
			// old one counts as its current window's: shortened from an
			// hour to 2 s, 5 of 5 refuse for that window and weigh less
			// in the next (not for the two hours the old state lasts);
			// lengthened from 2 s to an hour, 5 of 5 an instant ago are
			// 5 of the hour's (not forgotten).
			Name:    "change/sliding_window_length",
			Charges: append(append(changed("c12", hourly, twoSeconds), changed("c13", twoSeconds, hourly)...), changed("c19", twoSeconds, hourly)...),
			Steps: []Step{
				use(ok(0, 5, 0), 0),
				use(no(3*time.Second, 1, 1400*ms, 0), 1),
				use(ok(4400*ms, 1, 0), 1),
				use(ok(0, 5, 0), 2),
				use(no(time.Second, 1, 71*time.Minute+59*time.Second, 0), 3),
				// A look converts the state as a charge does, on every
				// store: from then on it is the new window's (the Redis
				// store's quick path once left a look's reading unkept).
				use(ok(10*time.Second, 5, 0), 4),
				use(ok(10*time.Second, 0, 0), 5),
				use(no(15*time.Second, 1, 71*time.Minute+45*time.Second, 0), 5),
			},
		},
		{
			// A combination's buckets are adopted each as a bucket is:
			// drained at 100/s burst 100 and moved to 1/h burst 1000, it
			// stays drained (1 ms of a 10 ms token is 360 s of an hour's:
			// 54 minutes to the next); moved back, it refills at 100/s
			// from what it held.
			Name:    "change/combination",
			Charges: changed("c15", comboFast, comboSlow),
			Steps: []Step{
				use(ok(0, 1, 100), 0),
				use(ok(0, 100, 0), 0),
				use(no(ms, 1, 54*time.Minute, 0), 1),
				use(no(2*ms, 1, 10*ms-1000002, 0), 0),
				use(ok(12*ms, 1, 0), 0),
			},
		},
		{
			// A combination's floor changed while it is not full (the
			// Redis store's script once failed every decision on the key
			// until the old floor would have refilled): 5 of the 10/s
			// floor's 10 spent are 5 of the 20/s floor's 20.
			Name:    "change/combination_floor",
			Charges: changed("c16", floorTen, floorTwenty),
			Steps: []Step{
				use(ok(0, 5, 55), 0),
				use(ok(0, 1, 54), 1),
			},
		},
		{
			// Windows of two lengths that end together: an hour's 20 of
			// 20, read 32 minutes in by a two-hour window, are the two
			// hours' 20 (not its previous window's, weighing 15, which
			// admitted 5 more); flipped between 10 s and 20 s, 20 of 20
			// stay 20 however often (37 were admitted in ten flips).
			Name:    "change/sliding_window_lengths_aligned",
			Charges: append(changed("c17", hour20, twoHours20), changed("c18", tenSeconds, twentySeconds)...),
			Steps: []Step{
				use(ok(0, 20, 0), 0),
				use(no(32*time.Minute, 1, 94*time.Minute, 0), 1),
				use(ok(4*time.Hour, 20, 0), 1), // both its windows have ended, to the nanosecond
				use(ok(9200*ms, 20, 0), 2),
				use(Step{At: 9250 * ms, Cost: 1}, 3),
				use(Step{At: 9300 * ms, Cost: 1}, 2),
				use(Step{At: 9350 * ms, Cost: 1}, 3),
				use(Step{At: 9400 * ms, Cost: 1}, 2),
				use(Step{At: 9450 * ms, Cost: 1}, 3),
			},
		},
		{
			Name:    "change/quota",
			Charges: changed("c8", twoMonthly, fiveMonthly),
			Steps: []Step{
				use(ok(0, 2, 0), 0),
				use(ok(time.Second, 1, 2), 1),
				use(no(2*time.Second, 1, 31*day-2*time.Second, 0), 0),
			},
		},
		{
			// A reservation booked under one rule (a second of 1/s, a
			// debt) and cancelled after another took the key over: the
			// new rule kept the debt as that second, and the cancel
			// gives back what is left of it, half, as time, and the half
			// that time repaid as whole tokens of 1/s, none. The key is
			// drained, never holding more than it would had the
			// reservation not been made.
			Name:    "change/cancel_after_change",
			Charges: changed("c11", perSecond, quick),
			Steps: []Step{
				use(ok(0, 1, 0), 0),
				{Op: Reserve, Use: []int{0}, Cost: 1, MaxWait: 5 * time.Second, Want: true, Wait: D(time.Second), Name: "R"},
				use(no(0, 1, time.Second+100*time.Microsecond, 0), 1),
				{At: 500 * ms, Op: Cancel, Name: "R"},
				use(no(500*ms, 1, time.Second, 0), 0),
			},
		},
		{
			// A debit past a window whose limit is the most a count
			// holds did not fit, though the count stops at its limit.
			Name:    "debit/fixed_window_at_max_count",
			Charges: changed("c10", most),
			Steps: []Step{
				debit(ok(0, bounds.MaxCost, int64(bounds.MaxCount-bounds.MaxCost)), 0),
				debit(ok(0, bounds.MaxCost, int64(bounds.MaxCount-2*bounds.MaxCost)), 0),
				debit(ok(0, bounds.MaxCost, int64(bounds.MaxCount-3*bounds.MaxCost)), 0),
				debit(ok(0, bounds.MaxCost, 0), 0),
				debit(Step{At: 0, Cost: 1, Want: true, Remaining: []int64{0}, Fits: []bool{false}, RuleRetry: []time.Duration{time.Hour}}, 0),
				no(0, 1, time.Hour, 0),
			},
		},
		{
			// Leases taken under a max of 2 are held under a max of 3,
			// and count against 2 again.
			Name:    "change/concurrency",
			Charges: changed("c9", two, three3),
			Steps: []Step{
				use(ok(0, 2, 0), 0),
				use(ok(time.Second, 1, 0), 1),
				use(no(2*time.Second, 1, 8*time.Second, 0), 0),
			},
		},
	}
}
