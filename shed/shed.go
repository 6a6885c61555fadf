// Package shed protects a service from more load than it can take: load
// shedding. Rate limits say how much a client may ask;
// they cannot say how much the service can serve, which moves with its
// dependencies, its deploys and its neighbours. A Limiter measures it: it
// lets requests through up to a concurrency limit that it adjusts from the
// latency of the requests it admitted, and queues briefly, newest first,
// so that the queue never holds stale work, and sheds the rest.
//
// The gradient algorithm (after Envoy's adaptive concurrency filter and
// Netflix's concurrency-limits) measures the service's unloaded latency
// now and then by letting only a few requests through (a probe), then
// compares the latency of each short window of requests with it: slower
// than Tolerance × unloaded, the limit shrinks in proportion; faster, it
// grows, by about its square root at a time. AIMD, the simple
// alternative, adds one slot per limit's worth of requests served within
// Timeout and takes off a tenth at each slower or failed one.
//
// Requests carry a Class. Under overload sheddable requests go first, then
// default ones; a share of the limit is kept for critical requests
// (Stripe's fleet shedder keeps 20 %). A tenant may hold at most a share of
// the limit, so that one tenant's flood cannot take it all.
//
// Time is read from Options.Now, so tests drive a Limiter on a manual
// clock with synthetic latencies.
package shed

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"sync"
	"time"

	"github.com/admitdev/admit"
)

// Class is a request's priority.
type Class uint8

// The classes. The zero Class is Default; from the first to keep to the
// first to shed they are Critical, Default, Sheddable (see byPriority).
const (
	Default Class = iota
	Critical
	Sheddable
	classes
)

// byPriority lists the classes from the first to keep to the first to
// shed.
var byPriority = [...]Class{Critical, Default, Sheddable}

// Classes returns the classes from the first to keep to the first to shed.
func Classes() []Class { return []Class{Critical, Default, Sheddable} }

var classNames = [...]string{Critical: "critical", Default: "default", Sheddable: "sheddable"}

// String returns "critical", "default" or "sheddable".
func (c Class) String() string {
	if c < classes {
		return classNames[c]
	}
	return "invalid"
}

// ParseClass returns the Class named s.
func ParseClass(s string) (Class, error) {
	for c, name := range classNames {
		if name == s {
			return Class(c), nil
		}
	}
	return 0, admit.Errorf(admit.CodeInvalid, "unknown class %q (want critical, default or sheddable)", s)
}

// The algorithms that adjust the limit.
const (
	Gradient = "gradient"
	AIMD     = "aimd"
)

// Options configure a Limiter. The zero Options is valid and gives the
// defaults documented on each field.
type Options struct {
	// Algorithm is Gradient (the default) or AIMD.
	Algorithm string
	// InitialLimit, MinLimit and MaxLimit bound the concurrency limit;
	// defaults 20, 1 and 1000.
	InitialLimit, MinLimit, MaxLimit int
	// Tolerance is how much slower than the service's unloaded latency
	// the requests of a window may be (their 90th percentile) before the
	// gradient lowers the limit; default 1.1.
	Tolerance float64
	// Window is how often the gradient adjusts the limit; default 100ms.
	// ProbeEvery is how often it measures the unloaded latency again, by
	// letting ProbeLimit requests at a time through (default
	// max(MinLimit, 3)) until ProbeSamples (default 30) have ended;
	// default 30s.
	Window, ProbeEvery time.Duration
	ProbeLimit         int
	ProbeSamples       int
	// Timeout, for AIMD, is the latency past which a request counts as a
	// failure and the limit backs off; default 1s.
	Timeout time.Duration
	// Backoff is AIMD's multiplicative decrease; default 0.9.
	Backoff float64
	// CriticalReserve is the share of the limit only critical requests
	// may use; default 0.2. SheddableShare is the share sheddable
	// requests may use; default 0.7. Default requests use up to
	// 1 − CriticalReserve.
	CriticalReserve, SheddableShare float64
	// TenantShare is the most of the limit one tenant may hold; default
	// 0.5. 1 turns it off.
	TenantShare float64
	// MaxQueue bounds the requests waiting for a slot; default the
	// limit. MaxWait is the longest a critical request waits, default
	// 50ms; a default request waits a fifth of it, a sheddable one not at
	// all. The queue is served by class, then newest first, and a request
	// that waited its time is shed: what a client has given up on is not
	// worth serving, and a long wait is what makes an admitted request
	// slow.
	MaxQueue int
	MaxWait  time.Duration
	// Now reads the clock; default time.Now.
	Now func() time.Time
}

