package policy

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/admitdev/admit"
	"github.com/admitdev/admit/internal/bounds"
	"github.com/admitdev/admit/internal/engine"
	"github.com/admitdev/admit/memstore"
)

// Outcome says how a Decider reached a decision.
type Outcome uint8

const (
	// Stored: the store decided.
	Stored Outcome = iota
	// FailedOpen: the store was unavailable and every rule fails open, so
	// the request was admitted without a decision.
	FailedOpen
	// FailedLocal: the store was unavailable and a rule fails local, so
	// the in-process limiter decided, with each limit divided among the
	// servers.
	FailedLocal
	// Banned: a ban refused the request, and the store was not asked
	// (see Bans).
	Banned
)

// String returns "stored", "failed_open", "failed_local" or "banned", as
// logs and traces name the outcome.
func (o Outcome) String() string {
	switch o {
	case Stored:
		return "stored"
	case FailedOpen:
		return "failed_open"
	case FailedLocal:
		return "failed_local"
	case Banned:
		return "banned"
	}
	return "outcome(" + strconv.Itoa(int(o)) + ")"
}

// A Decider decides resolved requests against a store and applies the
// rules' failure modes (on_error) when the store cannot answer: a rule that
// fails closed refuses with the store's error, one that fails local sends
// the request to an in-process limiter, and otherwise the request is
// admitted. The HTTP API, the middleware and the proxy share it, so that a
// rule fails the same way wherever it is checked.
//
// A Decider is safe for concurrent use. Create it with NewDecider.
type Decider struct {
	store     admit.Store
	instances int64

	localMu     sync.Mutex
	local       *memstore.Store // started by the first local decision
	localClosed bool
	// shares caches each rule's local share; weakly keyed, so rules of
	// past policies leave it.
	shares engine.RuleCache[*admit.Rule]

	// downSince is when the current outage began (Unix nanoseconds), 0
	// while the store answers; lastFailure is when a call last failed;
	// onChange hears of each change.
	downSince   atomic.Int64
	lastFailure atomic.Int64
	onChange    func(StoreEvent)
	usage       Observer
	observers   []Observer
	bans        *Bans

	// tracer, when set, spans the store's calls (see Trace); storeAttrs
	// are their attributes.
	tracer     trace.Tracer
	storeAttrs []attribute.KeyValue
	storeKind  trace.SpanKind
}

// storeSettle is how long a store must go without a failed call before an
// outage is over: a Cluster that lost one master answers for the other
// slots meanwhile, and the outage should not flap with every decision.
const storeSettle = time.Second

// StoreEvent is a change in whether the store answers, as a Decider's
// decisions see it: the first decision that finds the store unavailable
// after it answered, and the first it answers once no call has failed for
// a second.
type StoreEvent struct {
	Up bool
	At time.Time
	// Outage is how long the store was unavailable (Up events), from the
	// first decision it failed to the first it answered again.
	Outage time.Duration
	// Err is the failure that began the outage (Down events).
	Err error
}

// OnStoreChange sets f to hear of the store going down and coming back:
// one event each way per outage, however many decisions fail in it (an
// outage ends once no call has failed for a second). Set it before the
// Decider is used.
func (d *Decider) OnStoreChange(f func(StoreEvent)) { d.onChange = f }

// StoreDownSince returns when the current outage began, and false while
// the store answers.
func (d *Decider) StoreDownSince() (time.Time, bool) {
	if v := d.downSince.Load(); v != 0 && time.Now().UnixNano()-d.lastFailure.Load() < int64(outageOver) {
		return time.Unix(0, v), true
	}
	return time.Time{}, false
}

// outageOver is how long after the store's last failure an outage is
// over, though no call since has been answered to say so (no traffic):
// the next failure starts another.
const outageOver = 10 * time.Second

