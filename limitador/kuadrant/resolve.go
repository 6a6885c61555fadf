package kuadrant

import (
	"cmp"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"slices"
	"strings"
	"unicode"

	"github.com/admitdev/admit/yamlconf"
)

// The topology is a set of paths from a Gateway listener to a route rule;
// the policies on a path (on its Gateway, listener, route and rule, in
// that order of specificity) merge into the effective policy whose limits
// the operator writes, in the route's namespace. Limitador's limits are
// the union over all paths, so each route can be weighed alone.
//
// What the files leave open (a route that is not given, a Gateway's other
// listeners, the order of two policies without a creationTimestamp) is a
// dimension with a few options; each combination of options is a world.
// A limit written in every world is converted; one written in some only is
// refused, naming the dimensions that decide it.

// Keys of the targetables policies attach to.
func gatewayKey(namespace, name string) string     { return "Gateway " + namespace + "/" + name }
func routeKey(kind, namespace, name string) string { return kind + " " + namespace + "/" + name }
func sectionKey(key, section string) string        { return key + "#" + section }

func (p *policy) targetKey() string {
	k := p.target.kind + " " + p.namespace + "/" + p.target.name
	if p.target.section != "" {
		k = sectionKey(k, p.target.section)
	}
	return k
}

func (p *policy) String() string { return p.kind + " " + p.namespace + "/" + p.name }
func (r *route) String() string  { return r.kind + " " + r.namespace + "/" + r.name }

// dimension is one thing the files leave open.
type dimension struct {
	reason  string
	options int
}

// attachment is a route's place on a Gateway: through one listener, or,
// for a route not given, through no Gateway that has policies (gateway "").
type attachment struct {
	gateway, listener string // listener "": one without policies
}

// model is what is known of a route's paths, and what is open.
type model struct {
	r    *route
	key  string
	dims []dimension
	// fixed are the attachments of a given route; for each, the
	// dimension (or -1) that says whether the Gateway has a listener
	// without policies besides those listed.
	fixed []fixedAttachment
	// attach is the dimension of a route not given choosing one of
	// attachOptions, or -1.
	attach        int
	attachOptions []attachment
	// rules are the route's rules; otherRule the dimension (or -1)
	// adding a rule without policies.
	rules     []string
	otherRule int
	// orders are the dimensions choosing the order of policies that
	// target the same thing, by targetable key and kind.
	orders map[string]orderDim
	// merged remembers the effective limits of a path by its policies:
	// many paths and worlds share them.
	merged map[string]map[string]*limit
}

type fixedAttachment struct {
	gateway   string
	listeners []string // "" for a listener without policies
	other     int      // dimension adding a listener without policies, or -1
}

type orderDim struct {
	dim    int         // -1: a single order
	orders [][]*policy // the orders possible
}

// resolve weighs every route and returns the limits to write.
func (in *input) resolve() []Limit {
	routes := in.routesToWeigh()
	at := in.attach()
	var limits []Limit
	emitted := map[string]bool{}
	for _, r := range routes {
		m, ok := in.modelOf(r, at)
		if !ok {
			continue
		}
		for _, l := range in.weigh(m) {
			key := l.Namespace + "\x00" + l.Conditions[0] + "\x00" + fmt.Sprint(l.MaxValue, l.Seconds)
			if emitted[key] {
				continue // an HTTPRoute and a GRPCRoute of one name share a namespace
			}
			emitted[key] = true
			if len(limits) == MaxEntries {
				in.refuse(in.policies[0].file, nil, "", "more than %d Limitador limits: the rest are not written", MaxEntries)
				break
			}
			limits = append(limits, l)
		}
	}
	for _, p := range in.policies {
		if !p.dead && p.target.kind == "Gateway" && !in.onGivenRoute(p) {
			where := gatewayKey(p.namespace, p.target.name)
			if p.target.section != "" {
				where += " (listener " + p.target.section + ")"
			}
			in.refuse(p.file, p.target.node, "spec.targetRef", "no route given attaches to %s: the operator writes a Gateway's limits once for each route on it, in that route's namespace; give the routes as route files (--route)", where)
		}
	}
	slices.SortStableFunc(limits, func(a, b Limit) int {
		return cmp.Or(cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Name, b.Name), cmp.Compare(a.Conditions[0], b.Conditions[0]))
	})
	return limits
}