// Validate reports the first option out of bounds, naming it.
func (o *Options) Validate() error {
	fail := func(field, format string, args ...any) error {
		e := admit.Errorf(admit.CodeInvalid, "%s: %s", field, fmt.Sprintf(format, args...))
		e.Field = field
		return e
	}
	for _, f := range []struct {
		name string
		v    int
	}{{"initial_limit", o.InitialLimit}, {"min_limit", o.MinLimit}, {"max_limit", o.MaxLimit}, {"max_queue", o.MaxQueue}, {"probe_limit", o.ProbeLimit}, {"probe_samples", o.ProbeSamples}} {
		if f.v < 0 || f.v > 1_000_000 {
			return fail(f.name, "must be from 0 (the default) to 1000000")
		}
	}
	for _, f := range []struct {
		name string
		v    time.Duration
	}{{"timeout", o.Timeout}, {"max_wait", o.MaxWait}, {"window", o.Window}, {"probe_every", o.ProbeEvery}} {
		if f.v < 0 {
			return fail(f.name, "must not be negative")
		}
	}
	switch {
	case o.Algorithm != "" && o.Algorithm != Gradient && o.Algorithm != AIMD:
		return fail("algorithm", "want gradient or aimd, not %q", o.Algorithm)
	case o.MinLimit > 0 && o.MaxLimit > 0 && o.MinLimit > o.MaxLimit:
		return fail("min_limit", "more than max_limit")
	case o.Tolerance != 0 && (o.Tolerance < 1 || o.Tolerance > 10):
		return fail("tolerance", "must be from 1 to 10")
	case o.Backoff != 0 && (o.Backoff <= 0 || o.Backoff >= 1):
		return fail("backoff", "must be between 0 and 1")
	case o.CriticalReserve < 0 || o.CriticalReserve >= 1:
		return fail("critical_reserve", "must be from 0 to below 1")
	case o.SheddableShare < 0 || o.SheddableShare > 1:
		return fail("sheddable_share", "must be from 0 to 1")
	case o.TenantShare < 0 || o.TenantShare > 1:
		return fail("tenant_share", "must be from 0 to 1")
	}
	return nil
}

func (o *Options) withDefaults() Options {
	d := *o
	def := func(v *int, x int) {
		if *v == 0 {
			*v = x
		}
	}
	deff := func(v *float64, x float64) {
		if *v == 0 {
			*v = x
		}
	}
	if d.Algorithm == "" {
		d.Algorithm = Gradient
	}
	def(&d.MinLimit, 1)
	def(&d.MaxLimit, 1000)
	def(&d.InitialLimit, min(20, d.MaxLimit))
	d.InitialLimit = min(max(d.InitialLimit, d.MinLimit), d.MaxLimit)
	deff(&d.Tolerance, 1.1)
	def(&d.ProbeLimit, max(d.MinLimit, 3))
	def(&d.ProbeSamples, 30)
	if d.Window == 0 {
		d.Window = 100 * time.Millisecond
	}
	if d.ProbeEvery == 0 {
		d.ProbeEvery = 30 * time.Second
	}
	deff(&d.Backoff, 0.9)
	deff(&d.CriticalReserve, 0.2)
	deff(&d.SheddableShare, 0.7)
	deff(&d.TenantShare, 0.5)
	if d.Timeout == 0 {
		d.Timeout = time.Second
	}
	if d.MaxWait == 0 {
		d.MaxWait = 50 * time.Millisecond
	}
	if d.Now == nil {
		d.Now = time.Now
	}
	return d
}

// ErrShed is the error of a request shed: errors.Is(err, ErrShed).
var ErrShed = admit.Errorf(admit.CodeUnavailable, "shed: the service is at its concurrency limit")

// Shed is a request's refusal: its class and a suggested wait.
type Shed struct {
	Class      Class
	RetryAfter time.Duration
	Queued     bool // it waited in the queue before being shed
}

func (s *Shed) Error() string {
	return fmt.Sprintf("shed: %s request refused at the concurrency limit; retry after %v", s.Class, s.RetryAfter)
}

// Is makes errors.Is(err, ErrShed) true.
func (s *Shed) Is(target error) bool { return target == ErrShed }