// storeAnswered records a call the store answered.
func (d *Decider) storeAnswered() {
	v := d.downSince.Load()
	if v == 0 {
		return
	}
	now := time.Now()
	if now.UnixNano()-d.lastFailure.Load() < int64(storeSettle) {
		return // still failing for some calls
	}
	if d.downSince.CompareAndSwap(v, 0) && d.onChange != nil {
		d.onChange(StoreEvent{Up: true, At: now, Outage: now.Sub(time.Unix(0, v))})
	}
}

// storeFailed records a call the store could not answer.
func (d *Decider) storeFailed(err error) {
	now := time.Now()
	last := d.lastFailure.Swap(now.UnixNano())
	if v := d.downSince.Load(); v != 0 && now.UnixNano()-last >= int64(outageOver) {
		// An outage no answered call ended: this failure is another's.
		d.downSince.CompareAndSwap(v, 0)
	}
	if d.downSince.Load() == 0 && d.downSince.CompareAndSwap(0, now.UnixNano()) && d.onChange != nil {
		d.onChange(StoreEvent{At: now, Err: err})
	}
}

// NewDecider returns a Decider over store. instances is the number of
// servers sharing the limits (at least 1): with on_error local each takes
// limit ÷ instances.
func NewDecider(store admit.Store, instances int64) *Decider {
	return &Decider{store: store, instances: max(1, instances)}
}

// Decide decides the charges of res into dec. A resolution without charges
// is admitted. The error is the store's when it is not an outage, or the
// outage itself when a rule fails closed.
//
// With bans enforced (EnforceBans), a request a ban refuses is decided by
// the ban alone, with no store call: res then holds the ban's rule (named
// "ban:" and the ban's id) and dec its one result, refusing until the ban
// ends, with outcome Banned.
func (d *Decider) Decide(ctx context.Context, res *Resolution, dec *admit.Decision) (Outcome, error) {
	if b := d.bans; b != nil && b.refuse(res, dec) {
		return Banned, nil
	}
	out, err := d.decide(ctx, res, dec)
	if err == nil {
		if d.usage != nil {
			d.usage.Observe(res, dec, out)
		}
		for _, o := range d.observers {
			o.Observe(res, dec, out)
		}
		if b := d.bans; b != nil && !dec.Allowed && out == Stored {
			b.observe(res, dec)
		}
	}
	return out, err
}

// RefuseBanned makes dec the refusal of res by the ban in force over its
// request, as Decide does, and reports whether there is one: for a front
// end that asks the store by other means (a reservation's booking) than
// Decide.
func (d *Decider) RefuseBanned(res *Resolution, dec *admit.Decision) bool {
	return d.bans != nil && d.bans.refuse(res, dec)
}

// EnforceBans makes d refuse the requests b's bans name, and count the
// refusals b's escalation rules count. Call it before the first decision.
func (d *Decider) EnforceBans(b *Bans) { d.bans = b }

// Bans returns the bans d enforces, nil if none.
func (d *Decider) Bans() *Bans {
	if d == nil {
		return nil
	}
	return d.bans
}

// An Observer is told of every decision a Decider makes, with its
// outcome (package usage's Meter counts quotas' usage so).
type Observer interface {
	Observe(res *Resolution, dec *admit.Decision, out Outcome)
}

// MeterUsage makes d tell o of every decision it makes. Call it before
// the first decision.
func (d *Decider) MeterUsage(o Observer) { d.usage = o }

// Observe makes d tell o of every decision it makes, as well as the
// usage meter and those before. Call it before the first decision.
func (d *Decider) Observe(o Observer) { d.observers = append(d.observers, o) }

