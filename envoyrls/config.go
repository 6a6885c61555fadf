package envoyrls

import (
	"sort"
	"strconv"
	"strings"
	"time"

	"google.golang.org/protobuf/types/known/structpb"

	"github.com/admitdev/admit"
	"github.com/admitdev/admit/policy"
	"github.com/admitdev/admit/yamlconf"
)

// Bounds on what one configuration may hold.
const (
	MaxFileSize = 4 << 20 // bytes of one YAML file
	MaxFiles    = 1000    // YAML files in a directory
	MaxDepth    = 16      // nesting of descriptors
)

// Unit is a rate limit unit of envoyproxy/ratelimit's configuration.
type Unit uint8

// The units, with the lengths envoyproxy/ratelimit gives them: a month is
// 30 days and a year 365.
const (
	UnitUnknown Unit = iota
	Second
	Minute
	Hour
	Day
	Week
	Month
	Year
)

var unitNames = [...]string{"UNKNOWN", "SECOND", "MINUTE", "HOUR", "DAY", "WEEK", "MONTH", "YEAR"}

var unitLengths = [...]time.Duration{0, time.Second, time.Minute, time.Hour, 24 * time.Hour,
	7 * 24 * time.Hour, 30 * 24 * time.Hour, 365 * 24 * time.Hour}

// String returns the unit's name in capitals, as in the protocol.
func (u Unit) String() string {
	if int(u) < len(unitNames) {
		return unitNames[u]
	}
	return "Unit(" + strconv.Itoa(int(u)) + ")"
}

// Duration returns the length of one unit.
func (u Unit) Duration() time.Duration {
	if int(u) < len(unitLengths) {
		return unitLengths[u]
	}
	return 0
}

// parseUnit parses a unit name in any case ("second", "MINUTE"…).
func parseUnit(s string) (Unit, bool) {
	for i, n := range unitNames {
		if i > 0 && strings.EqualFold(s, n) {
			return Unit(i), true
		}
	}
	return UnitUnknown, false
}

// Limit is the rate_limit block of one configured descriptor.
type Limit struct {
	// FullKey is the descriptor's path: the domain and each level's key,
	// with "_value" when the level names a value, joined by dots, as
	// envoyproxy/ratelimit names its statistics.
	FullKey string
	// Name and Replaces implement replaces: a matched limit whose Name
	// another matched limit of the same request replaces is not applied.
	Name     string
	Replaces []string
	// Unlimited limits always admit and are never counted.
	Unlimited bool
	// Shadow limits are counted and reported but never refuse
	// (shadow_mode).
	Shadow bool
	// Quota limits (quota_mode) do not refuse a request on their own: the
	// request is over the limit only when every group of quota descriptors
	// it has is (Options.QuotaAnswers says how they answer).
	Quota bool
	// Metadata is the descriptor's metadata block, which dynamic metadata
	// repeats for the descriptors a request passed (QuotaGroups).
	Metadata *structpb.Struct

	RequestsPerUnit uint32
	Unit            Unit
	UnitMultiplier  uint32 // at least 1

	// rule is what the store decides: fixed_window unless the file names
	// another algorithm. Nil when Unlimited or RequestsPerUnit is 0 (the
	// limit refuses everything, as in envoyproxy/ratelimit).
	rule *policy.Rule
	// strict is a quota limit's rule decided as a normal one: when a
	// request's quota descriptors form one group, "every group over its
	// limit" is any of them being over, which the store decides exactly.
	strict *policy.Rule
	// counted and strictCounted are rule and strict as the service
	// decides them when they are exact fixed windows: admit.Counted,
	// which a store counts with its cheapest means.
	counted, strictCounted *admit.Rule

	file      string // where the rate_limit block is, for Check's errors
	line, col int
}

// countEach sets l.counted from l.rule, and l.strictCounted from
// l.strict.
func (l *Limit) countEach() {
	counted := func(p *policy.Rule) *admit.Rule {
		if p == nil || p.Algorithm != admit.FixedWindow || p.Distribution != admit.Exact {
			return nil
		}
		c := p.Rule
		c.Distribution = admit.Counted
		return &c
	}
	l.counted, l.strictCounted = counted(l.rule), counted(l.strict)
}

// countedRule returns the admit.Counted copy of r, one of l's rules, or r.
func (l *Limit) countedRule(r *admit.Rule) *admit.Rule {
	switch {
	case l.counted != nil && r == &l.rule.Rule:
		return l.counted
	case l.strictCounted != nil && l.strict != nil && r == &l.strict.Rule:
		return l.strictCounted
	}
	return r
}

// Rule returns the rule the store decides for l: a fixed window unless the
// file names another algorithm. It is nil when l is unlimited or its
// requests_per_unit is 0 (it refuses everything, as in
// envoyproxy/ratelimit).
func (l *Limit) Rule() *admit.Rule {
	if l.rule == nil {
		return nil
	}
	return &l.rule.Rule
}

// Window returns the limit's period: its unit times its multiplier.
func (l *Limit) Window() time.Duration {
	return l.Unit.Duration() * time.Duration(l.UnitMultiplier)
}

// Config is a set of envoyproxy/ratelimit configuration files: rate limit
// domains, each a tree of descriptors. It is immutable once loaded and safe
// for concurrent use.
type Config struct {
	domains map[string]*level
	charge  map[string]Charge // what each domain's file says of charge
	files   []string
}

// Charge is how a domain counts its descriptors' hits.
type Charge uint8