// Stats is a Limiter's state.
type Stats struct {
	Limit    int
	InFlight int
	// Held is how many of InFlight are held by long-lived connections
	// (see Token.Hold).
	Held   int
	Queued int
	// Shed counts the requests shed, by class.
	Shed [3]int64
	// Admitted counts the requests let through, by class.
	Admitted [3]int64
}

// Limiter is an adaptive concurrency limiter. It is safe for concurrent
// use; create it with New.
type Limiter struct {
	o Options

	mu       sync.Mutex
	limit    float64
	inFlight int
	held     int // of inFlight, the slots of held tokens
	byTenant map[string]int
	queue    []*waiter // a stack: the newest last
	shed     [3]int64
	admitted [3]int64

	// short is the latency now (an exponential average, ns), for the
	// retry hint.
	short float64
	// The gradient's state: the unloaded latency the last probe measured,
	// the probe under way (the limit to go back to after it, its
	// samples) and when the next is due, and the window being collected.
	unloaded  time.Duration
	probing   bool
	saved     float64
	probed    []time.Duration
	nextProbe time.Time
	window    []time.Duration
	windowEnd time.Time
	busiest   int // the most in flight during the window
}

type waiter struct {
	class  Class
	tenant string
	since  time.Time
	ready  chan *Token // closed or sent once, under Limiter.mu
	done   bool
}

// New returns a Limiter, or the first option out of bounds.
func New(o Options) (*Limiter, error) {
	if err := o.Validate(); err != nil {
		return nil, err
	}
	d := o.withDefaults()
	l := &Limiter{o: d, limit: float64(d.InitialLimit), byTenant: map[string]int{}}
	if d.Algorithm == Gradient {
		l.startProbe() // nothing is known of the service yet
	}
	return l, nil
}

// Token is an admitted request's slot: call Done when it ends, or Drop
// when it failed in a way that says the service is overloaded (a
// timeout, a 503 from it).
type Token struct {
	l      *Limiter
	tenant string
	start  time.Time
	once   sync.Once
	// held and released change under l.mu.
	held, released bool
}

// Done releases the slot and reports the request's latency.
func (t *Token) Done() { t.release(false) }

// Drop releases the slot and reports an overload failure.
func (t *Token) Drop() { t.release(true) }

// Hold reports the request's latency so far, as Done would, and keeps
// its slot until Done or Drop, which then report nothing. It is for a
// request that became a long-lived connection (an upgrade to WebSocket):
// the handshake measures the service, the connection's life does not,
// yet the connection takes a share of the service for as long as it
// lasts. A held slot counts against the limit and its tenant's share
// like any other, but not against a probe's few slots, which measure the
// latency of requests. Hold after Done, Drop or Hold does nothing.
func (t *Token) Hold() {
	l := t.l
	now := l.o.Now()
	l.mu.Lock()
	defer l.mu.Unlock()
	if t.held || t.released {
		return
	}
	t.held = true
	l.held++
	l.sample(now.Sub(t.start), false, now)
	l.serve(now)
}

func (t *Token) release(dropped bool) {
	t.once.Do(func() {
		l := t.l
		now := l.o.Now()
		l.mu.Lock()
		defer l.mu.Unlock()
		t.released = true
		l.inFlight--
		if t.tenant != "" {
			if l.byTenant[t.tenant]--; l.byTenant[t.tenant] <= 0 {
				delete(l.byTenant, t.tenant)
			}
		}
		if t.held {
			// Its latency was reported when it was held.
			l.held--
		} else {
			l.sample(now.Sub(t.start), dropped, now)
		}
		l.serve(now)
	})
}

// ceiling returns how much of the limit class may use.
func (l *Limiter) ceiling(c Class) float64 {
	switch c {
	case Critical:
		return l.limit
	case Default:
		return l.limit * (1 - l.o.CriticalReserve)
	}
	return l.limit * min(l.o.SheddableShare, 1-l.o.CriticalReserve)
}

// fits reports whether a request of class and tenant may take a slot now.
func (l *Limiter) fits(c Class, tenant string) bool {
	n := l.inFlight
	if l.probing {
		// A probe measures requests: the connections held open would
		// take its few slots for as long as they last.
		n -= l.held
	}
	if float64(n+1) > max(l.ceiling(c), 1) {
		return false
	}
	if tenant != "" && l.o.TenantShare < 1 {
		if float64(l.byTenant[tenant]+1) > max(l.limit*l.o.TenantShare, 1) {
			return false
		}
	}
	return true
}

