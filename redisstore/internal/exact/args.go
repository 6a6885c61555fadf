package exact

import (
	"strconv"
	"strings"
	"time"

	"github.com/admitdev/admit"
	"github.com/admitdev/admit/internal/bounds"
	"github.com/admitdev/admit/internal/engine"
	"github.com/admitdev/admit/internal/wide"
)

// maxSpan bounds every time a rule makes the script compute with: a
// bucket's burst × interval, a window, a lease TTL. The script keeps
// nanoseconds relative to now in doubles, exact below 2^53; spans up to
// 2^52 ns (about 52 days) leave room for the sums it forms. Rules past it
// are refused with a clear error; monthly quotas (30 or 31 days) fit.
const maxSpan = time.Duration(1 << 52)

// stride is the number of script arguments per charge (the library, STRIDE).
const stride = 15

// ruleArgs holds the script arguments of one rule, computed once: slots
// 0 (algorithm), 2 (shadow) and 5..14 (parameters) of a charge's stride;
// slot 3, the lease TTL, is the rule's own unless the charge overrides it.
type ruleArgs struct {
	fixed [stride]string
	text  string // fixed joined with commas, as a batch sends it
	lease bool   // a concurrency rule: its charges send their lease TTL
	quota bool   // a quota: its charges send the ends of its periods
	// A fixed window: its limit and its window in µs, for the short
	// replies of a batch of windows (see counted).
	window        bool
	limit, widthU int64
	err           error
}

// CheckRule reports whether the Redis store can decide r exactly: r must be
// valid, its spans and windows at most about 52 days, and its windows and
// lease TTL whole microseconds (Redis TIME's resolution).
func CheckRule(r *admit.Rule) error {
	if err := r.Validate(); err != nil {
		return err
	}
	tooLong := func(field string, d time.Duration) error {
		return admit.Errorf(admit.CodeInvalid, "rule %q: %s of %v is longer than the Redis store's %v", r.Name, field, d, time.Duration(maxSpan).Truncate(time.Second))
	}
	switch r.Algorithm {
	case admit.TokenBucket, admit.GCRA, admit.Combination:
		if d, ok := bucketSpan(r.Rate, r.Burst); !ok {
			return tooLong("burst × interval", d)
		}
		if r.Algorithm == admit.Combination && r.Floor.Per > maxSpan {
			return tooLong("floor period", r.Floor.Per)
		}
	case admit.FixedWindow, admit.SlidingWindow, admit.SlidingLog, admit.FirstHitWindow:
		if r.Window > maxSpan {
			return tooLong("window", r.Window)
		}
		if r.Window%time.Microsecond != 0 {
			return admit.Errorf(admit.CodeInvalid, "rule %q: window %v: the Redis store needs whole microseconds", r.Name, r.Window)
		}
	case admit.Concurrency:
		if engine.LeaseTTL(r) > maxSpan {
			return tooLong("lease_ttl", engine.LeaseTTL(r))
		}
	}
	return nil
}

// bucketSpan returns burst × per / n and whether it is within maxSpan.
func bucketSpan(rate admit.Rate, burst int64) (time.Duration, bool) {
	// burst ≤ 4e9 and per ≤ 366 days: compare burst·per with maxSpan·n
	// without overflowing, by dividing first.
	q := int64(rate.Per) / rate.N
	if q > 0 && burst > int64(maxSpan)/q {
		return time.Duration(burst) * time.Duration(q), false
	}
	frac := wide.MulDiv(uint64(burst), uint64(int64(rate.Per)%rate.N), uint64(rate.N)) // below burst
	d := time.Duration(burst*q + int64(frac))
	return d, d <= maxSpan
}

// argsCache maps rules to their arguments, weakly: every reload or admin
// change compiles new rules, and the cache must not keep the old ones.
var argsCache engine.RuleCache[*ruleArgs]

