package envoyrls

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/admitdev/admit"
	"github.com/admitdev/admit/internal/bounds"
	"github.com/admitdev/admit/internal/engine"
	"github.com/admitdev/admit/internal/ruletext"
	"github.com/admitdev/admit/policy"
	"github.com/admitdev/admit/yamlconf"
)

// LoadDir loads every *.yaml file of dir (not its subdirectories), in name
// order, as envoyproxy/ratelimit does with its runtime directory. A
// directory without YAML files is an empty configuration. A domain may be
// configured in one file only.
func LoadDir(dir string) (*Config, error) {
	names, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
	if err != nil {
		return nil, yamlconf.Errors{{File: dir, Msg: err.Error()}}
	}
	if _, err := os.Stat(dir); err != nil {
		return nil, yamlconf.Errors{{File: dir, Msg: err.Error()}}
	}
	if len(names) > MaxFiles {
		return nil, yamlconf.Errors{{File: dir, Msg: fmt.Sprintf("%d YAML files; at most %d", len(names), MaxFiles)}}
	}
	sort.Strings(names)
	files := make([]File, 0, len(names))
	var errs yamlconf.Errors
	for _, name := range names {
		data, err := yamlconf.ReadFile(name, MaxFileSize)
		if err != nil {
			errs = append(errs, yamlconf.Error{File: name, Msg: err.Error()})
			continue
		}
		files = append(files, File{Name: name, Data: data})
	}
	c, err := Parse(files...)
	if err != nil {
		var ce yamlconf.Errors
		errors.As(err, &ce)
		errs = append(errs, ce...)
	}
	if len(errs) > 0 {
		return nil, errs
	}
	return c, nil
}

// File is one configuration file's name and content.
type File struct {
	Name string
	Data []byte
}

// Parse builds a Config from files. Every problem of every file is
// reported, each with its file, line and column; the error is then a
// yamlconf.Errors.
func Parse(files ...File) (*Config, error) {
	c := &Config{domains: map[string]*level{}, charge: map[string]Charge{}}
	p := parser{cfg: c}
	domainFile := map[string]string{}
	for _, f := range files {
		p.file = f.Name
		c.files = append(c.files, f.Name)
		before := len(p.errs)
		domain, root, pos, charge := p.parseFile(f.Data)
		if domain != "" {
			// A domain two files name is reported whatever else is
			// wrong with either.
			if prev, dup := domainFile[domain]; dup {
				p.fail(pos, "duplicate domain '%s' in config file (first configured in %s)", domain, prev)
				root = nil
			} else {
				domainFile[domain] = f.Name
			}
		}
		sort.SliceStable(p.errs[before:], func(i, j int) bool {
			a, b := p.errs[before+i], p.errs[before+j]
			return a.Line < b.Line || a.Line == b.Line && a.Col < b.Col
		})
		if len(p.errs) > before || root == nil {
			continue
		}
		c.domains[domain] = root
		c.charge[domain] = charge
	}
	if len(p.errs) > 0 {
		return nil, p.errs
	}
	return c, nil
}

type parser struct {
	cfg  *Config
	file string
	errs yamlconf.Errors
	each bool // the file being parsed says charge: each
	// metaLeft is how many metadata values the file may still hold.
	metaLeft int
}

func (p *parser) fail(n *yaml.Node, format string, args ...any) {
	p.errs = append(p.errs, yamlconf.At(p.file, n, "", fmt.Sprintf(format, args...)))
}

