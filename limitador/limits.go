package limitador

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/admitdev/admit"
	"github.com/admitdev/admit/internal/bounds"
	"github.com/admitdev/admit/policy"
	"github.com/admitdev/admit/yamlconf"
)

// Bounds on a limits file.
const (
	MaxFileSize       = 4 << 20 // bytes
	MaxLimits         = 10_000  // limits in a file
	MaxExpressions    = 64      // conditions, and variables, of one limit
	MaxExpressionSize = 4096    // bytes of one condition or variable
	// MaxSeconds is the longest window a limit's seconds may give: the
	// Redis store's longest span, about 52 days. A longer period is a
	// quota (algorithm: quota).
	MaxSeconds = 52 * 24 * 3600
)

// The algorithms a limit may name. FixedWindow, the default, is
// Limitador's: a window starts at its counter's first hit.
const (
	FixedWindow   = "fixed_window"
	SlidingWindow = "sliding_window"
	TokenBucket   = "token_bucket"
	GCRA          = "gcra"
	Quota         = "quota"
)

// Limit is one limit of a limits file.
type Limit struct {
	Namespace string
	MaxValue  int64
	Seconds   int64
	// Name and ID are optional: "" when the file leaves them out.
	Name, ID string
	// Conditions and Variables are the limit's CEL expressions, each once,
	// in order (Limitador keeps them as sets).
	Conditions, Variables []string
	// Algorithm is what counts the limit: FixedWindow (the default,
	// written ""), SlidingWindow, TokenBucket (max_value a burst refilled
	// over seconds), GCRA, or Quota (max_value per calendar Period in
	// TimeZone). Limitador reads none of these fields and counts a fixed
	// window, so a file that names them still loads there.
	Algorithm string
	Period    string // day, week, month or year (quota)
	TimeZone  string // an IANA zone (quota); "" is UTC
	// Distribution is how servers sharing a Redis store count the limit:
	// "exact" (every decision in Redis, as Limitador's redis storage) or
	// "leased" (from allowances each server takes, never over the limit,
	// where Limitador's redis_cached counts late); "" is the file's
	// default (ParseOptions).
	Distribution string

	// Line is where the limit starts in its file.
	Line int

	identity string // the counters' name: see identityOf
	equality string // what Limitador tells limits apart by: see identityOf
	rule     *policy.Rule
	conds    []*expr
	vars     []*expr
	ctxLimit *request // limit, as CEL sees it (only its limit field is set)
	// never and always are limits no counter can hold (max_value 0), or
	// that forget every hit at once (seconds 0, a fixed window).
	never, always bool
}

// Rule returns the Admit rule that counts l.
func (l *Limit) Rule() *admit.Rule { return &l.rule.Rule }

// Stored reports whether l's counters are kept in the store: all but a
// limit of max_value 0, which refuses every hit, and of seconds 0, which
// forgets every hit, both decided without the store.
func (l *Limit) Stored() bool { return !l.never && !l.always }

// Limits are the limits of one file, by namespace. They are immutable
// once parsed; a reload parses a new set.
type Limits struct {
	File string
	// Warnings are what was read but not taken: fields Limitador ignores,
	// and limits that count as another of the same namespace does.
	Warnings []string

	all []*Limit
	ns  map[string][]*Limit
}

// Namespace returns the limits of namespace ns, in file order.
func (ls *Limits) Namespace(ns string) []*Limit {
	if ls == nil {
		return nil
	}
	return ls.ns[ns]
}

// Has reports whether namespace ns has a limit.
func (ls *Limits) Has(ns string) bool { return ls != nil && len(ls.ns[ns]) > 0 }

// Namespaces returns the namespaces, sorted.
func (ls *Limits) Namespaces() []string {
	if ls == nil {
		return nil
	}
	out := make([]string, 0, len(ls.ns))
	for n := range ls.ns {
		out = append(out, n)
	}
	slices.Sort(out)
	return out
}

// All returns every limit, in file order.
func (ls *Limits) All() []*Limit {
	if ls == nil {
		return nil
	}
	return ls.all
}

// Parse reads a limits file: data, named file in errors. Every problem is
// reported, each with its line and column (yamlconf.Errors).
func Parse(file string, data []byte) (*Limits, error) {
	return ParseWith(file, data, ParseOptions{})
}

