package simulate

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/admitdev/admit/policy"
)

// ParseRule parses a rule as `admit simulate --rule` takes it: the
// algorithm, then the configuration's parameters as key=value, separated
// by spaces or commas:
//
//	token_bucket rate=2/2s burst=5
//	fixed_window limit=5 window=5s name=per-5s
//	sliding_log limit=5 window=5s scope=user
//	quota limit=1000 period=month time_zone=Europe/Paris
//
// name defaults to the algorithm, scope to global.
func ParseRule(s string) (policy.RuleSpec, error) {
	fields := strings.FieldsFunc(s, func(r rune) bool { return r == ' ' || r == ',' })
	if len(fields) == 0 {
		return policy.RuleSpec{}, errors.New("empty rule; want e.g. \"token_bucket rate=2/2s burst=5\"")
	}
	rs := policy.RuleSpec{Algorithm: fields[0], Name: fields[0], Scope: policy.ScopeGlobal}
	for _, f := range fields[1:] {
		k, v, ok := strings.Cut(f, "=")
		if !ok || v == "" {
			return rs, fmt.Errorf("rule %q: %q is not key=value", s, f)
		}
		num := func(dst **int64) error {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				return fmt.Errorf("rule %q: %s: want a whole number", s, k)
			}
			*dst = &n
			return nil
		}
		var err error
		switch k {
		case "name":
			rs.Name = v
		case "scope":
			rs.Scope = v
		case "actions":
			rs.Actions = strings.Split(v, "|")
		case "per_action":
			rs.PerAction = v == "true"
		case "rate":
			rs.Rate = v
		case "floor":
			rs.Floor = v
		case "window":
			rs.Window = v
		case "lease_ttl":
			rs.LeaseTTL = v
		case "period":
			rs.Period = v
		case "time_zone":
			rs.TimeZone = v
		case "anchor":
			rs.Anchor = v
		case "burst":
			err = num(&rs.Burst)
		case "initial":
			err = num(&rs.Initial)
		case "limit":
			err = num(&rs.Limit)
		case "max":
			err = num(&rs.Max)
		case "shadow":
			b := v == "true"
			rs.Shadow = &b
		default:
			err = fmt.Errorf("rule %q: unknown parameter %q", s, k)
		}
		if err != nil {
			return rs, err
		}
	}
	return rs, nil
}

// Compile checks rules as a configuration's global rules are checked and
// returns them ready to run. Rules with the same name get a number.
func Compile(specs []policy.RuleSpec) ([]*policy.Rule, error) {
	seen := map[string]int{}
	for i := range specs {
		seen[specs[i].Name]++
		if n := seen[specs[i].Name]; n > 1 {
			specs[i].Name = fmt.Sprintf("%s-%d", specs[i].Name, n)
		}
	}
	p, err := policy.Compile(&policy.Spec{Global: specs})
	if err != nil {
		return nil, err
	}
	return p.Global(), nil
}

// TenantRules returns the rules a tenant's requests for action are
// charged: the global rules and the tenant's (its tier's, after its
// overrides) that apply to action, concurrency rules left out (checks do
// not take leases). An empty action keeps every rule.
func TenantRules(p *policy.Policy, tenant, action string) ([]*policy.Rule, error) {
	t := p.Tenant(tenant)
	if t == nil {
		return nil, fmt.Errorf("tenant %q is not in the configuration", tenant)
	}
	var out []*policy.Rule
	for _, r := range append(append([]*policy.Rule(nil), p.Global()...), t.Rules...) {
		if r.Algorithm.String() == "concurrency" || (action != "" && !r.Applies(action)) {
			continue
		}
		out = append(out, r)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no rule of tenant %q applies to action %q", tenant, action)
	}
	return out, nil
}
