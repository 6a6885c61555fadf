package main

import (
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/admitdev/admit"
	"github.com/admitdev/admit/httplimit"
	"github.com/admitdev/admit/internal/server"
	"github.com/admitdev/admit/shed"
	"github.com/admitdev/admit/yamlconf"
)

// HTTPConfig is the http section: how the middleware of admit proxy and
// the /v1/authz endpoint identify requests. The trusted proxies are
// server.trusted_proxies.
type HTTPConfig struct {
	// ForwardedHeader is the header trusted proxies set: x-forwarded-for
	// (default) or forwarded (RFC 7239).
	ForwardedHeader string `json:"forwarded_header"`
	// UserHeader carries the user id, set by an authenticating proxy.
	UserHeader string         `json:"user_header"`
	JWT        *JWTConfig     `json:"jwt"`
	Actions    []ActionConfig `json:"actions"`
	// StrictPaths matches the actions' paths exactly, as net/http's
	// ServeMux does, rather than as web frameworks route them (trailing
	// slash, case, ;parameters, .format: see httplimit.Options).
	StrictPaths bool `json:"strict_paths"`
	// RetryJitter spreads Retry-After (default 1s; 0s disables).
	RetryJitter string `json:"retry_jitter"`
	// ForwardAuth names the proxy that asks /v1/authz: traefik, caddy,
	// nginx, haproxy or envoy. /v1/authz reads the original method and
	// URI from that proxy's headers only, and only when it comes from
	// server.trusted_proxies; unset, it reads the request itself, as
	// envoy, and no user header.
	ForwardAuth string `json:"forward_auth"`
}

// JWTConfig is the http.jwt section.
type JWTConfig struct {
	UserClaim   string         `json:"user_claim"`
	TenantClaim string         `json:"tenant_claim"`
	Issuer      string         `json:"issuer"`
	Audience    string         `json:"audience"`
	Leeway      string         `json:"leeway"`
	Keys        []JWTKeyConfig `json:"keys"`
}

// JWTKeyConfig is one key of http.jwt.keys: an HS256 secret, or an RS256
// or ES256 public key in PEM, inline or in a file.
type JWTKeyConfig struct {
	ID            string `json:"kid"`
	Alg           string `json:"alg"`
	Secret        string `json:"secret"`
	PublicKey     string `json:"public_key"`
	PublicKeyFile string `json:"public_key_file"`
}

// ActionConfig maps a ServeMux pattern to an action.
type ActionConfig struct {
	Match  string `json:"match"`
	Action string `json:"action"`
}

// ShedGroupConfig is one group of the shedding section: admit proxy's
// adaptive concurrency limit for the routes of some actions (see
// httplimit.ShedGroup and package shed for each field).
type ShedGroupConfig struct {
	Name            string        `json:"name"`
	Actions         []string      `json:"actions"`
	Algorithm       string        `json:"algorithm"`
	InitialLimit    int           `json:"initial_limit"`
	MinLimit        int           `json:"min_limit"`
	MaxLimit        int           `json:"max_limit"`
	Tolerance       float64       `json:"tolerance"`
	Timeout         string        `json:"timeout"`
	CriticalReserve float64       `json:"critical_reserve"`
	SheddableShare  float64       `json:"sheddable_share"`
	TenantShare     float64       `json:"tenant_share"`
	MaxQueue        int           `json:"max_queue"`
	MaxWait         string        `json:"max_wait"`
	Classes         ClassesConfig `json:"classes"`
}

// ClassesConfig says how a shedding group finds a request's class.
type ClassesConfig struct {
	Header  string            `json:"header"`
	Actions map[string]string `json:"actions"`
	Tiers   map[string]string `json:"tiers"`
	Default string            `json:"default"`
}

// shedGroups turns the shedding section into middleware options.
func shedGroups(c *Config) ([]httplimit.ShedGroup, error) {
	var out []httplimit.ShedGroup
	for i, g := range c.Shedding {
		at := func(f string) string { return fmt.Sprintf("shedding[%d].%s", i, f) }
		sg := httplimit.ShedGroup{Name: g.Name, Actions: g.Actions, ClassHeader: g.Classes.Header,
			Limiter: shed.Options{
				Algorithm: g.Algorithm, InitialLimit: g.InitialLimit, MinLimit: g.MinLimit, MaxLimit: g.MaxLimit,
				Tolerance: g.Tolerance, CriticalReserve: g.CriticalReserve, SheddableShare: g.SheddableShare,
				TenantShare: g.TenantShare, MaxQueue: g.MaxQueue,
			}}
		if g.Name == "" {
			return nil, &fieldError{at("name"), "missing; it names the group in metrics"}
		}
		for _, d := range []struct {
			f, v string
			dst  *time.Duration
		}{{"timeout", g.Timeout, &sg.Limiter.Timeout}, {"max_wait", g.MaxWait, &sg.Limiter.MaxWait}} {
			if d.v == "" {
				continue
			}
			v, err := time.ParseDuration(d.v)
			if err != nil || v <= 0 {
				return nil, &fieldError{at(d.f), fmt.Sprintf("%q is not a duration like 50ms", d.v)}
			}
			*d.dst = v
		}
		if err := sg.Limiter.Validate(); err != nil {
			return nil, &fieldError{at(admit.ErrorField(err)), err.Error()}
		}
		class := func(f, v string) (shed.Class, error) {
			cl, err := shed.ParseClass(v)
			if err != nil {
				return 0, &fieldError{at(f), err.Error()}
			}
			return cl, nil
		}
		var err error
		if g.Classes.Default != "" {
			if sg.Default, err = class("classes.default", g.Classes.Default); err != nil {
				return nil, err
			}
		}
		for _, m := range []struct {
			f   string
			src map[string]string
			dst *map[string]shed.Class
		}{{"classes.actions", g.Classes.Actions, &sg.Classes}, {"classes.tiers", g.Classes.Tiers, &sg.Tiers}} {
			for k, v := range m.src {
				cl, err := class(m.f+"."+k, v)
				if err != nil {
					return nil, err
				}
				if *m.dst == nil {
					*m.dst = map[string]shed.Class{}
				}
				(*m.dst)[k] = cl
			}
		}
		out = append(out, sg)
	}
	return out, nil
}

