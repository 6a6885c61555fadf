package storetest

import (
	"time"
	_ "time/tzdata" // the quota timelines' zones, wherever the tests run

	"github.com/admitdev/admit"
	"github.com/admitdev/admit/internal/bounds"
)

const (
	ms   = time.Millisecond
	hour = time.Hour
	day  = 24 * time.Hour
)

func quotaRule(name string, limit int64, p admit.Period, loc string, anchor time.Time) *admit.Rule {
	l, err := time.LoadLocation(loc)
	if err != nil {
		panic(err) // time/tzdata holds every zone
	}
	return rule(name, admit.Quota, func(r *admit.Rule) { r.Limit, r.Period, r.Location, r.Anchor = limit, p, l, anchor })
}

func rule(name string, a admit.Algorithm, edit func(*admit.Rule)) *admit.Rule {
	r := &admit.Rule{Name: name, Algorithm: a}
	edit(r)
	return r
}

func bucketRule(name string, a admit.Algorithm, rate admit.Rate, burst int64) *admit.Rule {
	return rule(name, a, func(r *admit.Rule) { r.Rate, r.Burst = rate, burst })
}

func windowRule(name string, a admit.Algorithm, limit int64, window time.Duration) *admit.Rule {
	return rule(name, a, func(r *admit.Rule) { r.Limit, r.Window = limit, window })
}

func leaseRule(name string, max int64, ttl time.Duration) *admit.Rule {
	return rule(name, admit.Concurrency, func(r *admit.Rule) { r.Max, r.LeaseTTL = max, ttl })
}

func key(timeline, subject string, r *admit.Rule) admit.Charge {
	return admit.Charge{Key: admit.Key{Scope: "test", Tenant: timeline, Subject: subject, Rule: r.Name}.String(), Rule: r}
}

// globalKey is a key of no tenant (the global scope); subject keeps each
// timeline's apart.
func globalKey(timeline string, r *admit.Rule) admit.Charge {
	return admit.Charge{Key: admit.Key{Scope: "global", Subject: timeline, Rule: r.Name}.String(), Rule: r}
}

func ok(at time.Duration, cost int64, rem ...int64) Step {
	return Step{At: at, Cost: cost, Want: true, Remaining: rem}
}

func no(at time.Duration, cost int64, retry time.Duration, rem ...int64) Step {
	return Step{At: at, Cost: cost, Want: false, Retry: D(retry), Remaining: rem}
}

func use(s Step, idx ...int) Step { s.Use = idx; return s }

func reset(s Step, d time.Duration) Step { s.Reset = D(d); return s }

func dry(s Step) Step { s.DryRun = true; return s }

func named(s Step, name string) Step { s.Name = name; return s }

func denied(s Step, rule string) Step { s.DeniedBy = rule; return s }

// debit makes the timeline's charges idx debits in s.
func debit(s Step, idx ...int) Step { s.Debits = idx; return s }

// costs gives the charges s uses each its own cost.
func costs(s Step, c ...int64) Step { s.Costs = c; return s }

