package envoyrls

import (
	"context"
	"errors"
	"net/netip"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/admitdev/admit"
	"github.com/admitdev/admit/internal/bounds"
	"github.com/admitdev/admit/internal/engine"
	"github.com/admitdev/admit/internal/tracing"
	"github.com/admitdev/admit/policy"
)

// Bounds on one request.
const (
	MaxDescriptors = 64   // descriptors per request
	MaxEntries     = 32   // entries per descriptor
	MaxEntryLen    = 1024 // bytes of an entry's key or value
)

// DefaultCatalogDomain is the domain whose descriptors are decided against
// Admit's own tenants, tiers and rules.
const DefaultCatalogDomain = "admit"

// The descriptor entry keys the catalog domain understands. Any other key
// is a request attribute, for rules whose scope names it.
const (
	EntryTenant        = "tenant"
	EntryUser          = "user"
	EntryAction        = "action"
	EntryGenericKey    = "generic_key" // Envoy's generic_key action; the action when no action entry is sent
	EntryAPIKey        = "api_key"
	EntryRemoteAddress = "remote_address" // Envoy's remote_address action; the ip scope
	EntryIP            = "ip"
	EntrySession       = "session"
)

// Options configure a Service.
type Options struct {
	// Decider decides the charges and applies the rules' on_error modes.
	// Required.
	Decider *policy.Decider
	// Policy returns Admit's current policy (the tenant catalog). With it,
	// requests for CatalogDomain are resolved against the catalog; its
	// on_error mode is also the one of envoyproxy/ratelimit limits.
	Policy func() *policy.Policy
	// CatalogDomain is the domain decided against the catalog; default
	// DefaultCatalogDomain. A configuration file's domain of the same name
	// takes precedence.
	CatalogDomain string
	// Config is the envoyproxy/ratelimit configuration to start with; nil
	// for none. SetConfig replaces it.
	Config *Config
	// DynamicMetadata fills the response's dynamic_metadata as
	// envoyproxy/ratelimit does with RESPONSE_DYNAMIC_METADATA: the domain,
	// the descriptors (entries as "key=value", hitsAddend), the request's
	// hitsAddend, and what QuotaAnswers says of quota descriptors.
	DynamicMetadata bool
	// ResponseHeaders adds X-RateLimit-Limit, -Remaining and -Reset
	// (draft-polli-ratelimit-headers-03, as Envoy's own filter writes
	// them) to response_headers_to_add.
	ResponseHeaders bool
	// LimitHeaders, if set, adds envoyproxy/ratelimit's own headers (its
	// LIMIT_RESPONSE_HEADERS_ENABLED) to response_headers_to_add, under
	// these names: the limit, remaining and reset of the descriptor over
	// its limit, else of the one with the least remaining.
	LimitHeaders *LimitHeaderNames
	// QuotaAnswers is how quota_mode descriptors answer: QuotaGroups (the
	// default) or QuotaReported.
	QuotaAnswers QuotaAnswers
	// QuotaAll makes every descriptor of a domain that counts each hit
	// (charge: each) a quota descriptor, as envoyproxy/ratelimit's
	// QUOTA_MODE setting does. A domain of charge: all keeps its files'
	// quota_mode.
	QuotaAll bool
	// GlobalShadow answers OK to every request, whatever its descriptors
	// say (their statuses unchanged), and counts each request it let
	// through in ratelimit.service.global_shadow_mode, as
	// envoyproxy/ratelimit's SHADOW_MODE setting does. Under charge: all,
	// such a request is not counted: it was refused.
	GlobalShadow bool
	// Charge is how a domain whose file does not say counts its hits:
	// ChargeAll (the default, also for ChargeDefault) or ChargeEach, as
	// envoyproxy/ratelimit counts.
	Charge Charge
	// Observe, if set, is told every request answered.
	Observe func(Event)
	// Stats, if set, counts what envoyproxy/ratelimit's statistics count,
	// under its names.
	Stats *UpstreamStats
	// TrustedPeers are the peers (Envoy, a mesh's sidecars) trusted to name
	// the client's address in a remote_address entry as the anonymous
	// caller it divides the anonymous part of a shared limit among. From
	// any other peer the anonymous caller is the peer itself: a client
	// that reaches the port could otherwise name as many addresses as it
	// liked and take the part of every real one. (The entry still keys the
	// rules of scope ip, as envoyproxy/ratelimit keys them.)
	TrustedPeers []netip.Prefix
	// Now reads the clock for the resets of limits that refuse everything;
	// default time.Now.
	Now func() time.Time
	// Domains, if set, answers the requests of the domains it owns
	// (Limitador's namespaces, say) in place of the files and the
	// catalog.
	Domains DomainDecider
	// TracerProvider, if set, traces every decision of ShouldRateLimit,
	// and every usage report of a QuotaService over the Service, in an
	// OpenTelemetry span (docs/traces.md): a child of the trace the call's
	// traceparent metadata continues. The store calls are the Decider's
	// spans (policy.Decider.Trace). Nil traces nothing, at no cost.
	TracerProvider trace.TracerProvider
}

