package envoyrls

import (
	"context"
	"errors"
	"math"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rlext "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/admitdev/admit"
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
	// hitsAddend, quotaModeEnabled and quotaModeViolations (the indexes of
	// the quota descriptors over their limit).
	DynamicMetadata bool
	// ResponseHeaders adds X-RateLimit-Limit, -Remaining and -Reset
	// (draft-polli-ratelimit-headers-03, as Envoy's own filter writes
	// them) to response_headers_to_add.
	ResponseHeaders bool
	// Observe, if set, is told every request answered.
	Observe func(Event)
	// Now reads the clock for the resets of limits that refuse everything;
	// default time.Now.
	Now func() time.Time
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
	s := &Service{opts: opts, overrides: map[overrideKey]*Limit{}}
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
	entries []Entry
	descs   []descState
	refs    []int // charge index per descriptor charge
	never   []bool
	all     policy.Resolution // every descriptor's charges, in order
	one     policy.Resolution // one catalog descriptor's
	dry     bool              // the decision was a dry run: nothing charged
	each    bool              // the domain counts every descriptor (charge: each)
	req     policy.Request
	attrs   map[string]string
	dec     admit.Decision
	key     []byte
	sub     []byte
}

// ShouldRateLimit decides a request: every descriptor is matched to its
// limits, and all of them are charged together or none is.
func (s *Service) ShouldRateLimit(ctx context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	start := time.Now()
	c := s.calls.Get().(*call)
	resp, out, err := s.decide(ctx, req, c)
	s.calls.Put(c)
	if s.opts.Observe != nil {
		ev := Event{Outcome: out, Err: err, Took: time.Since(start)}
		ev.Allowed = err == nil && resp.OverallCode == rlsv3.RateLimitResponse_OK
		s.opts.Observe(ev)
	}
	if err != nil {
		return nil, grpcError(err)
	}
	return resp, nil
}