// parseFile parses one file: its domain, its descriptor tree, the
// position of its domain field and whether it says charge: each.
func (p *parser) parseFile(data []byte) (string, *level, *yaml.Node, Charge) {
	p.metaLeft = maxFileMetadataValues
	if len(data) > MaxFileSize {
		p.fail(nil, "%d bytes; at most %d", len(data), MaxFileSize)
		return "", nil, nil, ChargeDefault
	}
	var doc yaml.Node
	dec := yaml.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			p.fail(nil, "config file cannot have empty domain")
			return "", nil, nil, ChargeDefault
		}
		p.yamlError(err)
		return "", nil, nil, ChargeDefault
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); err == nil {
		p.fail(&extra, "a second YAML document; a configuration file is one document")
		return "", nil, nil, ChargeDefault
	}
	// Anchors, aliases and merge keys (<<) read as envoyproxy/ratelimit's
	// YAML library reads them, expanded within a bound.
	budget := maxExpandedNodes
	if !p.expand(&doc, 0, &budget) {
		return "", nil, nil, ChargeDefault
	}
	// Duplicated keys are reported with every other error of the file;
	// the first of each is read.
	p.errs = append(p.errs, yamlconf.DuplicateKeys(p.file, &doc)...)
	root := doc.Content[0]
	fields := p.mapping(root, "the file", "domain", "descriptors", "charge")
	if fields == nil {
		return "", nil, nil, ChargeDefault
	}
	dn := fields["domain"]
	domain := p.str(dn)
	if dn == nil || domain == "" {
		p.fail(orNode(dn, root), "config file cannot have empty domain")
		return "", nil, nil, ChargeDefault
	}
	p.each = false
	charge := ChargeDefault
	if cn := fields["charge"]; cn != nil {
		switch v := p.str(cn); v {
		case "all":
			charge = ChargeAll
		case "each":
			p.each, charge = true, ChargeEach
		default:
			p.fail(cn, "charge: want all (a request's counters all charged or none, the default) or each (every descriptor counted on its own, as envoyproxy/ratelimit does), not '%s'", v)
		}
	}
	top := p.descriptors(fields["descriptors"], domain+".", 1)
	return domain, top, dn, charge
}

// maxExpandedNodes bounds the nodes of a file once its aliases are
// expanded: a few anchors can otherwise stand for billions.
const maxExpandedNodes = 1_000_000

// expand replaces, under n, every alias by a copy of the node it names and
// merges each mapping's merge keys (<<: a mapping or a list of them) into
// it, a key the mapping has already keeping its own value, spending budget
// nodes. It reports false, having said why, when the file passes the
// bound or nests too deep.
func (p *parser) expand(n *yaml.Node, depth int, budget *int) bool {
	if depth > 4*MaxDepth+8 {
		p.fail(n, "nested %d deep, aliases expanded; at most %d", depth, 4*MaxDepth+8)
		return false
	}
	for i, c := range n.Content {
		if c.Kind == yaml.AliasNode {
			c = copyNode(c.Alias, budget)
			if c == nil {
				p.fail(n.Content[i], "more than %d values once its aliases are expanded", maxExpandedNodes)
				return false
			}
			n.Content[i] = c
		}
		if *budget--; *budget < 0 {
			p.fail(c, "more than %d values once its aliases are expanded", maxExpandedNodes)
			return false
		}
		if !p.expand(c, depth+1, budget) {
			return false
		}
	}
	if n.Kind != yaml.MappingNode {
		return true
	}
	var own, merged []*yaml.Node
	has := map[string]bool{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		if k := n.Content[i]; k.Kind == yaml.ScalarNode && k.Tag == "!!merge" {
			v := n.Content[i+1]
			from := []*yaml.Node{v}
			if v.Kind == yaml.SequenceNode {
				from = v.Content
			}
			for _, m := range from {
				if m.Kind != yaml.MappingNode {
					p.fail(m, "config error, a merge key (<<) takes a mapping or a list of them, not %s", yamlconf.KindName(m))
					return false
				}
				merged = append(merged, m.Content...)
			}
			continue
		}
		own = append(own, n.Content[i], n.Content[i+1])
		has[n.Content[i].Value] = true
	}
	if merged == nil {
		return true
	}
	for i := 0; i+1 < len(merged); i += 2 {
		if k := merged[i].Value; !has[k] {
			has[k] = true // the first of several merged mappings wins
			own = append(own, merged[i], merged[i+1])
		}
	}
	n.Content = own
	return true
}

// copyNode returns a deep copy of n, spending budget nodes, or nil past
// it.
func copyNode(n *yaml.Node, budget *int) *yaml.Node {
	if *budget--; *budget < 0 {
		return nil
	}
	c := *n
	if n.Kind == yaml.AliasNode {
		return copyNode(n.Alias, budget)
	}
	c.Content = make([]*yaml.Node, len(n.Content))
	for i, x := range n.Content {
		if c.Content[i] = copyNode(x, budget); c.Content[i] == nil {
			return nil
		}
	}
	return &c
}