// A DomainDecider answers the rate limit requests of the domains it owns
// in its own terms, as another rate limit service would: Envoy cannot
// tell it from this one.
type DomainDecider interface {
	Owns(domain string) bool
	ShouldRateLimit(ctx context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error)
}

// LimitHeaderNames are the names of envoyproxy/ratelimit's response
// headers (its LIMIT_LIMIT_HEADER, LIMIT_REMAINING_HEADER and
// LIMIT_RESET_HEADER; by default RateLimit-Limit, RateLimit-Remaining and
// RateLimit-Reset).
type LimitHeaderNames struct {
	Limit, Remaining, Reset string
}

// Event describes one ShouldRateLimit call, for metrics.
type Event struct {
	Allowed bool
	Outcome policy.Outcome
	Err     error // the call failed; Allowed is then meaningless
	Took    time.Duration
}

// Service is the Envoy rate limit service: ShouldRateLimit of
// envoy.service.ratelimit.v3.RateLimitService. It is safe for concurrent
// use; create it with New.
type Service struct {
	rlsv3.UnimplementedRateLimitServiceServer

	opts  Options
	cfg   atomic.Pointer[Config]
	calls sync.Pool
	// tracer and quotaTracer trace ShouldRateLimit and the quota
	// service's reports; nil when traces are off.
	tracer, quotaTracer *tracing.Tracer

	overMu    sync.Mutex
	overrides map[overrideKey]*Limit
}

var _ rlsv3.RateLimitServiceServer = (*Service)(nil)

