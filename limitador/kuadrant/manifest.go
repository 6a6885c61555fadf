package kuadrant

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"regexp"
	"slices"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/admitdev/admit/yamlconf"
)

// The two kinds of policy, and what tells their limits apart in Limitador.
const (
	rateLimitPolicy      = "RateLimitPolicy"
	tokenRateLimitPolicy = "TokenRateLimitPolicy"
	gatewayGroup         = "gateway.networking.k8s.io"
)

// apiVersions are the versions the operator's CRDs serve.
var apiVersions = map[string]string{
	rateLimitPolicy:      "kuadrant.io/v1",
	tokenRateLimitPolicy: "kuadrant.io/v1alpha1",
}

// windowPattern is the CRDs' pattern for a rate's window (Gateway API's
// Duration): up to four parts of up to five digits and h, m, s or ms.
var windowPattern = regexp.MustCompile(`^([0-9]{1,5}(h|m|s|ms)){1,4}$`)

// policy is a RateLimitPolicy or TokenRateLimitPolicy the API server would
// accept.
type policy struct {
	kind            string // rateLimitPolicy or tokenRateLimitPolicy
	file            string
	node            *yaml.Node // the document
	namespace, name string
	created         time.Time // zero: the manifest has no creationTimestamp
	target          target
	overrides       bool // spec.overrides, not (implicit or explicit) defaults
	merge           bool // strategy: merge, not atomic
	limits          map[string]*limit
	dead            bool // refused as a whole after reading
	id              int  // its place among the policies read
}

// target is a policy's targetRef: in the policy's namespace.
type target struct {
	kind, name, section string
	node                *yaml.Node
}

// limit is one named limit of a policy.
type limit struct {
	policy   *policy
	name     string
	node     *yaml.Node // its key, for positions
	rates    []rate     // those that can be written
	counters []string   // as the operator writes them: descriptors[0]["…"]
	broken   bool       // refused: none of its rates is written
	windows  []rateNode // while reading: each rate's window, for checkLimit
	exprs    []rateNode // while reading: each counter's expression, likewise
}

// rate is one rate of a limit, as Limitador counts it.
type rate struct {
	maxValue, seconds int64
}

// route is an HTTPRoute or GRPCRoute: given in a route file, or only named
// by a policy's targetRef.
type route struct {
	kind            string // HTTPRoute or GRPCRoute
	namespace, name string
	file            string
	node            *yaml.Node
	given           bool
	parents         []parent // its parentRefs to Gateways
	rules           []string // its rules' names (rule-N for a rule without one)
}

// parent is a route's reference to a Gateway: to one listener, or to all
// (section empty).
type parent struct {
	namespace, name, section string
}

// input gathers what Import read and what it refused.
type input struct {
	opts     Options
	docs     int
	policies []*policy
	routes   []*route
	errs     yamlconf.Errors
	seen     map[string]yamlconf.Error // kind namespace/name → where first given
	// fileOrder numbers the files in the order given, to list refusals
	// in it.
	fileOrder map[string]int
}

func newInput(opts Options) *input {
	return &input{opts: opts, seen: map[string]yamlconf.Error{}, fileOrder: map[string]int{}}
}

func (in *input) refuse(file string, n *yaml.Node, path, format string, args ...any) {
	in.errs = append(in.errs, yamlconf.At(file, n, path, fmt.Sprintf(format, args...)))
}

// readFile reads every document of f: policies, or routes when routeFile.
func (in *input) readFile(f File, routeFile bool) {
	if _, ok := in.fileOrder[f.Name]; !ok {
		in.fileOrder[f.Name] = len(in.fileOrder)
	}
	dec := yaml.NewDecoder(bytes.NewReader(f.Data))
	for {
		var doc yaml.Node
		err := dec.Decode(&doc)
		if errors.Is(err, io.EOF) {
			return
		}
		if err != nil {
			in.errs = append(in.errs, yamlconf.SyntaxError(f.Name, err))
			return
		}
		if dup := yamlconf.DuplicateKeys(f.Name, &doc); len(dup) > 0 {
			for _, e := range dup {
				e.Msg += "; kubectl refuses such a manifest, so this document is not converted"
				in.errs = append(in.errs, e)
			}
			continue
		}
		if len(doc.Content) == 0 {
			continue
		}
		if !in.readObject(f.Name, deref(doc.Content[0]), routeFile, true) {
			return
		}
	}
}

