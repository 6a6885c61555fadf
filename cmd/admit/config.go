package main

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"maps"
	"math"
	"net"
	"net/netip"
	"os"
	"path"
	"reflect"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/admitdev/admit"
	"github.com/admitdev/admit/envoyrls"
	"github.com/admitdev/admit/httplimit"
	"github.com/admitdev/admit/limitador"
	"github.com/admitdev/admit/policy"
	"github.com/admitdev/admit/redisstore"
	"github.com/admitdev/admit/yamlconf"
)

// Config is the YAML configuration file. Field names are the
// contract; see docs/configuration.md for every field and its default.
type Config struct {
	Version  int                          `json:"version"`
	Server   ServerConfig                 `json:"server"`
	Store    StoreConfig                  `json:"store"`
	Defaults DefaultsConfig               `json:"defaults"`
	Global   []policy.RuleSpec            `json:"global"`
	Tiers    map[string]policy.TierSpec   `json:"tiers"`
	Tenants  map[string]policy.TenantSpec `json:"tenants"`
	HTTP     HTTPConfig                   `json:"http"`
	Envoy    EnvoyConfig                  `json:"envoy"`
	Gateway  GatewayConfig                `json:"gateway"`
	Usage    UsageConfig                  `json:"usage"`
	Shedding []ShedGroupConfig            `json:"shedding"`
	LLM      LLMConfig                    `json:"llm"`
	Bans     []BanRuleConfig              `json:"bans"`
	// Limitador serves Limitador's limits file: see LimitadorConfig.
	Limitador LimitadorConfig `json:"limitador"`

	// src keeps the positions of the decoded fields, for checks made
	// after parsing (CheckProxyActions).
	src *decoder
}

// BanRuleConfig is one escalation rule of the bans section: refusals
// refusals by rule within the window ban the refused request's identifier
// of scope for ban, each next ban of it twice as long, at most max; its
// bans are forgotten forget after the last one ended (default 24h).
type BanRuleConfig struct {
	Name     string `json:"name"`
	Rule     string `json:"rule"`
	Refusals int64  `json:"refusals"`
	Within   string `json:"within"`
	Ban      string `json:"ban"`
	Max      string `json:"max"`
	Forget   string `json:"forget"`
	Scope    string `json:"scope"`
}

// Escalations returns the bans section's rules; the configuration was
// checked, so every duration parses.
func (c *Config) Escalations() []policy.Escalation {
	out := make([]policy.Escalation, 0, len(c.Bans))
	for _, b := range c.Bans {
		e, _ := b.escalation()
		out = append(out, e)
	}
	return out
}

// escalation parses b, naming the field that does not parse.
func (b *BanRuleConfig) escalation() (policy.Escalation, string) {
	e := policy.Escalation{Name: b.Name, Rule: b.Rule, Refusals: b.Refusals, Scope: b.Scope}
	for _, f := range []struct {
		name, v string
		d       *time.Duration
	}{{"within", b.Within, &e.Within}, {"ban", b.Ban, &e.Ban}, {"max", b.Max, &e.Max}, {"forget", b.Forget, &e.Forget}} {
		if f.v == "" {
			continue
		}
		d, err := time.ParseDuration(f.v)
		if err != nil {
			return e, f.name
		}
		*f.d = d
	}
	return e, ""
}

// checkBans checks the bans section: durations, bounds, and that each
// rule it counts is one of the configuration's.
func (d *decoder) checkBans(c *Config) {
	names := map[string]bool{}
	rules := map[string]bool{}
	for _, r := range c.Global {
		rules[r.Name] = true
	}
	for _, t := range c.Tiers {
		for _, r := range t.Rules {
			rules[r.Name] = true
		}
	}
	for _, t := range c.Tenants {
		for _, r := range t.Overrides {
			rules[r.Name] = true
		}
	}
	for i, b := range c.Bans {
		at := func(f string) string { return fmt.Sprintf("bans[%d].%s", i, f) }
		e, bad := b.escalation()
		if bad != "" {
			d.failAt(at(bad), "%q is not a duration like 10m", map[string]string{"within": b.Within, "ban": b.Ban, "max": b.Max, "forget": b.Forget}[bad])
			continue
		}
		if err := policy.CheckEscalation(&e); err != nil {
			var ae *admit.Error
			field := "name"
			if errors.As(err, &ae) && ae.Field != "" {
				field = ae.Field
			}
			d.failAt(at(field), "%s", strings.TrimPrefix(err.Error(), "invalid: "))
			continue
		}
		if names[b.Name] {
			d.failAt(at("name"), "%q names two escalation rules", b.Name)
		}
		names[b.Name] = true
		if !rules[b.Rule] {
			hint := ""
			if s := policy.Suggest(b.Rule, slices.Sorted(maps.Keys(rules))); s != "" {
				hint = "; did you mean " + strconv.Quote(s) + "?"
			}
			d.failAt(at("rule"), "%q is no rule of the configuration%s", b.Rule, hint)
		}
	}
}