// yamlError reports a YAML syntax error with its line.
func (p *parser) yamlError(err error) {
	e := yamlconf.SyntaxError(p.file, err)
	// In envoyproxy/ratelimit's words, the parser's message whole; the
	// line is also where the error's position goes.
	e.Msg = "error loading config file: " + err.Error()
	p.errs = append(p.errs, e)
}

func orNode(a, b *yaml.Node) *yaml.Node {
	if a != nil {
		return a
	}
	return b
}

// mapping returns the fields of a mapping node, reporting keys not in
// allowed (as envoyproxy/ratelimit does: "unknown key") and duplicates.
// what names the node in errors.
func (p *parser) mapping(n *yaml.Node, what string, allowed ...string) map[string]*yaml.Node {
	if n.Kind != yaml.MappingNode {
		p.fail(n, "config error, %s must be a map, not %s", what, yamlconf.KindName(n))
		return nil
	}
	fields := make(map[string]*yaml.Node, len(n.Content)/2)
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		if k.Kind != yaml.ScalarNode || k.Tag != "!!str" {
			p.fail(k, "config error, key is not of type string: %s", k.Value)
			continue
		}
		known := false
		for _, a := range allowed {
			known = known || a == k.Value
		}
		if !known {
			if _, elsewhere := keyHome[k.Value]; elsewhere {
				p.fail(k, "config error, unknown key '%s' in %s (it belongs in %s)", k.Value, what, keyHome[k.Value])
			} else {
				p.fail(k, "config error, unknown key '%s'", k.Value)
			}
			continue
		}
		if _, dup := fields[k.Value]; dup {
			continue // reported, with the first's line, by yamlconf.DuplicateKeys
		}
		if v.Kind == yaml.ScalarNode && v.Tag == "!!null" {
			continue // "key:" with nothing after it, as if absent
		}
		fields[k.Value] = v
	}
	return fields
}

// keyHome says where a known key belongs, for errors about keys in the
// wrong place.
var keyHome = map[string]string{
	"domain": "the top of the file", "key": "a descriptor", "value": "a descriptor",
	"descriptors": "the top of the file or a descriptor", "rate_limit": "a descriptor",
	"shadow_mode": "a descriptor", "quota_mode": "a descriptor", "detailed_metric": "a descriptor",
	"value_to_metric": "a descriptor", "share_threshold": "a descriptor", "metadata": "a descriptor",
	"charge": "the top of the file",
	"unit":   "rate_limit", "requests_per_unit": "rate_limit", "unit_multiplier": "rate_limit",
	"unlimited": "rate_limit", "name": "rate_limit or a replaces entry", "replaces": "rate_limit",
	"algorithm": "rate_limit", "burst": "rate_limit",
}

// str returns a scalar's text; anything else is reported.
func (p *parser) str(n *yaml.Node) string {
	if n == nil {
		return ""
	}
	if n.Kind != yaml.ScalarNode {
		p.fail(n, "config error, want a string, not %s", yamlconf.KindName(n))
		return ""
	}
	return n.Value
}

func (p *parser) boolean(n *yaml.Node, field string) bool {
	if n == nil {
		return false
	}
	var b bool
	if n.Kind != yaml.ScalarNode || n.Decode(&b) != nil {
		p.fail(n, "%s: want true or false, not %s", field, yamlconf.KindName(n))
	}
	return b
}

func (p *parser) uint32(n *yaml.Node, field string) (uint32, bool) {
	if n == nil {
		return 0, false
	}
	v, err := strconv.ParseUint(n.Value, 10, 32)
	if n.Kind != yaml.ScalarNode || err != nil {
		p.fail(n, "%s: want a whole number from 0 to %d, not %s", field, uint32(1<<32-1), yamlconf.KindName(n))
		return 0, false
	}
	return uint32(v), true
}

