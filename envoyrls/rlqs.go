package envoyrls

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"hash/fnv"
	"io"
	"maps"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	rlext "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"go.opentelemetry.io/otel/attribute"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/admitdev/admit"
	"github.com/admitdev/admit/internal/tracing"
	"github.com/admitdev/admit/internal/wide"
	"github.com/admitdev/admit/policy"
)

// QuotaServiceName is the gRPC name of Envoy's rate limit quota service.
const QuotaServiceName = "envoy.service.rate_limit_quota.v3.RateLimitQuotaService"

// The quota service's defaults and bounds.
const (
	// DefaultReportInterval is the interval between an Envoy's reports
	// assumed until one is observed (Envoy's filter reports every 5 s).
	DefaultReportInterval = 5 * time.Second
	// MinQuotaTTL is the shortest time to live of an assignment: two
	// report intervals, so that one late report does not let it expire.
	MinQuotaTTL = 2 * DefaultReportInterval
	// DeliveryGrace is how long after it is sent an assignment is
	// counted to reach its Envoy, whose time to live starts then.
	DeliveryGrace = 2 * time.Second
	// MaxBucketsPerStream bounds the buckets one stream (one Envoy's
	// domain) is given shares for; past it a new bucket is abandoned.
	// A report of so many buckets of a few short entries is near
	// MaxMessageSize, which bounds every message.
	MaxBucketsPerStream = 500
	// DefaultIdleAfter is how long a bucket may see no request before it
	// is abandoned, its share given back.
	DefaultIdleAfter = time.Minute
	// MaxQuotaStreams bounds the quota streams a server holds at once,
	// and MaxQuotaBuckets their buckets together (a few kilobytes each):
	// past them a stream is refused RESOURCE_EXHAUSTED and a bucket
	// abandoned.
	MaxQuotaStreams = 4096
	MaxQuotaBuckets = 1 << 14
	// MaxBucketsPerConnection bounds the buckets of the streams of one
	// connection together (an Envoy opens a stream a domain).
	MaxBucketsPerConnection = 2 * MaxBucketsPerStream
	// MaxQuotaStreamsPerConnection bounds a connection's quota streams
	// (an Envoy opens one a domain): past it one is refused
	// RESOURCE_EXHAUSTED, as each holds its buffers.
	MaxQuotaStreamsPerConnection = 8
	// MinReportInterval is the least time between two shares of one
	// bucket: a report sooner adds its counts to the next one, so that
	// a client reporting as fast as it can costs the ledger no more.
	MinReportInterval = time.Second
)

// QuotaOptions configure a QuotaService.
type QuotaOptions struct {
	// Service resolves a bucket's entries to the limits that apply, as it
	// resolves a descriptor's. Required.
	Service *Service
	// Ledger keeps the limits' shares; default a MemoryLedger, for a
	// server alone in its deployment.
	Ledger QuotaLedger
	// IdleAfter is how long a bucket may see no request before it is
	// abandoned; default DefaultIdleAfter.
	IdleAfter time.Duration
	// Tick is how often each stream's buckets are looked at between
	// reports (waiting shares, idle buckets, changed rules); default 1 s.
	Tick time.Duration
	// Now reads the clock for intervals between reports; default
	// time.Now. Shares are counted on the ledger's clock.
	Now func() time.Time
}

// QuotaService is Envoy's rate limit quota service (RLQS): the server of
// the rate_limit_quota filter's streams, which divides each limit among the
// Envoys enforcing it by their reported demand. It is safe for concurrent
// use; create it with NewQuotaService and register it with
// Server.ServeQuota.
type QuotaService struct {
	rlqsv3.UnimplementedRateLimitQuotaServiceServer

	opts  QuotaOptions
	id    string // this server's part of holder names
	seq   atomic.Uint64
	stats *quotaStats

	// held counts this server's buckets of each limit, by ledger key;
	// perConn the buckets of each connection, by its peer's address.
	heldMu         sync.Mutex
	held           map[string]*heldLimit
	perConn        map[string]int
	streamsPerConn map[string]int
}

// heldLimit is a limit this server's buckets hold shares of.
type heldLimit struct {
	rule    string
	window  bool
	buckets int
}

var _ rlqsv3.RateLimitQuotaServiceServer = (*QuotaService)(nil)