// UsageConfig is the usage section: the usage records of quotas, what a
// billing job reads (GET /v1/admin/usage).
type UsageConfig struct {
	// KeepPeriods is how many ended periods of each quota are kept;
	// default 12.
	KeepPeriods int `json:"keep_periods"`
	// MaxRecords bounds the records the memory store keeps (the oldest
	// periods' go first); default 1,000,000. In Redis, records expire
	// keep_periods after their period.
	MaxRecords int `json:"max_records"`
}

// GatewayConfig is the gateway section: the WebSocket gateway's settings
// for the whole server. Each tier's connection and message limits are in
// the tier's own gateway section.
type GatewayConfig struct {
	// AllowedOrigins are the browser origins allowed to connect besides
	// the server's own host: host patterns ("app.example.com",
	// "*.example.com") or scheme://host patterns.
	AllowedOrigins []string `json:"allowed_origins"`
	// LeaseTTL is how long a dead server's connections keep their slots;
	// default 30s.
	LeaseTTL string `json:"lease_ttl"`
	// PingInterval: a connection silent this long is pinged; default 30s.
	PingInterval string `json:"ping_interval"`
	// SendBufferBytes and SendBufferFrames bound what may wait for a slow
	// client before it is closed with 1008; defaults 1 MiB and 4096.
	SendBufferBytes  int64 `json:"send_buffer_bytes"`
	SendBufferFrames int64 `json:"send_buffer_frames"`
	// MaxMessageBytes bounds a client frame (1009 beyond); default 32 KiB.
	MaxMessageBytes int64 `json:"max_message_bytes"`
	// FrameBudget and FrameBudgetPerSecond bound a connection's frames
	// that carry no admitted message (refused, malformed, pings and
	// pongs): past the budget it is closed with 1008; defaults 100 and 10.
	FrameBudget          int64 `json:"frame_budget"`
	FrameBudgetPerSecond int64 `json:"frame_budget_per_second"`
	// MessageFrames and MessageTimeout bound one client message: at most
	// so many frames, whole within the timeout of the gateway's waiting
	// for it (1008 beyond); defaults 128 and 10s.
	MessageFrames  int64  `json:"message_frames"`
	MessageTimeout string `json:"message_timeout"`
	// PoolWorkers sizes the pool route; default 4 per CPU.
	PoolWorkers int64 `json:"pool_workers"`
	// Demo serves the sample client page at /demo/; default true.
	Demo *bool `json:"demo"`
	// MaxSessions bounds the live sessions of the memory store (a session
	// past it is refused with 503 until some expire); default 1,000,000.
	// With Redis, Redis's maxmemory bounds them.
	MaxSessions int64 `json:"max_sessions"`
}

// EnvoyConfig is the envoy section: the Envoy rate limit service (gRPC).
type EnvoyConfig struct {
	// ConfigDir holds envoyproxy/ratelimit YAML files (*.yaml), loaded
	// and hot-reloaded; --envoy-config overrides it.
	ConfigDir string `json:"config_dir"`
	// Domain is the domain decided against Admit's own tenants and rules;
	// default "admit".
	Domain string `json:"domain"`
	// ResponseHeaders adds X-RateLimit-Limit, -Remaining and -Reset to
	// the responses Envoy sends.
	ResponseHeaders bool `json:"response_headers"`
	// DynamicMetadata fills the responses' dynamic metadata (the domain,
	// descriptors, and what --envoy-quota says of quota descriptors), as
	// envoyproxy/ratelimit's RESPONSE_DYNAMIC_METADATA does.
	DynamicMetadata bool `json:"dynamic_metadata"`
}

// LimitadorConfig is the limitador section: a Limitador limits file
// decided as Limitador decides it, for the domains that are its
// namespaces, over the Envoy rate limit service, Kuadrant's RPCs and
// Limitador's HTTP API.
type LimitadorConfig struct {
	// LimitsFile is the limits file, reloaded when it changes;
	// --limitador-config overrides it.
	LimitsFile string `json:"limits_file"`
	// RateLimitHeaders are the headers ShouldRateLimit's answers carry:
	// NONE (the default), DRAFT_VERSION_03 (Limitador's
	// --rate-limit-headers), IETF, or DRAFT_VERSION_03,IETF.
	RateLimitHeaders string `json:"rate_limit_headers"`
	// HTTPAPI says who may use Limitador's HTTP API on the HTTP port
	// besides GET /status: trusted (the default: callers with a service
	// or the admin token, and loopback clients that reach the server
	// directly), open (anyone, as Limitador's own port), or off.
	HTTPAPI string `json:"http_api"`
	// LimitNameInLabels labels limited_calls with the limit's name, as
	// Limitador's --limit-name-in-labels.
	LimitNameInLabels bool `json:"limit_name_in_labels"`
	// Distribution is how servers on one Redis count the limits that do
	// not say: exact (the default, as Limitador's redis storage) or
	// leased (as its redis_cached, but never over the limit).
	Distribution string `json:"distribution"`
}