// descriptors parses a descriptor list at the given depth; parent is the
// full key of the level above, ending in a dot.
func (p *parser) descriptors(n *yaml.Node, parent string, depth int) *level {
	lv := &level{exact: map[[2]string]*node{}, byKey: map[string]*node{}}
	if n == nil {
		return lv
	}
	if n.Kind != yaml.SequenceNode {
		p.fail(n, "config error, descriptors must be a list, not %s", yamlconf.KindName(n))
		return lv
	}
	if depth > MaxDepth {
		p.fail(n, "descriptors nested %d deep; at most %d", depth, MaxDepth)
		return lv
	}
	for _, dn := range n.Content {
		if dn.Kind != yaml.MappingNode {
			p.fail(dn, "config error, yaml file contains list of type other than map: %s", plainValue(dn))
			continue
		}
		// metadata (envoyproxy/ratelimit, April 2026) is data for the
		// data plane: dynamic metadata repeats it for the descriptors a
		// request passed.
		f := p.mapping(dn, "a descriptor", "key", "value", "rate_limit", "descriptors", "shadow_mode",
			"quota_mode", "detailed_metric", "value_to_metric", "share_threshold", "metadata")
		if f == nil {
			continue
		}
		key, value := p.str(f["key"]), p.str(f["value"])
		if key == "" {
			p.fail(dn, "descriptor has empty key")
			continue
		}
		final := key
		if value != "" {
			final += "_" + value
		}
		full := parent + final
		nd := &node{}
		isWildcard := strings.Contains(value, "*")
		switch {
		case value == "":
			if lv.byKey[key] != nil {
				p.fail(f["key"], "duplicate descriptor composite key '%s'", full)
				continue
			}
			lv.byKey[key] = nd
		case isWildcard:
			if slices.ContainsFunc(lv.wildcards, func(w wildcard) bool { return w.key == key && w.pattern == value }) {
				p.fail(f["value"], "duplicate descriptor composite key '%s'", full)
				continue
			}
			lv.wildcards = append(lv.wildcards, wildcard{key: key, pattern: value, n: nd})
		default:
			if lv.exact[[2]string{key, value}] != nil {
				p.fail(f["value"], "duplicate descriptor composite key '%s'", full)
				continue
			}
			lv.exact[[2]string{key, value}] = nd
		}
		shadow := p.boolean(f["shadow_mode"], "shadow_mode")
		quota := p.boolean(f["quota_mode"], "quota_mode")
		p.boolean(f["detailed_metric"], "detailed_metric")
		p.boolean(f["value_to_metric"], "value_to_metric")
		if p.boolean(f["share_threshold"], "share_threshold") {
			if !isWildcard {
				p.fail(f["share_threshold"], "share_threshold can only be used with wildcard values (containing '*'), but found key '%s'", final)
			}
			nd.shared, nd.pattern = true, value
		}
		if rl := f["rate_limit"]; rl != nil {
			nd.limit = p.rateLimit(rl, full, shadow, quota)
			if md := f["metadata"]; md != nil && nd.limit != nil {
				nd.limit.Metadata = p.metadata(md)
			}
		}
		if sub := f["descriptors"]; sub != nil {
			nd.next = p.descriptors(sub, full+".", depth+1)
		}
	}
	return lv
}

// metadata parses a descriptor's metadata block: a mapping of any depth.
// Its scalars keep their YAML types (numbers, booleans, null), and any
// other scalar is its text, as envoyproxy/ratelimit's YAML reading gives
// it (a date stays "2026-12-31"); keys are their text.
func (p *parser) metadata(n *yaml.Node) *structpb.Struct {
	if n.Kind != yaml.MappingNode {
		p.fail(n, "metadata: want a mapping, not %s", yamlconf.KindName(n))
		return nil
	}
	budget := min(maxMetadataValues, p.metaLeft)
	v := p.metadataValue(n, 0, &budget)
	if v == nil {
		return nil
	}
	p.metaLeft -= min(maxMetadataValues, p.metaLeft) - budget
	return v.GetStructValue()
}

// maxMetadataValues and maxFileMetadataValues bound the values of one
// metadata block and of a file's, aliases expanded: a few anchors can
// otherwise stand for billions of values.
const (
	maxMetadataValues     = 10000
	maxFileMetadataValues = 100000
)