func (s *Service) decide(ctx context.Context, req *rlsv3.RateLimitRequest, c *call) (*rlsv3.RateLimitResponse, policy.Outcome, error) {
	domain := req.GetDomain()
	ds := req.GetDescriptors()
	switch {
	case domain == "":
		return nil, 0, unknownError{admit.Errorf(admit.CodeInvalid, "rate limit domain must not be empty")}
	case len(ds) == 0:
		return nil, 0, unknownError{admit.Errorf(admit.CodeInvalid, "rate limit descriptor list must not be empty")}
	case len(ds) > MaxDescriptors:
		return nil, 0, admit.Errorf(admit.CodeInvalid, "%d descriptors; at most %d", len(ds), MaxDescriptors)
	case len(domain) > MaxEntryLen:
		return nil, 0, admit.Errorf(admit.CodeInvalid, "the domain is %d bytes; at most %d", len(domain), MaxEntryLen)
	}
	cfg := s.cfg.Load()
	var p *policy.Policy
	if s.opts.Policy != nil {
		p = s.opts.Policy()
	}
	configured := cfg.HasDomain(domain)
	catalog := p != nil && domain == s.opts.CatalogDomain && !configured
	each := configured && cfg.ChargesEach(domain)
	c.each = each
	resp := &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK,
		Statuses: make([]*rlsv3.RateLimitResponse_DescriptorStatus, len(ds))}
	if !catalog && !configured {
		// An unknown domain limits nothing, as in envoyproxy/ratelimit: an
		// OK status without a limit for every descriptor.
		for i := range resp.Statuses {
			resp.Statuses[i] = &rlsv3.RateLimitResponse_DescriptorStatus{Code: rlsv3.RateLimitResponse_OK}
		}
		return resp, policy.Stored, nil
	}

	c.descs = c.descs[:0]
	c.refs = c.refs[:0]
	c.never = c.never[:0]
	c.all = policy.Resolution{Policy: p, Charges: c.all.Charges[:0], Rules: c.all.Rules[:0]}
	var replaced []string
	for i, d := range ds {
		if err := c.readEntries(d); err != nil {
			return nil, 0, err
		}
		cost, never := hits(req, d)
		st := descState{from: len(c.refs)}
		switch {
		case d.GetLimit() != nil:
			l, err := s.override(d.GetLimit())
			if err != nil {
				return nil, 0, admit.Errorf(admit.CodeInvalid, "descriptor %d: limit override: %v", i, err)
			}
			st.limit = l
			// Overrides of other periods count apart, as upstream's
			// window keys do; those of one period share a counter.
			s.addLimit(c, &st, domain, "limit-override:"+l.Window().String(), l, Match{}, cost, never)
		case catalog:
			if err := s.addCatalog(c, p, &st, cost, never); err != nil {
				return nil, 0, err
			}
		default:
			m := cfg.Lookup(domain, c.entries)
			if m.Limit != nil {
				st.limit = m.Limit
				replaced = append(replaced, m.Limit.Replaces...)
				s.addLimit(c, &st, domain, m.Limit.FullKey, m.Limit, m, cost, never)
			}
		}
		st.to = len(c.refs)
		c.descs = append(c.descs, st)
	}
	if len(replaced) > 0 {
		c.replace(replaced)
	}
	if len(c.all.Charges) > admit.MaxCharges {
		return nil, 0, admit.Errorf(admit.CodeInvalid, "the request resolves to %d charges; at most %d", len(c.all.Charges), admit.MaxCharges)
	}

	quotas := 0
	for i := range c.descs {
		if st := &c.descs[i]; st.limit != nil && st.limit.Quota && st.kind != kindUnlimited {
			quotas++
		}
	}
	if each {
		for i := range c.all.Charges {
			c.all.Charges[i].Debit = true
		}
	} else if quotas == 1 {
		c.strictQuota()
	}

	// A request that some descriptor refuses whatever the counters say is
	// decided as a dry run: the statuses report the counters, nothing is
	// charged. So is a request of several quota descriptors at first, to
	// learn whether all of them are over.
	dry := false
	for i := range c.descs {
		st := &c.descs[i]
		dry = dry || st.kind == kindRefuseAll && !st.limit.Shadow && !st.limit.Quota
	}
	for i, never := range c.never {
		dry = dry || never && !c.all.Charges[i].Rule.Shadow
	}
	dry = dry && !each
	probe := !dry && !each && quotas > 1
	out, err := s.run(ctx, c, dry || probe)
	if err != nil {
		return nil, out, err
	}
	if probe && !c.allQuotasOver(out) {
		if out, err = s.run(ctx, c, false); err != nil {
			return nil, out, err
		}
	}
	now := s.opts.Now()
	best, bestRemaining := -1, int64(math.MaxInt64)
	var violations []int
	for i := range c.descs {
		st, over := s.status(c, &c.descs[i], out, now)
		if l := c.descs[i].limit; over && l != nil && l.Quota {
			violations = append(violations, i)
		}
		resp.Statuses[i] = st
		if st.Code == rlsv3.RateLimitResponse_OVER_LIMIT {
			resp.OverallCode = rlsv3.RateLimitResponse_OVER_LIMIT
		}
		if st.CurrentLimit != nil && int64(st.LimitRemaining) < bestRemaining {
			best, bestRemaining = i, int64(st.LimitRemaining)
		}
	}
	if quotas > 0 && len(violations) == quotas {
		// Every quota descriptor is over: the request is.
		for _, i := range violations {
			resp.Statuses[i].Code = rlsv3.RateLimitResponse_OVER_LIMIT
		}
		resp.OverallCode = rlsv3.RateLimitResponse_OVER_LIMIT
	}
	if s.opts.ResponseHeaders && best >= 0 {
		resp.ResponseHeadersToAdd = rateLimitHeaders(resp.Statuses, best)
	}
	if s.opts.DynamicMetadata {
		resp.DynamicMetadata = dynamicMetadata(req, violations, quotas > 0)
	}
	return resp, out, nil
}

