package llm

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"regexp"
	"strconv"
	"sync"
	"time"

	"github.com/admitdev/admit"
	"github.com/admitdev/admit/internal/bounds"
	"github.com/admitdev/admit/internal/wide"
	"github.com/admitdev/admit/policy"
	"github.com/admitdev/admit/units"
)

// Rates are prices per million tokens of each kind (web searches: per
// million searches), in millionths of the currency (150000 is 0.15 per
// million tokens).
type Rates [units.NumTokenKinds]int64

// Cost returns what t costs at r in millionths of the currency, rounded
// up to a whole millionth, at most bounds.MaxCost: exact integer
// arithmetic, no floating point.
func (r *Rates) Cost(t units.Tokens) int64 {
	var sum wide.U128
	for k, n := range t {
		sum = sum.Add(wide.Mul(uint64(max(n, 0)), uint64(max(r[k], 0))))
	}
	return min(sum.DivUp(1_000_000), bounds.MaxCost)
}

// Price is a model's price: its rates, those of a long context, and
// those of its service tiers.
type Price struct {
	Rates
	// LongContextAbove, when above 0, prices a call whose prompt (its
	// input of every kind) has more tokens than that at LongContext, the
	// whole call: as Anthropic and Google bill prompts past 200,000
	// tokens.
	LongContextAbove int64
	LongContext      Rates
	// Tiers price the calls a provider reports it served at a service
	// tier, by the name it reports ("priority", "flex"); any other tier
	// is priced at the model's own rates. A tier has no tiers of its own.
	Tiers map[string]*Price
}

// RatesAt returns the rates of a call the provider served at tier ("" for
// its default) and that used t.
func (p *Price) RatesAt(tier string, t units.Tokens) *Rates {
	if tp, ok := p.Tiers[tier]; ok && tier != "" {
		p = tp
	}
	if p.LongContextAbove > 0 && t.Prompt() > p.LongContextAbove {
		return &p.LongContext
	}
	return &p.Rates
}

// Cost returns what a call served at tier that used t costs.
func (p *Price) Cost(tier string, t units.Tokens) int64 {
	return p.RatesAt(tier, t).Cost(t)
}

// bound returns the rates that bound a call's cost before it is made:
// each kind at the most the rates of the tier it asks for may charge it,
// long context included when its prompt's estimate passes the threshold.
func (p *Price) bound(tier string, input int64) Rates {
	if tp, ok := p.Tiers[tier]; ok && tier != "" {
		p = tp
	}
	r := p.Rates
	if p.LongContextAbove > 0 && input > p.LongContextAbove {
		for k, v := range p.LongContext {
			r[k] = max(r[k], v)
		}
	}
	return r
}

// GateOptions configure a Gate. Decider and Policy are required.
type GateOptions struct {
	Decider *policy.Decider
	Policy  func() *policy.Policy
	// Prices are the models' prices, for rules in money. A call to a model
	// without a price is refused (400) when a rule in money applies to it.
	Prices map[string]Price
	// DefaultMaxOutput is the most output tokens a request that sets no
	// maximum may produce (per choice); the Gate writes the maximum into
	// the request. Default 4096.
	DefaultMaxOutput int64
	// MinOutput: a request that sets no maximum is refused when its
	// budgets leave it fewer output tokens than this. Default 1.
	MinOutput int64
	// LowerMaxOutput lowers a request's own maximum to what its budgets
	// leave (at least MinOutput), where it would be refused.
	LowerMaxOutput bool
	// Count estimates the input tokens of a text for a model; default
	// CountTokens.
	Count func(model, text string) int64
	// Record, if set, hears of every settled call.
	Record func(*Record)
	// Now reads the clock; default time.Now.
	Now    func() time.Time
	Logger *slog.Logger
}

// A Gate decides LLM calls against a policy's rules: request rules count
// the call, rules in tokens and money its tokens, reserved before it goes
// out and settled to what the provider reports. It is safe for concurrent
// use.
type Gate struct {
	opts GateOptions

	mu sync.Mutex
	// inFlight counts each tenant's calls between Enter and their end.
	inFlight map[string]int64
	// spent are the tenants a budget that holds nothing refused lately,
	// refused again by Enter for a little while without a look at the
	// store or at the call's body.
	spent map[string]spentRefusal
}

// spentRefusal is a remembered refusal by a budget that held nothing.
type spentRefusal struct {
	policy    *policy.Policy
	at, until time.Time
	p         Problem
}