// readObject reads one Kubernetes object, or the items of a List. It
// returns false when the document bound is reached.
func (in *input) readObject(file string, n *yaml.Node, routeFile, top bool) bool {
	if n == nil || n.Kind == yaml.ScalarNode && n.ShortTag() == "!!null" {
		return true // an empty document
	}
	if in.docs >= MaxDocuments {
		in.refuse(file, n, "", "more than %d documents in all: this one and the rest of the file are not read", MaxDocuments)
		return false
	}
	in.docs++
	if n.Kind != yaml.MappingNode {
		in.refuse(file, n, "", "a manifest is a mapping (a Kubernetes object), not %s", yamlconf.KindName(n))
		return true
	}
	apiVersion, kind := scalar(lookup(n, "apiVersion")), scalar(lookup(n, "kind"))
	if items := lookup(n, "items"); top && items != nil && strings.HasSuffix(kind, "List") {
		if items.Kind != yaml.SequenceNode {
			in.refuse(file, items, "items", "a List's items are a list, not %s", yamlconf.KindName(items))
			return true
		}
		for _, item := range items.Content {
			if !in.readObject(file, deref(item), routeFile, false) {
				return false
			}
		}
		return true
	}
	kindNode := deref(lookup(n, "kind"))
	if kindNode == nil {
		kindNode = n
	}
	switch {
	case routeFile && (kind == "HTTPRoute" || kind == "GRPCRoute"):
		in.readRoute(file, n, apiVersion, kind)
	case routeFile:
		in.refuse(file, kindNode, "kind", "%s: a route file holds HTTPRoute and GRPCRoute manifests (Gateways are not read: a route's parentRefs say which Gateways it attaches to)", describe(apiVersion, kind))
	case kind == rateLimitPolicy || kind == tokenRateLimitPolicy:
		in.readPolicy(file, n, apiVersion, kind)
	case kind == "HTTPRoute" || kind == "GRPCRoute":
		in.refuse(file, kindNode, "kind", "%s among the policies: give it as a route file (--route)", describe(apiVersion, kind))
	default:
		in.refuse(file, kindNode, "kind", "%s is not a rate limit policy: only kuadrant.io RateLimitPolicy and TokenRateLimitPolicy are converted", describe(apiVersion, kind))
	}
	return true
}

func describe(apiVersion, kind string) string {
	if kind == "" {
		return "a manifest without a kind"
	}
	if apiVersion == "" {
		return kind
	}
	return kind + " (" + apiVersion + ")"
}

// checker collects the problems of one manifest that the API server would
// refuse it for.
type checker struct {
	file string
	errs yamlconf.Errors
}

func (c *checker) fail(n *yaml.Node, path, format string, args ...any) {
	c.errs = append(c.errs, yamlconf.At(c.file, n, path, fmt.Sprintf(format, args...)))
}

// fields checks that n is a mapping holding only the keys allowed, and
// returns its values by key.
func (c *checker) fields(n *yaml.Node, path string, allowed ...string) map[string]*yaml.Node {
	n = deref(n)
	if n == nil || n.Kind != yaml.MappingNode {
		c.fail(n, path, "is a mapping, not %s", kindName(n))
		return nil
	}
	out := map[string]*yaml.Node{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k := n.Content[i]
		if !slices.Contains(allowed, k.Value) {
			c.fail(k, join(path, k.Value), "unknown field (known: %s)", strings.Join(allowed, ", "))
			continue
		}
		out[k.Value] = deref(n.Content[i+1])
	}
	return out
}

// str returns the string n holds; empty, and a problem, if it holds none.
func (c *checker) str(n *yaml.Node, path string) string {
	if n == nil {
		c.fail(n, path, "is required")
		return ""
	}
	if n.Kind != yaml.ScalarNode || n.ShortTag() != "!!str" {
		c.fail(n, path, "is a string, not %s", kindName(n))
		return ""
	}
	if n.Value == "" {
		c.fail(n, path, "is empty")
	}
	return n.Value
}