// New returns a Service, or an error if opts lack a Decider.
func New(opts Options) (*Service, error) {
	if opts.Decider == nil {
		return nil, errors.New("envoyrls: Options.Decider is required")
	}
	if opts.CatalogDomain == "" {
		opts.CatalogDomain = DefaultCatalogDomain
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	s := &Service{opts: opts, overrides: map[overrideKey]*Limit{},
		tracer: tracing.New(opts.TracerProvider, "envoy_rls"), quotaTracer: tracing.New(opts.TracerProvider, "rlqs")}
	s.cfg.Store(opts.Config)
	s.calls.New = func() any { return new(call) }
	return s, nil
}

// SetConfig replaces the envoyproxy/ratelimit configuration. Requests
// already being decided finish under the old one. Counters of limits kept
// across the change carry on.
func (s *Service) SetConfig(c *Config) { s.cfg.Store(c) }

// Config returns the current envoyproxy/ratelimit configuration, or nil.
func (s *Service) Config() *Config { return s.cfg.Load() }

// descriptor kinds, by what decides them.
const (
	kindNone      uint8 = iota // nothing applies: OK without a limit
	kindUnlimited              // unlimited: OK, never counted
	kindRefuseAll              // requests_per_unit 0: always over the limit
	kindCharged                // charges[from:to] of the call decide it
)

// descState is what one request descriptor became.
type descState struct {
	kind     uint8
	limit    *Limit // the envoyproxy/ratelimit limit or override, if any
	from, to int    // its charge indexes: refs[from:to]
}

// call holds one request's buffers; calls are pooled.
type call struct {
	entries  []Entry
	descs    []descState
	refs     []int // charge index per descriptor charge
	never    []bool
	all      policy.Resolution // every descriptor's charges, in order
	one      policy.Resolution // one catalog descriptor's
	dry      bool              // the decision was a dry run: nothing charged
	each     bool              // the domain counts every descriptor (charge: each)
	quotaAll bool              // every descriptor is a quota one (Options.QuotaAll)
	// group is each quota descriptor's group key (QuotaGroups), "" for
	// the others; groups counts the distinct keys.
	group  []string
	groups int
	req    policy.Request
	attrs  map[string]string
	// peer is the address of a peer not trusted to name its clients
	// (Options.TrustedPeers), "" when it is trusted or has none.
	peer string
	// ban is the ban in force over one of the request's descriptors,
	// which refuses it whole, nil if none.
	ban *policy.Ban
	dec admit.Decision
	key []byte
	sub []byte
	// span is the decision's, while it is decided.
	span tracing.Span
	// tenant is the tenant of the catalog's descriptors, for the span,
	// when tenants counts one: the descriptors of a request may name
	// several.
	tenant  *policy.Tenant
	tenants int
}

// ShouldRateLimit decides a request: every descriptor is matched to its
// limits, and all of them are charged together or none is.
func (s *Service) ShouldRateLimit(ctx context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	if d := s.opts.Domains; d != nil && d.Owns(req.GetDomain()) {
		return s.delegate(ctx, d, req)
	}
	start := time.Now()
	c := s.calls.Get().(*call)
	ctx, c.span = startSpan(ctx, s.tracer)
	resp, out, err := s.decide(ctx, req, c)
	c.span.End(err)
	c.span = tracing.Span{}
	s.calls.Put(c)
	if st := s.opts.Stats; st != nil {
		st.call(time.Since(start))
		// The store failed, whether or not the rules fail open or decide
		// locally then.
		if err != nil && admit.ErrorCode(err) == admit.CodeUnavailable || err == nil && out != policy.Stored && out != policy.Banned {
			st.Add("ratelimit.service.call.should_rate_limit.redis_error", 1)
		} else if err != nil {
			st.Add("ratelimit.service.call.should_rate_limit.service_error", 1)
		}
	}
	if s.opts.Observe != nil {
		ev := Event{Outcome: out, Err: err, Took: time.Since(start)}
		ev.Allowed = err == nil && resp.OverallCode == rlsv3.RateLimitResponse_OK
		s.opts.Observe(ev)
	}
	if err != nil {
		return nil, grpcError(ctx, err)
	}
	return resp, nil
}

// delegate has d answer req, observed and counted as the Service's own
// answers are.
func (s *Service) delegate(ctx context.Context, d DomainDecider, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	start := time.Now()
	resp, err := d.ShouldRateLimit(ctx, req)
	if s.opts.Observe != nil {
		ev := Event{Outcome: policy.Stored, Err: err, Took: time.Since(start)}
		if err != nil && status.Code(err) == codes.Unavailable {
			ev.Err = admit.Errorf(admit.CodeUnavailable, "%v", err)
		} else if err != nil {
			ev.Err = admit.Errorf(admit.CodeInvalid, "%v", err)
		}
		ev.Allowed = err == nil && resp.GetOverallCode() == rlsv3.RateLimitResponse_OK
		s.opts.Observe(ev)
	}
	return resp, err
}

// decide answers req in four phases: check the request, resolve its
// descriptors to charges, decide the charges, and write each descriptor's
// status from what its charges found.
func (s *Service) decide(ctx context.Context, req *rlsv3.RateLimitRequest, c *call) (*rlsv3.RateLimitResponse, policy.Outcome, error) {
	if err := checkRequest(req); err != nil {
		return nil, 0, err
	}
	domain, ds := req.GetDomain(), req.GetDescriptors()
	if c.span.Recording() {
		c.span.SetAttributes(Domain.String(domain))
	}
	c.peer = s.untrustedPeer(ctx)
	cfg := s.cfg.Load()
	var p *policy.Policy
	if s.opts.Policy != nil {
		p = s.opts.Policy()
	}
	configured := cfg.HasDomain(domain)
	catalog := p != nil && domain == s.opts.CatalogDomain && !configured
	c.each = configured && s.chargesEach(cfg, domain)
	c.quotaAll = c.each && s.opts.QuotaAll
	resp := &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK,
		Statuses: make([]*rlsv3.RateLimitResponse_DescriptorStatus, len(ds))}
	if !catalog && !configured {
		// An unknown domain limits nothing, as in envoyproxy/ratelimit: an
		// OK status without a limit for every descriptor.
		for i := range resp.Statuses {
			resp.Statuses[i] = &rlsv3.RateLimitResponse_DescriptorStatus{Code: rlsv3.RateLimitResponse_OK}
		}
		if s.opts.Stats != nil {
			s.opts.Stats.Add("ratelimit.service.rate_limit."+domain+".domain_not_found", uint64(len(ds)))
		}
		return resp, policy.Stored, nil
	}
	if err := s.resolve(c, req, cfg, p, catalog); err != nil {
		return nil, 0, err
	}
	if c.ban != nil {
		banned(resp, c.ban, s.opts.Now())
		return resp, policy.Banned, nil
	}
	quotas := c.prepareCounting(req, s.opts.QuotaAnswers)
	out, err := s.decideCharges(ctx, c, quotas)
	if err != nil {
		return nil, out, err
	}
	s.respond(resp, req, c, out, quotas)
	if c.span.Recording() {
		// Allowed as the answer says, which quota groups and the global
		// shadow mode may make OK though a charge refused.
		res := c.all
		if c.tenants == 1 {
			res.Tenant = c.tenant
		}
		c.span.Decided(&res, &c.dec, out)
		c.span.SetAttributes(tracing.Allowed.Bool(resp.OverallCode == rlsv3.RateLimitResponse_OK))
	}
	return resp, out, nil
}

