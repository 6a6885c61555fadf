// Package rlqsenvoy is a client of the Rate Limit Quota Service (RLQS) that
// decides requests the way Envoy's HTTP rate_limit_quota filter does, so that
// tests can stand a fleet of simulated Envoys in front of an RLQS server and
// check that the server's assignments hold a limit across the fleet.
//
// A [Filter] plays one Envoy with one domain: it keeps one
// StreamRateLimitQuotas stream, subscribes a bucket with a report of its first
// request, reports every bucket it holds once per report interval, and
// enforces the assignments the server pushes back. The model follows the
// filter's global client and request path in envoyproxy/envoy
// (source/extensions/filters/http/rate_limit_quota/global_client_impl.cc and
// filter.cc) and the atomic token bucket in
// source/common/common/token_bucket_impl.{h,cc}. Where Envoy's code and the
// RLQS API documentation disagree, the package follows the code:
//
//   - An assignment's TTL counts only the whole seconds of
//     assignment_time_to_live; an unset or sub-second TTL expires at once,
//     although the API documents an unset TTL as never expiring
//     (startActionExpirationTimer in global_client_impl.cc).
//   - A token bucket fills at tokens_per_fill divided by the whole seconds of
//     fill_interval. A fill_interval under one second divides by zero, which
//     gives an infinite fill rate: the bucket never runs dry
//     (createTokenBucketFromAction). An unset tokens_per_fill counts as zero,
//     not one, and the rate is then raised to Envoy's floor of one token a
//     year.
//   - Whether a token bucket assignment is "identical" to the one in force
//     compares max_tokens, tokens_per_fill and only the nanos of
//     fill_interval (protoTokenBucketsEq). Buckets that differ only in the
//     seconds of fill_interval are therefore identical: the old bucket, with
//     its old fill rate, stays in force.
//   - A token bucket that replaces another starts with
//     floor(new max_tokens × remaining/old max_tokens) tokens, remaining
//     being the old bucket's fractional content at the moment of the swap;
//     one that replaces anything else starts full. global_client_impl.cc
//     computes that count and passes it to the AtomicTokenBucketImpl
//     constructor; every version of that constructor found in Envoy's tree
//     takes a bool (start full or empty) there, under which a partial count
//     would start full. This package reproduces the partial fill that the
//     global client means, which is also what the change that introduced it
//     (envoyproxy/envoy#37624) describes.
//   - The fallback of expired_assignment_behavior lasts the whole seconds of
//     expired_assignment_behavior_timeout (filter.cc), after which the bucket
//     returns to no_assignment_behavior. Without a timeout the fallback ends
//     the moment it begins. reuse_last_assignment is not implemented:
//     filter.cc reads only fallback_rate_limit, so it behaves like no
//     fallback at all.
//   - A closed stream is reopened only by the next report tick, and the
//     report built by that tick goes out on the new stream. What is lost is
//     the subscription report of any bucket first hit while no stream is
//     open, and with it that bucket's first request, since Envoy resets the
//     counters before it finds the stream closed; so is whatever the server
//     never read. Buckets and their assignments survive a reconnect and
//     their TTLs keep running, so requests meanwhile are decided by the
//     assignment in force, or by no_assignment_behavior: failures fail open.
//   - The report timer starts with the first bucket, and from then on every
//     tick sends a message, even one without buckets.
//   - A requests_per_time_unit assignment, or one without a strategy, is
//     ignored: the bucket keeps its action and its TTL. A bucket action with
//     neither an assignment nor an abandon replaces the action in force with
//     an empty one, which allows requests and expires at once. An abandon
//     drops the bucket with its unreported counts, and the bucket's next
//     request subscribes it again. Actions for buckets the filter does not
//     hold, or without a bucket id, are ignored.
//   - The token bucket refills continuously and keeps fractional tokens; a
//     request takes one whole token, and refill beyond max_tokens is lost.
package rlqsenvoy