// list returns the items of the list n, of at most max.
func (c *checker) list(n *yaml.Node, path string, max int) []*yaml.Node {
	if n == nil || n.Kind != yaml.SequenceNode {
		c.fail(n, path, "is a list, not %s", kindName(n))
		return nil
	}
	if len(n.Content) > max {
		c.fail(n, path, "%d items; at most %d are read", len(n.Content), max)
		return nil
	}
	items := make([]*yaml.Node, len(n.Content))
	for i, item := range n.Content {
		items[i] = deref(item)
	}
	return items
}

// meta reads metadata's name, namespace and creationTimestamp.
func (in *input) meta(c *checker, n *yaml.Node) (namespace, name string, created time.Time, ok bool) {
	md := deref(lookup(n, "metadata"))
	if md == nil || md.Kind != yaml.MappingNode {
		c.fail(n, "metadata", "a manifest has metadata with a name")
		return "", "", time.Time{}, false
	}
	name = c.str(deref(lookup(md, "name")), "metadata.name")
	if ns := deref(lookup(md, "namespace")); ns != nil {
		namespace = c.str(ns, "metadata.namespace")
	} else if namespace = in.opts.Namespace; namespace == "" {
		c.fail(md, "metadata.namespace", "is missing, and no default namespace is given (--namespace): a limit's namespace and identifier depend on it")
	}
	if ts := deref(lookup(md, "creationTimestamp")); ts != nil && ts.ShortTag() != "!!null" {
		t, err := time.Parse(time.RFC3339, ts.Value)
		if err != nil {
			c.fail(ts, "metadata.creationTimestamp", "is not an RFC 3339 time: %q", ts.Value)
		}
		created = t
	}
	return namespace, name, created, len(c.errs) == 0
}

// firstSeen refuses a second object of the same kind and name, and reports
// whether n is the first.
func (in *input) firstSeen(file string, n *yaml.Node, kind, namespace, name string) bool {
	key := kind + " " + namespace + "/" + name
	if first, dup := in.seen[key]; dup {
		in.refuse(file, n, "", "%s %s/%s is given again (first at %s:%d): only the first is converted", kind, namespace, name, first.File, first.Line)
		return false
	}
	in.seen[key] = yamlconf.At(file, n, "", "")
	return true
}

// readPolicy reads a policy as the API server validates it: against its
// CRD's schema and rules. A policy the server would refuse is refused
// whole.
func (in *input) readPolicy(file string, n *yaml.Node, apiVersion, kind string) {
	c := &checker{file: file}
	defer func() {
		for _, e := range c.errs {
			e.Msg += "; the API server refuses this " + kind + ", so none of its limits is written"
			in.errs = append(in.errs, e)
		}
	}()
	if want := apiVersions[kind]; apiVersion != want {
		c.fail(lookup(n, "apiVersion"), "apiVersion", "%s is served as %s, not %q", kind, want, apiVersion)
		return
	}
	namespace, name, created, ok := in.meta(c, n)
	if !ok {
		return
	}
	if md := deref(lookup(n, "metadata")); lookup(md, "deletionTimestamp") != nil {
		in.refuse(file, lookup(md, "deletionTimestamp"), "metadata.deletionTimestamp", "%s %s/%s is being deleted: the operator writes no limits for it", kind, namespace, name)
		return
	}
	p := &policy{kind: kind, file: file, node: n, namespace: namespace, name: name, created: created}
	spec := deref(lookup(n, "spec"))
	if spec == nil {
		c.fail(n, "spec", "is required")
		return
	}
	if refs := lookup(spec, "targetRefs"); refs != nil {
		c.fail(keyOf(spec, "targetRefs"), "spec.targetRefs", "is not a field of %s: it takes one spec.targetRef", kind)
	}
	f := c.fields(spec, "spec", "targetRef", "defaults", "overrides", "limits", "when", "targetRefs")
	if f == nil {
		return
	}
	p.target = c.targetRef(f["targetRef"], kind)
	c.predicates(f["when"], "spec.when")
	switch {
	case f["defaults"] != nil && f["limits"] != nil:
		c.fail(f["defaults"], "spec.defaults", "and spec.limits (implicit defaults) are mutually exclusive")
	case f["defaults"] != nil && f["overrides"] != nil:
		c.fail(f["overrides"], "spec.overrides", "and spec.defaults are mutually exclusive")
	case f["overrides"] != nil && f["limits"] != nil:
		c.fail(f["overrides"], "spec.overrides", "and spec.limits (implicit defaults) are mutually exclusive")
	case f["defaults"] != nil:
		p.merge, p.limits = c.mergeable(p, f["defaults"], "spec.defaults")
	case f["overrides"] != nil:
		p.overrides = true
		p.merge, p.limits = c.mergeable(p, f["overrides"], "spec.overrides")
	case f["limits"] != nil:
		p.limits = c.limits(p, f["limits"], "spec.limits")
	default:
		c.fail(spec, "spec.limits", "at least one limit is required (in spec.limits, spec.defaults or spec.overrides)")
	}
	if len(c.errs) > 0 || !in.firstSeen(file, n, kind, namespace, name) {
		return
	}
	for _, l := range p.limits {
		in.checkLimit(l)
	}
	p.id = len(in.policies)
	in.policies = append(in.policies, p)
}