// metadataValue converts n, at depth, spending budget, or fails and
// returns nil.
func (p *parser) metadataValue(n *yaml.Node, depth int, budget *int) *structpb.Value {
	if depth > MaxDepth {
		p.fail(n, "metadata nested %d deep; at most %d", depth, MaxDepth)
		return nil
	}
	if *budget--; *budget < 0 {
		p.fail(n, "metadata holds more than %d values (and a file %d)", maxMetadataValues, maxFileMetadataValues)
		return nil
	}
	switch n.Kind {
	case yaml.AliasNode:
		return p.metadataValue(n.Alias, depth+1, budget)
	case yaml.MappingNode:
		f := make(map[string]*structpb.Value, len(n.Content)/2)
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, vn := n.Content[i], n.Content[i+1]
			if k.Kind == yaml.AliasNode {
				k = k.Alias
			}
			if k.Kind != yaml.ScalarNode {
				p.fail(k, "metadata: a key is %s; want a scalar", yamlconf.KindName(k))
				return nil
			}
			v := p.metadataValue(vn, depth+1, budget)
			if v == nil {
				return nil
			}
			f[k.Value] = v
		}
		return structpb.NewStructValue(&structpb.Struct{Fields: f})
	case yaml.SequenceNode:
		l := make([]*structpb.Value, 0, len(n.Content))
		for _, c := range n.Content {
			v := p.metadataValue(c, depth+1, budget)
			if v == nil {
				return nil
			}
			l = append(l, v)
		}
		return structpb.NewListValue(&structpb.ListValue{Values: l})
	case yaml.ScalarNode:
		switch n.ShortTag() {
		case "!!null":
			return structpb.NewNullValue()
		case "!!bool":
			var b bool
			if n.Decode(&b) == nil {
				return structpb.NewBoolValue(b)
			}
		case "!!int", "!!float":
			var f float64
			if n.Decode(&f) == nil {
				return structpb.NewNumberValue(f)
			}
		}
		return structpb.NewStringValue(n.Value)
	}
	p.fail(n, "metadata: %s is not a value", yamlconf.KindName(n))
	return nil
}