func (d *Decider) decide(ctx context.Context, res *Resolution, dec *admit.Decision) (Outcome, error) {
	if len(res.Charges) == 0 {
		dec.Reset()
		dec.Allowed = true
		return Stored, nil
	}
	var err error
	if d.tracer == nil {
		err = d.store.Decide(ctx, res.Charges, dec)
	} else {
		err = d.tracedDecide(ctx, res.Charges, dec)
	}
	if err == nil {
		d.storeAnswered()
		return Stored, checkResults(res, dec)
	}
	if admit.ErrorCode(err) != admit.CodeUnavailable {
		return Stored, err
	}
	if cerr := ctx.Err(); cerr != nil {
		// The caller gave up (its deadline passed, it went away), not the
		// store: no failure mode applies, or a caller could choose its
		// deadline to be let through.
		return Stored, errors.Join(cerr, err)
	}
	return d.Failover(ctx, res, dec, err)
}

// checkResults holds the store to its contract, one result per charge, so
// that every front end may read a result for each of the request's rules.
func checkResults(res *Resolution, dec *admit.Decision) error {
	if len(dec.Results) != len(res.Charges) {
		n := len(dec.Results)
		dec.Reset()
		return admit.Errorf(admit.CodeInternal, "the store answered %d of %d results", n, len(res.Charges))
	}
	return nil
}

// Failover decides res when the store failed with cause (an
// admit.CodeUnavailable error): cause itself if any rule fails closed, the
// local limiter's decision if any fails local, admitted otherwise. Like a
// stored decision, an admission without the store carries one result per
// charge: each admits, with the rule's whole limit as its limit and as its
// remaining, since nothing is known of the store's levels.
func (d *Decider) Failover(ctx context.Context, res *Resolution, dec *admit.Decision, cause error) (Outcome, error) {
	d.storeFailed(cause)
	def := admit.FailOpen
	if res.Policy != nil {
		def = res.Policy.OnError()
	}
	local := false
	for _, r := range res.Rules {
		mode := r.OnError
		if mode == admit.FailDefault {
			mode = def
		}
		switch mode {
		case admit.FailClosed:
			return Stored, cause
		case admit.FailLocal:
			local = true
		}
	}
	if !local {
		admitUnknown(res, dec)
		dec.Lease = unheld(res, time.Now())
		return FailedOpen, nil
	}
	l := d.startLocal()
	if l == nil {
		return Stored, cause // closed
	}
	charges := make([]admit.Charge, len(res.Charges))
	for i, ch := range res.Charges {
		ch.Rule = d.shares.Get(ch.Rule, d.share)
		if err := engine.CheckCost(ch.Rule, ch.Cost); err != nil {
			ch.Cost = ch.Rule.Capacity()
		}
		charges[i] = ch
	}
	if err := l.Decide(ctx, charges, dec); err != nil {
		return FailedLocal, err
	}
	if dec.Lease.ID != "" {
		dec.Lease.ID = localLease + dec.Lease.ID
	}
	return FailedLocal, checkResults(res, dec)
}

// Leases taken without the store say so in their ids (store ids are hex),
// so that renewing and releasing them reach what holds them: the local
// limiter, or nothing for a lease admitted open.
const (
	localLease  = "local-"
	unheldLease = "unheld-" // then the TTL in milliseconds, "-", a random part
)

// unheld returns a lease that holds no slot, for a concurrency charge
// admitted while the store is down, so that the holder can renew and
// release it like any other.
func unheld(res *Resolution, now time.Time) admit.Lease {
	ttl := time.Duration(0)
	for _, ch := range res.Charges {
		if ch.DryRun {
			return admit.Lease{}
		}
		if ch.Rule.Algorithm == admit.Concurrency {
			t := ch.LeaseTTL
			if t <= 0 {
				t = engine.LeaseTTL(ch.Rule)
			}
			ttl = max(ttl, t)
		}
	}
	if ttl == 0 {
		return admit.Lease{}
	}
	var b [8]byte
	_, _ = rand.Read(b[:])
	return admit.Lease{
		ID:        unheldLease + strconv.FormatInt(ttl.Milliseconds(), 10) + "-" + hex.EncodeToString(b[:]),
		ExpiresAt: now.Add(ttl),
	}
}