// ServerConfig is the server section.
type ServerConfig struct {
	HTTP       string `json:"http"`
	GRPC       string `json:"grpc"`
	AdminToken string `json:"admin_token"`
	// ServiceTokens are the bearer tokens of the platform's own backends,
	// which act for any tenant and name the ip and attributes of keys
	// that all tenants share (docs/security.md); ADMIT_SERVICE_TOKEN adds
	// one.
	ServiceTokens  []string `json:"service_tokens"`
	TrustedProxies []string `json:"trusted_proxies"`
	// DecisionLog, when set, is a file that receives one JSON line per
	// decision ("-" for standard output).
	DecisionLog string `json:"decision_log"`
	// GRPCMaxConnections and GRPCMaxConnectionsPerIP bound the gRPC
	// port's connections at once, in all and from one client address
	// (0: envoyrls's defaults, 512 and 32).
	GRPCMaxConnections      int `json:"grpc_max_connections"`
	GRPCMaxConnectionsPerIP int `json:"grpc_max_connections_per_ip"`
	// HTTPMaxConnections and HTTPMaxConnectionsPerIP bound the HTTP
	// port's connections at once (admit serve's API, admit proxy's
	// listener), in all and from one client address other than a trusted
	// proxy (0: the defaults, defaultHTTPMaxConnections and
	// defaultHTTPMaxConnectionsPerIP).
	HTTPMaxConnections      int `json:"http_max_connections"`
	HTTPMaxConnectionsPerIP int `json:"http_max_connections_per_ip"`
	// TenantMetrics adds a tenant label to the decision metrics. Off by
	// default: the label's cardinality grows with the tenants.
	TenantMetrics bool `json:"tenant_metrics"`
	// IdempotencyWindow is how long the decision API keeps the answer of
	// a charge made with an Idempotency-Key for its retries (a duration;
	// default 1h, at most 24h).
	IdempotencyWindow string `json:"idempotency_window"`
	// IdempotencyKeysPerTenant bounds the keys a tenant (or an anonymous
	// caller's address) has kept at once (default 20,000): past them its
	// keyed charges are 429 until one expires.
	IdempotencyKeysPerTenant int `json:"idempotency_keys_per_tenant"`
}

// StoreConfig is the store section.
type StoreConfig struct {
	Backend   string      `json:"backend"`
	Redis     RedisConfig `json:"redis"`
	OnError   string      `json:"on_error"`
	Instances int64       `json:"instances"`
	MaxKeys   int64       `json:"max_keys"`
	// Region and Home make the Redis store one region of limits held
	// across regions: Home is the URL of the Redis every region shares
	// (any form --store takes), Region this one's name.
	Region string `json:"region"`
	Home   string `json:"home"`
	// WhenCut is what a region cut from its home does once it has spent
	// what it holds: refuse (the default) or on_error.
	WhenCut string `json:"when_cut"`
}

// RedisTLSConfig is the store.redis.tls section (see redisstore.TLS).
type RedisTLSConfig struct {
	Enabled                  bool   `json:"enabled"`
	CAFile                   string `json:"ca_file"`
	CertFile                 string `json:"cert_file"`
	KeyFile                  string `json:"key_file"`
	ServerName               string `json:"server_name"`
	SkipHostnameVerification bool   `json:"skip_hostname_verification"`
}

// RedisConfig is the store.redis section.
type RedisConfig struct {
	Mode       string   `json:"mode"`
	Addrs      []string `json:"addrs"`
	MasterName string   `json:"master_name"`
	// Username and Password authenticate to Redis (an ACL user, or the
	// default user's password alone); ${VAR} keeps them out of the file.
	Username string `json:"username"`
	Password string `json:"password"`
	// TLS reaches every server over TLS.
	TLS     *RedisTLSConfig `json:"tls"`
	Timeout string          `json:"timeout"`
}

// DefaultsConfig is the defaults section.
type DefaultsConfig struct {
	UnknownTenant string `json:"unknown_tenant"`
	Shadow        bool   `json:"shadow"`
	// AnonymousWeight is the anonymous callers' weight in the limits
	// tenants share (policy.Spec.AnonymousWeight); default 1.
	AnonymousWeight int64 `json:"anonymous_weight"`
}

// Spec returns the policy part of c.
func (c *Config) Spec() *policy.Spec {
	return &policy.Spec{
		UnknownTenant: c.Defaults.UnknownTenant, Shadow: c.Defaults.Shadow, OnError: c.Store.OnError,
		AnonymousWeight: c.Defaults.AnonymousWeight,
		Global:          c.Global, Tiers: c.Tiers, Tenants: c.Tenants,
	}
}