func (c *checker) targetRef(n *yaml.Node, kind string) target {
	if n == nil {
		c.fail(n, "spec.targetRef", "is required")
		return target{}
	}
	f := c.fields(n, "spec.targetRef", "group", "kind", "name", "sectionName")
	if f == nil {
		return target{}
	}
	t := target{node: n}
	if g := c.str(f["group"], "spec.targetRef.group"); g != gatewayGroup && g != "" {
		c.fail(f["group"], "spec.targetRef.group", "is %q: the only one supported is %s", g, gatewayGroup)
	}
	t.kind = c.str(f["kind"], "spec.targetRef.kind")
	kinds := []string{"HTTPRoute", "GRPCRoute", "Gateway"}
	if kind == tokenRateLimitPolicy {
		kinds = []string{"HTTPRoute", "Gateway"}
	}
	if t.kind != "" && !slices.Contains(kinds, t.kind) {
		c.fail(f["kind"], "spec.targetRef.kind", "is %q: a %s targets one of %s", t.kind, kind, strings.Join(kinds, ", "))
	}
	t.name = c.str(f["name"], "spec.targetRef.name")
	if s := f["sectionName"]; s != nil {
		t.section = c.str(s, "spec.targetRef.sectionName")
	}
	return t
}

// mergeable reads spec.defaults or spec.overrides.
func (c *checker) mergeable(p *policy, n *yaml.Node, path string) (merge bool, limits map[string]*limit) {
	f := c.fields(n, path, "strategy", "limits", "when")
	if f == nil {
		return false, nil
	}
	if s := f["strategy"]; s != nil {
		switch v := c.str(s, path+".strategy"); v {
		case "atomic", "":
		case "merge":
			merge = true
		default:
			c.fail(s, path+".strategy", "is %q: atomic or merge", v)
		}
	}
	c.predicates(f["when"], path+".when")
	if f["limits"] == nil {
		c.fail(n, path+".limits", "at least one limit is required")
		return merge, nil
	}
	return merge, c.limits(p, f["limits"], path+".limits")
}

func (c *checker) limits(p *policy, n *yaml.Node, path string) map[string]*limit {
	if n.Kind != yaml.MappingNode {
		c.fail(n, path, "is a mapping of limits by name, not %s", kindName(n))
		return nil
	}
	if len(n.Content) == 0 {
		c.fail(n, path, "at least one limit is required")
	}
	if len(n.Content)/2 > MaxLimits {
		c.fail(n, path, "%d limits; at most %d are read", len(n.Content)/2, MaxLimits)
		return nil
	}
	out := map[string]*limit{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], deref(n.Content[i+1])
		lp := join(path, k.Value)
		if k.Kind != yaml.ScalarNode {
			c.fail(k, path, "a limit's name is a string, not %s", kindName(k))
			continue
		}
		l := &limit{policy: p, name: k.Value, node: k}
		out[k.Value] = l
		f := c.fields(v, lp, "rates", "counters", "when")
		if f == nil {
			continue
		}
		c.predicates(f["when"], lp+".when")
		if f["counters"] != nil {
			for j, cn := range c.list(f["counters"], lp+".counters", MaxCounters) {
				cp := fmt.Sprintf("%s.counters[%d]", lp, j)
				if cf := c.fields(cn, cp, "expression"); cf != nil {
					if cf["expression"] == nil {
						c.fail(cn, cp+".expression", "is required")
						continue
					}
					l.counters = append(l.counters, c.str(cf["expression"], cp+".expression"))
					l.exprs = append(l.exprs, rateNode{node: cf["expression"], path: cp + ".expression"})
				}
			}
		}
		if f["rates"] != nil {
			for j, rn := range c.list(f["rates"], lp+".rates", MaxRates) {
				c.rate(l, rn, fmt.Sprintf("%s.rates[%d]", lp, j))
			}
		}
	}
	return out
}