// spentMemory is the most a refusal by a spent budget is remembered: a
// refund of a call in flight may give some back any time.
const spentMemory = time.Second

// maxSpent bounds the refusals remembered; past it the oldest are dropped
// as they expire, and new ones are not kept.
const maxSpent = 100_000

func (g *Gate) now() time.Time {
	if g.opts.Now != nil {
		return g.opts.Now()
	}
	return time.Now()
}

// rememberSpent keeps p, a refusal of tenant's call under pol by a budget
// that held nothing, for the calls that follow.
func (g *Gate) rememberSpent(tenant string, pol *policy.Policy, p *Problem) {
	now := g.now()
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.spent == nil {
		g.spent = map[string]spentRefusal{}
	}
	if len(g.spent) >= maxSpent {
		for k, r := range g.spent {
			if !now.Before(r.until) {
				delete(g.spent, k)
			}
		}
		if len(g.spent) >= maxSpent {
			return
		}
	}
	g.spent[tenant] = spentRefusal{policy: pol, at: now, until: now.Add(min(p.RetryAfter, spentMemory)), p: *p}
}

// Enter counts a call of tenant in flight, or refuses it (a *Problem,
// 429) when the tenant already has its tier's llm_in_flight: before its
// body is read or counted, so that a flood of calls costs little. The
// returned func ends the call; calling it again does nothing.
func (g *Gate) Enter(tenant string) (leave func(), err error) {
	limit := int64(bounds.DefaultLLMInFlight)
	pol := g.opts.Policy()
	if t, err := pol.TenantOrDefault(tenant); err == nil && t.Tier != nil && t.Tier.LLMInFlight > 0 {
		limit = t.Tier.LLMInFlight
	}
	now := g.now()
	g.mu.Lock()
	defer g.mu.Unlock()
	if r, ok := g.spent[tenant]; ok {
		if r.policy == pol && now.Before(r.until) {
			p := r.p
			p.RetryAfter = max(p.RetryAfter-now.Sub(r.at), time.Millisecond)
			return nil, &p
		}
		delete(g.spent, tenant)
	}
	if g.inFlight[tenant] >= limit {
		return nil, &Problem{Status: http.StatusTooManyRequests, Kind: "rate_limit_exceeded", RetryAfter: time.Second,
			Message: fmt.Sprintf("the tenant has %d LLM calls in flight through this proxy, its tier's llm_in_flight: retry when one ends", limit)}
	}
	if g.inFlight == nil {
		g.inFlight = map[string]int64{}
	}
	g.inFlight[tenant]++
	var once sync.Once
	return func() {
		once.Do(func() {
			g.mu.Lock()
			defer g.mu.Unlock()
			if g.inFlight[tenant]--; g.inFlight[tenant] <= 0 {
				delete(g.inFlight, tenant)
			}
		})
	}, nil
}