// MaxConfigSize bounds a configuration file.
const MaxConfigSize = 4 << 20

// LoadConfig reads, decodes and validates a configuration file.
func LoadConfig(file string) (*Config, error) {
	data, err := yamlconf.ReadFile(file, MaxConfigSize)
	if err != nil {
		return nil, yamlconf.Errors{{File: file, Msg: err.Error()}}
	}
	return ParseConfig(file, data)
}

// ParseConfig decodes and validates a configuration. file names it in
// errors. Every problem is reported, each with its line and column.
func ParseConfig(file string, data []byte) (*Config, error) {
	if len(data) > MaxConfigSize {
		return nil, yamlconf.Errors{{File: file, Msg: fmt.Sprintf("%d bytes; at most %d", len(data), MaxConfigSize)}}
	}
	var root yaml.Node
	dec := yaml.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(&root); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, yamlconf.Errors{{File: file, Line: 1, Col: 1, Msg: "the file is empty; a configuration starts with version: 1"}}
		}
		return nil, yamlconf.Errors{yamlconf.SyntaxError(file, err)}
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); err == nil {
		return nil, yamlconf.Errors{{File: file, Line: extra.Line, Col: extra.Column, Msg: "a second YAML document; a configuration is one document"}}
	}
	// Duplicated keys are reported with every other error: the decoding
	// goes on, the later key read after the first.
	dups := yamlconf.DuplicateKeys(file, &root)
	d := decoder{file: file, pos: map[string]*yaml.Node{}}
	cfg := &Config{}
	if len(root.Content) == 1 {
		d.value(root.Content[0], reflect.ValueOf(cfg).Elem(), "")
	} else {
		d.fail(&root, "", "the file is empty; a configuration starts with version: 1")
	}
	// Every error in one run: the checks run on what decoded, an unknown
	// field left out; a field that did not decode holds its zero value,
	// so their errors at or under it are dropped.
	decoded := len(d.errs)
	d.check(cfg)
	if decoded > 0 {
		d.errs = append(d.errs[:decoded:decoded], slices.DeleteFunc(d.errs[decoded:], func(e yamlconf.Error) bool {
			for _, de := range d.errs[:decoded] {
				if de.Path != "" && (e.Path == de.Path || strings.HasPrefix(e.Path, de.Path+".") || strings.HasPrefix(e.Path, de.Path+"[")) {
					return true
				}
			}
			return false
		})...)
	}
	d.errs = append(d.errs, dups...)
	sort.SliceStable(d.errs, func(i, j int) bool {
		a, b := d.errs[i], d.errs[j]
		return a.Line < b.Line || a.Line == b.Line && a.Col < b.Col
	})
	if len(d.errs) > 0 {
		return nil, d.errs
	}
	cfg.src = &d
	return cfg, nil
}

// CheckProxyActions checks c for admit proxy, where a request's action
// comes only from the http.actions routes. A rule naming an action that no
// route produces but one route nearly does ("reports" for "report") is a
// typo and is refused with its position. Other such rules are legitimate in
// a configuration that admit serve shares (its callers name any action)
// but never apply in the proxy: unreachable names them, for a warning.
// Concurrency rules are left out: the proxy takes no leases.
func (c *Config) CheckProxyActions() (unreachable []string, err error) {
	var produced []string
	for _, a := range c.HTTP.Actions {
		if !slices.Contains(produced, a.Action) {
			produced = append(produced, a.Action)
		}
	}
	slices.Sort(produced)
	d := &decoder{file: "(configuration)", pos: map[string]*yaml.Node{}}
	if c.src != nil {
		d = &decoder{file: c.src.file, pos: c.src.pos}
	}
	check := func(path string, rules []policy.RuleSpec) {
		for i, r := range rules {
			if r.Algorithm == admit.Concurrency.String() {
				continue
			}
			for j, a := range r.Actions {
				if a == "*" || slices.Contains(produced, a) {
					continue
				}
				if s := policy.Suggest(a, produced); s != "" {
					d.failAt(fmt.Sprintf("%s[%d].actions[%d]", path, i, j), "action %q is produced by no http.actions route, so admit proxy never applies this rule; did you mean %q?", a, s)
					continue
				}
				unreachable = append(unreachable, r.Name)
			}
		}
	}
	check("global", c.Global)
	for _, name := range slices.Sorted(maps.Keys(c.Tiers)) {
		check("tiers."+name+".rules", c.Tiers[name].Rules)
	}
	if len(d.errs) > 0 {
		return nil, d.errs
	}
	slices.Sort(unreachable)
	return slices.Compact(unreachable), nil
}