// rateNode is where a rate's window or a counter's expression was read:
// checkLimit refuses one there.
type rateNode struct {
	node  *yaml.Node
	path  string
	value string
}

func (c *checker) rate(l *limit, n *yaml.Node, path string) {
	f := c.fields(n, path, "limit", "window")
	if f == nil {
		return
	}
	var value int64
	switch ln := f["limit"]; {
	case ln == nil:
		c.fail(n, path+".limit", "is required")
	case ln.Kind != yaml.ScalarNode || ln.ShortTag() != "!!int" || ln.Decode(&value) != nil:
		c.fail(ln, path+".limit", "is an integer (int64), not %s", kindName(ln))
	}
	wn := f["window"]
	if wn == nil {
		c.fail(n, path+".window", "is required")
		return
	}
	w := c.str(wn, path+".window")
	if w == "" {
		return
	}
	if !windowPattern.MatchString(w) {
		c.fail(wn, path+".window", "%q does not match the CRD's pattern %s (its units are h, m, s and ms: a day is 24h)", w, windowPattern)
		return
	}
	d, err := time.ParseDuration(w)
	if err != nil {
		c.fail(wn, path+".window", "%q: %v", w, err)
		return
	}
	l.rates = append(l.rates, rate{maxValue: max(value, 0), seconds: int64(d / time.Second)})
	l.windows = append(l.windows, rateNode{node: wn, path: path + ".window", value: w})
}

func (c *checker) predicates(n *yaml.Node, path string) {
	if n == nil {
		return
	}
	for i, pn := range c.list(n, path, MaxPredicates) {
		pp := fmt.Sprintf("%s[%d]", path, i)
		if f := c.fields(pn, pp, "predicate"); f != nil {
			if f["predicate"] == nil {
				c.fail(pn, pp+".predicate", "is required")
				continue
			}
			c.str(f["predicate"], pp+".predicate")
		}
	}
}

// checkLimit refuses what the API server takes but Limitador could not
// use as the operator writes it: a window under a second (written as
// seconds: 0), and a counter whose expression the operator would put
// unescaped into a CEL string.
func (in *input) checkLimit(l *limit) {
	p := l.policy
	var rates []rate
	for i, r := range l.rates {
		if r.seconds < 1 {
			w := l.windows[i]
			in.refuse(p.file, w.node, w.path, "%q is under a second: the operator keeps whole seconds and would write seconds: 0; this rate is not converted", w.value)
			continue
		}
		rates = append(rates, r)
	}
	l.rates, l.windows = rates, nil
	for i, expr := range l.counters {
		if strings.ContainsAny(expr, "\"\\\n\r\t") {
			in.refuse(p.file, l.exprs[i].node, l.exprs[i].path, "%q holds a quote, backslash or control character: the operator writes it unescaped inside descriptors[0][\"…\"], a CEL string Limitador cannot read; limit %q is not converted", expr, l.name)
			l.broken = true
			continue
		}
		// The operator trims the expression and quotes it as a
		// descriptor key (the wasm-shim sends each counter under its
		// own expression as the key).
		l.counters[i] = fmt.Sprintf(`descriptors[0]["%s"]`, strings.TrimSpace(expr))
	}
	l.exprs = nil
}