// onGivenRoute reports whether a given route certainly attaches to what
// the Gateway policy p targets.
func (in *input) onGivenRoute(p *policy) bool {
	for _, r := range in.routes {
		if len(r.rules) == 0 {
			continue
		}
		for _, parent := range r.parents {
			if parent.namespace == p.namespace && parent.name == p.target.name &&
				(p.target.section == "" || parent.section == "" || parent.section == p.target.section) {
				return true
			}
		}
	}
	return false
}

// attach indexes the live policies by the key of what they target.
func (in *input) attach() map[string][]*policy {
	at := map[string][]*policy{}
	for _, p := range in.policies {
		if !p.dead {
			at[p.targetKey()] = append(at[p.targetKey()], p)
		}
	}
	return at
}

// routesToWeigh returns the given routes and those only named by a
// policy, in order, refusing the policies whose route is given but cannot
// carry them.
func (in *input) routesToWeigh() []*route {
	byKey := map[string]*route{}
	for _, r := range in.routes {
		byKey[routeKey(r.kind, r.namespace, r.name)] = r
	}
	for _, p := range in.policies {
		if p.target.kind == "Gateway" {
			continue
		}
		key := routeKey(p.target.kind, p.namespace, p.target.name)
		if byKey[key] == nil {
			byKey[key] = &route{kind: p.target.kind, namespace: p.namespace, name: p.target.name, file: p.file, node: p.target.node}
		}
	}
	keys := make([]string, 0, len(byKey))
	for k := range byKey {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	var out []*route
	for _, key := range keys {
		r := byKey[key]
		if r.given {
			in.checkRoute(r, key)
		}
		out = append(out, r)
	}
	return out
}

// checkRoute refuses the policies that target a given route (or one of its
// rules) that is on no Gateway, or a rule it does not have: the operator
// finds no path for them.
func (in *input) checkRoute(r *route, key string) {
	for _, p := range in.policies {
		if p.dead || p.target.kind != r.kind || p.namespace != r.namespace || p.target.name != r.name {
			continue
		}
		switch {
		case len(r.parents) == 0:
			in.refuse(p.file, p.target.node, "spec.targetRef", "%s (%s:%d) attaches to no Gateway (its parentRefs name none): the operator writes limits only for routes on Kuadrant's Gateways", r, r.file, r.node.Line)
		case len(r.rules) == 0:
			in.refuse(p.file, p.target.node, "spec.targetRef", "%s (%s:%d) has no rules, so no request takes it", r, r.file, r.node.Line)
		case p.target.section != "" && !slices.Contains(r.rules, p.target.section):
			in.refuse(p.file, p.target.node, "spec.targetRef.sectionName", "%s (%s:%d) has no rule %q (its rules: %s): the operator finds no target and writes none of this policy's limits", r, r.file, r.node.Line, p.target.section, strings.Join(r.rules, ", "))
		default:
			continue
		}
		p.dead = true
	}
}

// modelOf lays out what is known and open about r's paths.
func (in *input) modelOf(r *route, at map[string][]*policy) (*model, bool) {
	m := &model{r: r, key: routeKey(r.kind, r.namespace, r.name), attach: -1, otherRule: -1, orders: map[string]orderDim{}, merged: map[string]map[string]*limit{}}
	listeners := map[string][]string{} // Gateway key → the listeners policies target
	var gateways []string              // Gateways with policies
	for key := range at {
		if !strings.HasPrefix(key, "Gateway ") {
			continue
		}
		gw, section, _ := strings.Cut(key, "#")
		if !slices.Contains(gateways, gw) {
			gateways = append(gateways, gw)
		}
		if section != "" {
			listeners[gw] = append(listeners[gw], section)
		}
	}
	slices.Sort(gateways)
	for _, l := range listeners {
		slices.Sort(l)
	}
	var onPath []string // the targetables of the route's paths
	if r.given {
		others := map[string]int{}
		for _, p := range r.parents {
			gw := gatewayKey(p.namespace, p.name)
			onPath = append(onPath, gw)
			fa := fixedAttachment{gateway: gw, other: -1}
			switch {
			case p.section != "":
				fa.listeners = []string{p.section}
			case len(listeners[gw]) == 0:
				fa.listeners = []string{""}
			default:
				fa.listeners = listeners[gw]
				d, ok := others[gw]
				if !ok {
					d = m.add(fmt.Sprintf("%s attaches to every listener of %s, and no Gateway manifest is read to tell whether it has listeners besides %s", r, gw, strings.Join(listeners[gw], ", ")), 2)
					others[gw] = d
				}
				fa.other = d
			}
			for _, l := range fa.listeners {
				if l != "" {
					onPath = append(onPath, sectionKey(gw, l))
				}
			}
			m.fixed = append(m.fixed, fa)
		}
		m.rules = r.rules
	} else {
		m.attachOptions = []attachment{{}}
		for _, gw := range gateways {
			onPath = append(onPath, gw)
			for _, l := range listeners[gw] {
				m.attachOptions = append(m.attachOptions, attachment{gateway: gw, listener: l})
				onPath = append(onPath, sectionKey(gw, l))
			}
			m.attachOptions = append(m.attachOptions, attachment{gateway: gw})
		}
		if len(gateways) > 0 {
			m.attach = m.add(fmt.Sprintf("%s is not among the routes given, so whether it attaches to %s (and through which listener) is unknown", r, strings.Join(gateways, ", ")), len(m.attachOptions))
		}
		prefix := m.key + "#"
		for key := range at {
			if section, ok := strings.CutPrefix(key, prefix); ok {
				m.rules = append(m.rules, section)
			}
		}
		slices.Sort(m.rules)
		if len(m.rules) == 0 {
			m.rules = []string{""}
		} else {
			m.otherRule = m.add(fmt.Sprintf("%s is not among the routes given, so whether it has rules besides %s is unknown", r, strings.Join(m.rules, ", ")), 2)
		}
	}
	onPath = append(onPath, m.key)
	for _, rule := range m.rules {
		if rule != "" {
			onPath = append(onPath, sectionKey(m.key, rule))
		}
	}
	slices.Sort(onPath)
	onPath = slices.Compact(onPath)
	for _, key := range onPath {
		for _, kind := range []string{rateLimitPolicy, tokenRateLimitPolicy} {
			ok := m.order(key, kind, at[key])
			if !ok {
				in.refuseAll(r, at, onPath, fmt.Sprintf("more than six %s target %s without a creationTimestamp to order them", strings.TrimSuffix(kind, "y")+"ies", key))
				return nil, false
			}
		}
	}
	worlds := 1
	for _, d := range m.dims {
		if worlds > MaxWorlds/d.options {
			in.refuseAll(r, at, onPath, fmt.Sprintf("more than %d combinations of what the files leave open to weigh", MaxWorlds))
			return nil, false
		}
		worlds *= d.options
	}
	return m, true
}

// add adds a dimension and returns its index.
func (m *model) add(reason string, options int) int {
	m.dims = append(m.dims, dimension{reason: reason, options: options})
	return len(m.dims) - 1
}

// order records the orders in which the operator may merge the policies
// of kind that target key: by creationTimestamp, then namespace/name. A
// policy without a creationTimestamp may stand anywhere among the others.
// It reports false when there are too many to weigh.
func (m *model) order(key, kind string, all []*policy) bool {
	var group []*policy
	for _, p := range all {
		if p.kind == kind {
			group = append(group, p)
		}
	}
	if len(group) == 0 {
		return true
	}
	before := func(a, b *policy) int {
		if c := a.created.Compare(b.created); c != 0 {
			return c
		}
		return cmp.Compare(a.namespace+"/"+a.name, b.namespace+"/"+b.name)
	}
	slices.SortFunc(group, before)
	known := func(order []*policy) bool {
		for i, a := range order {
			for _, b := range order[i+1:] {
				if !a.created.IsZero() && !b.created.IsZero() && before(a, b) > 0 {
					return false
				}
			}
		}
		return true
	}
	var orders [][]*policy
	if slices.ContainsFunc(group, func(p *policy) bool { return p.created.IsZero() }) && len(group) > 1 {
		if len(group) > 6 {
			return false
		}
		permute(group, func(order []*policy) {
			if known(order) {
				orders = append(orders, slices.Clone(order))
			}
		})
	} else {
		orders = [][]*policy{group}
	}
	od := orderDim{dim: -1, orders: orders}
	if len(orders) > 1 {
		names := make([]string, len(group))
		for i, p := range group {
			names[i] = p.namespace + "/" + p.name
		}
		od.dim = m.add(fmt.Sprintf("the %s %s target %s and no metadata.creationTimestamp tells the order they were created in, which decides how the operator merges them", strings.TrimSuffix(kind, "y")+"ies", strings.Join(names, ", "), key), len(orders))
	}
	m.orders[key+"\x00"+kind] = od
	return true
}

// permute calls f with every order of ps (Heap's algorithm).
func permute(ps []*policy, f func([]*policy)) {
	ps = slices.Clone(ps)
	var gen func(k int)
	gen = func(k int) {
		if k <= 1 {
			f(ps)
			return
		}
		for i := 0; i < k; i++ {
			gen(k - 1)
			if k%2 == 0 {
				ps[i], ps[k-1] = ps[k-1], ps[i]
			} else {
				ps[0], ps[k-1] = ps[k-1], ps[0]
			}
		}
	}
	gen(len(ps))
}

// refuseAll refuses every limit of the policies on r's paths.
func (in *input) refuseAll(r *route, at map[string][]*policy, onPath []string, why string) {
	seen := map[*policy]bool{}
	for _, key := range onPath {
		for _, p := range at[key] {
			if seen[p] {
				continue
			}
			seen[p] = true
			in.refuse(p.file, p.target.node, "spec.targetRef", "%s, for %s: not converted: %s", p, r, why)
		}
	}
}

// world is one combination of options, one per dimension.
type world []int

// written returns the limits the operator writes for the route in world w.
func (m *model) written(w world) map[*limit]bool {
	out := map[*limit]bool{}
	seen := map[string]bool{}
	order := func(key, kind string) []*policy {
		od, ok := m.orders[key+"\x00"+kind]
		if !ok {
			return nil
		}
		if od.dim < 0 {
			return od.orders[0]
		}
		return od.orders[w[od.dim]]
	}
	var places []attachment
	if m.r.given {
		for _, fa := range m.fixed {
			for _, l := range fa.listeners {
				places = append(places, attachment{gateway: fa.gateway, listener: l})
			}
			if fa.other >= 0 && w[fa.other] == 1 {
				places = append(places, attachment{gateway: fa.gateway})
			}
		}
	} else if m.attach >= 0 {
		places = []attachment{m.attachOptions[w[m.attach]]}
	} else {
		places = []attachment{{}}
	}
	rules := m.rules
	if m.otherRule >= 0 && w[m.otherRule] == 1 {
		rules = append(slices.Clone(rules), "")
	}
	kinds := []string{rateLimitPolicy}
	if m.r.kind == "HTTPRoute" {
		kinds = append(kinds, tokenRateLimitPolicy) // a TokenRateLimitPolicy reaches HTTPRoutes only
	}
	for _, place := range places {
		for _, rule := range rules {
			for _, kind := range kinds {
				var path []*policy
				if place.gateway != "" {
					path = append(path, order(place.gateway, kind)...)
					if place.listener != "" {
						path = append(path, order(sectionKey(place.gateway, place.listener), kind)...)
					}
				}
				path = append(path, order(m.key, kind)...)
				if rule != "" {
					path = append(path, order(sectionKey(m.key, rule), kind)...)
				}
				key := make([]byte, 0, 4*len(path))
				for _, p := range path {
					key = fmt.Appendf(key, "%d,", p.id)
				}
				if seen[string(key)] {
					continue // another path with the same policies
				}
				seen[string(key)] = true
				eff, ok := m.merged[string(key)]
				if !ok {
					eff = effective(path)
					m.merged[string(key)] = eff
				}
				for _, l := range eff {
					out[l] = true
				}
			}
		}
	}
	return out
}

// effective merges the policies of one path, ordered from the least
// specific to the most specific, as the operator does: starting from the
// most specific, each less specific policy is merged in by its own
// strategy.
//
//   - defaults, atomic (and implicit defaults, spec.limits): the limits so
//     far stand, unless there are none;
//   - defaults, merge: its limits are added where the name is not taken;
//   - overrides, atomic: its limits replace the limits so far;
//   - overrides, merge: its limits replace those of the same name.
func effective(path []*policy) map[string]*limit {
	if len(path) == 0 {
		return nil
	}
	eff := maps(path[len(path)-1].limits)
	for i := len(path) - 2; i >= 0; i-- {
		p := path[i]
		switch {
		case !p.overrides && !p.merge:
			if len(eff) == 0 {
				eff = maps(p.limits)
			}
		case !p.overrides && p.merge:
			for name, l := range p.limits {
				if _, taken := eff[name]; !taken {
					eff[name] = l
				}
			}
		case p.overrides && !p.merge:
			eff = maps(p.limits)
		default:
			merged := maps(p.limits)
			for name, l := range eff {
				if _, taken := merged[name]; !taken {
					merged[name] = l
				}
			}
			eff = merged
		}
	}
	return eff
}

func maps(limits map[string]*limit) map[string]*limit {
	out := make(map[string]*limit, len(limits))
	for k, v := range limits {
		out[k] = v
	}
	return out
}

// weigh runs every world of m, refuses the limits written in some only,
// and returns the Limitador limits written in all.
func (in *input) weigh(m *model) []Limit {
	stride := make([]int, len(m.dims))
	worlds := 1
	for i, d := range m.dims {
		stride[i] = worlds
		worlds *= d.options
	}
	results := make([]map[*limit]bool, worlds)
	possible := map[*limit]bool{}
	for i := range results {
		w := make(world, len(m.dims))
		for d := range m.dims {
			w[d] = i / stride[d] % m.dims[d].options
		}
		results[i] = m.written(w)
		for l := range results[i] {
			possible[l] = true
		}
	}
	var certain, open []*limit
	for l := range possible {
		all := true
		for _, res := range results {
			if !res[l] {
				all = false
				break
			}
		}
		if all {
			certain = append(certain, l)
		} else {
			open = append(open, l)
		}
	}
	byPlace := func(a, b *limit) int {
		return cmp.Or(cmp.Compare(in.fileOrder[a.policy.file], in.fileOrder[b.policy.file]), cmp.Compare(a.node.Line, b.node.Line), cmp.Compare(a.name, b.name))
	}
	slices.SortFunc(open, byPlace)
	for _, l := range open {
		if l.broken {
			continue // refused already
		}
		var why []string
		for d, dim := range m.dims {
			if matters(results, l, stride[d], dim.options) {
				why = append(why, dim.reason)
			}
		}
		in.refuse(l.policy.file, l.node, "", "limit %q of %s, for %s: not converted, since whether the operator writes it turns on what the files do not say: %s", l.name, l.policy, m.r, strings.Join(why, "; "))
	}
	slices.SortFunc(certain, byPlace)
	var out []Limit
	namespace := m.r.namespace + "/" + m.r.name
	for _, l := range certain {
		if l.broken {
			continue
		}
		cond := fmt.Sprintf(`descriptors[0]["%s"] == "1"`, identifier(l.policy, l.name))
		for _, r := range l.rates {
			out = append(out, Limit{
				Namespace:  namespace,
				MaxValue:   r.maxValue,
				Seconds:    r.seconds,
				Conditions: []string{cond},
				Variables:  append([]string{}, l.counters...),
				Name:       l.name,
			})
		}
	}
	return out
}

// matters reports whether changing only the dimension of the given stride
// and number of options changes whether l is written, in some world. It
// walks each line of worlds that differ in that dimension alone once.
func matters(results []map[*limit]bool, l *limit, stride, options int) bool {
	for i, res := range results {
		if i/stride%options != 0 {
			continue
		}
		for o := 1; o < options; o++ {
			if results[i+o*stride][l] != res[l] {
				return true
			}
		}
	}
	return false
}

// identifier is the operator's name for a limit in Limitador: "limit." (or
// "tokenlimit.") and the limit's name with every character but a letter,
// a digit or _ replaced by _, then "__" and the first four bytes, in hex,
// of the SHA-256 of "namespace/policy/limit" (the hash keeps two names
// apart that the replacement made alike).
func identifier(p *policy, limitName string) string {
	var b strings.Builder
	b.WriteString("limit.")
	if p.kind == tokenRateLimitPolicy {
		b.Reset()
		b.WriteString("tokenlimit.")
	}
	for _, c := range limitName {
		if unicode.IsLetter(c) || unicode.IsDigit(c) || c == '_' {
			b.WriteRune(c)
		} else {
			b.WriteByte('_')
		}
	}
	sum := sha256.Sum256([]byte(p.namespace + "/" + p.name + "/" + limitName))
	b.WriteString("__")
	b.WriteString(hex.EncodeToString(sum[:4]))
	return b.String()
}

// refusals returns what was refused, by file and position.
func (in *input) refusals() yamlconf.Errors {
	errs := slices.Clone(in.errs)
	slices.SortStableFunc(errs, func(a, b yamlconf.Error) int {
		return cmp.Or(cmp.Compare(in.fileOrder[a.File], in.fileOrder[b.File]), cmp.Compare(a.Line, b.Line), cmp.Compare(a.Col, b.Col))
	})
	return errs
}