// checkRequest refuses a request envoyproxy/ratelimit refuses (an empty
// domain or descriptor list, which it answers UNKNOWN, as any error of its
// own: INVALID_ARGUMENT here, which says what they are) and one past the
// service's bounds.
func checkRequest(req *rlsv3.RateLimitRequest) error {
	domain, ds := req.GetDomain(), req.GetDescriptors()
	switch {
	case domain == "":
		return admit.Errorf(admit.CodeInvalid, "rate limit domain must not be empty")
	case len(ds) == 0:
		return admit.Errorf(admit.CodeInvalid, "rate limit descriptor list must not be empty")
	case len(ds) > MaxDescriptors:
		return admit.Errorf(admit.CodeInvalid, "%d descriptors; at most %d", len(ds), MaxDescriptors)
	case len(domain) > MaxEntryLen:
		return admit.Errorf(admit.CodeInvalid, "the domain is %d bytes; at most %d", len(domain), MaxEntryLen)
	}
	// A descriptor without entries, or an entry without a key, is no
	// descriptor Envoy makes: matching nothing, it would be admitted.
	for i, d := range ds {
		es := d.GetEntries()
		if len(es) == 0 {
			return admit.Errorf(admit.CodeInvalid, "descriptor %d has no entries", i)
		}
		for j, e := range es {
			if e.GetKey() == "" {
				return admit.Errorf(admit.CodeInvalid, "descriptor %d, entry %d: an empty key", i, j)
			}
		}
	}
	return nil
}

// isQuota reports whether st is a quota descriptor: one of a quota limit,
// or with QuotaAll any but an unlimited one (a descriptor without a limit
// is then a group never over, as in envoyproxy/ratelimit).
func (c *call) isQuota(st *descState) bool {
	return st.kind != kindUnlimited && (c.quotaAll || st.limit != nil && st.limit.Quota)
}

// quotaOver reports whether quota descriptor i is over its limit: a shadow
// limit's never is, as its status says OK.
func (c *call) quotaOver(i int) bool {
	l := c.descs[i].limit
	return l != nil && !l.Shadow && c.descOver(i)
}