// checkRegionStore checks the store's region settings.
func (d *decoder) checkRegionStore(st *StoreConfig) {
	if st.Home != "" {
		if _, err := redisstore.ParseURL(st.Home); err != nil || !strings.HasPrefix(st.Home, "redis") {
			d.failAt("store.home", "%q: want a Redis URL as --store takes (redis://host:port/db, rediss://…, redis+sentinel://…, redis+cluster://…)", redisstore.Redact(st.Home))
		}
		if st.Region == "" {
			d.failAt("store.home", "a home needs store.region, this region's name")
		}
		if st.Backend != "redis" {
			d.failAt("store.home", "a home needs store.backend: redis, the region's own Redis")
		}
	}
	if st.Region != "" {
		if err := checkRegionName(st.Region); err != nil {
			d.failAt("store.region", "%v", err)
		} else if st.Home == "" {
			d.failAt("store.region", "a region needs store.home, the Redis the regions share; without one each region would hold every limit on its own")
		}
	}
	switch st.WhenCut {
	case "", "refuse", "on_error":
	default:
		d.failAt("store.when_cut", "%q: want refuse or on_error", st.WhenCut)
	}
}

// checkRegionName reports whether name can name a region.
func checkRegionName(name string) error {
	if len(name) == 0 || len(name) > 64 || strings.IndexFunc(name, func(r rune) bool {
		return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_' || r == '.')
	}) >= 0 {
		return fmt.Errorf("%q: a region's name is 1 to 64 letters, digits, '-', '_' or '.'", name)
	}
	return nil
}

// CheckRegions reports, with their places in the file, the rules that
// cannot be held across regions: those of algorithms other than token
// buckets and GCRA, and rules whose limit tenants share by fair shares.
func (c *Config) CheckRegions() error {
	d := &decoder{file: "(configuration)", pos: map[string]*yaml.Node{}}
	if c.src != nil {
		d = &decoder{file: c.src.file, pos: c.src.pos}
	}
	d.checkRegionRules(c)
	if len(d.errs) > 0 {
		return d.errs
	}
	return nil
}

// checkRegionRules is CheckRegions, adding its errors to d's.
func (d *decoder) checkRegionRules(c *Config) {
	d.checkStoreRules(c, redisstore.CheckRegionRule, true)
}

// checkStoreRules checks the compiled rules of c with check, a store's
// bounds (the Redis store's spans, a region's algorithms), each error at
// its rule's position, rather than at serve's start without one.
func (d *decoder) checkStoreRules(c *Config, check func(*admit.Rule) error, region bool) {
	p, err := policy.Compile(c.Spec())
	if err != nil {
		return // reported by check
	}
	paths := map[string]string{}
	note := func(tier, path string, rules []policy.RuleSpec) {
		for i, r := range rules {
			for _, k := range []string{tier + "\x00" + r.Name, r.Name} {
				if _, ok := paths[k]; !ok {
					paths[k] = fmt.Sprintf("%s[%d]", path, i)
				}
			}
		}
	}
	note("", "global", c.Global)
	for _, name := range slices.Sorted(maps.Keys(c.Tiers)) {
		note(name, "tiers."+name+".rules", c.Tiers[name].Rules)
	}
	for _, name := range slices.Sorted(maps.Keys(c.Tenants)) {
		note("", "tenants."+name+".overrides", c.Tenants[name].Overrides)
	}
	for _, r := range p.Rules() {
		path, ok := paths[r.Tier+"\x00"+r.Name]
		if !ok {
			path = paths[r.Name]
		}
		if err := check(&r.Rule); err != nil {
			field := admit.ErrorField(err)
			if field == "" {
				field = "algorithm"
			}
			d.failAt(path+"."+field, "%v", err)
		} else if region && r.Fair {
			d.failAt(path+".fair_share", "rule %q: fair shares of a limit tenants share are not held across regions yet; set fair_share: false", r.Name)
		}
	}
}

// decoder decodes a YAML node tree into Go values by their json tags,
// configFields gathers the configuration fields of struct type t by
// their names, with their index paths; an embedded struct's fields are
// its container's, as encoding/json has them.
func configFields(t reflect.Type, index []int, fields map[string][]int, names *[]string) {
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		at := append(slices.Clip(index), i)
		if f.Anonymous && f.Type.Kind() == reflect.Struct {
			configFields(f.Type, at, fields, names)
			continue
		}
		tag, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if !f.IsExported() || tag == "" {
			continue // not configuration (Config.src)
		}
		fields[tag] = at
		*names = append(*names, tag)
	}
}

// strictly: unknown fields, wrong kinds and bad numbers are errors with the
// node's position. It records the position of every path it decodes, so
// that later checks can point at the field they reject.
type decoder struct {
	file string
	pos  map[string]*yaml.Node
	errs yamlconf.Errors
}

func (d *decoder) fail(n *yaml.Node, path, format string, args ...any) {
	d.errs = append(d.errs, yamlconf.Error{File: d.file, Line: n.Line, Col: n.Column, Path: path, Msg: fmt.Sprintf(format, args...)})
}

var envRef = regexp.MustCompile(`\$\{([A-Za-z_][A-Za-z0-9_]*)\}`)