// rateLimit parses a rate_limit block.
func (p *parser) rateLimit(n *yaml.Node, full string, shadow, quota bool) *Limit {
	f := p.mapping(n, "rate_limit", "unit", "requests_per_unit", "unit_multiplier", "unlimited",
		"name", "replaces", "algorithm", "burst", "distribution")
	if f == nil {
		return nil
	}
	l := &Limit{FullKey: full, Shadow: shadow, Quota: quota, UnitMultiplier: 1, file: p.file, line: n.Line, col: n.Column}
	l.Name = p.str(f["name"])
	l.Unlimited = p.boolean(f["unlimited"], "unlimited")
	unit, validUnit := parseUnit(p.str(f["unit"]))
	switch {
	case l.Unlimited && validUnit:
		p.fail(f["unit"], "should not specify rate limit unit when unlimited")
	case !l.Unlimited && !validUnit:
		p.fail(orNode(f["unit"], n), "invalid rate limit unit '%s'; want second, minute, hour, day, week, month or year", p.str(f["unit"]))
	}
	l.Unit = unit
	l.RequestsPerUnit, _ = p.uint32(f["requests_per_unit"], "requests_per_unit")
	if m, ok := p.uint32(f["unit_multiplier"], "unit_multiplier"); ok {
		if m == 0 {
			p.fail(f["unit_multiplier"], "unit_multiplier must be at least 1")
		}
		l.UnitMultiplier = max(m, 1)
	}
	if rn := f["replaces"]; rn != nil {
		if rn.Kind != yaml.SequenceNode {
			p.fail(rn, "config error, replaces must be a list, not %s", yamlconf.KindName(rn))
		} else {
			for _, e := range rn.Content {
				if e.Kind != yaml.MappingNode {
					p.fail(e, "config error, yaml file contains list of type other than map: %s", yamlconf.KindName(e))
					continue
				}
				ef := p.mapping(e, "a replaces entry", "name")
				if ef == nil {
					continue
				}
				name := p.str(ef["name"])
				switch {
				case name == "":
					p.fail(e, "should not have an empty replaces entry")
				case name == l.Name:
					p.fail(e, "replaces should not contain name of same descriptor")
				default:
					l.Replaces = append(l.Replaces, name)
				}
			}
		}
	}
	algo := admit.FixedWindow
	if an := f["algorithm"]; an != nil {
		a, err := ruletext.Algorithm(p.str(an))
		switch {
		case err != nil:
			p.fail(an, "algorithm %q: want fixed_window, sliding_window, sliding_log, token_bucket or gcra", an.Value)
		case a == admit.Concurrency || a == admit.Combination:
			p.fail(an, "algorithm %s cannot be written as requests per unit; want fixed_window, sliding_window, sliding_log, token_bucket or gcra", a)
		default:
			algo = a
		}
	}
	burst, hasBurst := p.uint32(f["burst"], "burst")
	if hasBurst && algo != admit.TokenBucket && algo != admit.GCRA {
		p.fail(f["burst"], "burst applies to token_bucket and gcra only")
	}
	dist := admit.Exact
	if dn := f["distribution"]; dn != nil {
		d, err := ruletext.Distribution(p.str(dn))
		switch {
		case err != nil:
			p.fail(dn, "distribution %q: want exact or leased", dn.Value)
		case d == admit.Leased && !engine.Leasable(algo):
			p.fail(dn, "algorithm %s cannot be leased; fixed_window, sliding_window, token_bucket and gcra can", algo)
		default:
			dist = d
		}
	}
	if l.Unlimited || !validUnit || l.RequestsPerUnit == 0 {
		return l
	}
	window := l.Window()
	if u := l.Unit.Duration(); u > 0 && int64(l.UnitMultiplier) > int64(bounds.MaxRatePeriod/u) || window > bounds.MaxRatePeriod {
		// The first test before the product, which wraps around: a
		// year × 585 is not 21 days.
		p.fail(orNode(f["unit_multiplier"], n), "a period of %d × %s is longer than %v", l.UnitMultiplier, l.Unit, bounds.MaxRatePeriod)
		return l
	}
	name := l.Name
	if name == "" {
		name = full
	}
	if p.each && algo == admit.SlidingLog {
		p.fail(f["algorithm"], "algorithm sliding_log cannot count past its limit, which charge: each does; use sliding_window")
		return l
	}
	// A quota limit is decided as a shadow one (it never refuses on its
	// own); the service applies quota_mode's rule to the statuses.
	r := &admit.Rule{Name: name, Algorithm: algo, Shadow: shadow || quota, Distribution: dist}
	switch algo {
	case admit.TokenBucket, admit.GCRA:
		r.Rate = admit.Rate{N: int64(l.RequestsPerUnit), Per: window}
		r.Burst = int64(l.RequestsPerUnit)
		if hasBurst {
			r.Burst = int64(burst)
		}
	default:
		r.Limit, r.Window = int64(l.RequestsPerUnit), window
	}
	if err := r.Validate(); err != nil {
		// The rule's name is the descriptor's key, which the position
		// already shows: say the field and what is wrong with it.
		msg := err.Error()
		var e *admit.Error
		if errors.As(err, &e) && e.Field != "" && e.Err != nil {
			msg = e.Field + ": " + e.Err.Error()
		}
		p.fail(n, "%s", msg)
		return l
	}
	l.rule = &policy.Rule{Rule: *r, Scope: "envoy"}
	if quota {
		l.strict = &policy.Rule{Rule: *r, Scope: "envoy"}
		l.strict.Shadow = shadow
	}
	l.countEach()
	return l
}

// plainValue writes a node as envoyproxy/ratelimit's messages print what
// it decoded (Go's %v): a scalar's text, a list's items in brackets, a
// mapping's pairs after "map".
func plainValue(n *yaml.Node) string {
	switch n.Kind {
	case yaml.SequenceNode:
		items := make([]string, len(n.Content))
		for i, c := range n.Content {
			items[i] = plainValue(c)
		}
		return "[" + strings.Join(items, " ") + "]"
	case yaml.MappingNode:
		pairs := make([]string, 0, len(n.Content)/2)
		for i := 0; i+1 < len(n.Content); i += 2 {
			pairs = append(pairs, plainValue(n.Content[i])+":"+plainValue(n.Content[i+1]))
		}
		return "map[" + strings.Join(pairs, " ") + "]"
	}
	return n.Value
}