import (
	"context"
	"fmt"
	"math"
	"sort"
	"strings"
	"sync"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
)

// DefaultReportInterval is the report interval a Config gets when it names
// none. Envoy requires the interval to be configured; five seconds is a common
// choice and keeps tests readable.
const DefaultReportInterval = 5 * time.Second

// minFillRate is Envoy's lower bound for a token bucket's fill rate: one token
// a year. It keeps a zero rate from dividing by zero.
const minFillRate = 1.0 / (365 * 24 * 60 * 60)

// Behavior is the no_assignment_behavior of a bucket: how its requests are
// decided while the server has given it no assignment.
type Behavior int

const (
	// AllowAll allows every request of an unassigned bucket. It is also what
	// Envoy does when no_assignment_behavior is not configured.
	AllowAll Behavior = iota
	// DenyAll denies every request of an unassigned bucket.
	DenyAll
)

func (b Behavior) String() string {
	switch b {
	case AllowAll:
		return "ALLOW_ALL"
	case DenyAll:
		return "DENY_ALL"
	}
	return fmt.Sprintf("Behavior(%d)", int(b))
}

// Phase says where the action in force on a bucket comes from.
type Phase int

const (
	// Unassigned buckets are decided by the no_assignment_behavior.
	Unassigned Phase = iota
	// Assigned buckets follow the server's last assignment until its TTL.
	Assigned
	// Fallback buckets follow the expired_assignment_behavior fallback until
	// its timeout.
	Fallback
)

func (p Phase) String() string {
	switch p {
	case Unassigned:
		return "unassigned"
	case Assigned:
		return "assigned"
	case Fallback:
		return "fallback"
	}
	return fmt.Sprintf("Phase(%d)", int(p))
}

// Config configures a Filter. Its fields mirror the parts of Envoy's
// RateLimitQuotaFilterConfig and RateLimitQuotaBucketSettings that shape what
// a server sees and what a bucket enforces.
type Config struct {
	// Domain goes into every usage report.
	Domain string
	// ReportInterval is the time between periodic reports. Zero means
	// DefaultReportInterval. It paces only the ticker run by Start; Tick
	// sends a report whenever it is called.
	ReportInterval time.Duration
	// NoAssignment decides the requests of a bucket without an assignment,
	// including the first request, which subscribes the bucket.
	NoAssignment Behavior
	// Expired is the fallback_rate_limit of expired_assignment_behavior: the
	// strategy a bucket takes when its assignment expires. Nil sends an
	// expired bucket straight back to NoAssignment.
	Expired *typev3.RateLimitStrategy
	// ExpiredTimeout is expired_assignment_behavior_timeout: how long the
	// Expired fallback stays in force. Envoy keeps only its whole seconds,
	// and zero ends the fallback as soon as it starts.
	ExpiredTimeout time.Duration
	// Now reads the clock that dates reports, TTLs and token buckets. Nil
	// means time.Now. A fake clock makes token buckets and TTLs
	// deterministic; the stream and the ticker still run in real time.
	Now func() time.Time
	// Logf, if set, receives a line for each event Envoy would log: stream
	// failures, ignored actions, dropped reports.
	Logf func(format string, args ...any)
}

// BucketState is a snapshot of a bucket the Filter holds.
type BucketState struct {
	// ID is the bucket's BucketId.
	ID map[string]string
	// Phase says where the action in force comes from.
	Phase Phase
	// Strategy is the strategy in force; nil while Unassigned. An empty
	// strategy (none of its oneof set) allows every request.
	Strategy *typev3.RateLimitStrategy
	// Expires is when the action in force ends; zero while Unassigned.
	Expires time.Time
	// TokenBucket reports whether a token bucket decides the bucket's
	// requests. The next three fields describe it.
	TokenBucket bool
	// Tokens is the token bucket's content now, fractions included.
	Tokens float64
	// MaxTokens is the token bucket's capacity.
	MaxTokens float64
	// FillRate is the token bucket's fill rate in tokens a second. It may be
	// +Inf (fill_interval under one second) or NaN (the same with zero
	// tokens_per_fill); both let every request through.
	FillRate float64
	// PendingAllowed and PendingDenied count the requests the next report
	// will carry.
	PendingAllowed, PendingDenied uint64
	// LastReport is when the bucket last went into a report.
	LastReport time.Time
}