// fieldError is a problem with one field of the configuration, by path.
type fieldError struct{ path, msg string }

func (e *fieldError) Error() string { return e.path + ": " + e.msg }

// fieldErrors are every problem httpOptions found, in the order of the
// fields.
type fieldErrors []*fieldError

func (e fieldErrors) Error() string {
	s := make([]string, len(e))
	for i, fe := range e {
		s[i] = fe.Error()
	}
	return strings.Join(s, "\n")
}

// httpOptions turns the server and http sections into middleware options
// (without store and policy). Its error is a fieldErrors: every field's
// problem, the options built from the others.
func httpOptions(c *Config) (httplimit.Options, error) {
	var o httplimit.Options
	var errs fieldErrors
	fail := func(path, msg string) { errs = append(errs, &fieldError{path, msg}) }
	proxies, err := httplimit.ParseProxies(c.Server.TrustedProxies)
	if err != nil {
		fail("server.trusted_proxies", err.Error())
	}
	o.TrustedProxies = proxies
	h := &c.HTTP
	switch strings.ToLower(h.ForwardedHeader) {
	case "", "x-forwarded-for":
		o.ForwardedHeader = httplimit.XForwardedFor
	case "forwarded":
		o.ForwardedHeader = httplimit.Forwarded
	default:
		fail("http.forwarded_header", fmt.Sprintf("%q: want x-forwarded-for or forwarded", h.ForwardedHeader))
	}
	if _, ok := server.ForwardAuthProxies[h.ForwardAuth]; !ok {
		fail("http.forward_auth", fmt.Sprintf("%q: want traefik, caddy, nginx, haproxy or envoy", h.ForwardAuth))
	}
	o.UserHeader = h.UserHeader
	if h.RetryJitter != "" {
		d, err := time.ParseDuration(h.RetryJitter)
		if err != nil || d < 0 {
			fail("http.retry_jitter", fmt.Sprintf("%q is not a duration like 1s", h.RetryJitter))
		}
		o.RetryJitter = d
		if d == 0 {
			o.RetryJitter = -1
		}
	}
	for _, a := range h.Actions {
		o.Actions = append(o.Actions, httplimit.Action{Pattern: a.Match, Name: a.Action})
	}
	o.StrictPaths = h.StrictPaths
	if j := h.JWT; j != nil {
		jwt := &httplimit.JWT{UserClaim: j.UserClaim, TenantClaim: j.TenantClaim, Issuer: j.Issuer, Audience: j.Audience}
		if j.Leeway != "" {
			d, err := time.ParseDuration(j.Leeway)
			if err != nil || d < 0 {
				fail("http.jwt.leeway", fmt.Sprintf("%q is not a duration like 30s", j.Leeway))
			}
			jwt.Leeway = d
		}
		if len(j.Keys) == 0 {
			fail("http.jwt.keys", "at least one key is needed")
		}
		for i, k := range j.Keys {
			key, err := jwtKey(k)
			if err != nil {
				fail(fmt.Sprintf("http.jwt.keys[%d]", i), err.Error())
				continue
			}
			jwt.Keys = append(jwt.Keys, key)
		}
		o.JWT = jwt
	}
	groups, err := shedGroups(c)
	var fe *fieldError
	switch {
	case errors.As(err, &fe):
		errs = append(errs, fe)
	case err != nil:
		fail("shedding", err.Error())
	}
	o.Shedding = groups
	if len(errs) > 0 {
		return o, errs
	}
	return o, nil
}

func jwtKey(k JWTKeyConfig) (httplimit.JWTKey, error) {
	key := httplimit.JWTKey{ID: k.ID, Alg: k.Alg}
	if k.Alg == "HS256" {
		if k.PublicKey != "" || k.PublicKeyFile != "" {
			return key, fmt.Errorf("an HS256 key has a secret, not a public key")
		}
		key.Secret = []byte(k.Secret)
		return key, nil
	}
	if k.Secret != "" {
		return key, fmt.Errorf("a %s key has a public key, not a secret", k.Alg)
	}
	data := []byte(k.PublicKey)
	if k.PublicKeyFile != "" {
		if k.PublicKey != "" {
			return key, fmt.Errorf("public_key and public_key_file: give one")
		}
		b, err := yamlconf.ReadFile(k.PublicKeyFile, 1<<20)
		if err != nil {
			return key, err
		}
		data = b
	}
	block, _ := pem.Decode(data)
	if block == nil {
		return key, fmt.Errorf("the public key is not PEM (-----BEGIN PUBLIC KEY-----)")
	}
	pub, err := x509.ParsePKIXPublicKey(block.Bytes)
	if err != nil {
		return key, fmt.Errorf("the public key: %v", err)
	}
	key.Public = pub
	return key, nil
}