// expand replaces ${VAR} with the environment's value (empty when unset).
func expand(s string) string {
	if !strings.Contains(s, "${") {
		return s
	}
	return envRef.ReplaceAllStringFunc(s, func(m string) string { return os.Getenv(m[2 : len(m)-1]) })
}

func (d *decoder) value(n *yaml.Node, v reflect.Value, path string) {
	d.pos[path] = n
	if n.Kind == yaml.AliasNode {
		d.fail(n, path, "aliases are not supported in a configuration")
		return
	}
	if n.Kind == yaml.ScalarNode && n.Tag == "!!null" {
		return // an empty value keeps the default
	}
	switch v.Kind() {
	case reflect.Pointer:
		p := reflect.New(v.Type().Elem())
		d.value(n, p.Elem(), path)
		v.Set(p)
	case reflect.Struct:
		if n.Kind != yaml.MappingNode {
			d.fail(n, path, "want a mapping, got %s", yamlconf.KindName(n))
			return
		}
		fields := map[string][]int{}
		names := []string{}
		configFields(v.Type(), nil, fields, &names)
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, val := n.Content[i], n.Content[i+1]
			fp := join(path, k.Value)
			idx, ok := fields[k.Value]
			if !ok {
				d.fail(k, fp, "unknown field %q (known: %s)", k.Value, strings.Join(names, ", "))
				continue
			}
			d.value(val, v.FieldByIndex(idx), fp)
		}
	case reflect.Map:
		if n.Kind != yaml.MappingNode {
			d.fail(n, path, "want a mapping, got %s", yamlconf.KindName(n))
			return
		}
		m := reflect.MakeMap(v.Type())
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, val := n.Content[i], n.Content[i+1]
			fp := path + "." + k.Value
			e := reflect.New(v.Type().Elem()).Elem()
			d.value(val, e, fp)
			d.pos[fp] = k
			m.SetMapIndex(reflect.ValueOf(k.Value), e)
		}
		v.Set(m)
	case reflect.Slice:
		if n.Kind != yaml.SequenceNode {
			d.fail(n, path, "want a list, got %s", yamlconf.KindName(n))
			return
		}
		s := reflect.MakeSlice(v.Type(), len(n.Content), len(n.Content))
		for i, e := range n.Content {
			d.value(e, s.Index(i), fmt.Sprintf("%s[%d]", path, i))
		}
		v.Set(s)
	case reflect.String:
		if n.Kind != yaml.ScalarNode {
			d.fail(n, path, "want a text value, got %s", yamlconf.KindName(n))
			return
		}
		v.SetString(expand(n.Value))
	case reflect.Int, reflect.Int64:
		if n.Kind != yaml.ScalarNode {
			d.fail(n, path, "want an integer, got %s", yamlconf.KindName(n))
			return
		}
		x, err := strconv.ParseInt(strings.ReplaceAll(expand(n.Value), "_", ""), 10, 64)
		if err != nil {
			d.fail(n, path, "want an integer, got %q", n.Value)
			return
		}
		v.SetInt(x)
	case reflect.Float64:
		if n.Kind != yaml.ScalarNode {
			d.fail(n, path, "want a number, got %s", yamlconf.KindName(n))
			return
		}
		x, err := strconv.ParseFloat(expand(n.Value), 64)
		if err != nil || math.IsNaN(x) || math.IsInf(x, 0) {
			d.fail(n, path, "want a number, got %q", n.Value)
			return
		}
		v.SetFloat(x)
	case reflect.Bool:
		if n.Kind != yaml.ScalarNode {
			d.fail(n, path, "want true or false, got %s", yamlconf.KindName(n))
			return
		}
		switch expand(n.Value) {
		case "true":
			v.SetBool(true)
		case "false":
			v.SetBool(false)
		default:
			d.fail(n, path, "want true or false, got %q", n.Value)
		}
	default:
		d.fail(n, path, "cannot decode into %s", v.Type())
	}
}

func join(path, field string) string {
	if path == "" {
		return field
	}
	return path + "." + field
}

// at returns the node recorded for path or its closest recorded parent.
func (d *decoder) at(path string) *yaml.Node {
	for p := path; ; {
		if n := d.pos[p]; n != nil {
			return n
		}
		i := strings.LastIndexAny(p, ".[")
		if i < 0 {
			if n := d.pos[""]; n != nil {
				return n
			}
			return &yaml.Node{}
		}
		p = p[:i]
	}
}

func (d *decoder) failAt(path, format string, args ...any) {
	d.fail(d.at(path), path, format, args...)
}