// prepareCounting sets how c's charges count, groups c's quota
// descriptors as answers says, and returns how many groups there are
// (QuotaGroups) or how many quota descriptors (QuotaReported): with
// charge: each, every charge is a debit (counted whether it fits or not,
// as upstream counts); else the quota descriptors of a request with a
// single group (one descriptor, when reported) are decided strictly.
// Exact fixed windows are then decided as admit.Counted.
func (c *call) prepareCounting(req *rlsv3.RateLimitRequest, answers QuotaAnswers) (quotas int) {
	c.group = c.group[:0]
	c.groups = 0
	for i := range c.descs {
		key := ""
		if c.isQuota(&c.descs[i]) {
			quotas++
			if answers == QuotaGroups {
				key = quotaGroup(req.GetDescriptors()[i])
				if !slices.Contains(c.group, key) {
					c.groups++
				}
			}
		}
		c.group = append(c.group, key)
	}
	if answers == QuotaGroups {
		quotas = c.groups
	}
	if c.each {
		for i := range c.all.Charges {
			// A rule that cannot count past its limit (an Admit
			// extension: sliding_log) stays all or nothing.
			c.all.Charges[i].Debit = engine.CheckDebit(c.all.Charges[i].Rule, 1) == nil
		}
	} else if quotas == 1 {
		c.strictQuota()
	}
	for i := range c.descs {
		if l := c.descs[i].limit; l != nil && l.counted != nil {
			for _, j := range c.refs[c.descs[i].from:c.descs[i].to] {
				c.all.Charges[j].Rule = l.countedRule(c.all.Charges[j].Rule)
			}
		}
	}
	return quotas
}

// The descriptor entries that name a quota descriptor's group: a model
// behind a backend.
const (
	EntryBackendName       = "backend_name"
	EntryModelNameOverride = "model_name_override"
)

// quotaGroup names d's quota group: the descriptors that name one backend
// and model (see modelOf) are one group, and any other is a group of its
// own entries.
func quotaGroup(d *rlv3.RateLimitDescriptor) string {
	if backend, model, named := modelOf(d); named {
		return "m" + strconv.Itoa(len(backend)) + ":" + backend + model
	}
	b := []byte{'e'}
	for _, e := range d.GetEntries() {
		b = appendField(appendField(b, e.GetKey()), e.GetValue())
	}
	return string(b)
}

// modelOf returns the values of d's backend_name and model_name_override
// entries, and whether it names either.
func modelOf(d *rlv3.RateLimitDescriptor) (backend, model string, named bool) {
	for _, e := range d.GetEntries() {
		switch e.GetKey() {
		case EntryBackendName:
			backend = e.GetValue()
		case EntryModelNameOverride:
			model = e.GetValue()
		}
	}
	return backend, model, backend != "" || model != ""
}

// decideCharges decides c's charges. A request that some descriptor
// refuses whatever the counters say is decided as a dry run: the statuses
// report the counters, nothing is charged. So is a request of several
// quota descriptors at first, to learn whether all of them are over; if
// not, it is decided for real.
func (s *Service) decideCharges(ctx context.Context, c *call, quotas int) (policy.Outcome, error) {
	dry := false
	for i := range c.descs {
		st := &c.descs[i]
		dry = dry || st.kind == kindRefuseAll && !st.limit.Shadow && !st.limit.Quota
	}
	for i, never := range c.never {
		dry = dry || never && !c.all.Charges[i].Rule.Shadow
	}
	dry = dry && !c.each
	probe := !dry && !c.each && quotas > 1
	out, err := s.run(ctx, c, dry || probe)
	if err != nil || !probe || c.allQuotasOver(out) {
		return out, err
	}
	return s.run(ctx, c, false)
}

// chargesEach reports whether domain counts every descriptor on its own:
// as its file says, else as the service's default.
func (s *Service) chargesEach(cfg *Config, domain string) bool {
	if ch := cfg.ChargeOf(domain); ch != ChargeDefault {
		return ch == ChargeEach
	}
	return s.opts.Charge == ChargeEach
}