// RenewLease renews a lease that a decision of d took: in the store, in the
// local limiter for one taken while the store was down, or, for one
// admitted open, by its TTL alone.
func (d *Decider) RenewLease(ctx context.Context, id string) (admit.Lease, error) {
	switch {
	case strings.HasPrefix(id, unheldLease):
		ms, _, ok := strings.Cut(id[len(unheldLease):], "-")
		n, err := strconv.ParseInt(ms, 10, 64)
		if !ok || err != nil || n <= 0 || n > bounds.MaxRatePeriod.Milliseconds() {
			return admit.Lease{}, admit.Errorf(admit.CodeNotFound, "lease %.64q does not exist", id)
		}
		return admit.Lease{ID: id, ExpiresAt: time.Now().Add(time.Duration(n) * time.Millisecond)}, nil
	case strings.HasPrefix(id, localLease):
		l := d.localStore()
		if l == nil {
			return admit.Lease{}, admit.Errorf(admit.CodeNotFound, "lease %.64q does not exist", id)
		}
		lease, err := l.RenewLease(ctx, id[len(localLease):])
		if err == nil {
			lease.ID = id
		}
		return lease, err
	}
	ctx, span := d.startStore(ctx, "admit.store.renew_lease")
	lease, err := d.store.RenewLease(ctx, id)
	endStore(span, err)
	return lease, err
}

// ReleaseLease releases a lease that a decision of d took (see RenewLease).
func (d *Decider) ReleaseLease(ctx context.Context, id string) error {
	switch {
	case strings.HasPrefix(id, unheldLease):
		return nil
	case strings.HasPrefix(id, localLease):
		l := d.localStore()
		if l == nil {
			return admit.Errorf(admit.CodeNotFound, "lease %.64q does not exist", id)
		}
		return l.ReleaseLease(ctx, id[len(localLease):])
	}
	ctx, span := d.startStore(ctx, "admit.store.release_lease")
	err := d.store.ReleaseLease(ctx, id)
	endStore(span, err)
	return err
}

// startLocal returns the local limiter, started on first use; nil once d
// is closed.
func (d *Decider) startLocal() *memstore.Store {
	d.localMu.Lock()
	defer d.localMu.Unlock()
	if d.local == nil && !d.localClosed {
		d.local = memstore.New(nil)
	}
	return d.local
}

// localStore returns the local limiter if it has started.
func (d *Decider) localStore() *memstore.Store {
	d.localMu.Lock()
	defer d.localMu.Unlock()
	return d.local
}

// admitUnknown fills dec with an admission of every charge of res whose
// levels are unknown.
func admitUnknown(res *Resolution, dec *admit.Decision) {
	dec.Reset()
	for i := range res.Charges {
		r := res.Charges[i].Rule
		c := r.Capacity()
		dec.Results = append(dec.Results, admit.Result{Rule: r.Name, Allowed: true, Shadow: r.Shadow, Limit: c, Remaining: c})
	}
	engine.Summarize(dec)
}

// share returns r with its limits divided among the servers, for the local
// limiter; at least 1 of everything is kept.
func (d *Decider) share(r *admit.Rule) *admit.Rule {
	l := *r
	n := d.instances
	div := func(v int64) int64 { return max(1, v/n) }
	l.Burst, l.Limit, l.Max = div(l.Burst), div(l.Limit), div(l.Max)
	if l.Initial != nil {
		v := min(*l.Initial, l.Burst)
		l.Initial = &v
	}
	if l.Rate.N > 0 {
		l.Rate.N = div(l.Rate.N)
	}
	if l.Floor.N > 0 {
		l.Floor.N = div(l.Floor.N)
	}
	if err := l.Validate(); err != nil {
		l = *r // a share too small to be valid: keep the whole limit
	}
	return &l
}