// ParseWith is Parse with defaults for the limits.
func ParseWith(file string, data []byte, opts ParseOptions) (*Limits, error) {
	p := parser{file: file, opts: opts, ls: &Limits{File: file, ns: map[string][]*Limit{}}}
	if len(data) > MaxFileSize {
		return nil, yamlconf.Errors{{File: file, Msg: fmt.Sprintf("the file is %d bytes; a limits file is at most %d", len(data), MaxFileSize)}}
	}
	var root yaml.Node
	dec := yaml.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(&root); err != nil && err != io.EOF {
		return nil, yamlconf.Errors{yamlconf.SyntaxError(file, err)}
	}
	var next yaml.Node
	if err := dec.Decode(&next); err != io.EOF {
		// Limitador reads one document; a second, the rest of a file
		// joined with ---, would go unread.
		e := yamlconf.Error{File: file, Msg: "the file holds more than one YAML document; a limits file is one list of limits"}
		if err == nil {
			e.Line, e.Col = next.Line, next.Column
		} else {
			e = yamlconf.SyntaxError(file, err)
		}
		return nil, yamlconf.Errors{e}
	}
	if len(root.Content) == 0 {
		return nil, yamlconf.Errors{{File: file, Msg: "the file is empty; a limits file is a list of limits (write [] for none)"}}
	}
	if dup := yamlconf.DuplicateKeys(file, &root); len(dup) > 0 {
		return nil, dup
	}
	list := root.Content[0]
	if list.Kind != yaml.SequenceNode {
		p.fail(list, "", "a limits file is a list of limits, not %s", yamlconf.KindName(list))
		return nil, p.errs
	}
	if len(list.Content) > MaxLimits {
		p.fail(list, "", "%d limits; a file holds at most %d", len(list.Content), MaxLimits)
		return nil, p.errs
	}
	seen := map[string]*Limit{}
	for i, n := range list.Content {
		l := p.limit(n, fmt.Sprintf("[%d]", i))
		if l == nil {
			continue
		}
		// Limitador keeps each namespace's limits as a set, of limits equal
		// by namespace, seconds, conditions and variables (not by id).
		if first, ok := seen[l.equality]; ok {
			p.ls.Warnings = append(p.ls.Warnings, fmt.Sprintf("%s:%d: this limit counts as the one at line %d does (the same namespace, seconds, conditions and variables, or the same id): the first is kept, as Limitador keeps one", file, l.Line, first.Line))
			continue
		}
		seen[l.equality] = l
		p.ls.all = append(p.ls.all, l)
		p.ls.ns[l.Namespace] = append(p.ls.ns[l.Namespace], l)
	}
	if len(p.errs) > 0 {
		slices.SortStableFunc(p.errs, func(a, b yamlconf.Error) int { return a.Line - b.Line })
		return nil, p.errs
	}
	return p.ls, nil
}

type parser struct {
	file string
	opts ParseOptions
	ls   *Limits
	errs yamlconf.Errors
}

// ParseOptions are the defaults of a limits file's limits.
type ParseOptions struct {
	// Distribution is the distribution of the limits that name none:
	// "exact" (the default) or "leased".
	Distribution string
}

func (p *parser) fail(n *yaml.Node, path, format string, args ...any) {
	p.errs = append(p.errs, yamlconf.At(p.file, n, path, fmt.Sprintf(format, args...)))
}