// check validates what decoding cannot: values and cross-references.
func (d *decoder) check(c *Config) {
	if c.Version != 1 {
		d.failAt("version", "want version: 1, got %d", c.Version)
	}
	for _, f := range []struct{ path, addr string }{{"server.http", c.Server.HTTP}, {"server.grpc", c.Server.GRPC}} {
		if f.addr != "" {
			if _, port, err := net.SplitHostPort(f.addr); err != nil {
				d.failAt(f.path, "%q is not host:port (%v)", f.addr, err)
			} else if _, err := net.LookupPort("tcp", port); err != nil {
				d.failAt(f.path, "%q: the port is not a number from 0 to 65535 (or a service of /etc/services)", f.addr)
			}
		}
	}
	if c.Server.HTTP != "" && c.Server.HTTP == c.Server.GRPC {
		d.failAt("server.grpc", "%q is server.http's address too; the two ports differ", c.Server.GRPC)
	}
	for _, f := range []struct {
		path string
		n    int
	}{{"server.grpc_max_connections", c.Server.GRPCMaxConnections}, {"server.grpc_max_connections_per_ip", c.Server.GRPCMaxConnectionsPerIP},
		{"server.http_max_connections", c.Server.HTTPMaxConnections}, {"server.http_max_connections_per_ip", c.Server.HTTPMaxConnectionsPerIP}} {
		if f.n < 0 || f.n > 1_000_000 {
			d.failAt(f.path, "%d: want 1 to 1,000,000 (0: the default)", f.n)
		}
	}
	if n := c.Server.IdempotencyKeysPerTenant; n < 0 || n > 10_000_000 {
		d.failAt("server.idempotency_keys_per_tenant", "%d: want 1 to 10,000,000 (0: the default, 20,000)", n)
	}
	if w := c.Server.IdempotencyWindow; w != "" {
		if v, err := time.ParseDuration(w); err != nil || v < time.Second || v > 24*time.Hour {
			d.failAt("server.idempotency_window", "%q: want a duration from 1s to 24h", w)
		}
	}
	for i, p := range c.Server.TrustedProxies {
		if _, err := parsePrefix(p); err != nil {
			d.failAt(fmt.Sprintf("server.trusted_proxies[%d]", i), "%v", err)
		}
	}
	o, err := httpOptions(c)
	var fes fieldErrors
	errors.As(err, &fes)
	for _, fe := range fes {
		if fe.path != "server.trusted_proxies" { // reported above, entry by entry
			d.failAt(fe.path, "%s", fe.msg)
		}
	}
	// The options the other fields made are checked whatever failed.
	if err := o.Validate(); err != nil {
		msg := strings.TrimPrefix(err.Error(), "httplimit: ")
		path := "http"
		var oe *httplimit.OptionError
		if errors.As(err, &oe) {
			path = httpOptionPaths[oe.Field]
			if oe.Index >= 0 {
				path += fmt.Sprintf("[%d]", oe.Index)
			}
		}
		d.failAt(path, "%s", msg)
	}
	if len(c.Envoy.Domain) > envoyrls.MaxEntryLen {
		d.failAt("envoy.domain", "%d bytes; at most %d", len(c.Envoy.Domain), envoyrls.MaxEntryLen)
	}
	d.checkGateway(&c.Gateway)
	d.checkLLM(&c.LLM)
	d.checkBans(c)
	if _, err := limitador.ParseHeaders(c.Limitador.RateLimitHeaders); err != nil {
		d.failAt("limitador.rate_limit_headers", "%s", strings.TrimPrefix(err.Error(), "rate limit headers "))
	}
	switch c.Limitador.Distribution {
	case "", "exact", "leased":
	default:
		d.failAt("limitador.distribution", "%q: want exact (the default) or leased", c.Limitador.Distribution)
	}
	switch c.Limitador.HTTPAPI {
	case "", "trusted", "open", "off":
	default:
		d.failAt("limitador.http_api", "%q: want trusted (the default), open or off", c.Limitador.HTTPAPI)
	}
	switch c.Store.Backend {
	case "", "memory", "redis":
	default:
		d.failAt("store.backend", "%q: want memory or redis", c.Store.Backend)
	}
	switch c.Store.Redis.Mode {
	case "", "standalone", "sentinel", "cluster":
	default:
		d.failAt("store.redis.mode", "%q: want standalone, sentinel or cluster", c.Store.Redis.Mode)
	}
	if t := c.Store.Redis.TLS; t != nil && !t.Enabled && (t.CAFile != "" || t.CertFile != "" || t.KeyFile != "" || t.ServerName != "" || t.SkipHostnameVerification) {
		d.failAt("store.redis.tls", "TLS settings without enabled: true")
	}
	if t := c.Store.Redis.TLS; t != nil && (t.CertFile == "") != (t.KeyFile == "") {
		d.failAt("store.redis.tls", "cert_file and key_file go together")
	}
	if t := c.Store.Redis.TLS; t != nil && t.Enabled {
		// The files are read when the store connects: a missing or
		// broken one would stop the server there, without its position.
		if t.CAFile != "" {
			if pem, err := os.ReadFile(t.CAFile); err != nil {
				d.failAt("store.redis.tls.ca_file", "%v", err)
			} else if !x509.NewCertPool().AppendCertsFromPEM(pem) {
				d.failAt("store.redis.tls.ca_file", "%s holds no PEM certificate", t.CAFile)
			}
		}
		if t.CertFile != "" && t.KeyFile != "" {
			if _, err := tls.LoadX509KeyPair(t.CertFile, t.KeyFile); err != nil {
				d.failAt("store.redis.tls.cert_file", "%v", err)
			}
		}
	}
	if c.Store.Redis.Timeout != "" {
		if t, err := time.ParseDuration(c.Store.Redis.Timeout); err != nil || t <= 0 {
			d.failAt("store.redis.timeout", "%q is not a positive duration like 50ms", c.Store.Redis.Timeout)
		}
	}
	d.checkRegionStore(&c.Store)
	if c.Store.Instances < 0 || c.Store.Instances > 10000 {
		d.failAt("store.instances", "must be from 1 to 10000")
	}
	if c.Usage.KeepPeriods < 0 || c.Usage.KeepPeriods > 1000 {
		d.failAt("usage.keep_periods", "must be from 1 to 1000")
	}
	if c.Usage.MaxRecords < 0 || c.Usage.MaxRecords > 100_000_000 {
		d.failAt("usage.max_records", "must be from 1 to 100000000")
	}
	if c.Store.MaxKeys < 0 || c.Store.MaxKeys > 1_000_000_000 {
		d.failAt("store.max_keys", "must be from 1 to 1000000000")
	}
	switch {
	case c.Store.Home != "":
		d.checkRegionRules(c)
	case c.Store.Backend == "redis":
		d.checkStoreRules(c, redisstore.CheckRule, false)
	}
	if _, err := policy.Compile(c.Spec()); err != nil {
		var fes policy.Errors
		if !errors.As(err, &fes) {
			d.failAt("", "%v", err)
			return
		}
		for _, fe := range fes {
			path := fe.Path
			switch path {
			case "unknown_tenant":
				path = "defaults.unknown_tenant"
			case "on_error":
				path = "store.on_error"
			}
			d.failAt(path, "%s", fe.Msg)
		}
	}
}