// Close stops the local limiter, if it ever ran. It does not close the
// store, which the caller owns.
func (d *Decider) Close() error {
	d.localMu.Lock()
	l := d.local
	d.local, d.localClosed = nil, true
	d.localMu.Unlock()
	if l != nil {
		return l.Close()
	}
	return nil
}

// Refund gives back charges of a decision that out says where it was made
// and that the store made at at (admit.Decision.At): to the store, or to
// the local limiter for a decision made there (with the rules' local
// shares, as it was charged); a decision admitted open charged nothing.
// The store's errors are returned and count toward an outage like a
// decision's.
func (d *Decider) Refund(ctx context.Context, charges []admit.Charge, at time.Time, out Outcome) error {
	switch out {
	case Stored:
		f, ok := d.store.(engine.Refunder)
		if !ok {
			return admit.Errorf(admit.CodeInvalid, "the store (%T) takes no refunds", d.store)
		}
		ctx, span := d.startStore(ctx, "admit.store.refund")
		err := f.Refund(ctx, charges, at)
		endStore(span, err)
		if admit.ErrorCode(err) == admit.CodeUnavailable {
			d.storeFailed(err)
		}
		return err
	case FailedLocal:
		l := d.localStore()
		if l == nil {
			return nil
		}
		local := make([]admit.Charge, len(charges))
		for i, ch := range charges {
			ch.Rule = d.shares.Get(ch.Rule, d.share)
			ch.Cost = min(ch.Cost, ch.Rule.MaxCost, ch.Rule.Capacity())
			local[i] = ch
		}
		return l.Refund(ctx, local, at)
	}
	return nil
}

// Trace makes d span the calls it makes to its store (decisions, refunds,
// leases renewed and released) with tp's tracer, each a child of the
// span of the decision in its context: "admit.store.decide" and so on,
// with the store's kind ("memory", "redis") as admit.store, the charges
// as admit.charges and a failure's admit.Code as error.type. A call
// whose context holds no recording span (the caller traces nothing, or
// its sampler dropped the trace) makes none. A nil tp makes none at all,
// at the cost of a nil check. Call Trace before the first decision.
func (d *Decider) Trace(tp trace.TracerProvider, store string) {
	if tp == nil {
		d.tracer, d.storeAttrs = nil, nil
		return
	}
	d.tracer = tp.Tracer("github.com/admitdev/admit")
	d.storeAttrs, d.storeKind = nil, trace.SpanKindClient
	if store != "" {
		d.storeAttrs = append(d.storeAttrs, attribute.String("admit.store", store))
	}
	switch store {
	case "memory":
		// In this process: not a call to another.
		d.storeKind = trace.SpanKindInternal
	case "redis":
		d.storeAttrs = append(d.storeAttrs, attribute.String("db.system.name", "redis"))
	}
}

// tracedDecide is d.store.Decide in a span of its own.
func (d *Decider) tracedDecide(ctx context.Context, charges []admit.Charge, dec *admit.Decision) error {
	ctx, span := d.startStore(ctx, "admit.store.decide")
	if span != nil {
		span.SetAttributes(attribute.Int("admit.charges", len(charges)))
	}
	err := d.store.Decide(ctx, charges, dec)
	endStore(span, err)
	return err
}

// startStore starts the span of a store call named name, or returns ctx
// and nil when d traces nothing or ctx holds no recording span.
func (d *Decider) startStore(ctx context.Context, name string) (context.Context, trace.Span) {
	if d.tracer == nil || !trace.SpanFromContext(ctx).IsRecording() {
		return ctx, nil
	}
	return d.tracer.Start(ctx, name, trace.WithSpanKind(d.storeKind), trace.WithAttributes(d.storeAttrs...))
}

// endStore ends a span startStore started, if it started one.
func endStore(span trace.Span, err error) {
	if span == nil {
		return
	}
	if err != nil {
		span.SetAttributes(attribute.String("error.type", admit.ErrorCode(err).String()))
		span.SetStatus(codes.Error, err.Error())
	}
	span.End()
}