// run decides c's charges, as a dry run when dry says.
func (s *Service) run(ctx context.Context, c *call, dry bool) (policy.Outcome, error) {
	c.dry = dry
	for i := range c.all.Charges {
		c.all.Charges[i].DryRun = dry
	}
	return s.opts.Decider.Decide(ctx, &c.all, &c.dec)
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

// allQuotasOver reports whether every quota descriptor of c's (dry)
// decision is over its limit.
func (c *call) allQuotasOver(out policy.Outcome) bool {
	if out == policy.FailedOpen || len(c.dec.Results) != len(c.all.Charges) {
		return false
	}
	for i := range c.descs {
		st := &c.descs[i]
		if st.limit == nil || !st.limit.Quota || st.kind == kindUnlimited {
			continue
		}
		over := st.kind == kindRefuseAll
		for _, j := range c.refs[st.from:st.to] {
			over = over || !c.dec.Results[j].Allowed || c.never[j]
		}
		if !over {
			return false
		}
	}
	return true
}

// unknownError is an error envoyproxy/ratelimit answers with UNKNOWN (its
// service errors), which Admit does the same for: an empty domain or
// descriptor list.
type unknownError struct{ error }

func (e unknownError) Unwrap() error { return e.error }

// dynamicMetadata is the response's dynamic metadata, in the shape
// envoyproxy/ratelimit gives it.
func dynamicMetadata(req *rlsv3.RateLimitRequest, violations []int, quota bool) *structpb.Struct {
	descs := make([]*structpb.Value, 0, len(req.GetDescriptors()))
	for _, d := range req.GetDescriptors() {
		entries := make([]*structpb.Value, len(d.GetEntries()))
		for i, e := range d.GetEntries() {
			entries[i] = structpb.NewStringValue(e.GetKey() + "=" + e.GetValue())
		}
		f := map[string]*structpb.Value{"entries": structpb.NewListValue(&structpb.ListValue{Values: entries})}
		if l := d.GetLimit(); l != nil {
			f["limit"] = structpb.NewStringValue(l.String())
		}
		if h := d.GetHitsAddend(); h != nil {
			f["hitsAddend"] = structpb.NewNumberValue(float64(h.GetValue()))
		}
		descs = append(descs, structpb.NewStructValue(&structpb.Struct{Fields: f}))
	}
	f := map[string]*structpb.Value{
		"domain":           structpb.NewStringValue(req.GetDomain()),
		"descriptors":      structpb.NewListValue(&structpb.ListValue{Values: descs}),
		"quotaModeEnabled": structpb.NewBoolValue(quota),
	}
	if h := req.GetHitsAddend(); h != 0 {
		f["hitsAddend"] = structpb.NewNumberValue(float64(h))
	}
	if len(violations) > 0 {
		vs := make([]*structpb.Value, len(violations))
		for i, v := range violations {
			vs[i] = structpb.NewNumberValue(float64(v))
		}
		f["quotaModeViolations"] = structpb.NewListValue(&structpb.ListValue{Values: vs})
	}
	return &structpb.Struct{Fields: f}
}

// hits returns a descriptor's cost: its own hits_addend if set (0 asks
// without counting), else the request's, where 0 means 1. never is set when
// the cost is more than any charge may carry.
func hits(req *rlsv3.RateLimitRequest, d *rlext.RateLimitDescriptor) (cost int64, never bool) {
	n := max(1, uint64(req.GetHitsAddend()))
	if h := d.GetHitsAddend(); h != nil {
		n = h.GetValue()
	}
	if d.GetIsNegativeHits() {
		n = 0 // a refund: Admit gives nothing back, and reports the counters
	}
	if n > admit.MaxCost {
		return admit.MaxCost, true
	}
	return int64(n), false
}

// readEntries copies a descriptor's entries into c.entries, bounded.
func (c *call) readEntries(d *rlext.RateLimitDescriptor) error {
	es := d.GetEntries()
	if len(es) > MaxEntries {
		return admit.Errorf(admit.CodeInvalid, "a descriptor has %d entries; at most %d", len(es), MaxEntries)
	}
	c.entries = c.entries[:0]
	for _, e := range es {
		k, v := e.GetKey(), e.GetValue()
		if len(k) > MaxEntryLen || len(v) > MaxEntryLen {
			return admit.Errorf(admit.CodeInvalid, "descriptor entry %.64q: keys and values are at most %d bytes", k, MaxEntryLen)
		}
		c.entries = append(c.entries, Entry{Key: k, Value: v})
	}
	return nil
}

// addLimit adds the charge of an envoyproxy/ratelimit limit (or override)
// for the descriptor in c.entries: one counter per domain, limit and entry
// values (a share_threshold wildcard's pattern standing for the value).
func (s *Service) addLimit(c *call, st *descState, domain, bucket string, l *Limit, m Match, cost int64, never bool) {
	switch {
	case l.Unlimited:
		st.kind = kindUnlimited
		return
	case l.rule == nil:
		st.kind = kindRefuseAll
		return
	}
	st.kind = kindCharged
	c.sub = c.sub[:0]
	pat := 0
	for i, e := range c.entries {
		c.sub = appendField(c.sub, e.Key)
		if i < 64 && m.Shared&(1<<i) != 0 {
			c.sub = append(c.sub, '*')
			c.sub = appendField(c.sub, m.Patterns[pat])
			pat++
			continue
		}
		c.sub = append(c.sub, '=')
		c.sub = appendField(c.sub, e.Value)
	}
	// The encoding of admit.Key{Scope: "envoy", Tenant: domain, Subject:
	// sub, Rule: bucket}, written without building the Key's strings.
	c.key = appendField(c.key[:0], "envoy")
	c.key = appendField(c.key, domain)
	c.key = strconv.AppendInt(c.key, int64(len(c.sub)), 10)
	c.key = append(c.key, ':')
	c.key = append(c.key, c.sub...)
	c.key = appendField(c.key, "")
	c.key = appendField(c.key, bucket)
	c.add(admit.Charge{Key: string(c.key), Rule: &l.rule.Rule, Cost: cost}, l.rule, never)
}

func appendField(b []byte, f string) []byte {
	b = strconv.AppendInt(b, int64(len(f)), 10)
	b = append(b, ':')
	return append(b, f...)
}

// add adds a charge for the current descriptor. Descriptors that share a
// counter each have their charge: the store decides them one after the
// other in the same decision, so the counter takes both costs and each
// descriptor reports its own place (4 then 3 remaining of 5).
func (c *call) add(ch admit.Charge, r *policy.Rule, never bool) {
	j := len(c.all.Charges)
	c.all.Charges = append(c.all.Charges, ch)
	c.all.Rules = append(c.all.Rules, r)
	c.never = append(c.never, false)
	x := &c.all.Charges[j]
	if never || !c.each && x.Rule.CheckCost(x.Cost) != nil {
		// More than the rule can ever admit at once: over the limit
		// whatever the counter holds, which a peek reports.
		c.never[j] = true
	}
	if c.never[j] {
		x.Cost = 0
	}
	c.refs = append(c.refs, j)
}

// addCatalog resolves a descriptor of the catalog domain against Admit's
// tenants and rules and adds its charges.
func (s *Service) addCatalog(c *call, p *policy.Policy, st *descState, cost int64, never bool) error {
	r := &c.req
	*r = policy.Request{Cost: cost, Kind: policy.Requests}
	clear(c.attrs)
	for _, e := range c.entries {
		switch e.Key {
		case EntryTenant:
			r.Tenant = e.Value
		case EntryUser:
			r.User = e.Value
		case EntryAction:
			r.Action = e.Value
		case EntryAPIKey:
			r.APIKey = e.Value
		case EntryRemoteAddress, EntryIP:
			r.IP = e.Value
		case EntrySession:
			r.Session = e.Value
		case EntryGenericKey:
		default:
			if c.attrs == nil {
				c.attrs = map[string]string{}
			}
			c.attrs[e.Key] = e.Value
		}
	}
	if r.Action == "" {
		for _, e := range c.entries {
			if e.Key == EntryGenericKey {
				r.Action = e.Value
			}
		}
	}
	if len(c.attrs) > 0 {
		r.Attributes = c.attrs
	}
	// Envoy's descriptors are the client's credentials: the one rule
	// (policy.Authenticate) holds, with no caller trusted.
	if err := p.AuthenticateRequest(r, false); err != nil {
		return err
	}
	if err := p.Resolve(r, &c.one); err != nil {
		return err
	}
	if len(c.one.Charges) == 0 {
		st.kind = kindNone
		return nil
	}
	st.kind = kindCharged
	for i, ch := range c.one.Charges {
		c.add(ch, c.one.Rules[i], never)
	}
	return nil
}

// replace drops the limits that another matched limit replaces: their
// descriptors answer OK without a limit, and their charges are not made
// (unless another descriptor needs the same counter).
func (c *call) replace(names []string) {
	keep := make([]bool, len(c.all.Charges))
	for i := range c.descs {
		st := &c.descs[i]
		if st.limit != nil && st.limit.Name != "" && slices.Contains(names, st.limit.Name) {
			st.kind, st.limit = kindNone, nil
			continue
		}
		for _, j := range c.refs[st.from:st.to] {
			keep[j] = true
		}
	}
	// Compact the charges, renumbering every descriptor's references.
	renum := make([]int, len(c.all.Charges))
	n := 0
	for j := range c.all.Charges {
		renum[j] = n
		if keep[j] {
			c.all.Charges[n], c.all.Rules[n], c.never[n] = c.all.Charges[j], c.all.Rules[j], c.never[j]
			n++
		}
	}
	c.all.Charges, c.all.Rules, c.never = c.all.Charges[:n], c.all.Rules[:n], c.never[:n]
	for i := range c.descs {
		st := &c.descs[i]
		if st.kind == kindNone {
			st.from, st.to = 0, 0
			continue
		}
		for k := st.from; k < st.to; k++ {
			c.refs[k] = renum[c.refs[k]]
		}
	}
}

// status builds one descriptor's status from the decision, and says
// whether the descriptor is over its limit, refusing or not (a shadow or
// quota limit does not refuse).
func (s *Service) status(c *call, st *descState, out policy.Outcome, now time.Time) (*rlsv3.RateLimitResponse_DescriptorStatus, bool) {
	ok := &rlsv3.RateLimitResponse_DescriptorStatus{Code: rlsv3.RateLimitResponse_OK}
	switch st.kind {
	case kindNone:
		return ok, false
	case kindUnlimited:
		ok.LimitRemaining = math.MaxUint32
		return ok, false
	case kindRefuseAll:
		l := st.limit
		w := l.Window()
		code := rlsv3.RateLimitResponse_OVER_LIMIT
		if l.Shadow || l.Quota {
			code = rlsv3.RateLimitResponse_OK
		}
		return &rlsv3.RateLimitResponse_DescriptorStatus{
			Code: code, CurrentLimit: currentLimit(l.Name, 0, l.Unit, l.UnitMultiplier),
			DurationUntilReset: wholeSeconds(w - time.Duration(now.UnixNano())%w),
		}, true
	}
	if out == policy.FailedOpen || len(c.dec.Results) != len(c.all.Charges) {
		return ok, false // admitted without a decision: the store is down and the rules fail open
	}
	// As admit.Decision summarizes: the refusing charge that asks for the
	// longest wait, or when admitted the one with the fewest remaining.
	best, refused, over := -1, false, false
	for _, j := range c.refs[st.from:st.to] {
		r := &c.dec.Results[j]
		shadow := c.all.Charges[j].Rule.Shadow
		over = over || !r.Allowed || c.never[j]
		if (!r.Allowed || c.never[j]) && !shadow {
			if !refused || r.RetryAfter > c.dec.Results[best].RetryAfter {
				best = j
			}
			refused = true
			continue
		}
		if !refused && (best < 0 || !shadow && (c.all.Charges[best].Rule.Shadow || r.Remaining < c.dec.Results[best].Remaining)) {
			best = j
		}
	}
	r := &c.dec.Results[best]
	rule := c.all.Charges[best].Rule
	ds := &rlsv3.RateLimitResponse_DescriptorStatus{Code: rlsv3.RateLimitResponse_OK}
	if st.limit != nil {
		l := st.limit
		ds.CurrentLimit = currentLimit(l.Name, l.RequestsPerUnit, l.Unit, l.UnitMultiplier)
	} else {
		rpu, unit, mult := quota(rule)
		ds.CurrentLimit = currentLimit(rule.Name, rpu, unit, mult)
	}
	reset := r.ResetAfter
	if refused {
		ds.Code = rlsv3.RateLimitResponse_OVER_LIMIT
		if r.RetryAfter > 0 {
			reset = r.RetryAfter
		}
	} else {
		remaining := r.Remaining
		if c.dry && !over {
			// A dry run reports what would remain after the request;
			// nothing was charged, so what remains is that and its cost.
			for _, j := range c.refs[st.from:st.to] {
				if &c.dec.Results[j] == r {
					remaining += c.all.Charges[j].Cost
				}
			}
		}
		ds.LimitRemaining = uint32(min(max(remaining, 0), math.MaxUint32))
	}
	ds.DurationUntilReset = wholeSeconds(reset)
	return ds, over
}

// wholeSeconds is d rounded up to whole seconds, as envoyproxy/ratelimit
// sends duration_until_reset (never earlier than the reset).
func wholeSeconds(d time.Duration) *durationpb.Duration {
	return &durationpb.Duration{Seconds: int64((max(d, 0) + time.Second - 1) / time.Second)}
}

func currentLimit(name string, rpu uint32, unit Unit, mult uint32) *rlsv3.RateLimitResponse_RateLimit {
	l := &rlsv3.RateLimitResponse_RateLimit{Name: name, RequestsPerUnit: rpu, Unit: protoUnit(unit)}
	if mult > 1 {
		l.UnitMultiplier = wrapperspb.UInt32(mult)
	}
	return l
}

// quota expresses an Admit rule as requests per unit: a window's limit per
// window, a bucket's burst per the time it takes to refill from empty, in
// the largest unit that divides that period.
func quota(r *admit.Rule) (uint32, Unit, uint32) {
	var n int64
	var per time.Duration
	switch r.Algorithm {
	case admit.TokenBucket, admit.GCRA, admit.Combination:
		n = r.Capacity()
		// Burst × Per / N, in floating point: the product may pass 2^63.
		per = time.Duration(float64(r.Burst) * float64(r.Rate.Per) / float64(r.Rate.N))
	default: // windows; concurrency rules never decide requests
		n, per = r.Limit, r.Window
	}
	n = min(n, math.MaxUint32)
	for u := Year; u > Second; u-- {
		if d := u.Duration(); per >= d && per%d == 0 {
			return uint32(n), u, uint32(min(int64(per/d), math.MaxUint32))
		}
	}
	secs := max(1, (per+time.Second-1)/time.Second)
	return uint32(n), Second, uint32(min(int64(secs), math.MaxUint32))
}

// overrideKey identifies the limit of a descriptor's limit override.
type overrideKey struct {
	rpu  uint32
	unit typev3.RateLimitUnit
	mult uint32
}

// maxOverrides bounds the cache of override limits: overrides come from
// Envoy's route configuration, so there are few of them.
const maxOverrides = 4096

// override returns the fixed window limit of a descriptor's limit
// override, cached so that its rule is shared by every request (stores
// cache per-rule work by the rule's address).
func (s *Service) override(o *rlext.RateLimitDescriptor_RateLimitOverride) (*Limit, error) {
	k := overrideKey{rpu: o.GetRequestsPerUnit(), unit: o.GetUnit(), mult: 1}
	if m := o.GetUnitMultiplier(); m != nil {
		if m.GetValue() == 0 {
			return nil, errors.New("unit_multiplier must be at least 1")
		}
		k.mult = m.GetValue()
	}
	s.overMu.Lock()
	l := s.overrides[k]
	s.overMu.Unlock()
	if l != nil {
		return l, nil
	}
	unit, ok := parseUnit(k.unit.String())
	if !ok {
		return nil, errors.New("unit " + k.unit.String() + " is not a rate limit unit")
	}
	l = &Limit{FullKey: "limit-override", RequestsPerUnit: k.rpu, Unit: unit, UnitMultiplier: k.mult}
	if l.Window() > admit.MaxRatePeriod {
		return nil, errors.New("the period is longer than " + admit.MaxRatePeriod.String())
	}
	if k.rpu > 0 {
		r := admit.Rule{Name: "limit-override", Algorithm: admit.FixedWindow, Limit: int64(k.rpu), Window: l.Window()}
		if err := r.Validate(); err != nil {
			return nil, err
		}
		l.rule = &policy.Rule{Rule: r, Scope: "envoy"}
	}
	s.overMu.Lock()
	defer s.overMu.Unlock()
	if prev := s.overrides[k]; prev != nil {
		return prev, nil
	}
	if len(s.overrides) < maxOverrides {
		s.overrides[k] = l
	}
	return l, nil
}

// grpcError maps an Admit error to a gRPC status.
func grpcError(err error) error {
	code := codes.Internal
	var unknown unknownError
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
	}
	if errors.As(err, &unknown) {
		code = codes.Unknown
	} else if errors.Is(err, context.Canceled) {
		code = codes.Canceled
	} else if errors.Is(err, context.DeadlineExceeded) {
		code = codes.DeadlineExceeded
	}
	return status.Error(code, err.Error())
}