// argsOf returns the cached arguments of r, computing and checking them on
// first use. Rules are immutable once in use (see admit.Rule), so the
// pointer identifies the parameters.
func argsOf(r *admit.Rule) *ruleArgs {
	return argsCache.Get(r, func(r *admit.Rule) *ruleArgs {
		a := &ruleArgs{err: CheckRule(r)}
		if a.err == nil {
			a.fill(r)
			// A batch's rule text carries the rule's share parameters
			// too (the library, ruleOf), for its fair charges.
			p, _ := engine.Prepare(r)
			sp := p.ShareParams()
			a.text = strings.Join(a.fixed[:], ",") + "," + strings.Join([]string{
				itoa(int64(sp.Family)), strconv.FormatFloat(sp.Rate, 'g', -1, 64), strconv.FormatFloat(sp.Burst, 'g', -1, 64),
				itoa(sp.Epoch.Microseconds()), itoa(sp.Ceiling), strconv.FormatFloat(sp.Top, 'g', -1, 64),
				strconv.FormatFloat(sp.Pace, 'g', -1, 64), strconv.FormatFloat(sp.Once, 'g', -1, 64),
			}, ",")
			a.lease = r.Algorithm == admit.Concurrency
			a.quota = endsInArgs(r)
			a.window = r.Algorithm == admit.FixedWindow
			a.limit, a.widthU = r.Limit, r.Window.Microseconds()
		}
		return a
	})
}

func (a *ruleArgs) fill(r *admit.Rule) {
	for i := range a.fixed {
		a.fixed[i] = "0"
	}
	a.fixed[chAlgorithm] = strconv.Itoa(int(r.Algorithm))
	if r.Algorithm == admit.FirstHitWindow {
		// The script runs a first-hit window as a quota whose period is
		// the window from now (quotaEnds): a count and its end.
		a.fixed[chAlgorithm] = strconv.Itoa(int(admit.Quota))
	}
	if r.Shadow {
		a.fixed[chShadow] = "1"
	}
	a.fixed[chLeaseTTL] = micros(engine.LeaseTTL(r))
	p := a.fixed[chParams:]
	bucket := func(p []string, rate admit.Rate, burst, initial int64, remember time.Duration) {
		n, per := rate.N, int64(rate.Per)
		p[0], p[1], p[2] = itoa(n), itoa(per/n), itoa(per%n)
		p[3], p[4], p[5] = itoa(burst), itoa(initial), itoa(int64(remember))
	}
	switch r.Algorithm {
	case admit.TokenBucket, admit.GCRA, admit.Combination:
		initial := r.Burst
		if r.Initial != nil {
			initial = *r.Initial
		}
		remember := time.Duration(0)
		if initial < r.Burst {
			remember = bounds.RememberFull
		}
		bucket(p, r.Rate, r.Burst, initial, remember)
		if r.Algorithm != admit.Combination {
			p[9] = itoa(r.MaxDebt) // where a combination's floor goes
		}
		if r.Algorithm == admit.Combination {
			n, per := r.Floor.N, int64(r.Floor.Per)
			p[6], p[7], p[8], p[9] = itoa(n), itoa(per/n), itoa(per%n), itoa(n)
		}
	case admit.FixedWindow, admit.SlidingWindow, admit.SlidingLog:
		p[0], p[1] = itoa(r.Limit), micros(r.Window)
	case admit.Quota:
		p[0] = itoa(r.Limit) // the period's ends come with each charge
	case admit.FirstHitWindow:
		p[0], p[1] = itoa(r.Limit), "-"+micros(r.Window)
	case admit.Concurrency:
		p[0], p[1] = itoa(r.Max), micros(engine.LeaseTTL(r))
	}
}

// micros returns d in whole microseconds, rounded up.
func micros(d time.Duration) string {
	return itoa(int64((d + time.Microsecond - 1) / time.Microsecond))
}

// small holds the decimal strings of small integers, the usual costs.
var small = func() (s [1024]string) {
	for i := range s {
		s[i] = strconv.Itoa(i)
	}
	return s
}()

func itoa(v int64) string {
	if v >= 0 && v < int64(len(small)) {
		return small[v]
	}
	return strconv.FormatInt(v, 10)
}

// endsInArgs reports whether charges of r carry their period's ends
// (quotaEnds) and their replies say the end in µs rather than the reset:
// a quota's, and a first-hit window's, which the script runs as a quota.
func endsInArgs(r *admit.Rule) bool {
	return r.Algorithm == admit.Quota || r.Algorithm == admit.FirstHitWindow
}