// Timelines returns the conformance timelines. Each one runs on a new store.
func Timelines() []Timeline {
	tb := bucketRule("tb", admit.TokenBucket, admit.PerSecond(10), 5)
	owing := bucketRule("owing", admit.TokenBucket, admit.PerSecond(10), 5)
	owing.MaxDebt = 1000
	fifty := int64(50)
	initial := rule("initial", admit.TokenBucket, func(r *admit.Rule) {
		r.Rate, r.Burst, r.Initial = admit.PerSecond(10), 100, &fifty
	})
	zero := int64(0)
	empty := rule("empty", admit.TokenBucket, func(r *admit.Rule) {
		r.Rate, r.Burst, r.Initial = admit.PerSecond(10), 5, &zero
	})
	seed003 := bucketRule("seed003", admit.TokenBucket, admit.PerSecond(10), 100)
	gcraBurst := bucketRule("gcra", admit.GCRA, admit.PerSecond(1), 3)
	fixed := windowRule("fixed", admit.FixedWindow, 3, time.Second)
	firstHit := windowRule("first-hit", admit.FirstHitWindow, 3, time.Second)
	sliding := windowRule("sliding", admit.SlidingWindow, 10, time.Second)
	slog := windowRule("log", admit.SlidingLog, 3, time.Second)
	combo := rule("combo", admit.Combination, func(r *admit.Rule) {
		r.Floor, r.Rate, r.Burst = admit.PerSecond(2), admit.PerSecond(1), 3
	})
	conc := leaseRule("conc", 2, 10*time.Second)
	wide := leaseRule("wide", 3000, 10*time.Second)
	slow := bucketRule("slow", admit.GCRA, admit.PerSecond(1), 1)
	perMinute := admit.Rate{N: 1, Per: time.Minute}
	user := bucketRule("user", admit.TokenBucket, perMinute, 2)
	tenant := bucketRule("tenant", admit.TokenBucket, perMinute, 3)
	shadow := rule("shadow", admit.TokenBucket, func(r *admit.Rule) { r.Rate, r.Burst, r.Shadow = perMinute, 1, true })
	normal := bucketRule("normal", admit.TokenBucket, perMinute, 5)
	one := bucketRule("one", admit.TokenBucket, perMinute, 1)
	global := bucketRule("global", admit.TokenBucket, perMinute, 2)
	logOne := windowRule("log-one", admit.SlidingLog, 1, time.Minute)
	concOne := leaseRule("conc-one", 1, time.Minute)
	conns := leaseRule("conns", 1, 0)
	perMin := windowRule("per-minute", admit.SlidingWindow, 2, time.Minute)
	thirds := bucketRule("thirds", admit.GCRA, admit.Rate{N: 3, Per: time.Second}, 2)
	monthly := quotaRule("monthly", 2, admit.Month, "UTC", time.Time{})
	monthlyOn15th := quotaRule("monthly", 2, admit.Month, "UTC", time.Date(2025, 6, 15, 0, 0, 0, 0, time.UTC))
	on31st := quotaRule("on31st", 1, admit.Month, "UTC", time.Date(2026, 1, 31, 0, 0, 0, 0, time.UTC))
	leapYearly := quotaRule("leap", 1, admit.Year, "UTC", time.Date(2028, 2, 29, 0, 0, 0, 0, time.UTC))
	nyDaily := quotaRule("ny", 1, admit.Day, "America/New_York", time.Time{})
	yearly := quotaRule("yearly", 1, admit.Year, "UTC", time.Time{})
	weekly := quotaRule("weekly", 1, admit.Week, "UTC", time.Time{})

	return append(ruleChanges(), []Timeline{
		{
			// A dry run reports the decision at its cost and changes
			// nothing: not the buckets, not the window, no lease taken.
			Name: "dry_run/changes_nothing",
			Charges: []admit.Charge{key("dry", "u", user), key("dry", "", tenant),
				key("dry", "w", fixed), key("dry", "c", concOne)},
			Steps: []Step{
				dry(ok(0, 1, 1, 2, 2, 0)),
				dry(ok(0, 1, 1, 2, 2, 0)),
				ok(0, 1, 1, 2, 2, 0),
				dry(denied(no(0, 1, time.Minute, 0, 1, 1, 0), "conc-one")),
				dry(use(denied(no(0, 2, time.Minute, 1), "user"), 0)),
				use(ok(0, 1, 0), 0),
			},
		},
		{
			Name:    "token_bucket/burst_refill_cap",
			Charges: []admit.Charge{key("t1", "u", tb)},
			Steps: []Step{
				reset(ok(0, 1, 4), 100*ms), ok(0, 1, 3), ok(0, 1, 2), ok(0, 1, 1), reset(ok(0, 1, 0), 500*ms),
				reset(no(0, 1, 100*ms, 0), 500*ms),
				ok(100*ms, 1, 0),
				ok(250*ms, 1, 0), // 1.5 tokens had refilled; half of one is left
				no(250*ms, 1, 50*ms, 0),
				// Idle for 10s: the bucket refills to its burst, not beyond.
				reset(ok(10*time.Second, 0, 5), 0), // a peek: admitted, nothing charged
				reset(ok(10*time.Second, 1, 4), 100*ms),
				ok(10*time.Second, 4, 0),
				{At: 10 * time.Second, Cost: 6, Err: errInvalid}, // cost > burst is an error
			},
		},
		{
			Name:    "token_bucket/initial_balance",
			Charges: []admit.Charge{key("t2", "new", initial)},
			Steps: []Step{
				reset(ok(0, 1, 49), 5100*ms),
				ok(time.Second, 1, 58),
				ok(time.Minute, 1, 99), // refilled to burst, past the initial balance
			},
		},
		{
			// A bucket that starts empty starts refilling when first seen,
			// even though that first request was refused.
			Name:    "token_bucket/starts_empty",
			Charges: []admit.Charge{key("t2e", "new", empty)},
			Steps: []Step{
				reset(no(0, 1, 100*ms, 0), 500*ms),
				no(50*ms, 1, 50*ms, 0),
				ok(100*ms, 1, 0),
				ok(time.Second, 5, 0),
			},
		},
		{
			// Seed 003: a user with 95 tokens comes back 5 s later at 10/s:
			// 145 would be over the maximum, so 100, and the request leaves 99.
			// A new user starts at the maximum and also leaves 99.
			Name:    "token_bucket/seed003",
			Charges: []admit.Charge{key("t3", "user123", seed003), key("t3", "user456", seed003)},
			Steps: []Step{
				use(ok(0, 5, 95), 0),
				use(ok(5*time.Second, 1, 99), 0),
				use(ok(5*time.Second, 1, 99), 1),
				use(ok(5*time.Second+100*ms, 100, 0), 0), // 99 + 1 refilled: exactly enough
				use(no(5*time.Second+100*ms, 1, 100*ms, 0), 0),
			},
		},
		{
			Name:    "gcra/burst",
			Charges: []admit.Charge{key("t4", "u", gcraBurst)},
			Steps: []Step{
				ok(0, 1, 2), ok(0, 1, 1), reset(ok(0, 1, 0), 3*time.Second),
				reset(no(0, 1, time.Second, 0), 3*time.Second),
				no(999*ms, 1, ms, 0),
				ok(time.Second, 1, 0),
				ok(time.Hour, 3, 0),
			},
		},
		{
			// 3/s is 333,333,333⅓ ns a token: requests at the rounded-up
			// instants k·T all pass and one nanosecond earlier they do not,
			// which needs exact fractional arithmetic.
			Name:    "gcra/fractional_rate",
			Charges: []admit.Charge{key("t5", "u", bucketRule("third", admit.GCRA, admit.PerSecond(3), 3))},
			Steps:   fractionalSteps(),
		},
		{
			Name:    "fixed_window/boundaries",
			Charges: []admit.Charge{key("t6", "u", fixed)},
			Steps: []Step{
				reset(ok(0, 1, 2), time.Second), ok(0, 1, 1), ok(0, 1, 0),
				reset(no(999*ms, 1, ms, 0), ms),
				reset(ok(time.Second, 1, 2), time.Second),
				reset(ok(1500*ms, 2, 0), 500*ms),
				no(1999*ms, 1, ms, 0),
				ok(5*time.Second, 3, 0),
				{At: 5 * time.Second, Cost: 4, Err: errInvalid},
			},
		},
		{
			// A first-hit window starts at the key's first charge, and the
			// next one at the first charge after it ended, whenever that
			// is: Limitador's counters.
			Name:    "first_hit_window/starts_at_first_hit",
			Charges: []admit.Charge{key("t6f", "u", firstHit)},
			Steps: []Step{
				reset(ok(400*ms, 1, 2), time.Second), ok(900*ms, 1, 1), reset(ok(1399*ms, 1, 0), ms),
				reset(no(1399*ms, 1, ms, 0), ms),
				reset(ok(1400*ms, 1, 2), time.Second),
				reset(ok(2399*ms, 1, 1), ms),
				reset(ok(2400*ms, 2, 1), time.Second),
				reset(ok(10*time.Second+7*ms, 3, 0), time.Second),
				no(11*time.Second+6*ms, 1, ms, 0),
				{At: 12 * time.Second, Cost: 4, Err: errInvalid},
				dry(reset(ok(20*time.Second, 1, 2), time.Second)), // a dry run starts no window
				reset(ok(20*time.Second+500*ms, 1, 2), time.Second),
			},
		},
		{
			// A debit counts past the limit, and the window it started
			// ends a window after it.
			Name:    "first_hit_window/debit",
			Charges: []admit.Charge{key("t6d", "u", firstHit)},
			Steps: []Step{
				debit(ok(250*ms, 5, 0), 0),
				no(1249*ms, 0, ms, 0),
				reset(ok(1250*ms, 3, 0), time.Second),
			},
		},
		{
			// A rule's window grows from a minute to an hour: the hour in
			// progress counts from zero.
			Name: "fixed_window/window_changes",
			Charges: []admit.Charge{
				key("t6", "resized", windowRule("resized", admit.FixedWindow, 3, time.Minute)),
				key("t6", "resized", windowRule("resized", admit.FixedWindow, 3, time.Hour)),
			},
			Steps: []Step{
				use(ok(0, 3, 0), 0),
				use(no(10*time.Second, 1, 50*time.Second, 0), 0),
				use(reset(ok(10*time.Second, 1, 2), time.Hour-10*time.Second), 1),
				use(ok(20*time.Second, 2, 0), 1),
				use(no(30*time.Second, 1, time.Hour-30*time.Second, 0), 1),
			},
		},
		{
			Name:    "sliding_window/weighted",
			Charges: []admit.Charge{key("t7", "u", sliding)},
			Steps: []Step{
				reset(ok(0, 10, 0), 2*time.Second),
				// 10 in this window: the next request fits once a tenth of it
				// has slid out, at 1.1s.
				reset(no(500*ms, 1, 600*ms, 0), 1500*ms),
				no(1100*ms-1, 1, 1, 0),
				ok(1100*ms, 1, 0),
				ok(1500*ms, 4, 0), // 10·½ + 1 + 4 = 10
				no(1500*ms, 1, 100*ms, 0),
				ok(1600*ms, 1, 0), // 10·0.4 + 5 + 1 = 10
				ok(2500*ms, 1, 6), // 6·½ + 0 + 1 = 4
				ok(5*time.Second, 1, 9),
			},
		},
		{
			Name:    "sliding_log/exact",
			Charges: []admit.Charge{key("t8", "u", slog)},
			Steps: []Step{
				reset(ok(0, 1, 2), time.Second), ok(200*ms, 1, 1), ok(400*ms, 1, 0),
				reset(no(600*ms, 1, 400*ms, 0), 800*ms),
				ok(time.Second, 1, 0), // the entry at 0 left exactly now
				no(1100*ms, 1, 100*ms, 0),
				no(1200*ms, 2, 200*ms, 1),
				ok(1400*ms, 2, 0),
				{At: 1400 * ms, Cost: 4, Err: errInvalid},
			},
		},
		{
			// Seed 003's floor + burst: 2/s always, plus a 3-token bucket
			// refilling at 1/s, tried after the floor.
			Name:    "combination/floor_then_burst",
			Charges: []admit.Charge{key("t9", "u", combo)},
			Steps: []Step{
				ok(0, 1, 4), ok(0, 1, 3), ok(0, 1, 2), ok(0, 1, 1), ok(0, 1, 0),
				no(0, 1, 500*ms, 0),
				// The burst is gone; the floor still admits 2/s.
				ok(500*ms, 1, 0),
				ok(time.Second, 1, 1),
				ok(1500*ms, 1, 1),
				ok(1500*ms, 1, 0),
				no(1500*ms, 1, 500*ms, 0),
				ok(2*time.Second, 1, 1),
				ok(10*time.Second, 3, 2), // more than the floor holds: the burst bucket pays
				{At: 10 * time.Second, Cost: 4, Err: errInvalid},
			},
		},
		{
			Name:    "concurrency/leases",
			Charges: []admit.Charge{key("t10", "u", conc)},
			Steps: []Step{
				named(reset(ok(0, 1, 1), 10*time.Second), "A"),
				named(ok(time.Second, 1, 0), "B"),
				no(2*time.Second, 1, 8*time.Second, 0), // A would expire first
				{At: 3 * time.Second, Op: Release, Name: "A"},
				named(ok(3*time.Second, 1, 0), "C"),
				// B expires at 11s unrenewed: its slot is reclaimed.
				named(ok(11*time.Second, 1, 0), "D"),
				{At: 11 * time.Second, Op: Renew, Name: "B", Err: errNotFound},
				{At: 11 * time.Second, Op: Release, Name: "A", Err: errNotFound},
				{At: 12 * time.Second, Op: Renew, Name: "C", Reset: D(10 * time.Second)},
				no(14*time.Second, 1, 7*time.Second, 0), // D expires at 21s, C now at 22s
				{At: 14 * time.Second, Op: Release, Name: "C"},
				ok(14*time.Second, 1, 0),
				{At: 14 * time.Second, Cost: 3, Err: errInvalid},
			},
		},
		{
			// Leases of many slots at once — more than a Redis command
			// takes in one go from a Lua table — are taken, renewed and
			// released whole, a refusal takes none, and one lease takes
			// at most bounds.MaxLeaseCost slots.
			Name:    "concurrency/wide_leases",
			Charges: []admit.Charge{key("t10w", "u", wide)},
			Steps: []Step{
				named(reset(ok(0, 1000, 2000), 10*time.Second), "A"),
				named(ok(time.Second, 1000, 1000), "B"),
				named(ok(time.Second, 999, 1), "C"),
				no(2*time.Second, 2, 8*time.Second, 1), // A would expire first
				{At: 3 * time.Second, Op: Renew, Name: "A", Reset: D(10 * time.Second)},
				no(4*time.Second, 2, 7*time.Second, 1), // B expires at 11s, A at 13s
				{At: 5 * time.Second, Op: Release, Name: "A"},
				named(ok(5*time.Second, 1000, 1), "D"),
				{At: 6 * time.Second, Op: Release, Name: "B"},
				{At: 6 * time.Second, Op: Release, Name: "B", Err: errNotFound},
				ok(6*time.Second, 1, 1000),
				{At: 6 * time.Second, Cost: bounds.MaxLeaseCost + 1, Err: errInvalid},
			},
		},
		{
			Name:    "reservation/book_and_cancel",
			Charges: []admit.Charge{key("t11", "u", slow)},
			Steps: []Step{
				ok(0, 1, 0),
				{Op: Reserve, Cost: 1, MaxWait: 5 * time.Second, Want: true, Wait: D(time.Second), Name: "R1"},
				{Op: Reserve, Cost: 1, MaxWait: 5 * time.Second, Want: true, Wait: D(2 * time.Second), Name: "R2"},
				{Op: Reserve, Cost: 1, MaxWait: 500 * ms, Want: false, Wait: D(3 * time.Second)},
				// The refused reservation booked nothing.
				{Op: Reserve, Cost: 1, MaxWait: 3 * time.Second, Want: true, Wait: D(3 * time.Second), Name: "R3"},
				{Op: Cancel, Name: "R2"},
				{Op: Cancel, Name: "R2", Err: errNotFound},
				// R2's second is free again: the next booking waits 3s, not 4s.
				{Op: Reserve, Cost: 1, MaxWait: 10 * time.Second, Want: true, Wait: D(3 * time.Second)},
				no(0, 1, 4*time.Second, 0),
				// R1's time has come: cancelling it gives nothing back.
				{At: 1500 * ms, Op: Cancel, Name: "R1"},
				no(1500*ms, 1, 2500*ms, 0),
			},
		},
		{
			Name:    "reservation/hierarchy_and_invalid",
			Charges: []admit.Charge{key("t12", "u", slow), key("t12", "t", gcraBurst), key("t12", "f", fixed)},
			Steps: []Step{
				use(ok(0, 1, 0, 2), 0, 1),
				// The slow bucket needs 1s, the other none: both book, wait 1s.
				use(Step{Op: Reserve, Cost: 1, MaxWait: time.Second, Want: true, Wait: D(time.Second)}, 0, 1),
				use(ok(time.Second, 0, 0, 2), 0, 1),
				use(Step{Op: Reserve, Cost: 1, MaxWait: time.Hour, Err: errInvalid}, 0, 2),
			},
		},
		{
			// Seed 002's rule: all or nothing. A refusal by any bucket
			// charges none of them.
			Name:    "hierarchy/all_or_nothing",
			Charges: []admit.Charge{key("t13", "u1", user), key("t13", "u2", user), key("t13", "", tenant)},
			Steps: []Step{
				use(ok(0, 1, 1, 2), 0, 2),
				use(ok(0, 1, 0, 1), 0, 2),
				use(denied(no(0, 1, time.Minute, 0, 1), "user"), 0, 2),
				use(ok(0, 1, 1, 0), 1, 2),
				use(denied(no(0, 1, time.Minute, 1, 0), "tenant"), 1, 2),
				use(ok(0, 0, 1), 1), // u2 was not charged by the refusal
			},
		},
		{
			Name:    "hierarchy/shadow_never_refuses",
			Charges: []admit.Charge{key("t14", "u", shadow), key("t14", "u", normal)},
			Steps: []Step{
				ok(0, 1, 0, 4),
				ok(0, 1, 0, 3), // the shadow rule refuses; the request passes
				use(ok(0, 0, 0), 0),
				use(ok(time.Minute, 1, 0), 0), // the refused shadow charge took nothing
			},
		},
		{
			Name: "hierarchy/same_key_twice",
			Charges: []admit.Charge{
				key("t15", "u", one), key("t15", "u", one),
				key("t15", "l", logOne), key("t15", "l", logOne),
				key("t15", "c", concOne), key("t15", "c", concOne),
			},
			Steps: []Step{
				use(no(0, 1, time.Minute, 1, 0), 0, 1), // the first would pass; nothing is charged
				use(ok(0, 1, 0), 0),
				use(no(0, 1, time.Minute, 1, 0), 2, 3),
				use(ok(0, 1, 0), 2),
				use(no(0, 1, time.Minute, 1, 0), 4, 5),
				use(ok(0, 1, 0), 4),
			},
		},
		{
			// A global (tenantless) charge beside a tenant's: in Cluster
			// they live in two slots, decided group by group, the
			// tenant's first. When the global bucket refuses, the
			// tenant's charges already made are given back exactly.
			Name: "hierarchy/global_beside_tenant",
			Charges: []admit.Charge{
				key("t19", "u1", user), key("t19", "u2", user), key("t19", "", tenant), globalKey("t19", global),
			},
			Steps: []Step{
				use(ok(0, 1, 1, 2, 1), 0, 2, 3),
				use(ok(0, 1, 1, 1, 0), 1, 2, 3),
				// The tenant's buckets would admit; the global one
				// refuses, and nothing is charged.
				use(denied(no(0, 1, time.Minute, 1, 1, 0), "global"), 0, 2, 3),
				use(denied(no(0, 1, time.Minute, 1, 1, 0), "global"), 1, 2, 3),
				use(ok(0, 0, 1, 1, 1, 0), 0, 1, 2, 3),
				// The tenant's buckets alone still hold what they held.
				use(ok(0, 1, 0, 0), 0, 2),
				use(denied(no(0, 1, time.Minute, 1, 0), "tenant"), 1, 2),
				// A minute refills one token of each. The tenant's
				// bucket refuses: the global one, decided after it,
				// is not charged.
				use(ok(time.Minute, 1, 0), 2),
				use(denied(no(time.Minute, 1, time.Minute, 1, 0, 1), "tenant"), 0, 2, 3),
				use(ok(time.Minute, 0, 1, 2, 0, 1), 0, 1, 2, 3),
			},
		},
		{
			// A debit is charged whether it fits or not: the bucket goes
			// into debt, at most one burst (TAT at most 2·burst·T ahead),
			// and refuses until it is repaid. T = 100ms.
			Name:    "debit/bucket_into_debt",
			Charges: []admit.Charge{key("d1", "u", tb)},
			Steps: []Step{
				debit(ok(0, 3, 2), 0),
				debit(ok(0, 7, 0), 0), // 2 tokens there: 5 owed; the decision is admitted
				no(0, 1, 600*ms, 0),
				no(599*ms, 1, ms, 0),
				ok(600*ms, 1, 0),
				debit(ok(10*time.Second, 100, 0), 0), // capped at one burst of debt
				no(10*time.Second+599*ms, 1, ms, 0),
				ok(10*time.Second+600*ms, 1, 0),
				debit(Step{At: 11 * time.Second, Cost: bounds.MaxCost + 1, Err: errInvalid}, 0),
			},
		},
		{
			// A debit past the debt's cap never moves the bucket back: a
			// reservation of 20 (four of a burst) booked it to 2 s (its last token due at
			// 1.5 s), beyond a debt's cap of 1 s, so the debit charges
			// nothing more, and at 1.5 s the bucket is still drained, as
			// the reservation left it. (The cap once took the bucket
			// back to 1 s, giving the reservation's tokens out again:
			// red team, leased buckets admitting 1 % over.)
			Name:    "debit/after_reservation",
			Charges: []admit.Charge{key("d1r", "u", tb)},
			Steps: []Step{
				{Op: Reserve, Cost: 5, MaxWait: 5 * time.Second, Want: true, Wait: D(0)},
				{Op: Reserve, Cost: 5, MaxWait: 5 * time.Second, Want: true, Wait: D(500 * ms)},
				{Op: Reserve, Cost: 5, MaxWait: 5 * time.Second, Want: true, Wait: D(time.Second)},
				{Op: Reserve, Cost: 5, MaxWait: 5 * time.Second, Want: true, Wait: D(1500 * ms)},
				debit(ok(0, 1, 0), 0),
				no(1500*ms, 1, 100*ms, 0),
			},
		},
		{
			// A rule's MaxDebt bounds the debt instead: 95 owed beyond
			// the burst of 5 is 9.6 s to repay before a token; a debit
			// of 5,000 owes at most 1,000.
			Name:    "debit/bucket_max_debt",
			Charges: []admit.Charge{key("d1m", "u", owing)},
			Steps: []Step{
				debit(ok(0, 100, 0), 0),
				no(0, 1, 9600*ms, 0),
				ok(9600*ms, 1, 0),
				debit(ok(20*time.Second, 5000, 0), 0),
				no(20*time.Second, 1, 100100*ms, 0),
				ok(120100*ms, 1, 0),
			},
		},
		{
			// The same, where a token takes a third of a second (kept
			// with its fraction): 5 debited from a full bucket of 2 is 4
			// (the cap) ahead, and one token more is 3T = 1s away.
			Name:    "debit/gcra_fractions",
			Charges: []admit.Charge{key("d1b", "u", thirds)},
			Steps: []Step{
				debit(ok(0, 5, 0), 0),
				no(0, 1, time.Second, 0),
				no(time.Second-1, 1, 1, 0),
				ok(time.Second, 1, 0),
			},
		},
		{
			// A window counts a debit past its limit, as
			// envoyproxy/ratelimit counts every hit: a check of cost 0
			// after it is refused until the window ends.
			Name:    "debit/fixed_window_counts_past_limit",
			Charges: []admit.Charge{key("d2", "w", fixed)},
			Steps: []Step{
				ok(0, 1, 2),
				debit(ok(0, 5, 0), 0), // 6 counted of 3
				no(0, 0, time.Second, 0),
				ok(time.Second, 1, 2),
			},
		},
		{
			// 15 counted of 10: in the next window the previous one
			// weighs 15·(W−e)/W, which leaves room for one request when
			// e = 0.4 W.
			Name:    "debit/sliding_window",
			Charges: []admit.Charge{key("d3", "s", sliding)},
			Steps: []Step{
				debit(ok(0, 15, 0), 0),
				no(0, 1, 1400*ms, 0),
				no(1400*ms-1, 1, 1, 0),
				ok(1400*ms, 1, 0),
			},
		},
		{
			// A decision that its checks refuse still applies its debits
			// (the work they pay for was done). In Cluster the tenant's
			// group is charged first and given back when the global one
			// refuses: the debit stays.
			Name:    "debit/refused_decision_keeps_its_debits",
			Charges: []admit.Charge{key("d4", "", tenant), globalKey("d4", one)},
			Steps: []Step{
				costs(debit(ok(0, 0, 1, 0), 0), 2, 1),
				costs(debit(denied(no(0, 0, time.Minute, 0, 0), "one"), 0), 2, 1),
				// 240 s of TAT against a horizon of 180 s: in debt.
				use(denied(no(0, 0, time.Minute, 0), "tenant"), 0),
			},
		},
		{
			// The same when the refusing charge comes first: in Cluster
			// the debit's group is decided as refused already, and
			// still keeps its debit.
			Name:    "debit/refused_first",
			Charges: []admit.Charge{key("d5a", "", one), key("d5b", "", tenant)},
			Steps: []Step{
				costs(debit(ok(0, 0, 0, 1), 1), 1, 2),
				costs(debit(denied(no(0, 0, time.Minute, 0, 0), "one"), 1), 1, 2),
				use(denied(no(0, 0, time.Minute, 0), "tenant"), 1),
			},
		},
		{
			// Debits are for buckets and windows; a dry run of one
			// changes nothing.
			Name: "debit/where_and_dry_run",
			Charges: []admit.Charge{
				key("d6", "l", slog), key("d6", "c", conc), key("d6", "k", combo), key("d6", "u", tb), key("d6", "u", tb),
			},
			Steps: []Step{
				use(debit(Step{Cost: 1, Err: errInvalid}, 0), 0),
				use(debit(Step{Cost: 1, Err: errInvalid}, 1), 1),
				use(debit(Step{Cost: 1, Err: errInvalid}, 2), 2),
				use(debit(Step{Op: Reserve, Cost: 1, MaxWait: time.Second, Err: errInvalid}, 3), 3),
				use(debit(dry(ok(0, 7, 0)), 3), 3),
				use(ok(0, 5, 0), 3),
				// One key checked and debited at once is refused; debited
				// twice, it owes both.
				debit(use(Step{At: time.Minute, Cost: 1, Err: errInvalid}, 3, 4), 4),
				debit(use(ok(time.Minute, 3, 2, 0), 3, 4), 3, 4),
			},
		},
		{
			// A calendar month in UTC from the 1st: 31, 28, 31 and 30
			// days in 2026, 29 in February 2028. Epoch is 2026-01-01.
			Name:    "quota/month_lengths",
			Charges: []admit.Charge{key("q1", "t", monthly)},
			Steps: []Step{
				reset(ok(0, 1, 1), 31*day), ok(0, 1, 0),
				no(0, 1, 31*day, 0),
				no(31*day-time.Second, 1, time.Second, 0),
				reset(ok(31*day, 1, 1), 28*day),  // February
				reset(ok(59*day, 1, 1), 31*day),  // March
				reset(ok(90*day, 1, 1), 30*day),  // April
				reset(ok(761*day, 1, 1), 29*day), // February 2028
				no(761*day, 2, 29*day, 1),        // more than what is left
			},
		},
		{
			// Anchored on the 31st: a month without one starts on its last
			// day. Jan 31 → Feb 28 → Mar 31 → Apr 30 → May 31.
			Name:    "quota/anchor_on_the_31st",
			Charges: []admit.Charge{key("q2", "t", on31st)},
			Steps: []Step{
				reset(ok(30*day, 1, 0), 28*day),
				no(58*day-1, 1, 1, 0),
				reset(ok(58*day, 1, 0), 31*day),
				reset(ok(89*day, 1, 0), 30*day),
				reset(ok(119*day, 1, 0), 31*day),
			},
		},
		{
			// A year anchored on a leap day: in a year without one it
			// starts on the 28th. 2027-03-01 is in [2027-02-28,
			// 2028-02-29); then [2028-02-29, 2029-02-28).
			Name:    "quota/leap_day_anchor",
			Charges: []admit.Charge{key("q3", "t", leapYearly)},
			Steps: []Step{
				reset(ok(424*day, 1, 0), 365*day),
				no(789*day-1, 1, 1, 0),
				reset(ok(789*day, 1, 0), 365*day),
			},
		},
		{
			// Days in New York: the day clocks spring forward lasts 23
			// hours, the day they fall back 25. Midnight of 2026-03-08 is
			// 05:00 UTC, of 2026-11-01 04:00 UTC.
			Name:    "quota/daylight_saving_days",
			Charges: []admit.Charge{key("q4", "t", nyDaily)},
			Steps: []Step{
				reset(ok(66*day+5*hour, 1, 0), 23*hour),
				no(66*day+28*hour-1, 1, 1, 0),
				reset(ok(66*day+28*hour, 1, 0), 24*hour),
				reset(ok(304*day+4*hour, 1, 0), 25*hour),
				no(304*day+29*hour-1, 1, 1, 0),
				ok(304*day+29*hour, 1, 0),
			},
		},
		{
			// The year ends at midnight UTC of January 1st, whatever the
			// weekday; a week (from Monday) across it is one period.
			// 2026-12-28 is a Monday.
			Name:    "quota/year_and_week_across_new_year",
			Charges: []admit.Charge{key("q5", "t", yearly), key("q5", "t", weekly)},
			Steps: []Step{
				use(reset(ok(364*day+23*hour, 1, 0), hour), 0),
				use(no(364*day+23*hour+59*time.Minute, 1, time.Minute, 0), 0),
				use(ok(365*day, 1, 0), 0),
				use(reset(ok(361*day, 1, 0), 7*day), 1),
				use(no(365*day, 1, 3*day, 0), 1),
				use(ok(368*day, 1, 0), 1),
			},
		},
		{
			// A tenant's anchor moves from the 1st to the 15th on January
			// 12th: the period in progress keeps its end (February 1st),
			// and the next runs on the new anchor, [Feb 1, Feb 15).
			Name:    "quota/anchor_changes_mid_period",
			Charges: []admit.Charge{key("q6", "t", monthly), key("q6", "t", monthlyOn15th)},
			Steps: []Step{
				use(ok(9*day, 2, 0), 0),
				use(no(11*day, 1, 20*day, 0), 1),
				use(reset(ok(31*day, 1, 1), 14*day), 1),
				use(reset(ok(45*day, 1, 1), 28*day), 1),
			},
		},
		{
			// A quota charged beside a global bucket that refuses gets
			// its count back (in Cluster, by the give-back call).
			Name:    "quota/given_back",
			Charges: []admit.Charge{key("q8", "", monthly), globalKey("q8", one)},
			Steps: []Step{
				ok(0, 1, 1, 0),
				denied(no(0, 1, time.Minute, 1, 0), "one"),
				use(reset(ok(0, 1, 0), 31*day), 0),
			},
		},
		{
			// Debits count past a quota, which then refuses until the
			// period ends.
			Name:    "quota/debit",
			Charges: []admit.Charge{key("q7", "t", monthly)},
			Steps: []Step{
				debit(ok(0, 5, 0), 0),
				no(10*day, 0, 21*day, 0),
				ok(31*day, 2, 0),
			},
		},
		{
			// Two tenants and the global scope: three groups in
			// Cluster, decided in order. A refusal by the last or the
			// second gives back exactly what the groups before it took.
			Name: "hierarchy/two_tenants_and_global",
			Charges: []admit.Charge{
				key("t20a", "", tenant), key("t20b", "", tenant), globalKey("t20", one),
			},
			Steps: []Step{
				ok(0, 1, 2, 2, 0),
				denied(no(0, 1, time.Minute, 2, 2, 0), "one"),
				use(ok(0, 2, 0), 1),
				use(ok(time.Minute, 1, 0), 1),
				use(denied(no(time.Minute, 1, time.Minute, 3, 0, 1), "tenant"), 0, 1, 2),
				ok(time.Minute, 0, 3, 0, 1),
			},
		},
		{
			Name:    "reset",
			Charges: []admit.Charge{key("t16", "u", tb), key("t16", "c", combo), key("t16", "l", slog)},
			Steps: []Step{
				ok(0, 2, 3, 3, 1),
				{Op: Reset},
				ok(0, 1, 4, 4, 2),
			},
		},
		{
			// The gateway's admission: connection slots and connections per
			// minute decided together; a refusal charges neither.
			Name:    "mixed/leases_and_windows",
			Charges: []admit.Charge{key("t17", "tenant", conns), key("t17", "tenant", perMin)},
			Steps: []Step{
				named(ok(0, 1, 0, 1), "L1"),
				denied(no(time.Second, 1, 29*time.Second, 0, 1), "conns"),
				{At: 2 * time.Second, Op: Release, Name: "L1"},
				named(ok(2*time.Second, 1, 0, 0), "L2"),
				// Both refuse; the longer wait (the window's) is reported.
				denied(no(3*time.Second, 1, 87*time.Second, 0, 0), "per-minute"),
			},
		},
	}...)
}

func fractionalSteps() []Step {
	// After a first request of 3, the bucket's arrival time runs ahead of
	// the clock, so it accumulates thirds of nanoseconds exactly.
	steps := []Step{ok(0, 3, 0)}
	for k := int64(1); k <= 12; k++ {
		at := time.Duration((k*int64(time.Second) + 2) / 3) // ceil(k·T)
		steps = append(steps, no(at-1, 1, 1, 0), ok(at, 1, 0))
	}
	return steps
}