func (l *Limiter) take(c Class, tenant string, now time.Time) *Token {
	l.inFlight++
	l.busiest = max(l.busiest, l.inFlight)
	if tenant != "" {
		l.byTenant[tenant]++
	}
	l.admitted[c]++
	return &Token{l: l, tenant: tenant, start: now}
}

// TryAcquire is Acquire without waiting: a Token if a slot is free now,
// else a *Shed.
func (l *Limiter) TryAcquire(c Class, tenant string) (*Token, error) {
	if c >= classes {
		c = Sheddable
	}
	now := l.o.Now()
	l.mu.Lock()
	defer l.mu.Unlock()
	l.expire(now)
	if len(l.queue) == 0 && l.fits(c, tenant) {
		return l.take(c, tenant, now), nil
	}
	return nil, l.refuse(c, false)
}

// Acquire asks for a slot for a request of class c from tenant (""
// when unknown). It returns at once with a Token when one is free, waits
// up to MaxWait in the queue when none is, and otherwise fails with a
// *Shed (errors.Is ErrShed), or with ctx's error.
func (l *Limiter) Acquire(ctx context.Context, c Class, tenant string) (*Token, error) {
	if c >= classes {
		c = Sheddable
	}
	now := l.o.Now()
	l.mu.Lock()
	l.expire(now)
	if len(l.queue) == 0 && l.fits(c, tenant) {
		t := l.take(c, tenant, now)
		l.mu.Unlock()
		return t, nil
	}
	maxQueue := l.o.MaxQueue
	if maxQueue == 0 {
		maxQueue = int(l.limit)
	}
	if c == Sheddable || len(l.queue) >= maxQueue && !l.evict(c) {
		// A sheddable request never waits: when there is no slot at
		// once, the service is busy enough to do without it. A full
		// queue makes room for a request of a higher class only.
		err := l.refuse(c, false)
		l.mu.Unlock()
		return nil, err
	}
	w := &waiter{class: c, tenant: tenant, since: now, ready: make(chan *Token, 1)}
	l.queue = append(l.queue, w)
	l.mu.Unlock()

	timer := time.NewTimer(l.maxWait(c))
	defer timer.Stop()
	select {
	case t := <-w.ready:
		if t == nil {
			return nil, l.shedErr(c, true)
		}
		return t, nil
	case <-timer.C:
	case <-ctx.Done():
	}
	l.mu.Lock()
	if !w.done {
		w.done = true
		l.remove(w)
		err := l.refuse(c, true)
		l.mu.Unlock()
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, err
	}
	l.mu.Unlock()
	// Served while the timer fired: take what it was given.
	if t := <-w.ready; t != nil {
		return t, nil
	}
	return nil, l.shedErr(c, true)
}

// refuse counts a shed request and returns its error. Called with l.mu.
func (l *Limiter) refuse(c Class, queued bool) error {
	l.shed[c]++
	return l.shedErr(c, queued)
}

func (l *Limiter) shedErr(c Class, queued bool) error {
	// A slot frees in about the service's latency; a client told to come
	// back then spreads the retries over that time.
	retry := time.Duration(l.short)
	if retry <= 0 {
		retry = l.o.MaxWait
	}
	return &Shed{Class: c, RetryAfter: retry, Queued: queued}
}

// serve hands free slots to the queue, the highest class first and,
// within a class, newest first, shedding the waiters that waited MaxWait.
// Called with l.mu.
func (l *Limiter) serve(now time.Time) {
	l.expire(now)
	for _, c := range byPriority {
		for i := len(l.queue) - 1; i >= 0; i-- {
			w := l.queue[i]
			if w.class != c || !l.fits(w.class, w.tenant) {
				continue
			}
			w.done = true
			l.queue = append(l.queue[:i], l.queue[i+1:]...)
			w.ready <- l.take(w.class, w.tenant, now)
		}
	}
}

// evict sheds the oldest waiter of the lowest class below c, to make room
// in a full queue for a request of class c, and reports whether it did.
// Called with l.mu.
func (l *Limiter) evict(c Class) bool {
	for k := len(byPriority) - 1; k >= 0 && byPriority[k] != c; k-- {
		low := byPriority[k]
		for i, w := range l.queue {
			if w.class == low {
				w.done = true
				l.shed[w.class]++
				w.ready <- nil
				l.queue = append(l.queue[:i], l.queue[i+1:]...)
				return true
			}
		}
	}
	return false
}