// NewGate returns a Gate.
func NewGate(opts GateOptions) (*Gate, error) {
	if opts.Decider == nil || opts.Policy == nil {
		return nil, errors.New("llm: GateOptions.Decider and Policy are required")
	}
	if opts.DefaultMaxOutput <= 0 {
		opts.DefaultMaxOutput = 4096
	}
	if opts.MinOutput <= 0 {
		opts.MinOutput = 1
	}
	if opts.MinOutput > opts.DefaultMaxOutput {
		return nil, fmt.Errorf("llm: the minimum output %d is above the default maximum %d", opts.MinOutput, opts.DefaultMaxOutput)
	}
	if opts.Count == nil {
		opts.Count = CountTokens
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	return &Gate{opts: opts}, nil
}

// Record is a settled call: who made it, to which model, what it used
// and cost. A billing record.
type Record struct {
	Tenant, User, Model string
	API                 API
	At                  time.Time
	Usage               units.Tokens
	// Cost is in millionths of the currency; 0 without a price.
	Cost   int64
	Priced bool
	// Reported says the provider reported the usage. Otherwise Usage and
	// Cost are what was charged: the call's reservation (its input
	// estimate and the most output it allowed) when the provider said
	// nothing, or the answer ended before its report.
	Reported bool
	Status   int
	// ServiceTier is the tier the call was priced at: the one the
	// provider reported, else the one the request asked for; "" for the
	// default.
	ServiceTier string
}

// Ticket is an admitted call: what it reserved, where, until settled.
type Ticket struct {
	g       *Gate
	req     *Request
	who     policy.Request
	res     policy.Resolution
	dec     admit.Decision
	out     policy.Outcome
	price   *Price
	rates   Rates // the price's bound on the call, before it is made
	maxOut  int64 // per choice, as sent
	costs   []int64
	settled bool
}

// MaxOutput returns the maximum output tokens per choice the call goes
// out with.
func (t *Ticket) MaxOutput() int64 { return t.maxOut }

// Decision returns the decision that admitted the call and the rules of
// its charges.
func (t *Ticket) Decision() (*admit.Decision, []*policy.Rule) { return &t.dec, t.res.Rules }

// Begin decides a call for who (identified: tenant, user, key): it
// resolves the rules that apply, reserves at each of them the call's
// upper bound (requests: the request; tokens and money: the input
// estimate plus the most output the call allows, × its choices) and
// returns the ticket to settle. A call that sets no maximum output gets
// the default, lowered to what the tightest budget leaves. A refusal is
// a *Problem; nothing is reserved then.
func (g *Gate) Begin(ctx context.Context, who policy.Request, req *Request) (*Ticket, error) {
	p := g.opts.Policy()
	t, err := g.begin(ctx, p, who, req)
	if pr, ok := err.(*Problem); ok && pr.spent {
		g.rememberSpent(who.Tenant, p, pr)
	}
	return t, err
}

func (g *Gate) begin(ctx context.Context, p *policy.Policy, who policy.Request, req *Request) (*Ticket, error) {
	t := &Ticket{g: g, req: req, who: who}
	t.who.Metered, t.who.Model = true, req.Model
	if err := p.Resolve(&t.who, &t.res); err != nil {
		return nil, err
	}
	for _, r := range t.res.Rules {
		if r.Unit == units.UnitMoney && t.price == nil {
			pr, ok := g.priceOf(req.Model)
			if !ok {
				return nil, &Problem{Status: http.StatusBadRequest, Kind: "model_not_found",
					Message: fmt.Sprintf("model %q has no price, and rule %q budgets money: ask the platform to price it", req.Model, r.Name)}
			}
			t.price = &pr
			t.rates = pr.bound(req.ServiceTier, req.Input)
		}
	}
	outPerChoice := req.MaxOutput
	if req.API == Embeddings {
		outPerChoice = 0
	} else if outPerChoice == 0 || g.opts.LowerMaxOutput {
		want := outPerChoice
		if want == 0 {
			want = g.opts.DefaultMaxOutput
		}
		room, refusal, err := g.room(ctx, t, want)
		if err != nil {
			return nil, err
		}
		switch {
		case room >= want:
			outPerChoice = want
		case room < g.opts.MinOutput || req.MaxOutput > 0 && !g.opts.LowerMaxOutput:
			return nil, refusal
		default:
			outPerChoice = room
		}
	}
	t.maxOut = outPerChoice
	if err := g.reserve(ctx, t); err != nil {
		return nil, err
	}
	return t, nil
}

// cost returns the upper bound of a call's cost at rule r with out
// output tokens per choice (see heaviest).
func (t *Ticket) cost(r *policy.Rule, out int64) int64 {
	switch r.Unit {
	case units.UnitTokens:
		return heaviest(r.Weights, t.req, out, r.Weights.Cost)
	case units.UnitMoney:
		return heaviest(t.rates, t.req, out, t.rates.Cost)
	}
	return max(t.who.Cost, 1)
}

// heaviest bounds what req costs at weights (or rates) w with out output
// tokens per choice: its input estimate as the input kind that weighs
// most, its audio part as audio where that weighs more, the output of
// all its choices as the output kind that weighs most, and its web
// searches. Kinds the request cannot be billed are left out: audio
// output unless it asks for audio, hour-long cache writes unless it may
// make them.
func heaviest(w [units.NumTokenKinds]int64, req *Request, out int64, cost func(units.Tokens) int64) int64 {
	var t units.Tokens
	in := units.Input
	for _, k := range []units.TokenKind{units.CachedInput, units.CacheWrite, units.CacheWriteLong} {
		if w[k] > w[in] && (k != units.CacheWriteLong || req.CacheLong) {
			in = k
		}
	}
	audio := min(req.AudioInput, req.Input)
	t[in] = req.Input - audio
	if w[units.AudioInput] > w[in] {
		t[units.AudioInput] = audio
	} else {
		t[in] += audio
	}
	o := units.Output
	for _, k := range []units.TokenKind{units.Reasoning, units.AudioOutput} {
		if w[k] > w[o] && (k != units.AudioOutput || req.AudioOutput) {
			o = k
		}
	}
	t[o] = out * req.Choices
	t[units.WebSearch] = req.Searches
	return cost(t)
}

// earlyLook is the body size past which Parse looks at a call's budgets
// before it counts the call's input: counting a large prompt costs the
// proxy more than the look.
const earlyLook = 256 << 10

// Parse reads the body of a call to api for who, as ParseRequest does
// with the Gate's count. A body past 256 KB is counted only as far as
// who's budgets have room for, by a look at them first: a call whose
// input alone passes what a budget in tokens or money holds is refused
// there (a *Problem, 429), without counting the rest, so that a refused
// call costs the proxy less than an admitted one.
func (g *Gate) Parse(ctx context.Context, who policy.Request, api API, model string, body []byte) (*Request, error) {
	req, err := readRequest(api, model, body)
	if err != nil {
		return nil, err
	}
	if len(body) <= earlyLook {
		req.countInput(g.opts.Count, -1)
		return req, nil
	}
	limit, refusal, err := g.inputRoom(ctx, who, req)
	if err != nil {
		return nil, err
	}
	if !req.countInput(g.opts.Count, limit) {
		return nil, refusal
	}
	return req, nil
}

// inputRoom returns the most input tokens req may have within who's
// budgets in tokens and money, from a look at them, and the refusal of a
// call with more; -1 when none bounds it. Input is taken at its lightest
// kind, so that a call past the room would be refused by its
// reservation too.
func (g *Gate) inputRoom(ctx context.Context, who policy.Request, req *Request) (int64, *Problem, error) {
	t := &Ticket{g: g, req: req, who: who}
	t.who.Metered, t.who.Model = true, req.Model
	p := g.opts.Policy()
	if err := p.Resolve(&t.who, &t.res); err != nil {
		return 0, nil, err
	}
	d, err := g.look(ctx, &t.res)
	if err != nil {
		return 0, nil, err
	}
	room := int64(-1)
	var refusal *Problem
	for i, r := range t.res.Rules {
		if r.Unit == units.UnitRequests || r.Shadow || i >= len(d.Results) {
			continue
		}
		var w [units.NumTokenKinds]int64
		var per int64 // the weights' unit: thousandths of a token, millionths of a price
		if r.Unit == units.UnitTokens {
			w, per = r.Weights, 1000
		} else if pr, ok := g.priceOf(req.Model); ok {
			w, per = pr.Rates, 1_000_000
		} else {
			continue // refused by Begin, unpriced
		}
		// The kinds text may be billed as: Anthropic alone reports cache
		// writes.
		lightest := min(w[units.Input], w[units.CachedInput])
		if req.API.Provider() == Anthropic {
			lightest = min(lightest, w[units.CacheWrite])
			if req.CacheLong {
				lightest = min(lightest, w[units.CacheWriteLong])
			}
		}
		if lightest <= 0 {
			continue
		}
		res := &d.Results[i]
		left := max(min(res.Remaining, r.MaxCost), 0)
		n := min(wide.MulDiv(uint64(left), uint64(per), uint64(lightest)), bounds.MaxCost)
		if room < 0 || n < room {
			room = n
			refusal = g.refusal(r, res, fmt.Sprintf("rule %q leaves room for %d input tokens; this request's input is more", r.Name, n))
		}
	}
	return room, refusal, nil
}

// look is a dry run of res's charges at cost 0: what each rule holds.
func (g *Gate) look(ctx context.Context, res *policy.Resolution) (*admit.Decision, error) {
	charges := make([]admit.Charge, len(res.Charges))
	for i, c := range res.Charges {
		c.Cost, c.DryRun = 0, true
		charges[i] = c
	}
	look := policy.Resolution{Policy: res.Policy, Tenant: res.Tenant, Charges: charges, Rules: res.Rules}
	var d admit.Decision
	if _, err := g.opts.Decider.Decide(ctx, &look, &d); err != nil {
		return nil, err
	}
	return &d, nil
}

// room returns how many output tokens per choice the budgets of t leave,
// at most want, from a look at them (a dry run); and the refusal to give
// when that is too few.
func (g *Gate) room(ctx context.Context, t *Ticket, want int64) (int64, *Problem, error) {
	d, err := g.look(ctx, &t.res)
	if err != nil {
		return 0, nil, err
	}
	room := want
	var tightest *admit.Result
	var rule *policy.Rule
	for i, r := range t.res.Rules {
		if r.Unit == units.UnitRequests || r.Shadow || i >= len(d.Results) {
			continue
		}
		res := &d.Results[i]
		left := min(res.Remaining, r.MaxCost)
		// The most output o with cost(o) ≤ left, by bisection: cost is
		// monotone in o.
		lo, hi := int64(-1), want
		for lo < hi {
			mid := lo + (hi-lo+1)/2
			if t.cost(r, mid) <= left {
				lo = mid
			} else {
				hi = mid - 1
			}
		}
		if lo < room {
			room, tightest, rule = lo, res, r
		}
	}
	var refusal *Problem
	if tightest != nil {
		refusal = g.refusal(rule, tightest, fmt.Sprintf("rule %q leaves room for %d output tokens; this request needs at least %d", rule.Name, max(room, 0), g.opts.MinOutput))
	}
	return max(room, 0), refusal, nil
}

// refusal is the Problem of a refusal by rule r, whose result is res.
func (g *Gate) refusal(r *policy.Rule, res *admit.Result, msg string) *Problem {
	p := &Problem{Status: http.StatusTooManyRequests, Kind: "rate_limit_exceeded", Message: msg, RetryAfter: res.RetryAfter, DeniedBy: r.Name,
		// A tenant's own budget (not one per user, model or action) that
		// holds nothing refuses any call of the tenant alike.
		spent: res.Remaining <= 0 && r.Scope == policy.ScopeTenant && !r.PerModel && !r.PerAction}
	if p.RetryAfter <= 0 {
		p.RetryAfter = res.ResetAfter
	}
	if r.Unit == units.UnitMoney || r.Algorithm == admit.Quota {
		// A budget spent until its period ends: retrying sooner is
		// pointless, and OpenAI calls that insufficient quota.
		p.Final = true
		p.RetryAfter = max(res.ResetAfter, res.RetryAfter)
		if r.Unit == units.UnitMoney {
			p.Kind = "insufficient_quota"
		}
	}
	return p
}

// reserve charges t's bound at every rule, all or nothing.
func (g *Gate) reserve(ctx context.Context, t *Ticket) error {
	t.costs = make([]int64, len(t.res.Charges))
	for i, r := range t.res.Rules {
		c := t.cost(r, t.maxOut)
		if c > r.MaxCost && r.Shadow {
			c = r.MaxCost // reported, never refusing
		}
		if c > r.MaxCost {
			p := &Problem{Status: http.StatusTooManyRequests, Kind: "rate_limit_exceeded", Final: true, DeniedBy: r.Name,
				Message: fmt.Sprintf("this request may use up to %s of rule %q, which allows at most %s in one request: lower its maximum output", amount(r, c), r.Name, amount(r, r.MaxCost))}
			if r.Unit == units.UnitMoney {
				p.Kind = "insufficient_quota"
			}
			return p
		}
		t.costs[i] = c
		t.res.Charges[i].Cost = c
	}
	out, err := g.opts.Decider.Decide(ctx, &t.res, &t.dec)
	if err != nil {
		return err
	}
	t.out = out
	if !t.dec.Allowed {
		p := &Problem{Status: http.StatusTooManyRequests, Kind: "rate_limit_exceeded", Message: "rate limited by " + t.dec.DeniedBy, RetryAfter: t.dec.RetryAfter}
		for i, r := range t.res.Rules {
			if res := &t.dec.Results[i]; res.Rule == t.dec.DeniedBy && !res.Allowed {
				p = g.refusal(r, res, fmt.Sprintf("rate limited by %q: this request needs %s and %s remain; retry after %d ms",
					r.Name, amount(r, t.costs[i]), amount(r, res.Remaining), max(res.RetryAfter, 0).Milliseconds()))
				break
			}
		}
		p.rules, p.charges, p.results = t.res.Rules, t.res.Charges, t.dec.Results
		return p
	}
	return nil
}

// Settlement is how a call ended, for Ticket.Settle.
type Settlement struct {
	// Usage is what the call used: reported, or estimated.
	Usage units.Tokens
	// Reported says the provider reported Usage.
	Reported bool
	// ServiceTier is the service tier the provider reports it served the
	// call at, "" when it reports none.
	ServiceTier string
	// Keep charges the reservation as it stands, whatever Usage says:
	// for a call that reported nothing.
	Keep bool
	// Cut says the answer ended before the provider's report: the
	// client left, or the upstream broke.
	Cut    bool
	Status int
}

// Settle brings t's charges to what the call used: the unused part of
// each reservation in tokens or money is refunded, any excess debited
// (a debit is applied even past the limit), unless s.Keep. Settle runs
// once; later calls do nothing. Its errors are the store's, for the
// caller to log: the call is over either way.
func (t *Ticket) Settle(ctx context.Context, s Settlement) error {
	if t.settled {
		return nil
	}
	t.settled = true
	g := t.g
	usage := s.Usage
	if s.Keep {
		usage = units.Tokens{}
		usage[units.Input], usage[units.Output] = t.req.Input, t.maxOut*t.req.Choices
		usage[units.WebSearch] = t.req.Searches
	} else if t.req.API.Provider() != Anthropic && usage[units.WebSearch] == 0 {
		// OpenAI and Google bill searches without counting them in the
		// usage they report: charged as reserved.
		usage[units.WebSearch] = t.req.Searches
	}
	tier := s.ServiceTier
	if tier == "" {
		tier = t.req.ServiceTier
	}
	rec := &Record{Tenant: t.who.Tenant, User: t.who.User, Model: t.req.Model, API: t.req.API, At: time.Now(),
		Usage: usage, Reported: s.Reported && !s.Keep, Status: s.Status, ServiceTier: tier}
	price := t.price
	if p, ok := g.priceOf(t.req.Model); ok && price == nil {
		price = &p
	}
	if price != nil {
		rec.Cost, rec.Priced = price.Cost(tier, usage), true
		if s.Keep { // as reserved: at the kinds priced highest
			rates := price.bound(t.req.ServiceTier, t.req.Input)
			rec.Cost = heaviest(rates, t.req, t.maxOut, rates.Cost)
		}
	}
	if g.opts.Record != nil {
		defer g.opts.Record(rec)
	}
	if s.Keep {
		return nil
	}
	var refunds, debits []admit.Charge
	var debitRules []*policy.Rule
	for i, r := range t.res.Rules {
		if r.Unit == units.UnitRequests {
			continue
		}
		var used int64
		if r.Unit == units.UnitTokens {
			used = r.Weights.Cost(usage)
		} else {
			used = t.price.Cost(tier, usage)
		}
		c := t.res.Charges[i]
		c.DryRun = false
		switch diff := used - t.costs[i]; {
		case diff < 0:
			c.Cost = -diff
			refunds = append(refunds, c)
		case diff > 0:
			// The whole excess, whatever the rule's max_cost (a bound on
			// what callers ask): in charges of at most bounds.MaxCost.
			c.Rule, c.Debit = r.Settling(), true
			for ; diff > 0; diff -= c.Cost {
				c.Cost = min(diff, bounds.MaxCost)
				debits = append(debits, c)
				debitRules = append(debitRules, r)
			}
		}
	}
	var errs []error
	if len(refunds) > 0 && t.out != policy.FailedOpen {
		errs = append(errs, g.opts.Decider.Refund(ctx, refunds, t.dec.At, t.out))
	}
	if len(debits) > 0 {
		res := policy.Resolution{Policy: t.res.Policy, Tenant: t.res.Tenant, Charges: debits, Rules: debitRules}
		var d admit.Decision
		_, err := g.opts.Decider.Decide(ctx, &res, &d)
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// amount says n of r's units as a caller reads them: tokens, requests,
// or money in the prices' currency units (a rule counts millionths).
func amount(r *policy.Rule, n int64) string {
	if r.Unit == units.UnitMoney {
		return units.FormatDecimal(n, 6) + " in money (the prices' currency)"
	}
	return strconv.FormatInt(n, 10) + " " + r.Unit.String()
}

// snapshot matches the date a model's snapshot is named by, after its
// family: gpt-4o-2024-08-06, claude-sonnet-4-5-20250929,
// claude-3-5-sonnet@20241022, gemini-2.0-flash-001.
var snapshot = regexp.MustCompile(`(?:[-@](?:\d{4}-\d{2}-\d{2}|\d{8})|-\d{3})$`)

// priceOf returns model's price: its own, else its family's for a dated
// snapshot the prices do not list (as the providers bill a snapshot at
// its family's price).
func (g *Gate) priceOf(model string) (Price, bool) {
	if p, ok := g.opts.Prices[model]; ok {
		return p, true
	}
	if loc := snapshot.FindStringIndex(model); loc != nil && loc[0] > 0 {
		p, ok := g.opts.Prices[model[:loc[0]]]
		return p, ok
	}
	return Price{}, false
}