// limit reads one limit at path, or returns nil after reporting why not.
func (p *parser) limit(n *yaml.Node, path string) *Limit {
	if n.Kind != yaml.MappingNode {
		p.fail(n, path, "a limit is a mapping of namespace, max_value, seconds, conditions and variables, not %s", yamlconf.KindName(n))
		return nil
	}
	before := len(p.errs)
	l := &Limit{Line: n.Line}
	fields := map[string]*yaml.Node{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		fields[k.Value] = v
		switch k.Value {
		case "namespace", "max_value", "seconds", "conditions", "variables", "name", "id", "algorithm", "period", "time_zone", "distribution":
		default:
			p.ls.Warnings = append(p.ls.Warnings, fmt.Sprintf("%s:%d:%d: %s.%s: not a field of a limit; ignored, as Limitador ignores it", p.file, k.Line, k.Column, path, k.Value))
		}
	}
	required := func(name string) *yaml.Node {
		v := fields[name]
		if v == nil {
			p.fail(n, path, "missing field %s (a limit has namespace, max_value, seconds, conditions and variables)", name)
		}
		return v
	}
	str := func(name string, v *yaml.Node) (string, bool) {
		if v == nil || isNull(v) {
			return "", false
		}
		if v.Kind != yaml.ScalarNode || v.Tag != "!!str" {
			// Limitador reads these as strings, and refuses a number.
			p.fail(v, path+"."+name, "want a string, not %s (quote it)", yamlconf.KindName(v))
			return "", false
		}
		return v.Value, true
	}
	count := func(name string, max int64) int64 {
		v := required(name)
		if v == nil {
			return 0
		}
		x, err := strconv.ParseUint(v.Value, 10, 64)
		if v.Kind != yaml.ScalarNode || err != nil || v.Tag != "!!int" && v.Tag != "!!str" {
			p.fail(v, path+"."+name, "want a whole number from 0, not %s", yamlconf.KindName(v))
			return 0
		}
		if x > uint64(max) {
			if name == "seconds" {
				p.fail(v, path+"."+name, "%d: a window is at most %d seconds (52 days) here; a longer period is a quota (algorithm: quota, period: month)", x, max)
			} else {
				p.fail(v, path+"."+name, "%d: Admit counts at most %d", x, max)
			}
			return 0
		}
		return int64(x)
	}
	if v := required("namespace"); v != nil {
		if s, _ := str("namespace", v); s == "" {
			p.fail(v, path+".namespace", "want the namespace, the domain of the requests the limit applies to")
		} else {
			l.Namespace = s
		}
	}
	l.MaxValue = count("max_value", bounds.MaxCount)
	l.Seconds = count("seconds", MaxSeconds)
	l.Name, _ = str("name", fields["name"])
	l.ID, _ = str("id", fields["id"])
	l.Conditions, l.conds = p.expressions(required("conditions"), path+".conditions")
	l.Variables, l.vars = p.expressions(required("variables"), path+".variables")
	l.Algorithm, _ = str("algorithm", fields["algorithm"])
	l.Period, _ = str("period", fields["period"])
	l.TimeZone, _ = str("time_zone", fields["time_zone"])
	l.Distribution, _ = str("distribution", fields["distribution"])
	if l.Distribution == "" {
		l.Distribution = p.opts.Distribution
	}
	if len(p.errs) > before {
		return nil
	}
	if err := l.build(); err != nil {
		p.fail(fields["algorithm"], path, "%v", err)
		if fields["algorithm"] == nil {
			p.errs[len(p.errs)-1].Line, p.errs[len(p.errs)-1].Col = n.Line, n.Column
		}
		return nil
	}
	return l
}

func isNull(v *yaml.Node) bool {
	return v.Kind == yaml.ScalarNode && v.Tag == "!!null"
}

// expressions reads a list of CEL expressions (null is none, as
// Limitador reads it), each once, sorted as Limitador's sets keep them.
func (p *parser) expressions(v *yaml.Node, path string) ([]string, []*expr) {
	if v == nil || isNull(v) {
		return nil, nil
	}
	if v.Kind != yaml.SequenceNode {
		p.fail(v, path, "want a list of CEL expressions, not %s", yamlconf.KindName(v))
		return nil, nil
	}
	if len(v.Content) > MaxExpressions {
		p.fail(v, path, "%d expressions; a limit has at most %d", len(v.Content), MaxExpressions)
		return nil, nil
	}
	var srcs []string
	byText := map[string]*expr{}
	for i, e := range v.Content {
		at := fmt.Sprintf("%s[%d]", path, i)
		if e.Kind != yaml.ScalarNode || e.Tag != "!!str" {
			p.fail(e, at, "want a CEL expression, a string, not %s (quote it)", yamlconf.KindName(e))
			continue
		}
		if len(e.Value) > MaxExpressionSize {
			p.fail(e, at, "%d bytes; an expression is at most %d", len(e.Value), MaxExpressionSize)
			continue
		}
		if _, dup := byText[e.Value]; dup {
			continue
		}
		c, err := compile(e.Value)
		if err != nil {
			p.fail(e, at, "%q is not CEL: %v", e.Value, err)
			continue
		}
		byText[e.Value] = c
		srcs = append(srcs, e.Value)
	}
	slices.Sort(srcs)
	exprs := make([]*expr, len(srcs))
	for i, s := range srcs {
		exprs[i] = byText[s]
	}
	return srcs, exprs
}