// BucketStats counts what happened to one bucket over the Filter's life,
// across abandons.
type BucketStats struct {
	// ID is the bucket's BucketId.
	ID map[string]string
	// Allowed and Denied count decided requests.
	Allowed, Denied uint64
	// Subscriptions counts the times the bucket was created by a first
	// request, each of which sends a subscription report.
	Subscriptions uint64
	// Assignments counts bucket actions that replaced the action in force,
	// identical ones included.
	Assignments uint64
	// Ignored counts bucket actions that left the bucket as it was
	// (requests_per_time_unit, or no strategy).
	Ignored uint64
	// Abandons counts abandon actions that dropped the bucket.
	Abandons uint64
	// Held reports whether the Filter holds the bucket now.
	Held bool
	// Phase and Strategy describe the action in force when Held.
	Phase    Phase
	Strategy *typev3.RateLimitStrategy
}

// Stats is a snapshot of a Filter's counters.
type Stats struct {
	// Allowed and Denied count decided requests over all buckets.
	Allowed, Denied uint64
	// Ticks counts report ticks that built a report.
	Ticks uint64
	// ReportsQueued counts report messages handed to a stream,
	// ReportsSent those the stream accepted, and ReportsDropped those lost
	// because no stream was open or the stream failed first.
	ReportsQueued, ReportsSent, ReportsDropped uint64
	// Responses counts RateLimitQuotaResponse messages processed.
	Responses uint64
	// UnknownBuckets counts bucket actions for buckets the Filter does not
	// hold, and MissingIDs those without a bucket id; both are ignored.
	UnknownBuckets, MissingIDs uint64
	// StreamsOpened counts stream attempts; Reconnects those after the
	// first; StreamFailures streams that failed or were closed by the
	// server.
	StreamsOpened, Reconnects, StreamFailures uint64
	// Connected reports whether a stream is established now.
	Connected bool
	// Buckets holds per-bucket counters, keyed by Key of the bucket id.
	Buckets map[string]BucketStats
}