const (
	// ChargeDefault: the file says nothing; the service's default
	// applies (Options.Charge).
	ChargeDefault Charge = iota
	// ChargeAll: a request's counters are all charged or none is
	// (charge: all), Admit's guarantee.
	ChargeAll
	// ChargeEach: every descriptor's hits are counted on their own, past
	// the limit too, as envoyproxy/ratelimit counts them (charge: each).
	ChargeEach
)

// QuotaAnswers is how quota_mode descriptors answer: envoyproxy/ratelimit
// changed its answers in 2026, and a deployment replacing it keeps the
// answers of the version it ran.
type QuotaAnswers uint8

const (
	// QuotaGroups answers as envoyproxy/ratelimit's main branch has since
	// spring 2026. A quota descriptor over its limit answers OVER_LIMIT,
	// with its limit and reset. Quota descriptors form groups: those of
	// one backend_name and model_name_override entry (a model behind a
	// backend), else each descriptor by all its entries; a group is over
	// when any of its descriptors is. The request is over its limit when
	// a regular descriptor is or every group is, so a request may fail
	// over from an exhausted model to another. Dynamic metadata carries
	// the metadata blocks of the descriptors that passed, leaving out
	// those of an exhausted group, and passedBackends: the backend and
	// model pairs still available.
	QuotaGroups QuotaAnswers = iota
	// QuotaReported answers as its main branch of 2026-01-22 (the version
	// the module proxy serves): a quota descriptor over its limit answers
	// OK, with its limit, nothing remaining and no reset, and never
	// refuses a request; dynamic metadata lists quotaModeEnabled and
	// quotaModeViolations, the indexes of the quota descriptors over.
	// Under charge: all, a request whose quota descriptors are all over
	// is refused, and nothing is counted.
	QuotaReported
)

// ParseQuotaAnswers parses a QuotaAnswers name: groups or reported.
func ParseQuotaAnswers(s string) (QuotaAnswers, error) {
	switch s {
	case "groups":
		return QuotaGroups, nil
	case "reported":
		return QuotaReported, nil
	}
	return 0, admit.Errorf(admit.CodeInvalid, "quota answers %q: want groups (envoyproxy/ratelimit since spring 2026: a quota over answers OVER_LIMIT, the request refused when every group is over) or reported (its main of 2026-01-22: a quota over answers OK, never refusing)", s)
}

// ChargeOf returns what domain's file says of charge.
func (c *Config) ChargeOf(domain string) Charge {
	if c == nil {
		return ChargeDefault
	}
	return c.charge[domain]
}

// ChargesEach reports whether domain's file says charge: each.
func (c *Config) ChargesEach(domain string) bool { return c.ChargeOf(domain) == ChargeEach }

// Domains returns the names of the configured domains, sorted.
func (c *Config) Domains() []string {
	if c == nil {
		return nil
	}
	out := make([]string, 0, len(c.domains))
	for d := range c.domains {
		out = append(out, d)
	}
	sort.Strings(out)
	return out
}

// Files returns the files c was loaded from.
func (c *Config) Files() []string {
	if c == nil {
		return nil
	}
	return c.files
}

// HasDomain reports whether c configures domain.
func (c *Config) HasDomain(domain string) bool {
	return c != nil && c.domains[domain] != nil
}

// Check applies check (a store's own limits on rules, say) to every rule of
// c and reports the rules it refuses, with their positions.
func (c *Config) Check(check func(*admit.Rule) error) error {
	var errs yamlconf.Errors
	var walk func(lv *level)
	visit := func(n *node) {
		if n.limit != nil && n.limit.Rule() != nil {
			r := n.limit.Rule()
			if err := check(r); err != nil {
				errs = append(errs, yamlconf.Error{File: n.limit.file, Line: n.limit.line, Col: n.limit.col, Msg: n.limit.FullKey + ": " + err.Error()})
			}
		}
		if n.next != nil {
			walk(n.next)
		}
	}
	walk = func(lv *level) {
		for _, n := range lv.exact {
			visit(n)
		}
		for _, n := range lv.byKey {
			visit(n)
		}
		for _, w := range lv.wildcards {
			visit(w.n)
		}
	}
	for _, d := range c.Domains() {
		walk(c.domains[d])
	}
	if len(errs) == 0 {
		return nil
	}
	sort.SliceStable(errs, func(i, j int) bool {
		a, b := errs[i], errs[j]
		return a.File < b.File || a.File == b.File && (a.Line < b.Line || a.Line == b.Line && a.Col < b.Col)
	})
	return errs
}

// level is one level of a descriptor tree: the descriptors configured at
// this depth, by key and value, by key alone, and by key and value prefix
// (wildcards, tried in file order).
type level struct {
	exact     map[[2]string]*node
	byKey     map[string]*node
	wildcards []wildcard
}

// wildcard is a descriptor value with '*' in it: each '*' stands for any
// run of characters, possibly empty ("foo*", "bar*b", "foo*bar*baz").
type wildcard struct {
	key, pattern string
	n            *node
}

// matches reports whether value matches the wildcard pattern p.
func matches(p, value string) bool {
	first, rest, _ := strings.Cut(p, "*")
	if !strings.HasPrefix(value, first) {
		return false
	}
	value = value[len(first):]
	// Each further piece is matched at its first occurrence, which leaves
	// the most room for the pieces after it; the last must end the value.
	for {
		piece, more, starred := strings.Cut(rest, "*")
		if !starred {
			return strings.HasSuffix(value, piece)
		}
		i := strings.Index(value, piece)
		if i < 0 {
			return false
		}
		value, rest = value[i+len(piece):], more
	}
}

type node struct {
	limit *Limit
	next  *level // nil when no descriptors are nested
	// shared: values matched by this wildcard share one counter
	// (share_threshold); pattern is the wildcard value, like "files*".
	shared  bool
	pattern string
}