// build makes l's rule and identity from its fields.
func (l *Limit) build() error {
	if l.Algorithm == FixedWindow {
		l.Algorithm = "" // the default: one identity, however it is written
	}
	window := time.Duration(l.Seconds) * time.Second
	l.identity, l.equality = identityOf(l)
	// The rule's name is what headers and decisions name the limit by:
	// its name, or else its identity.
	// A store that does not answer fails the request, as Limitador's
	// UNAVAILABLE, for Envoy's failure_mode_deny to decide.
	r := admit.Rule{Name: l.Name, Limit: l.MaxValue, Window: window, OnError: admit.FailClosed}
	if r.Name == "" {
		r.Name = l.identity
	}
	if l.Algorithm != Quota && (l.Period != "" || l.TimeZone != "") {
		return fmt.Errorf("period and time_zone are a quota's (algorithm: quota)")
	}
	switch l.Algorithm {
	case "", FixedWindow:
		r.Algorithm = admit.FirstHitWindow
		l.never = l.MaxValue == 0
		l.always = !l.never && l.Seconds == 0
	case SlidingWindow:
		r.Algorithm = admit.SlidingWindow
	case TokenBucket, GCRA:
		r.Algorithm = admit.TokenBucket
		if l.Algorithm == GCRA {
			r.Algorithm = admit.GCRA
		}
		r.Rate, r.Burst, r.Limit, r.Window = admit.Rate{N: l.MaxValue, Per: window}, l.MaxValue, 0, 0
	case Quota:
		r.Algorithm, r.Window = admit.Quota, 0
		switch l.Period {
		case "day":
			r.Period = admit.Day
		case "week":
			r.Period = admit.Week
		case "month":
			r.Period = admit.Month
		case "year":
			r.Period = admit.Year
		default:
			return fmt.Errorf("period %q: a quota's period is day, week, month or year", l.Period)
		}
		loc, err := time.LoadLocation(l.TimeZone)
		if err != nil {
			return fmt.Errorf("time_zone %q: %v", l.TimeZone, err)
		}
		r.Location = loc
	default:
		return fmt.Errorf("algorithm %q: want fixed_window (Limitador's, the default), sliding_window, token_bucket, gcra or quota", l.Algorithm)
	}
	if l.Algorithm != "" && l.MaxValue == 0 {
		return fmt.Errorf("max_value 0 refuses every request, which only the default fixed_window counts")
	}
	if l.Algorithm != "" && l.Algorithm != Quota && l.Seconds == 0 {
		return fmt.Errorf("seconds 0 is no window for %s", l.Algorithm)
	}
	switch l.Distribution {
	case "", "exact":
		l.Distribution = ""
	case "leased":
		r.Distribution = admit.Leased
	default:
		return fmt.Errorf("distribution %q: want exact (the default) or leased", l.Distribution)
	}
	if !l.never && !l.always {
		if err := r.Validate(); err != nil {
			return fmt.Errorf("%s", strings.TrimPrefix(err.Error(), fmt.Sprintf("rule %q: ", r.Name)))
		}
	}
	l.rule = &policy.Rule{Rule: r, Scope: "limitador"}
	l.ctxLimit = &request{limit: limitValue(l.Name, l.ID)}
	return nil
}

// identityOf names the counters of l: by namespace, seconds, conditions
// and variables, as Limitador tells limits apart (equality), so that a
// limit whose max_value or name changes keeps its counters, and one whose
// conditions change starts new ones; a limit with an id by its id, its
// seconds and algorithm, so that its conditions may change and its
// counters stay. The algorithm and its period are part of both: another
// algorithm keeps another kind of state.
func identityOf(l *Limit) (identity, equality string) {
	h := sha256.New()
	field := func(s string) {
		h.Write([]byte(strconv.Itoa(len(s))))
		h.Write([]byte{':'})
		h.Write([]byte(s))
	}
	field(l.Namespace)
	field(strconv.FormatInt(l.Seconds, 10))
	field(strconv.Itoa(len(l.Conditions)))
	for _, c := range l.Conditions {
		field(c)
	}
	field(strconv.Itoa(len(l.Variables)))
	for _, v := range l.Variables {
		field(v)
	}
	field(l.Algorithm)
	field(l.Period)
	field(l.TimeZone)
	equality = hex.EncodeToString(h.Sum(nil)[:12])
	if l.ID == "" {
		return equality, equality
	}
	// The variables are part of an id's counters, as Limitador keys them
	// by each variable and its value: limits of one id keyed by other
	// variables count apart.
	v := sha256.New()
	for _, x := range l.Variables {
		v.Write([]byte(strconv.Itoa(len(x)) + ":" + x))
	}
	return "id:" + l.ID + ":" + strconv.FormatInt(l.Seconds, 10) + ":" + l.Algorithm + ":" + l.Period + ":" + l.TimeZone + ":" + hex.EncodeToString(v.Sum(nil)[:8]), equality
}