// expire sheds the waiters that waited MaxWait. Called with l.mu.
func (l *Limiter) expire(now time.Time) {
	keep := l.queue[:0]
	for _, w := range l.queue {
		if now.Sub(w.since) >= l.maxWait(w.class) {
			w.done = true
			l.shed[w.class]++
			w.ready <- nil
			continue
		}
		keep = append(keep, w)
	}
	clear(l.queue[len(keep):])
	l.queue = keep
}

// maxWait returns how long a request of class c may wait for a slot.
func (l *Limiter) maxWait(c Class) time.Duration {
	if c == Critical {
		return l.o.MaxWait
	}
	return l.o.MaxWait / 5
}

func (l *Limiter) remove(w *waiter) {
	for i, x := range l.queue {
		if x == w {
			l.queue = append(l.queue[:i], l.queue[i+1:]...)
			return
		}
	}
}

// sample adjusts the limit from one request's latency. Called with l.mu.
func (l *Limiter) sample(rtt time.Duration, dropped bool, now time.Time) {
	o := &l.o
	l.short = ewma(l.short, float64(max(rtt, time.Microsecond)), 0.1)
	switch o.Algorithm {
	case AIMD:
		appLimited := float64(l.inFlight+1) < l.limit/2 // +1: this request's slot, just freed
		switch {
		case dropped || rtt > o.Timeout:
			l.limit *= o.Backoff
		case !appLimited:
			l.limit += 1 / l.limit // about one more per limit's worth of requests
		}
	default:
		l.gradient(rtt, dropped, now)
	}
	l.limit = min(max(l.limit, float64(o.MinLimit)), float64(o.MaxLimit))
}

// startProbe lets only ProbeLimit requests at a time through, to measure
// the service unloaded. Called with l.mu.
func (l *Limiter) startProbe() {
	l.probing, l.saved, l.probed = true, l.limit, l.probed[:0]
	l.limit = float64(l.o.ProbeLimit)
}

// gradient is the gradient algorithm's step. Called with l.mu.
func (l *Limiter) gradient(rtt time.Duration, dropped bool, now time.Time) {
	o := &l.o
	if l.probing {
		l.probed = append(l.probed, rtt)
		l.limit = float64(o.ProbeLimit)
		if len(l.probed) < o.ProbeSamples {
			return
		}
		l.unloaded = percentile(l.probed, 50)
		l.probing, l.limit = false, max(l.saved, float64(o.MinLimit))
		l.nextProbe, l.windowEnd, l.window = now.Add(o.ProbeEvery), now.Add(o.Window), l.window[:0]
		return
	}
	if dropped {
		l.limit *= o.Backoff
		return
	}
	l.window = append(l.window, rtt)
	if now.Before(l.windowEnd) {
		return
	}
	observed := percentile(l.window, 90)
	l.window, l.windowEnd = l.window[:0], now.Add(o.Window)
	gradient := min(2, max(0.5, o.Tolerance*float64(l.unloaded)/float64(max(observed, 1))))
	if float64(l.busiest) < l.limit/2 {
		// The load used less than half the limit: it says nothing of
		// more, and a limit grown idle would let a burst through whole.
		gradient = min(gradient, 1)
		l.limit = max(l.limit*gradient, float64(l.busiest)*2)
	} else {
		l.limit = l.limit*gradient + math.Sqrt(l.limit)
	}
	l.busiest = l.inFlight
	if !now.Before(l.nextProbe) {
		l.startProbe()
	}
}

// percentile returns the p-th percentile of ds, which it sorts.
func percentile(ds []time.Duration, p int) time.Duration {
	slices.Sort(ds)
	return ds[(len(ds)-1)*p/100]
}

func ewma(avg, x, alpha float64) float64 {
	if avg == 0 {
		return x
	}
	return avg + alpha*(x-avg)
}

// Stats returns the limiter's state.
func (l *Limiter) Stats() Stats {
	l.mu.Lock()
	defer l.mu.Unlock()
	return Stats{Limit: int(l.limit), InFlight: l.inFlight, Held: l.held, Queued: len(l.queue), Shed: l.shed, Admitted: l.admitted}
}

// IsShed reports whether err is a shed request's, and returns it.
func IsShed(err error) (*Shed, bool) {
	var s *Shed
	return s, errors.As(err, &s)
}