// run decides c's charges, as a dry run when dry says.
func (s *Service) run(ctx context.Context, c *call, dry bool) (policy.Outcome, error) {
	c.dry = dry
	for i := range c.all.Charges {
		c.all.Charges[i].DryRun = dry
	}
	if len(c.all.Charges) <= bounds.MaxCharges {
		return s.opts.Decider.Decide(ctx, &c.all, &c.dec)
	}
	// More charges than one decision takes (a domain that counts each
	// hit, see resolve): decided a decision's worth at a time, the
	// results in order, the outcome the worst of them.
	out := policy.Stored
	var part admit.Decision
	c.dec.Reset()
	for from := 0; from < len(c.all.Charges); from += bounds.MaxCharges {
		to := min(len(c.all.Charges), from+bounds.MaxCharges)
		r := policy.Resolution{Policy: c.all.Policy, Tenant: c.all.Tenant, Charges: c.all.Charges[from:to], Rules: c.all.Rules[from:to]}
		o, err := s.opts.Decider.Decide(ctx, &r, &part)
		if err != nil {
			return o, err
		}
		out = max(out, o)
		if o != policy.FailedOpen {
			c.dec.Results = append(c.dec.Results, part.Results...)
		}
	}
	engine.Summarize(&c.dec)
	return out, nil
}

// strictQuota decides the one quota descriptor of a request by its strict
// rule: the request is over the limit iff it is, and then nothing is
// charged, all or nothing.
func (c *call) strictQuota() {
	for i := range c.descs {
		st := &c.descs[i]
		if st.limit == nil || !st.limit.Quota || st.limit.strict == nil {
			continue
		}
		for _, j := range c.refs[st.from:st.to] {
			c.all.Charges[j].Rule, c.all.Rules[j] = &st.limit.strict.Rule, st.limit.strict
		}
	}
}

// allQuotasOver reports whether every quota group (every quota
// descriptor, when reported) of c's dry decision is over its limit.
func (c *call) allQuotasOver(out policy.Outcome) bool {
	if out == policy.FailedOpen || len(c.dec.Results) != len(c.all.Charges) {
		return false
	}
	for i := range c.descs {
		if !c.isQuota(&c.descs[i]) || c.quotaOver(i) {
			continue
		}
		// Descriptor i passed: so did its group, unless another member
		// is over.
		if c.group[i] == "" || !c.groupOver(c.group[i]) {
			return false
		}
	}
	return true
}

// descOver reports whether descriptor i's decision put it over its limit.
func (c *call) descOver(i int) bool {
	st := &c.descs[i]
	over := st.kind == kindRefuseAll
	for _, j := range c.refs[st.from:st.to] {
		over = over || !c.dec.Results[j].Allowed || c.never[j]
	}
	return over
}

// groupOver reports whether a quota descriptor of group key is over its
// limit.
func (c *call) groupOver(key string) bool {
	for i, k := range c.group {
		if k == key && c.quotaOver(i) {
			return true
		}
	}
	return false
}

// grpcError maps an Admit error to a gRPC status: Canceled or
// DeadlineExceeded when the call's own ctx ended, whatever failed
// meanwhile; the store's own timeout is its failure, Unavailable.
func grpcError(ctx context.Context, err error) error {
	code := codes.Internal
	switch admit.ErrorCode(err) {
	case admit.CodeInvalid:
		code = codes.InvalidArgument
	case admit.CodePermission:
		code = codes.PermissionDenied
	case admit.CodeUnauthenticated:
		code = codes.Unauthenticated
	case admit.CodeNotFound:
		code = codes.NotFound
	case admit.CodeUnavailable:
		code = codes.Unavailable
	case admit.CodeExhausted:
		code = codes.ResourceExhausted
	}
	switch ctx.Err() {
	case context.Canceled:
		code = codes.Canceled
	case context.DeadlineExceeded:
		code = codes.DeadlineExceeded
	}
	return status.Error(code, err.Error())
}

// untrustedPeer returns the address of ctx's peer when it is a TCP peer
// not in Options.TrustedPeers, else "".
func (s *Service) untrustedPeer(ctx context.Context) string {
	pr, ok := peer.FromContext(ctx)
	if !ok || pr.Addr == nil {
		return ""
	}
	ap, err := netip.ParseAddrPort(pr.Addr.String())
	if err != nil {
		return "" // not an IP peer: a Unix socket, in-process
	}
	a := ap.Addr().Unmap()
	for _, p := range s.opts.TrustedPeers {
		if p.Contains(a) {
			return ""
		}
	}
	return a.String()
}