// NewQuotaService returns a QuotaService, or an error if opts lack a
// Service.
func NewQuotaService(opts QuotaOptions) (*QuotaService, error) {
	if opts.Service == nil {
		return nil, errors.New("envoyrls: QuotaOptions.Service is required")
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.Ledger == nil {
		opts.Ledger = NewMemoryLedger(opts.Now)
	}
	if opts.IdleAfter <= 0 {
		opts.IdleAfter = DefaultIdleAfter
	}
	if opts.Tick <= 0 {
		opts.Tick = time.Second
	}
	var b [6]byte
	_, _ = rand.Read(b[:])
	return &QuotaService{opts: opts, id: hex.EncodeToString(b[:]), stats: newQuotaStats(), held: map[string]*heldLimit{},
		perConn: map[string]int{}, streamsPerConn: map[string]int{}}, nil
}

// quotaKind says what decides a bucket.
type quotaKind uint8

const (
	quotaAllow  quotaKind = iota // no limit applies: ALLOW_ALL
	quotaDeny                    // refused whatever its share: DENY_ALL
	quotaShared                  // limits divided by demand
)

// quotaLimit is one limit a bucket's requests are charged to.
type quotaLimit struct {
	key    string // the ledger's key
	rule   *policy.Rule
	terms  shareLimit
	class  string
	weight int64
	// A window's (a fixed window's or a quota's) allowance is charged to
	// the store under charge; allowance is what the bucket was given of
	// it.
	window    bool
	charge    admit.Charge
	allowance allowance
}

// allowance is what one bucket was given of a window: the rate and
// maximum last sent, and until when that rate was charged, in the window
// that ends at end.
type allowance struct {
	end   time.Time
	units int64   // tokens per fill of the window's terms
	rate  float64 // the same, per second
	max   int64
	until time.Time
}

// quotaBucket is one Envoy bucket of a stream.
type quotaBucket struct {
	id     *rlqsv3.BucketId
	key    string // canonical entries
	holder string // its name in the limits' ledgers

	kind     quotaKind
	why      string // what denies it, for the log and statistics
	limits   []quotaLimit
	tenant   *policy.Tenant
	resolved resolvedFor // zero until resolved

	banUntil   time.Time // when the ban that denies it ends; zero if none
	lastReport time.Time
	interval   time.Duration // between its reports, as observed
	demand     float64       // requests per second, at its last report
	carry      uint64        // requests of reports too soon after the last
	measured   bool          // demand is measured between two reports
	lastUsed   time.Time     // its last report of requests

	sent    *rlqsv3.RateLimitQuotaResponse_BucketAction
	sentAt  time.Time
	expires time.Time // of the last assignment sent
	waiting bool      // no share could be given yet
	// failures counts the ledger's failures in a row for it, since
	// failedSince.
	failures    int
	failedSince time.Time
	// waitUntil is when a window it waits for ends: too late in it for
	// an assignment, it is given the next one's then.
	waitUntil time.Time
	rate      float64 // tokens per second assigned (for statistics)
}

// resolvedFor is what a bucket's resolution depends on.
type resolvedFor struct {
	policy *policy.Policy
	config *Config
	bans   int64 // the bans' version
}

// quotaStream is one StreamRateLimitQuotas call.
type quotaStream struct {
	q       *QuotaService
	id      string
	domain  string
	peer    string
	conn    string // the connection's peer address
	buckets map[string]*quotaBucket
	rules   map[string]int // buckets per rule name, for statistics
}

// StreamRateLimitQuotas implements the quota service: it reads an Envoy's
// usage reports and answers each with the assignments of the buckets
// reported, and between reports sends what changed.
func (q *QuotaService) StreamRateLimitQuotas(stream rlqsv3.RateLimitQuotaService_StreamRateLimitQuotasServer) error {
	ctx := stream.Context()
	st := &quotaStream{q: q, id: q.id + "." + strconv.FormatUint(q.seq.Add(1), 36), peer: q.opts.Service.untrustedPeer(ctx),
		buckets: map[string]*quotaBucket{}, rules: map[string]int{}}
	if pr, ok := peer.FromContext(ctx); ok && pr.Addr != nil {
		st.conn = pr.Addr.String()
	}
	if !q.connStreams(st.conn, 1) {
		q.stats.abandoned("connection_streams")
		return status.Errorf(codes.ResourceExhausted, "a connection holds at most %d quota streams", MaxQuotaStreamsPerConnection)
	}
	defer q.connStreams(st.conn, -1)
	if q.stats.streams.Add(1) > MaxQuotaStreams {
		q.stats.streams.Add(-1)
		q.stats.abandoned("streams_full")
		return status.Errorf(codes.ResourceExhausted, "the server holds %d quota streams, its most", MaxQuotaStreams)
	}
	defer q.stats.streams.Add(-1)
	defer st.leave()

	msgs := make(chan *rlqsv3.RateLimitQuotaUsageReports)
	recvErr := make(chan error, 1)
	go func() {
		for {
			m, err := stream.Recv()
			if err != nil {
				recvErr <- err
				return
			}
			select {
			case msgs <- m:
			case <-ctx.Done():
				return
			}
		}
	}()
	tick := time.NewTicker(q.opts.Tick)
	defer tick.Stop()
	// A stream that names no domain within UnaryTimeout is ended, as a
	// unary call that sends no message is.
	first := time.NewTimer(UnaryTimeout)
	defer first.Stop()
	for {
		var resp *rlqsv3.RateLimitQuotaResponse
		select {
		case m := <-msgs:
			rctx, span := startSpan(ctx, q.opts.Service.quotaTracer)
			r, err := st.report(rctx, m, span)
			span.End(err)
			if err != nil {
				return err
			}
			resp = r
		case err := <-recvErr:
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		case <-tick.C:
			resp = st.tick(ctx)
		case <-first.C:
			if st.domain == "" {
				return status.Error(codes.DeadlineExceeded, "the stream sent no usage report")
			}
		case <-ctx.Done():
			return ctx.Err()
		}
		if resp != nil && len(resp.BucketAction) > 0 {
			if err := stream.Send(resp); err != nil {
				return err
			}
		}
	}
}

// report takes one message of usage reports and returns the answer;
// span is the report's.
func (st *quotaStream) report(ctx context.Context, m *rlqsv3.RateLimitQuotaUsageReports, span tracing.Span) (*rlqsv3.RateLimitQuotaResponse, error) {
	switch d := m.GetDomain(); {
	case st.domain == "" && d == "":
		return nil, status.Error(codes.InvalidArgument, "the first usage report of a stream names its domain")
	case st.domain == "":
		if len(d) > MaxEntryLen {
			return nil, status.Errorf(codes.InvalidArgument, "a domain is at most %d bytes", MaxEntryLen)
		}
		st.domain = d
	case d != "" && d != st.domain:
		return nil, status.Errorf(codes.InvalidArgument, "the stream's domain is %.64q; a stream keeps the domain of its first report (open another stream for %.64q)", st.domain, d)
	}
	now := st.q.opts.Now()
	resp := &rlqsv3.RateLimitQuotaResponse{}
	var due []*quotaBucket
	for _, u := range m.GetBucketQuotaUsages() {
		b, abandon := st.bucket(u.GetBucketId(), now)
		if abandon != nil {
			resp.BucketAction = append(resp.BucketAction, abandon)
			continue
		}
		if !b.lastReport.IsZero() && now.Sub(b.lastReport) < MinReportInterval {
			// Too soon: counted with the next report.
			b.carry += u.GetNumRequestsAllowed() + u.GetNumRequestsDenied()
			st.q.stats.reported(b, u.GetNumRequestsAllowed(), u.GetNumRequestsDenied())
			continue
		}
		st.resolve(b)
		st.measure(b, u, now)
		due = append(due, b)
	}
	resp.BucketAction = append(resp.BucketAction, st.shareAll(ctx, due, true, now)...)
	if span.Recording() {
		traceReport(span, st.domain, len(m.GetBucketQuotaUsages()), due, resp)
	}
	return resp, nil
}

// traceReport records in span what a usage report of reported buckets of
// domain was answered: the rules of the buckets shared now (due), their
// tenant when they have one, and how many assignments were sent.
func traceReport(span tracing.Span, domain string, reported int, due []*quotaBucket, resp *rlqsv3.RateLimitQuotaResponse) {
	var rules []string
	seen := map[string]bool{}
	var tenant *policy.Tenant
	tenants := 0
	for _, b := range due {
		if b.tenant != nil && b.tenant != tenant {
			tenant, tenants = b.tenant, tenants+1
		}
		for _, l := range b.limits {
			if name := l.rule.Name; !seen[name] && len(rules) < tracing.MaxRules {
				seen[name] = true
				rules = append(rules, name)
			}
		}
	}
	attrs := []attribute.KeyValue{Domain.String(domain), ReportedBuckets.Int(reported), Assignments.Int(len(resp.BucketAction))}
	if len(rules) > 0 {
		attrs = append(attrs, tracing.Rules.StringSlice(rules))
	}
	if tenants == 1 {
		attrs = append(attrs, tracing.Tenant.String(tenant.ID))
	}
	span.SetAttributes(attrs...)
}

// bucket returns the stream's bucket of id, new if it has none, or the
// action abandoning it when it cannot be held.
func (st *quotaStream) bucket(id *rlqsv3.BucketId, now time.Time) (*quotaBucket, *rlqsv3.RateLimitQuotaResponse_BucketAction) {
	key, err := bucketKey(id)
	if err != nil {
		st.q.stats.abandoned("invalid")
		return nil, abandonAction(id)
	}
	if b := st.buckets[key]; b != nil {
		return b, nil
	}
	if len(st.buckets) >= MaxBucketsPerStream {
		st.q.stats.abandoned("too_many")
		return nil, abandonAction(id)
	}
	if st.q.stats.buckets.Load() >= MaxQuotaBuckets {
		st.q.stats.abandoned("server_full")
		return nil, abandonAction(id)
	}
	if !st.q.connBuckets(st.conn, 1) {
		st.q.stats.abandoned("connection_full")
		return nil, abandonAction(id)
	}
	h := fnv.New64a()
	_, _ = h.Write([]byte(key))
	b := &quotaBucket{id: &rlqsv3.BucketId{Bucket: maps.Clone(id.GetBucket())}, key: key,
		holder: st.id + "/" + strconv.FormatUint(h.Sum64(), 36), lastUsed: now}
	st.buckets[key] = b
	st.q.stats.buckets.Add(1)
	return b, nil
}

// bucketKey returns a bucket id's entries in one string, sorted, or an
// error for an id past the bounds of a descriptor.
func bucketKey(id *rlqsv3.BucketId) (string, error) {
	m := id.GetBucket()
	if len(m) == 0 || len(m) > MaxEntries {
		return "", errors.New("a bucket id has 1 to 32 entries")
	}
	keys := make([]string, 0, len(m))
	n := 0
	for k, v := range m {
		if k == "" || len(k) > MaxEntryLen || len(v) > MaxEntryLen {
			return "", errors.New("a bucket id's keys are 1 to 1024 bytes, its values at most 1024")
		}
		keys = append(keys, k)
		n += len(k) + len(v) + 2
	}
	slices.Sort(keys)
	var b strings.Builder
	b.Grow(n)
	for _, k := range keys {
		b.WriteString(strconv.Quote(k))
		b.WriteByte('=')
		b.WriteString(strconv.Quote(m[k]))
		b.WriteByte(';')
	}
	return b.String(), nil
}

func abandonAction(id *rlqsv3.BucketId) *rlqsv3.RateLimitQuotaResponse_BucketAction {
	return &rlqsv3.RateLimitQuotaResponse_BucketAction{BucketId: id,
		BucketAction: &rlqsv3.RateLimitQuotaResponse_BucketAction_AbandonAction_{AbandonAction: &rlqsv3.RateLimitQuotaResponse_BucketAction_AbandonAction{}}}
}

// measure takes a bucket's report: its demand is the requests it saw
// (allowed and denied) over the time since its last report, measured
// here: Envoy's time_elapsed is whole seconds, 0 in a first report.
func (st *quotaStream) measure(b *quotaBucket, u *rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage, now time.Time) {
	n := float64(u.GetNumRequestsAllowed()) + float64(u.GetNumRequestsDenied()) + float64(b.carry)
	b.carry = 0
	elapsed := DefaultReportInterval
	if !b.lastReport.IsZero() {
		b.measured = true
		elapsed = now.Sub(b.lastReport)
		// The interval between reports: a bucket's first report comes at
		// its first request, anywhere between two periodic ones.
		if b.interval == 0 {
			b.interval = DefaultReportInterval
		}
		if elapsed >= time.Second {
			b.interval = (b.interval + elapsed) / 2
		}
	}
	te := u.GetTimeElapsed().AsDuration()
	if !u.GetTimeElapsed().IsValid() {
		te = 0 // nanoseconds past a second, or of the other sign
	}
	if te > elapsed || b.lastReport.IsZero() && te >= time.Second {
		// A bucket's first report on this stream, periodic (an Envoy
		// that reopened its stream): its counts are over time_elapsed.
		elapsed = te
		b.measured = true
	}
	elapsed = max(elapsed, time.Second)
	b.demand = n / elapsed.Seconds()
	b.lastReport = now
	if n > 0 {
		b.lastUsed = now
	}
	st.q.stats.reported(b, u.GetNumRequestsAllowed(), u.GetNumRequestsDenied())
}

// ttl is how long a bucket's assignment lives: two of its report
// intervals, at least MinQuotaTTL, in whole seconds as Envoy counts them.
func (b *quotaBucket) ttl() time.Duration {
	if !b.banUntil.IsZero() {
		// A ban's DENY_ALL lasts until the ban ends, whole seconds up.
		return min(max(time.Until(b.banUntil), 0).Truncate(time.Second)+time.Second, MaxBanAssignment)
	}
	d := max(MinQuotaTTL, 2*b.interval)
	return min(d.Round(time.Second)+time.Second, time.Hour)
}

// MaxBanAssignment bounds the TTL of a banned bucket's DENY_ALL: a ban
// lifted early is replaced at the next tick, but an Envoy that lost its
// stream meanwhile holds the assignment that long.
const MaxBanAssignment = time.Hour

// bansVersion returns the version of the bans s's decider enforces.
func bansVersion(s *Service) int64 {
	if b := s.opts.Decider.Bans(); b != nil {
		return b.Version()
	}
	return 0
}

// resolve finds the limits of b's requests.
func (st *quotaStream) resolve(b *quotaBucket) {
	s := st.q.opts.Service
	cfg := s.cfg.Load()
	var p *policy.Policy
	if s.opts.Policy != nil {
		p = s.opts.Policy()
	}
	now := resolvedFor{policy: p, config: cfg, bans: bansVersion(s)}
	if b.resolved == now {
		return
	}
	for _, l := range b.limits {
		st.countRule(l, -1)
	}
	b.resolved, b.limits, b.kind, b.why, b.banUntil = now, nil, quotaAllow, "", time.Time{}
	configured := cfg.HasDomain(st.domain)
	if !configured && p == nil {
		return
	}
	c := s.calls.Get().(*call)
	defer s.calls.Put(c)
	c.peer = st.peer
	c.each, c.quotaAll = false, false
	var entries []*rlext.RateLimitDescriptor_Entry
	if configured {
		entries = cfg.bucketEntries(st.domain, b.id.GetBucket())
	} else {
		keys := make([]string, 0, len(b.id.GetBucket()))
		for k := range b.id.GetBucket() {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		for _, k := range keys {
			entries = append(entries, &rlext.RateLimitDescriptor_Entry{Key: k, Value: b.id.GetBucket()[k]})
		}
	}
	req := &rlsv3.RateLimitRequest{Domain: st.domain, Descriptors: []*rlext.RateLimitDescriptor{{Entries: entries}}}
	if len(entries) == 0 {
		return // no level of the domain's descriptors names an entry
	}
	if err := s.resolve(c, req, cfg, p, !configured); err != nil {
		b.kind, b.why = quotaDeny, admit.ErrorCode(err).String()
		st.q.stats.denied(b.why)
		return
	}
	if c.ban != nil {
		// Refused until the ban ends, with no share asked: its
		// assignment lives as long as the ban, and a ban lifted
		// re-resolves the bucket at the next tick.
		b.kind, b.why, b.banUntil = quotaDeny, "ban", c.ban.Expires
		st.q.stats.denied(b.why)
		return
	}
	if len(c.descs) == 1 && c.descs[0].kind == kindRefuseAll {
		b.kind, b.why = quotaDeny, "refuse_all"
		return
	}
	for i, ch := range c.all.Charges {
		r := c.all.Rules[i]
		if r.Shadow {
			continue
		}
		l := quotaLimit{key: "rlqs:" + ch.Key, rule: r}
		terms, ok := shareLimitOf(&r.Rule)
		if !ok {
			terms, ok = windowTerms(&r.Rule)
			l.window, l.charge = ok, ch
		}
		if !ok {
			// A sliding window or log, or concurrency, cannot be held by
			// token buckets an Envoy fills on its own: counted, and left
			// to the per-request service.
			st.q.stats.unsupported(r.Name)
			continue
		}
		l.terms = terms
		if ch.Share != nil {
			sh := *ch.Share
			l.charge.Share = &sh
			l.class, l.weight = ch.Share.Class, ch.Share.Weight
		}
		b.limits = append(b.limits, l)
		st.countRule(l, 1)
	}
	if len(b.limits) > 0 {
		b.kind = quotaShared
		b.tenant = c.all.Tenant
		// Buckets first: what they give bounds what a window is charged.
		slices.SortStableFunc(b.limits, func(x, y quotaLimit) int {
			if x.window == y.window {
				return 0
			}
			if y.window {
				return -1
			}
			return 1
		})
	}
}

// countRule counts a bucket of limit l in the stream (and the stream in
// its rule's streams once it has one) and in the server's limits held.
func (st *quotaStream) countRule(l quotaLimit, d int) {
	name := l.rule.Name
	n := st.rules[name] + d
	switch {
	case n == 0 && d < 0:
		delete(st.rules, name)
		st.q.stats.ruleStreams(name, -1)
	case n == 1 && d > 0:
		st.rules[name] = n
		st.q.stats.ruleStreams(name, 1)
	default:
		st.rules[name] = n
	}
	st.q.stats.ruleBuckets(name, d)
	key := l.key
	if l.window {
		key = "rlqsw:" + l.charge.Key
	}
	q := st.q
	q.heldMu.Lock()
	defer q.heldMu.Unlock()
	h := q.held[key]
	if h == nil {
		h = &heldLimit{rule: name, window: l.window}
		q.held[key] = h
	}
	if h.buckets += d; h.buckets <= 0 {
		delete(q.held, key)
	}
}

// QuotaShares is one limit as the quota service divides it, among the
// buckets of the Envoys of every server on its ledger.
type QuotaShares struct {
	Rule string `json:"rule"`
	Key  string `json:"key"` // the limit's store key
	// Window says the limit is a fixed window's or a quota's, whose
	// allowances are charged to the store.
	Window bool `json:"window,omitempty"`
	// PerSecond and Burst are the rate and burst divided (a window's: what
	// it had left over the time it had left, at its last share).
	PerSecond float64 `json:"per_second"`
	Burst     int64   `json:"burst"`
	// Holders counts the Envoy buckets with a share, Waiting those
	// waiting for one; Assigned is the rate they may be running, Pool the
	// tokens the limit may still put into new or raised buckets.
	Holders  int     `json:"holders"`
	Waiting  int     `json:"waiting"`
	Assigned float64 `json:"assigned_per_second"`
	Pool     float64 `json:"pool"`
	// Here counts this server's buckets of it.
	Here int `json:"here"`
}

// MaxSharesShown bounds the limits Shares reads.
const MaxSharesShown = 100

// Shares returns the ledgers of the limits this server's buckets hold
// shares of (MaxSharesShown at most, by rule and key), as they are now.
func (q *QuotaService) Shares(ctx context.Context) []QuotaShares {
	q.heldMu.Lock()
	var out []QuotaShares
	for key, h := range q.held {
		out = append(out, QuotaShares{Rule: h.rule, Key: key, Window: h.window, Here: h.buckets})
	}
	q.heldMu.Unlock()
	slices.SortFunc(out, func(a, b QuotaShares) int { return strings.Compare(a.Rule+"\x00"+a.Key, b.Rule+"\x00"+b.Key) })
	out = out[:min(len(out), MaxSharesShown)]
	for i := range out {
		v := &out[i]
		_ = q.opts.Ledger.Update(ctx, v.Key, ledgerTTL, func(now time.Time, data []byte) ([]byte, bool, error) {
			var s shareState
			if decodeState(data, &s) != nil || s.Limit.Fill == 0 {
				return nil, false, nil
			}
			t := now.UnixMicro()
			v.PerSecond, v.Burst = float64(s.Limit.Units)/float64(s.Limit.Fill), s.Limit.Burst
			s.refill(t)
			v.Pool = float64(s.Pool) / 1e6
			for j := range s.Holders {
				h := &s.Holders[j]
				if h.Expires <= t {
					continue
				}
				if h.Max == 0 {
					v.Waiting++
				} else {
					v.Holders++
				}
				v.Assigned += float64(h.rate(t)) / float64(s.Limit.Fill)
			}
			return nil, false, nil
		})
		v.Key = strings.TrimPrefix(strings.TrimPrefix(v.Key, "rlqsw:"), "rlqs:")
	}
	return out
}

// share returns b's assignment now, or nil to send none (it keeps what it
// has while it waits for a share).
func (st *quotaStream) share(ctx context.Context, b *quotaBucket, reported bool, now time.Time) *rlqsv3.RateLimitQuotaResponse_BucketAction {
	st.resolve(b)
	ttl := b.ttl()
	if b.kind != quotaShared {
		return st.apply(b, shareGrant{}, nil, ttl, now)
	}
	g, gttl, err := st.grant(ctx, b, reported, ttl, now)
	return st.apply(b, g, err, gttl, now)
}

// shareAll returns the assignments of bs now, as share does, with the
// buckets of one limit alone (the usual case: a stream holds a bucket per
// user of a tenant's limit) shared in one update of its ledger rather
// than one each.
func (st *quotaStream) shareAll(ctx context.Context, bs []*quotaBucket, reported bool, now time.Time) []*rlqsv3.RateLimitQuotaResponse_BucketAction {
	var out []*rlqsv3.RateLimitQuotaResponse_BucketAction
	groups := map[string][]*quotaBucket{}
	var keys []string
	for _, b := range bs {
		st.resolve(b)
		if b.kind == quotaShared && len(b.limits) == 1 && !b.limits[0].window {
			k := b.limits[0].key
			if groups[k] == nil {
				keys = append(keys, k)
			}
			groups[k] = append(groups[k], b)
			continue
		}
		if a := st.share(ctx, b, reported, now); a != nil {
			out = append(out, a)
		}
	}
	for _, k := range keys {
		group := groups[k]
		asks := make([]shareAsk, len(group))
		for i, b := range group {
			asks[i] = st.ask(b, group[i].limits[0], reported, b.ttl())
		}
		gs, err := st.update(ctx, group[0].limits[0], asks, false)
		for i, b := range group {
			var g shareGrant
			if err == nil {
				g = gs[i]
			}
			if a := st.apply(b, g, err, b.ttl(), now); a != nil {
				out = append(out, a)
			}
		}
	}
	return out
}

// ask is what b asks of limit l.
func (st *quotaStream) ask(b *quotaBucket, l quotaLimit, reported bool, ttl time.Duration) shareAsk {
	return shareAsk{ID: b.holder, Class: l.class, Weight: l.weight, Demand: b.demand, Reported: reported, Measured: b.measured,
		Every: b.interval, TTL: ttl + DeliveryGrace}
}

// apply turns b's grant (or the failure to get one) into its assignment,
// or nil to send none.
func (st *quotaStream) apply(b *quotaBucket, g shareGrant, err error, ttl time.Duration, now time.Time) *rlqsv3.RateLimitQuotaResponse_BucketAction {
	var strategy *typev3.RateLimitStrategy
	switch b.kind {
	case quotaAllow:
		strategy = blanket(typev3.RateLimitStrategy_ALLOW_ALL)
	case quotaDeny:
		strategy = blanket(typev3.RateLimitStrategy_DENY_ALL)
	default:
		if err != nil {
			b.failures++
		} else {
			b.failures = 0
		}
		switch {
		case err != nil && b.sent != nil && b.expires.Sub(now) > 3*time.Second:
			// The ledger failed, or was slow: the bucket keeps what it
			// has, still counted, and asks again at its next report; its
			// rules' on_error decides only when that runs out.
			st.q.stats.failed.Add(1)
			return nil
		case err != nil && b.sent == nil && (b.failures == 1 || now.Sub(b.failedSince) < MinQuotaTTL):
			// A new bucket asks again each tick, and on_error decides it
			// only after a TTL of failures: slow answers (a flood of one
			// limit) are not an outage.
			if b.failures == 1 {
				b.failedSince = now
			}
			st.q.stats.failed.Add(1)
			b.waiting = true
			return nil
		case err != nil:
			strategy = st.failover(b)
		case g.Deny:
			strategy = blanket(typev3.RateLimitStrategy_DENY_ALL)
			st.setRate(b, 0)
		case g.Wait:
			if g.Full && !b.waiting {
				st.q.stats.full.Add(1)
			}
			b.waiting = true
			st.setRate(b, 0)
			return nil
		default:
			tb := &typev3.TokenBucket{
				MaxTokens:     uint32(min(g.Max, math.MaxUint32)),
				TokensPerFill: wrapperspb.UInt32(uint32(g.Rate)),
				FillInterval:  &durationpb.Duration{Seconds: g.Limit.Fill},
			}
			if last := b.sent.GetQuotaAssignmentAction().GetRateLimitStrategy().GetTokenBucket(); last != nil {
				// Envoy takes a bucket whose fill interval differs only in
				// its seconds for the one it has, and keeps the old rate:
				// the nanoseconds, which its rate does not count, tell
				// them apart.
				tb.FillInterval.Nanos = last.GetFillInterval().GetNanos()
				if last.GetFillInterval().GetSeconds() != g.Limit.Fill {
					tb.FillInterval.Nanos = 1 - tb.FillInterval.Nanos%2
				}
			}
			strategy = &typev3.RateLimitStrategy{Strategy: &typev3.RateLimitStrategy_TokenBucket{TokenBucket: tb}}
			st.setRate(b, g.perSecond())
		}
	}
	b.waiting = false
	a := &rlqsv3.RateLimitQuotaResponse_BucketAction{BucketId: b.id,
		BucketAction: &rlqsv3.RateLimitQuotaResponse_BucketAction_QuotaAssignmentAction_{QuotaAssignmentAction: &rlqsv3.RateLimitQuotaResponse_BucketAction_QuotaAssignmentAction{
			AssignmentTimeToLive: durationpb.New(ttl),
			RateLimitStrategy:    strategy,
		}}}
	if b.sent == nil || !sameStrategy(b.sent, a) {
		st.q.stats.changed(b)
	}
	b.sent, b.sentAt, b.expires = a, now, now.Add(ttl)
	return a
}

func blanket(r typev3.RateLimitStrategy_BlanketRule) *typev3.RateLimitStrategy {
	return &typev3.RateLimitStrategy{Strategy: &typev3.RateLimitStrategy_BlanketRule_{BlanketRule: r}}
}

// sameStrategy reports whether two assignments carry one strategy.
func sameStrategy(a, b *rlqsv3.RateLimitQuotaResponse_BucketAction) bool {
	sa := a.GetQuotaAssignmentAction().GetRateLimitStrategy()
	sb := b.GetQuotaAssignmentAction().GetRateLimitStrategy()
	if sa.GetBlanketRule() != sb.GetBlanketRule() || (sa.GetTokenBucket() == nil) != (sb.GetTokenBucket() == nil) {
		return false
	}
	ta, tb := sa.GetTokenBucket(), sb.GetTokenBucket()
	return ta == nil || ta.GetMaxTokens() == tb.GetMaxTokens() && ta.GetTokensPerFill().GetValue() == tb.GetTokensPerFill().GetValue() &&
		ta.GetFillInterval().AsDuration() == tb.GetFillInterval().AsDuration()
}

// grant returns b's share of all its limits: the least of theirs. With
// several limits each bucket's limit is first asked what it would give,
// then each window charged for at most that, then each bucket's limit
// records the least (a limit records at least what the Envoy is sent).
func (st *quotaStream) grant(ctx context.Context, b *quotaBucket, reported bool, ttl time.Duration, now time.Time) (shareGrant, time.Duration, error) {
	ask := st.ask(b, quotaLimit{}, reported, ttl)
	capRate, capMax := math.Inf(1), int64(math.MaxInt64)
	windows := 0
	for _, l := range b.limits {
		if l.window {
			windows++
		}
	}
	shares := len(b.limits) - windows
	if shares > 1 || shares == 1 && windows > 0 {
		ask.TTL = ttl + DeliveryGrace
		for _, l := range b.limits[:shares] {
			g, err := st.askLimit(ctx, l, ask, true)
			if err != nil || g.Wait {
				return g, ttl, err
			}
			capRate, capMax = min(capRate, g.perSecond()), min(capMax, g.Max)
		}
	}
	var least shareGrant
	// Windows: each end is a deadline every assignment must expire by.
	for i := shares; i < len(b.limits); i++ {
		l := &b.limits[i]
		g, wttl, err := st.allow(ctx, b, l, ask, capRate, capMax, ttl, now)
		if err != nil || g.Wait || g.Deny {
			return g, wttl, err
		}
		ttl = min(ttl, wttl)
		capRate, capMax = min(capRate, g.perSecond()), min(capMax, g.Max)
		if least.Limit.Fill == 0 || g.perSecond() < least.perSecond() {
			least.Limit, least.Rate = g.Limit, g.Rate
		}
		if least.Max == 0 || g.Max < least.Max {
			least.Max = g.Max
		}
	}
	ask.TTL = ttl + DeliveryGrace
	if !math.IsInf(capRate, 1) {
		ask.CapRate, ask.CapMax = capRate, capMax
	}
	for _, l := range b.limits[:shares] {
		g, err := st.askLimit(ctx, l, ask, false)
		if err != nil || g.Wait {
			return g, ttl, err
		}
		if least.Limit.Fill == 0 || g.perSecond() < least.perSecond() {
			least.Limit, least.Rate = g.Limit, g.Rate
		}
		if least.Max == 0 || g.Max < least.Max {
			least.Max = g.Max
		}
	}
	return least, ttl, nil
}

// windowTerms returns the terms a fixed window's or a quota's allowances
// are written in (its limit over its length), and false for the other
// algorithms.
func windowTerms(r *admit.Rule) (shareLimit, bool) {
	var per time.Duration
	switch r.Algorithm {
	case admit.FixedWindow:
		per = r.Window
	case admit.Quota:
		per = map[admit.Period]time.Duration{admit.Day: 24 * time.Hour, admit.Week: 7 * 24 * time.Hour,
			admit.Month: 31 * 24 * time.Hour, admit.Year: 366 * 24 * time.Hour}[r.Period]
	}
	if per < MinWindow || r.Limit <= 0 {
		return shareLimit{}, false
	}
	return shareLimitOf(&admit.Rule{Algorithm: admit.TokenBucket, Rate: admit.Rate{N: r.Limit, Per: per}, Burst: r.Limit})
}

// MinWindow is the shortest window the quota service hands out
// allowances of: each assignment must expire, its delivery counted, before
// the window it was charged to ends, and Envoy counts TTLs in whole
// seconds.
const MinWindow = 10 * time.Second

// allow gives b an allowance of window l: a rate, among the buckets of
// all Envoys by their demands, of what the window has left over the time
// it has left, charged to the store's count of the window before it is
// sent. What an Envoy can take under it (a new bucket's maximum, and the
// rate until the assignment expires, its delivery counted) is charged
// whole; a bucket given a new one in the same window is charged what the
// new one can take beyond what the last was charged for. Every
// assignment expires before the window ends, so a window counts every
// token its allowances let through. A window with nothing left is
// DENY_ALL until it ends.
func (st *quotaStream) allow(ctx context.Context, b *quotaBucket, l *quotaLimit, ask shareAsk, capRate float64, capMax int64,
	ttl time.Duration, now time.Time) (shareGrant, time.Duration, error) {
	d := st.q.opts.Service.opts.Decider
	res := policy.Resolution{Policy: b.resolved.policy, Tenant: b.tenant, Charges: []admit.Charge{l.charge}, Rules: []*policy.Rule{l.rule}}
	res.Charges[0].Cost = 0
	var dec admit.Decision
	out, err := d.Decide(ctx, &res, &dec)
	if err != nil || out != policy.Stored {
		return shareGrant{}, ttl, undecided(err)
	}
	at := now
	if !dec.At.IsZero() {
		at = dec.At
	}
	r := dec.Results[0]
	end := at.Add(r.ResetAfter)
	left := r.Remaining
	if left <= 0 {
		return shareGrant{Deny: true}, max(time.Second, r.ResetAfter.Round(time.Second)), nil
	}
	// The assignment expires, delivered late, before the window ends.
	wttl := (end.Sub(at) - DeliveryGrace).Truncate(time.Second)
	if wttl < time.Second {
		// Too late in the window: the bucket keeps what it has, which
		// expires by the window's end, and is given the next window's
		// allowance then.
		b.waitUntil = end
		return shareGrant{Wait: true}, ttl, nil
	}
	ttl = min(ttl, wttl)
	runs := ttl + DeliveryGrace

	// The fair part of what is left over the time left.
	terms := l.terms
	terms.Units = min(terms.Units, wide.MulDiv(uint64(left), uint64(terms.Fill)*uint64(time.Second), uint64(end.Sub(at))))
	terms.Burst = left
	wl := *l
	wl.terms, wl.key = terms, "rlqsw:"+l.charge.Key
	ask.TTL = runs
	g, err := st.askLimit(ctx, wl, ask, false)
	if err != nil || g.Wait {
		return g, ttl, err
	}
	rate := min(g.perSecond(), capRate)
	maxTokens := min(max(1, int64(rate)), capMax, left)
	a := l.allowance
	steady := a.end.Equal(end) && a.rate <= capRate && terms.steady(int64(rate*float64(terms.Fill)), a.units, b.interval.Microseconds())
	if steady {
		// Within the hysteresis: the same strategy again, which Envoy
		// keeps as it is.
		rate, maxTokens = a.rate, min(a.max, left)
	}
	needed := math.Ceil(rate*runs.Seconds()) + float64(maxTokens)
	if a.end.Equal(end) {
		// The same window: what the last assignment was charged for and
		// has not run yet counts, and its tokens in hand were charged.
		ran := max(0, a.until.Sub(at).Seconds()) * a.rate
		needed = math.Ceil(max(rate, a.rate)*runs.Seconds()-ran) + float64(max(0, maxTokens-a.max))
	}
	cost := int64(max(0, min(needed, float64(left))))
	if cost > 0 {
		res.Charges[0].Cost = min(cost, int64(1e9))
		if out, err = d.Decide(ctx, &res, &dec); err != nil || out != policy.Stored {
			return shareGrant{}, ttl, undecided(err)
		}
		if !dec.Results[0].Allowed {
			// Others took it meanwhile: asked again at the next tick.
			return shareGrant{Wait: true}, ttl, nil
		}
	}
	if float64(cost) < needed {
		// Less was left than the share: the rate is what the rest pays
		// for.
		rate = max(0, (float64(cost)-float64(maxTokens))/runs.Seconds())
	}
	units := int64(rate * float64(terms.Fill))
	if steady && float64(cost) >= needed {
		units = a.units
	}
	if units < 1 {
		return shareGrant{Deny: true}, max(time.Second, r.ResetAfter.Round(time.Second)), nil
	}
	l.allowance = allowance{end: end, units: units, rate: float64(units) / float64(terms.Fill), max: maxTokens, until: at.Add(runs)}
	return shareGrant{Limit: terms, Rate: units, Max: maxTokens}, ttl, nil
}

// undecided is the error of a store that did not decide: its own, or that
// it was down (the rules' on_error then decides, as for a bucket's ledger).
func undecided(err error) error {
	if err != nil {
		return err
	}
	return admit.Errorf(admit.CodeUnavailable, "the store is down")
}

// askLimit asks one limit's ledger for a bucket's share; dry asks without
// recording.
func (st *quotaStream) askLimit(ctx context.Context, l quotaLimit, ask shareAsk, dry bool) (shareGrant, error) {
	ask.Class, ask.Weight = l.class, l.weight
	gs, err := st.update(ctx, l, []shareAsk{ask}, dry)
	if err != nil {
		return shareGrant{}, err
	}
	return gs[0], nil
}

// update runs asks against limit l's ledger in one update, in order; dry
// asks without recording.
func (st *quotaStream) update(ctx context.Context, l quotaLimit, asks []shareAsk, dry bool) ([]shareGrant, error) {
	gs := make([]shareGrant, len(asks))
	err := st.q.opts.Ledger.Update(ctx, l.key, ledgerTTL, func(now time.Time, data []byte) ([]byte, bool, error) {
		var s shareState
		if len(data) > 0 {
			if err := decodeState(data, &s); err != nil {
				// Not a state this server wrote: nothing is given rather
				// than a limit shared as if no Envoy held any of it.
				return nil, false, err
			}
		}
		s.setLimit(l.terms)
		for i, ask := range asks {
			gs[i] = s.share(now.UnixMicro(), ask)
		}
		if dry {
			return nil, false, nil
		}
		return appendState(make([]byte, 0, 64+48*len(s.Holders)), &s), true, nil
	})
	switch {
	case admit.ErrorCode(err) == admit.CodeConflict:
		// Other servers kept winning: the buckets keep what they have,
		// and ask again at the next tick.
		for i := range gs {
			gs[i] = shareGrant{Wait: true}
		}
		return gs, nil
	case err != nil:
		return nil, admit.Errorf(admit.CodeUnavailable, "the quota ledger: %w", err)
	}
	return gs, nil
}

// ledgerTTL is how long a limit's ledger outlives its last update: past
// any assignment it counts.
const ledgerTTL = time.Hour + time.Minute

// failover returns b's assignment while the ledger cannot be reached, as
// its rules' on_error modes say: closed denies, local divides each limit
// by the holders it had, open allows.
func (st *quotaStream) failover(b *quotaBucket) *typev3.RateLimitStrategy {
	st.q.stats.failed.Add(1)
	st.q.stats.failovers.Add(1)
	def := admit.FailOpen
	if b.resolved.policy != nil {
		def = b.resolved.policy.OnError()
	}
	local := false
	for _, l := range b.limits {
		mode := l.rule.OnError
		if mode == admit.FailDefault {
			mode = def
		}
		switch mode {
		case admit.FailClosed:
			st.setRate(b, 0)
			return blanket(typev3.RateLimitStrategy_DENY_ALL)
		case admit.FailLocal:
			local = true
		}
	}
	if !local {
		st.setRate(b, 0)
		return blanket(typev3.RateLimitStrategy_ALLOW_ALL)
	}
	// Each limit's rate and burst divided by the buckets this stream
	// holds of it: a stream knows no others.
	var least *typev3.TokenBucket
	for _, l := range b.limits {
		n := int64(max(1, st.rules[l.rule.Name]))
		tb := &typev3.TokenBucket{MaxTokens: uint32(max(1, min(l.terms.Burst/n, math.MaxUint32))),
			TokensPerFill: wrapperspb.UInt32(uint32(max(1, l.terms.capacity()/n))),
			FillInterval:  durationpb.New(time.Duration(l.terms.Fill) * time.Second)}
		if least == nil || float64(tb.TokensPerFill.Value)/float64(l.terms.Fill) < float64(least.TokensPerFill.Value)/least.FillInterval.AsDuration().Seconds() {
			least = tb
		}
	}
	return &typev3.RateLimitStrategy{Strategy: &typev3.RateLimitStrategy_TokenBucket{TokenBucket: least}}
}

// tick looks at every bucket between reports: one waiting for a share
// asks again, one whose rules changed is shared again, one about to expire
// without a report is renewed, and one idle too long is abandoned.
func (st *quotaStream) tick(ctx context.Context) *rlqsv3.RateLimitQuotaResponse {
	if st.domain == "" {
		return nil
	}
	now := st.q.opts.Now()
	resp := &rlqsv3.RateLimitQuotaResponse{}
	s := st.q.opts.Service
	var p *policy.Policy
	if s.opts.Policy != nil {
		p = s.opts.Policy()
	}
	current := resolvedFor{policy: p, config: s.cfg.Load(), bans: bansVersion(s)}
	var due []*quotaBucket
	for key, b := range st.buckets {
		switch {
		case now.Sub(b.lastUsed) >= st.q.opts.IdleAfter:
			st.drop(ctx, key, b)
			st.q.stats.abandoned("idle")
			resp.BucketAction = append(resp.BucketAction, abandonAction(b.id))
		case b.waiting && !now.Before(b.waitUntil), b.resolved != current, b.sent != nil && b.expires.Sub(now) < 3*time.Second && b.lastReport.Before(b.sentAt):
			due = append(due, b)
		}
	}
	resp.BucketAction = append(resp.BucketAction, st.shareAll(ctx, due, false, now)...)
	return resp
}

// drop forgets a bucket: its limits keep counting what it was sent until
// that expires.
func (st *quotaStream) drop(ctx context.Context, key string, b *quotaBucket) {
	for _, l := range b.limits {
		_, _ = st.askLimit(ctx, l, shareAsk{ID: b.holder, Leave: true}, false)
		st.countRule(l, -1)
	}
	st.setRate(b, 0)
	delete(st.buckets, key)
	st.q.stats.buckets.Add(-1)
	st.q.connBuckets(st.conn, -1)
}

// connStreams counts d streams more for connection conn, and reports
// whether it is within MaxQuotaStreamsPerConnection (a stream past it is
// not counted).
func (q *QuotaService) connStreams(conn string, d int) bool {
	q.heldMu.Lock()
	defer q.heldMu.Unlock()
	n := q.streamsPerConn[conn] + d
	if d > 0 && n > MaxQuotaStreamsPerConnection {
		return false
	}
	if n <= 0 {
		delete(q.streamsPerConn, conn)
	} else {
		q.streamsPerConn[conn] = n
	}
	return true
}

// connBuckets counts d buckets more for connection conn, and reports
// whether it is within MaxBucketsPerConnection (a bucket past it is not
// counted).
func (q *QuotaService) connBuckets(conn string, d int) bool {
	q.heldMu.Lock()
	defer q.heldMu.Unlock()
	n := q.perConn[conn] + d
	if d > 0 && n > MaxBucketsPerConnection {
		return false
	}
	if n <= 0 {
		delete(q.perConn, conn)
	} else {
		q.perConn[conn] = n
	}
	return true
}

// leave drops every bucket of an ended stream.
func (st *quotaStream) leave() {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	for key, b := range st.buckets {
		st.drop(ctx, key, b)
	}
}

// setRate counts b's assigned rate in its rules' statistics.
func (st *quotaStream) setRate(b *quotaBucket, perSecond float64) {
	if d := perSecond - b.rate; d != 0 {
		for _, l := range b.limits {
			st.q.stats.ruleRate(l.rule.Name, d)
		}
		b.rate = perSecond
	}
}

// bucketEntries orders a bucket's entries down domain's descriptors: at
// each level the entry of a key the level names (the first such key, in
// order, if it names several), until a level names none. The entries no
// level names are left out.
func (c *Config) bucketEntries(domain string, m map[string]string) []*rlext.RateLimitDescriptor_Entry {
	lv := c.domains[domain]
	used := map[string]bool{}
	var out []*rlext.RateLimitDescriptor_Entry
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for lv != nil {
		var n *node
		var key string
		for _, k := range keys {
			if used[k] {
				continue
			}
			v := m[k]
			n = lv.exact[[2]string{k, v}]
			if n == nil {
				for _, w := range lv.wildcards {
					if w.key == k && matches(w.pattern, v) {
						n = w.n
						break
					}
				}
			}
			if n == nil {
				n = lv.byKey[k]
			}
			if n != nil {
				key = k
				break
			}
		}
		if n == nil {
			break
		}
		used[key] = true
		out = append(out, &rlext.RateLimitDescriptor_Entry{Key: key, Value: m[key]})
		lv = n.next
	}
	return out
}