func (d *decoder) checkGateway(g *GatewayConfig) {
	for i, p := range g.AllowedOrigins {
		if _, err := path.Match(p, ""); err != nil || p == "" {
			d.failAt(fmt.Sprintf("gateway.allowed_origins[%d]", i), "%q is not a host pattern like *.example.com", p)
		}
	}
	for _, f := range []struct {
		path, v string
		lo      time.Duration
	}{{"gateway.lease_ttl", g.LeaseTTL, time.Second}, {"gateway.ping_interval", g.PingInterval, time.Second}, {"gateway.message_timeout", g.MessageTimeout, 100 * time.Millisecond}} {
		if f.v == "" {
			continue
		}
		if t, err := time.ParseDuration(f.v); err != nil || t < f.lo || t > time.Hour {
			d.failAt(f.path, "%q: want a duration from %v to 1h", f.v, f.lo)
		}
	}
	for _, f := range []struct {
		path     string
		v, lo, h int64
	}{
		{"gateway.send_buffer_bytes", g.SendBufferBytes, 1 << 10, 1 << 30},
		{"gateway.send_buffer_frames", g.SendBufferFrames, 1, 1 << 20},
		{"gateway.max_message_bytes", g.MaxMessageBytes, 128, 16 << 20},
		{"gateway.frame_budget", g.FrameBudget, 1, 1_000_000},
		{"gateway.frame_budget_per_second", g.FrameBudgetPerSecond, 1, 1_000_000},
		{"gateway.message_frames", g.MessageFrames, 1, 1_000_000},
		{"gateway.pool_workers", g.PoolWorkers, 1, 4096},
		{"gateway.max_sessions", g.MaxSessions, 1, 100_000_000},
	} {
		if f.v != 0 && (f.v < f.lo || f.v > f.h) {
			d.failAt(f.path, "must be from %d to %d", f.lo, f.h)
		}
	}
}

// httpOptionPaths maps httplimit's option names to configuration paths.
var httpOptionPaths = map[string]string{
	"ForwardedHeader": "http.forwarded_header",
	"UserHeader":      "http.user_header",
	"JWT.Keys":        "http.jwt.keys",
	"Actions":         "http.actions",
	"Shedding":        "shedding",
}

// parsePrefix parses a CIDR or a single address.
func parsePrefix(s string) (netip.Prefix, error) {
	if p, err := netip.ParsePrefix(s); err == nil {
		return p.Masked(), nil
	}
	a, err := netip.ParseAddr(s)
	if err != nil {
		return netip.Prefix{}, fmt.Errorf("%q is neither a CIDR nor an IP address", s)
	}
	return netip.PrefixFrom(a.Unmap(), a.Unmap().BitLen()), nil
}