// rateLimitHeaders returns the X-RateLimit fields of draft 03 as Envoy
// writes them: the limit and remaining count of the status closest to its
// limit (best), and every limit's quota policy.
func rateLimitHeaders(sts []*rlsv3.RateLimitResponse_DescriptorStatus, best int) []*corev3.HeaderValue {
	b := sts[best]
	limit := strconv.AppendUint(nil, uint64(b.CurrentLimit.RequestsPerUnit), 10)
	for _, st := range sts {
		l := st.GetCurrentLimit()
		if l == nil {
			continue
		}
		w := unitSeconds(l)
		if w == 0 {
			continue
		}
		limit = append(limit, ", "...)
		limit = strconv.AppendUint(limit, uint64(l.RequestsPerUnit), 10)
		limit = append(limit, ";w="...)
		limit = strconv.AppendInt(limit, w, 10)
		if l.Name != "" {
			limit = append(limit, `;name="`...)
			limit = append(limit, l.Name...)
			limit = append(limit, '"')
		}
	}
	reset := int64(0)
	if d := b.GetDurationUntilReset(); d != nil {
		reset = d.GetSeconds()
		if d.GetNanos() > 0 {
			reset++ // whole seconds, never earlier than the reset
		}
	}
	return []*corev3.HeaderValue{
		{Key: "x-ratelimit-limit", Value: string(limit)},
		{Key: "x-ratelimit-remaining", Value: strconv.FormatUint(uint64(b.LimitRemaining), 10)},
		{Key: "x-ratelimit-reset", Value: strconv.FormatInt(reset, 10)},
	}
}