// readRoute reads the parts of an HTTPRoute or GRPCRoute the topology
// needs: its name, parentRefs and rules.
func (in *input) readRoute(file string, n *yaml.Node, apiVersion, kind string) {
	c := &checker{file: file}
	defer func() {
		for _, e := range c.errs {
			e.Msg += "; this " + kind + " is not read"
			in.errs = append(in.errs, e)
		}
	}()
	if apiVersion != gatewayGroup+"/v1" && !(kind == "HTTPRoute" && apiVersion == gatewayGroup+"/v1beta1") {
		c.fail(lookup(n, "apiVersion"), "apiVersion", "is %q: %s/v1 is read", apiVersion, gatewayGroup)
		return
	}
	namespace, name, _, ok := in.meta(c, n)
	if !ok {
		return
	}
	r := &route{kind: kind, namespace: namespace, name: name, file: file, node: n, given: true}
	spec := deref(lookup(n, "spec"))
	if spec == nil || spec.Kind != yaml.MappingNode {
		c.fail(n, "spec", "a route has a spec with parentRefs")
		return
	}
	if refs := deref(lookup(spec, "parentRefs")); refs != nil {
		for i, pn := range c.list(refs, "spec.parentRefs", MaxParentRefs) {
			pp := fmt.Sprintf("spec.parentRefs[%d]", i)
			f := c.fields(pn, pp, "group", "kind", "namespace", "name", "sectionName", "port")
			if f == nil {
				continue
			}
			group, pkind := gatewayGroup, "Gateway"
			if f["group"] != nil {
				group = scalar(f["group"])
			}
			if f["kind"] != nil {
				pkind = scalar(f["kind"])
			}
			if group != gatewayGroup || pkind != "Gateway" {
				continue // a Service (mesh) or other parent: not on a Gateway's path
			}
			p := parent{namespace: namespace, name: c.str(f["name"], pp+".name")}
			if f["namespace"] != nil {
				p.namespace = c.str(f["namespace"], pp+".namespace")
			}
			if f["sectionName"] != nil {
				p.section = c.str(f["sectionName"], pp+".sectionName")
			}
			if !slices.Contains(r.parents, p) {
				r.parents = append(r.parents, p)
			}
		}
	}
	rules := deref(lookup(spec, "rules"))
	switch {
	case rules == nil && kind == "HTTPRoute":
		r.rules = []string{"rule-1"} // the API server's default: one rule matching every path
	case rules != nil:
		for i, rn := range c.list(rules, "spec.rules", MaxRules) {
			name := fmt.Sprintf("rule-%d", i+1)
			if rn.Kind != yaml.MappingNode {
				c.fail(rn, fmt.Sprintf("spec.rules[%d]", i), "is a mapping, not %s", kindName(rn))
				continue
			}
			if nn := deref(lookup(rn, "name")); nn != nil {
				name = c.str(nn, fmt.Sprintf("spec.rules[%d].name", i))
			}
			r.rules = append(r.rules, name)
		}
	}
	if len(c.errs) > 0 || !in.firstSeen(file, n, kind, namespace, name) {
		return
	}
	in.routes = append(in.routes, r)
}

// deref follows aliases to the node they name.
func deref(n *yaml.Node) *yaml.Node {
	for i := 0; n != nil && n.Kind == yaml.AliasNode && i < 32; i++ {
		n = n.Alias
	}
	if n != nil && n.Kind == yaml.AliasNode {
		return nil
	}
	return n
}

// lookup returns the value of key in the mapping n, or nil.
func lookup(n *yaml.Node, key string) *yaml.Node {
	if k := keyOf(n, key); k != nil {
		for i := 0; i+1 < len(n.Content); i += 2 {
			if n.Content[i] == k {
				return n.Content[i+1]
			}
		}
	}
	return nil
}

// keyOf returns the node of key in the mapping n, or nil.
func keyOf(n *yaml.Node, key string) *yaml.Node {
	n = deref(n)
	if n == nil || n.Kind != yaml.MappingNode {
		return nil
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		if n.Content[i].Kind == yaml.ScalarNode && n.Content[i].Value == key {
			return n.Content[i]
		}
	}
	return nil
}

// scalar returns the value of a scalar node, or "".
func scalar(n *yaml.Node) string {
	n = deref(n)
	if n == nil || n.Kind != yaml.ScalarNode {
		return ""
	}
	return n.Value
}

func kindName(n *yaml.Node) string {
	if n == nil {
		return "missing"
	}
	if n.Kind == yaml.ScalarNode && n.ShortTag() != "!!str" {
		return fmt.Sprintf("%s %q", strings.TrimPrefix(n.ShortTag(), "!!"), n.Value)
	}
	return yamlconf.KindName(n)
}

func join(path, key string) string {
	if strings.ContainsAny(key, ".[] ") || key == "" {
		return fmt.Sprintf("%s[%q]", path, key)
	}
	return path + "." + key
}