// Key returns the canonical form of a bucket id, under which Stats lists a
// bucket. Two ids have the same key exactly when they hold the same pairs,
// as Envoy's hash of the BucketId message is.
func Key(id map[string]string) string {
	keys := make([]string, 0, len(id))
	for k := range id {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	for _, k := range keys {
		fmt.Fprintf(&b, "%d:%s=%d:%s;", len(k), k, len(id[k]), id[k])
	}
	return b.String()
}

// A Filter is one simulated Envoy rate_limit_quota filter. Its methods are
// safe for concurrent use.
type Filter struct {
	cfg         Config
	client      rlqsv3.RateLimitQuotaServiceClient
	epoch       time.Time
	fallbackTTL time.Duration

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	startOnce sync.Once
	closeOnce sync.Once

	mu      sync.Mutex
	closed  bool
	started bool          // the first bucket exists; ticks report from now on
	first   chan struct{} // closed with the first bucket
	stream  *stream
	buckets map[string]*bucket
	lives   map[string]*BucketStats
	stats   Stats
	changed chan struct{} // closed and replaced on every change
}

// bucket is a bucket the Filter holds, as CachedBucket in Envoy.
type bucket struct {
	id         map[string]string
	allowed    uint64 // unreported
	denied     uint64 // unreported
	lastReport time.Time

	phase    Phase
	strategy *typev3.RateLimitStrategy // nil while unassigned
	expires  time.Time
	limiter  *tokenBucket
}

// stream is one StreamRateLimitQuotas call and the reports waiting for it.
type stream struct {
	ctx         context.Context
	cancel      context.CancelFunc
	queue       []*rlqsv3.RateLimitQuotaUsageReports
	wake        chan struct{}
	established bool
	dead        bool
}

// New returns a Filter that talks to the RLQS server behind conn. Nothing is
// sent until the first request: like Envoy, the Filter opens its stream with
// the first bucket. Call Start to send periodic reports, and Close to stop.
func New(conn grpc.ClientConnInterface, cfg Config) *Filter {
	if cfg.ReportInterval <= 0 {
		cfg.ReportInterval = DefaultReportInterval
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Expired != nil {
		cfg.Expired = proto.Clone(cfg.Expired).(*typev3.RateLimitStrategy)
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &Filter{
		cfg:         cfg,
		client:      rlqsv3.NewRateLimitQuotaServiceClient(conn),
		epoch:       cfg.Now(),
		fallbackTTL: cfg.ExpiredTimeout.Truncate(time.Second),
		ctx:         ctx,
		cancel:      cancel,
		first:       make(chan struct{}),
		buckets:     make(map[string]*bucket),
		lives:       make(map[string]*BucketStats),
		changed:     make(chan struct{}),
	}
}

// Start runs the report ticker in the background and returns. As in Envoy,
// the first tick comes one ReportInterval after the first bucket, and each
// later one an interval after the previous. When ctx is done the Filter shuts
// down as if closed. Start is meant for real-time runs; tests on a fake clock
// call Tick instead. Calls after the first do nothing.
func (f *Filter) Start(ctx context.Context) {
	f.startOnce.Do(func() {
		f.mu.Lock()
		defer f.mu.Unlock()
		if f.closed {
			return
		}
		f.wg.Add(1)
		go func() {
			defer f.wg.Done()
			f.runTicker(ctx)
		}()
	})
}

func (f *Filter) runTicker(ctx context.Context) {
	select {
	case <-f.first:
	case <-ctx.Done():
		f.shutdown()
		return
	case <-f.ctx.Done():
		return
	}
	t := time.NewTimer(f.cfg.ReportInterval)
	defer t.Stop()
	for {
		select {
		case <-t.C:
			f.Tick()
			t.Reset(f.cfg.ReportInterval)
		case <-ctx.Done():
			f.shutdown()
			return
		case <-f.ctx.Done():
			return
		}
	}
}

// Close stops the ticker and the stream and waits for them. Requests are
// still decided afterwards, with nothing sent.
func (f *Filter) Close() {
	f.shutdown()
	f.wg.Wait()
}

func (f *Filter) shutdown() {
	f.closeOnce.Do(func() {
		f.mu.Lock()
		f.closed = true
		f.mu.Unlock()
		f.cancel()
	})
}

// Allow decides one request of the bucket with the given id, now, and counts
// it for the next report. The first request of a bucket the Filter does not
// hold is decided by NoAssignment and sends that bucket's subscription report
// at once.
func (f *Filter) Allow(id map[string]string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	now := f.cfg.Now()
	k := Key(id)
	life := f.life(k, id)
	b := f.buckets[k]
	if b == nil {
		ok := f.cfg.NoAssignment != DenyAll
		b = &bucket{id: cloneID(id), lastReport: now}
		if ok {
			b.allowed = 1
		} else {
			b.denied = 1
		}
		f.buckets[k] = b
		life.Subscriptions++
		f.count(life, ok)
		if !f.started {
			f.started = true
			close(f.first)
			f.openStreamLocked()
		}
		f.sendLocked(f.reportLocked([]*bucket{b}, now))
		f.notifyLocked()
		return ok
	}
	f.advance(b, now)
	ok := f.decide(b, now)
	if ok {
		b.allowed++
	} else {
		b.denied++
	}
	f.count(life, ok)
	return ok
}

func (f *Filter) count(life *BucketStats, ok bool) {
	if ok {
		life.Allowed++
		f.stats.Allowed++
	} else {
		life.Denied++
		f.stats.Denied++
	}
}

// decide applies the action in force, as RateLimitQuotaFilter's
// shouldAllowRequest does.
func (f *Filter) decide(b *bucket, now time.Time) bool {
	if b.phase == Unassigned {
		return f.cfg.NoAssignment != DenyAll
	}
	switch s := b.strategy.GetStrategy().(type) {
	case *typev3.RateLimitStrategy_BlanketRule_:
		return s.BlanketRule != typev3.RateLimitStrategy_DENY_ALL
	case *typev3.RateLimitStrategy_TokenBucket:
		return b.limiter.consume(f.seconds(now))
	}
	// requests_per_time_unit (reachable through a fallback) and an empty
	// strategy fail open.
	return true
}

// Tick sends one report with the usage of every bucket the Filter holds,
// reopening the stream first if it is closed, as Envoy's report timer does.
// Before the first bucket there is no timer, and Tick does nothing.
func (f *Filter) Tick() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.started {
		return
	}
	now := f.cfg.Now()
	keys := make([]string, 0, len(f.buckets))
	for k := range f.buckets {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	bs := make([]*bucket, len(keys))
	for i, k := range keys {
		bs[i] = f.buckets[k]
	}
	msg := f.reportLocked(bs, now)
	f.stats.Ticks++
	if f.stream == nil {
		f.openStreamLocked()
	}
	f.sendLocked(msg)
	f.notifyLocked()
}

// reportLocked builds a report of the given buckets and starts their next
// reporting period: counters go back to zero, and time_elapsed counts whole
// seconds since each bucket's last report, truncated as Envoy does.
func (f *Filter) reportLocked(bs []*bucket, now time.Time) *rlqsv3.RateLimitQuotaUsageReports {
	msg := &rlqsv3.RateLimitQuotaUsageReports{Domain: f.cfg.Domain}
	for _, b := range bs {
		elapsed := now.Sub(b.lastReport)
		msg.BucketQuotaUsages = append(msg.BucketQuotaUsages, &rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{
			BucketId:           &rlqsv3.BucketId{Bucket: cloneID(b.id)},
			TimeElapsed:        &durationpb.Duration{Seconds: int64(elapsed / time.Second)},
			NumRequestsAllowed: b.allowed,
			NumRequestsDenied:  b.denied,
		})
		b.allowed, b.denied = 0, 0
		b.lastReport = now
	}
	return msg
}

// sendLocked hands msg to the open stream, or drops it when there is none.
func (f *Filter) sendLocked(msg *rlqsv3.RateLimitQuotaUsageReports) {
	st := f.stream
	if st == nil {
		f.stats.ReportsDropped++
		f.logf("rlqsenvoy: no open stream; dropping a report of %d buckets", len(msg.BucketQuotaUsages))
		return
	}
	f.stats.ReportsQueued++
	st.queue = append(st.queue, msg)
	select {
	case st.wake <- struct{}{}:
	default:
	}
}

// openStreamLocked starts a stream attempt. Like Envoy's asynchronous
// client, it returns at once: reports queue until the stream is up, and are
// lost if it fails.
func (f *Filter) openStreamLocked() {
	if f.closed {
		return
	}
	ctx, cancel := context.WithCancel(f.ctx)
	st := &stream{ctx: ctx, cancel: cancel, wake: make(chan struct{}, 1)}
	f.stream = st
	f.stats.StreamsOpened++
	if f.stats.StreamsOpened > 1 {
		f.stats.Reconnects++
	}
	f.wg.Add(1)
	go func() {
		defer f.wg.Done()
		f.runStream(st)
	}()
}

func (f *Filter) runStream(st *stream) {
	cs, err := f.client.StreamRateLimitQuotas(st.ctx)
	if err != nil {
		f.streamDead(st, err)
		return
	}
	f.mu.Lock()
	if st.dead {
		f.mu.Unlock()
		return
	}
	st.established = true
	f.notifyLocked()
	f.mu.Unlock()

	f.wg.Add(1)
	go func() {
		defer f.wg.Done()
		f.runSender(st, cs)
	}()
	for {
		resp := new(rlqsv3.RateLimitQuotaResponse)
		if err := cs.RecvMsg(resp); err != nil {
			f.streamDead(st, err)
			return
		}
		f.onResponse(resp)
	}
}

func (f *Filter) runSender(st *stream, cs grpc.BidiStreamingClient[rlqsv3.RateLimitQuotaUsageReports, rlqsv3.RateLimitQuotaResponse]) {
	for {
		select {
		case <-st.wake:
		case <-st.ctx.Done():
			return
		}
		f.mu.Lock()
		msgs := st.queue
		st.queue = nil
		f.mu.Unlock()
		for i, m := range msgs {
			if err := cs.Send(m); err != nil {
				// The receiver sees the stream's real error and retires it.
				f.mu.Lock()
				f.stats.ReportsDropped += uint64(len(msgs) - i)
				f.notifyLocked()
				f.mu.Unlock()
				return
			}
			f.mu.Lock()
			f.stats.ReportsSent++
			f.notifyLocked()
			f.mu.Unlock()
		}
	}
}

// streamDead retires a stream, as Envoy's onRemoteClose does. The next tick
// opens another.
func (f *Filter) streamDead(st *stream, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if st.dead {
		return
	}
	st.dead = true
	st.cancel()
	f.stats.ReportsDropped += uint64(len(st.queue))
	st.queue = nil
	if f.stream == st {
		f.stream = nil
	}
	if !f.closed {
		f.stats.StreamFailures++
		f.logf("rlqsenvoy: stream closed: %v", err)
	}
	f.notifyLocked()
}

// onResponse applies a response's bucket actions in order, as
// onQuotaResponseImpl does.
func (f *Filter) onResponse(resp *rlqsv3.RateLimitQuotaResponse) {
	f.mu.Lock()
	defer f.mu.Unlock()
	now := f.cfg.Now()
	for _, a := range resp.GetBucketAction() {
		f.apply(a, now)
	}
	f.stats.Responses++
	f.notifyLocked()
}

func (f *Filter) apply(a *rlqsv3.RateLimitQuotaResponse_BucketAction, now time.Time) {
	id := a.GetBucketId().GetBucket()
	if len(id) == 0 {
		f.stats.MissingIDs++
		f.logf("rlqsenvoy: ignoring a bucket action without a bucket id")
		return
	}
	k := Key(id)
	b := f.buckets[k]
	if b == nil {
		f.stats.UnknownBuckets++
		f.logf("rlqsenvoy: ignoring an action for bucket %v, which is not held", id)
		return
	}
	// Timers that would have fired by now fire first.
	f.advance(b, now)
	life := f.life(k, id)
	switch act := a.GetBucketAction().(type) {
	case *rlqsv3.RateLimitQuotaResponse_BucketAction_QuotaAssignmentAction_:
		qa := act.QuotaAssignmentAction
		s := qa.GetRateLimitStrategy()
		var limiter *tokenBucket
		switch s.GetStrategy().(type) {
		case *typev3.RateLimitStrategy_BlanketRule_:
		case *typev3.RateLimitStrategy_TokenBucket:
			if replaceTokenBucket(b.strategy, s) {
				limiter = f.newTokenBucket(s.GetTokenBucket(), now, b.limiter)
			} else {
				limiter = b.limiter
			}
		default:
			life.Ignored++
			f.logf("rlqsenvoy: ignoring an unsupported strategy %v for bucket %v", s, id)
			return
		}
		b.phase = Assigned
		b.strategy = proto.Clone(s).(*typev3.RateLimitStrategy)
		b.limiter = limiter
		b.expires = now.Add(time.Duration(max(qa.GetAssignmentTimeToLive().GetSeconds(), 0)) * time.Second)
		life.Assignments++
	case *rlqsv3.RateLimitQuotaResponse_BucketAction_AbandonAction_:
		delete(f.buckets, k)
		life.Abandons++
	default:
		// Envoy caches the bare action: nothing to enforce, and a TTL of
		// zero.
		b.phase = Assigned
		b.strategy = &typev3.RateLimitStrategy{}
		b.limiter = nil
		b.expires = now
		life.Assignments++
	}
}

// advance fires the expiry timers that are due by now, in order, so that
// reading state lazily matches Envoy's timers.
func (f *Filter) advance(b *bucket, now time.Time) {
	for {
		switch b.phase {
		case Assigned:
			if now.Before(b.expires) {
				return
			}
			at := b.expires
			fb := f.cfg.Expired
			if fb == nil {
				b.unassign()
				return
			}
			var limiter *tokenBucket
			if tb := fb.GetTokenBucket(); tb != nil {
				if replaceTokenBucket(b.strategy, fb) {
					limiter = f.newTokenBucket(tb, at, b.limiter)
				} else {
					limiter = b.limiter
				}
			}
			b.phase = Fallback
			b.strategy = fb
			b.limiter = limiter
			b.expires = at.Add(f.fallbackTTL)
		case Fallback:
			if now.Before(b.expires) {
				return
			}
			b.unassign()
			return
		default:
			return
		}
	}
}

func (b *bucket) unassign() {
	b.phase = Unassigned
	b.strategy = nil
	b.limiter = nil
	b.expires = time.Time{}
}

// replaceTokenBucket reports whether next needs a new token bucket rather
// than the one in force, comparing as Envoy's protoTokenBucketsEq does.
func replaceTokenBucket(cur, next *typev3.RateLimitStrategy) bool {
	c := cur.GetTokenBucket()
	if c == nil {
		return true
	}
	n := next.GetTokenBucket()
	return n.GetMaxTokens() != c.GetMaxTokens() ||
		n.GetTokensPerFill().GetValue() != c.GetTokensPerFill().GetValue() ||
		n.GetFillInterval().GetNanos() != c.GetFillInterval().GetNanos()
}

// newTokenBucket builds the limiter for tb at time at. A limiter that
// replaces old starts with old's fill ratio, truncated to whole tokens;
// otherwise it starts full.
func (f *Filter) newTokenBucket(tb *typev3.TokenBucket, at time.Time, old *tokenBucket) *tokenBucket {
	rate := float64(tb.GetTokensPerFill().GetValue()) / float64(wholeSeconds(tb.GetFillInterval()))
	maxTokens := uint64(tb.GetMaxTokens())
	initial := maxTokens
	t := f.seconds(at)
	if old != nil {
		fill := float64(maxTokens) * (old.remaining(t) / old.max)
		if math.IsNaN(fill) || math.IsInf(fill, 0) {
			// Only an old bucket of zero capacity gets here; C++ leaves the
			// conversion undefined, and in practice it yields a huge count.
			initial = maxTokens
		} else {
			initial = uint64(fill)
		}
	}
	return newLimiter(float64(maxTokens), rate, float64(initial), t)
}

// wholeSeconds truncates d toward zero to whole seconds, as
// absl::ToInt64Seconds does, without overflowing for long durations.
func wholeSeconds(d *durationpb.Duration) int64 {
	secs := d.GetSeconds()
	nanos := int64(d.GetNanos())
	secs += nanos / 1e9
	nanos %= 1e9
	switch {
	case secs > 0 && nanos < 0:
		secs--
	case secs < 0 && nanos > 0:
		secs++
	}
	return secs
}

// seconds places t on the float seconds scale the token buckets use, as
// Envoy's monotonic seconds are.
func (f *Filter) seconds(t time.Time) float64 {
	return t.Sub(f.epoch).Seconds()
}

// tokenBucket reproduces Envoy's AtomicTokenBucketImpl: it stores only the
// time at which the bucket was (notionally) empty, and the content is the
// time since, times the fill rate, capped at max.
type tokenBucket struct {
	max  float64
	rate float64
	mark float64 // seconds at which the bucket would have been empty
}

func newLimiter(maxTokens, rate, initial, now float64) *tokenBucket {
	rate = cmax(math.Abs(rate), minFillRate)
	mark := now
	if initial != 0 {
		mark -= initial / rate
	}
	return &tokenBucket{max: maxTokens, rate: rate, mark: mark}
}

func (tb *tokenBucket) remaining(now float64) float64 {
	return cmin(tb.max, (now-tb.mark)*tb.rate)
}

func (tb *tokenBucket) consume(now float64) bool {
	total := tb.remaining(now)
	if !(total >= 1) {
		return false
	}
	tb.mark = now - (total-1)/tb.rate
	return true
}

// cmin and cmax order their operands as C++'s std::min and std::max do, which
// matters when one is NaN: cmin(a, NaN) is a, where math.Min gives NaN.
func cmin(a, b float64) float64 {
	if b < a {
		return b
	}
	return a
}

func cmax(a, b float64) float64 {
	if a < b {
		return b
	}
	return a
}

// Bucket returns the state of the bucket with the given id, and whether the
// Filter holds it.
func (f *Filter) Bucket(id map[string]string) (BucketState, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	b := f.buckets[Key(id)]
	if b == nil {
		return BucketState{}, false
	}
	now := f.cfg.Now()
	f.advance(b, now)
	s := BucketState{
		ID:             cloneID(b.id),
		Phase:          b.phase,
		Expires:        b.expires,
		PendingAllowed: b.allowed,
		PendingDenied:  b.denied,
		LastReport:     b.lastReport,
	}
	if b.strategy != nil {
		s.Strategy = proto.Clone(b.strategy).(*typev3.RateLimitStrategy)
	}
	if b.strategy.GetTokenBucket() != nil && b.limiter != nil {
		s.TokenBucket = true
		s.Tokens = b.limiter.remaining(f.seconds(now))
		s.MaxTokens = b.limiter.max
		s.FillRate = b.limiter.rate
	}
	return s, true
}

// Stats returns a snapshot of the Filter's counters.
func (f *Filter) Stats() Stats {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.statsLocked()
}

func (f *Filter) statsLocked() Stats {
	now := f.cfg.Now()
	s := f.stats
	s.Connected = f.stream != nil && f.stream.established && !f.stream.dead
	s.Buckets = make(map[string]BucketStats, len(f.lives))
	for k, life := range f.lives {
		bs := *life
		bs.ID = cloneID(life.ID)
		if b := f.buckets[k]; b != nil {
			f.advance(b, now)
			bs.Held = true
			bs.Phase = b.phase
			if b.strategy != nil {
				bs.Strategy = proto.Clone(b.strategy).(*typev3.RateLimitStrategy)
			}
		}
		s.Buckets[k] = bs
	}
	return s
}

// WaitFor blocks until cond holds for the Filter's Stats or ctx is done. It
// re-evaluates cond after every change: a report sent or dropped, a response
// processed, a stream opened or closed, a bucket created. Changes that come
// from the clock alone, such as an expiry, wake no waiter. Tests use it to
// wait for the effect of a server's message instead of sleeping.
func (f *Filter) WaitFor(ctx context.Context, cond func(Stats) bool) error {
	for {
		f.mu.Lock()
		s := f.statsLocked()
		ch := f.changed
		f.mu.Unlock()
		if cond(s) {
			return nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

func (f *Filter) notifyLocked() {
	close(f.changed)
	f.changed = make(chan struct{})
}

func (f *Filter) life(k string, id map[string]string) *BucketStats {
	l := f.lives[k]
	if l == nil {
		l = &BucketStats{ID: cloneID(id)}
		f.lives[k] = l
	}
	return l
}

func (f *Filter) logf(format string, args ...any) {
	if f.cfg.Logf != nil {
		f.cfg.Logf(format, args...)
	}
}

func cloneID(id map[string]string) map[string]string {
	c := make(map[string]string, len(id))
	for k, v := range id {
		c[k] = v
	}
	return c
}