// unitSeconds returns a limit's period in seconds.
func unitSeconds(l *rlsv3.RateLimitResponse_RateLimit) int64 {
	u := fromProtoUnit(l.Unit)
	mult := int64(1)
	if m := l.GetUnitMultiplier(); m != nil && m.GetValue() > 0 {
		mult = int64(m.GetValue())
	}
	return int64(u.Duration()/time.Second) * mult
}

// protoUnits maps Unit to the protocol's unit, whose numbering differs
// (WEEK came last).
var protoUnits = [...]rlsv3.RateLimitResponse_RateLimit_Unit{
	rlsv3.RateLimitResponse_RateLimit_UNKNOWN, rlsv3.RateLimitResponse_RateLimit_SECOND,
	rlsv3.RateLimitResponse_RateLimit_MINUTE, rlsv3.RateLimitResponse_RateLimit_HOUR,
	rlsv3.RateLimitResponse_RateLimit_DAY, rlsv3.RateLimitResponse_RateLimit_WEEK,
	rlsv3.RateLimitResponse_RateLimit_MONTH, rlsv3.RateLimitResponse_RateLimit_YEAR,
}

func protoUnit(u Unit) rlsv3.RateLimitResponse_RateLimit_Unit {
	if int(u) < len(protoUnits) {
		return protoUnits[u]
	}
	return rlsv3.RateLimitResponse_RateLimit_UNKNOWN
}

// fromProtoUnit is protoUnit's inverse; UnitUnknown for other values.
func fromProtoUnit(p rlsv3.RateLimitResponse_RateLimit_Unit) Unit {
	for u, q := range protoUnits {
		if q == p {
			return Unit(u)
		}
	}
	return UnitUnknown
}
