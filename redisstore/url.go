package redisstore

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"net/url"
	"os"
	"strconv"
	"strings"

	"github.com/redis/rueidis"

	"github.com/admitdev/admit"
	"github.com/admitdev/admit/internal/redishook"
)

// Mode is how a Redis deployment is reached.
type Mode string

// The modes of a Redis deployment, as the configuration's
// store.redis.mode names them.
const (
	Standalone Mode = "standalone"
	Sentinel   Mode = "sentinel"
	Cluster    Mode = "cluster"
)

// Config describes a Redis deployment.
type Config struct {
	Mode       Mode
	Addrs      []string // host:port of the server, the sentinels or cluster nodes
	MasterName string   // Sentinel only
	DB         int      // standalone and Sentinel only
	// Username names an ACL user (Redis 6+); empty is the default user.
	Username string
	Password string
	// TLS, if set, reaches every server (sentinels and cluster nodes
	// too) over TLS.
	TLS *TLS
}

// TLS says how to reach Redis over TLS, as managed services with
// encryption in transit (ElastiCache, Redis Cloud, Azure Cache) require.
// The zero value checks the server's certificate against the system's
// roots and the name it is dialled by.
type TLS struct {
	// CAFile is a PEM bundle to check the server's certificate with,
	// instead of the system's roots.
	CAFile string
	// CertFile and KeyFile are a client certificate and its key (PEM),
	// for servers that ask for one (tls-auth-clients).
	CertFile, KeyFile string
	// ServerName is the name the certificate must have; default the
	// host each server is dialled by.
	ServerName string
	// SkipHostnameVerification checks the certificate's chain but not
	// its name, for deployments whose certificates name no address the
	// clients dial (envoyproxy/ratelimit's
	// REDIS_TLS_SKIP_HOSTNAME_VERIFICATION).
	SkipHostnameVerification bool
}

// config builds the tls.Config t describes, reading its files.
func (t *TLS) config() (*tls.Config, error) {
	c := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: t.ServerName}
	if t.CAFile != "" {
		pem, err := os.ReadFile(t.CAFile)
		if err != nil {
			return nil, fmt.Errorf("TLS CA: %w", err)
		}
		c.RootCAs = x509.NewCertPool()
		if !c.RootCAs.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("TLS CA %s: no PEM certificate in it", t.CAFile)
		}
	}
	if (t.CertFile == "") != (t.KeyFile == "") {
		return nil, fmt.Errorf("TLS client certificate: give both the certificate and its key")
	}
	if t.CertFile != "" {
		pair, err := tls.LoadX509KeyPair(t.CertFile, t.KeyFile)
		if err != nil {
			return nil, fmt.Errorf("TLS client certificate: %w", err)
		}
		c.Certificates = []tls.Certificate{pair}
	}
	if t.SkipHostnameVerification {
		roots := c.RootCAs
		c.InsecureSkipVerify = true // the chain is checked below, the name is not
		c.VerifyConnection = func(cs tls.ConnectionState) error {
			if len(cs.PeerCertificates) == 0 {
				return fmt.Errorf("redisstore: the server sent no certificate")
			}
			inter := x509.NewCertPool()
			for _, ic := range cs.PeerCertificates[1:] {
				inter.AddCert(ic)
			}
			_, err := cs.PeerCertificates[0].Verify(x509.VerifyOptions{Roots: roots, Intermediates: inter})
			return err
		}
	}
	return c, nil
}

// ParseURL parses a --store URL:
//
//	redis://[user:password@]host:port[/db]
//	redis+sentinel://[user:password@]master@host:port,host:port[/db]
//	redis+cluster://[user:password@]host:port,host:port,host:port
//
// The port defaults to 6379 (26379 for sentinels). The schemes rediss,
// rediss+sentinel and rediss+cluster reach every server over TLS, with the
// query parameters tls_ca_file, tls_cert_file, tls_key_file,
// tls_server_name and tls_skip_hostname_verification=true (see TLS):
//
//	rediss://admit:secret@redis.example:6380/0?tls_ca_file=/etc/admit/ca.pem
//
// A user name or password holding '/', '?' or '%' must percent-encode
// them (%2F, %3F, %25), as in any URL: an '@' after a '/' or '?' is
// refused rather than guessed at. Errors show the URL as Redact does.
func ParseURL(s string) (Config, error) {
	bad := func(format string, args ...any) (Config, error) {
		return Config{}, admit.Errorf(admit.CodeInvalid, "store URL %q: "+format, append([]any{Redact(s)}, args...)...)
	}
	scheme, rest, ok := strings.Cut(s, "://")
	if !ok {
		return bad("want redis://host:port/db, redis+sentinel://master@h1:p,h2:p or redis+cluster://h1:p,h2:p")
	}
	if end := strings.IndexAny(rest, "/?"); end >= 0 && strings.LastIndexByte(rest, '@') > end {
		// Read as a URL, the credentials would end at that '/' or '?',
		// and parts of the password would be read (and quoted) as
		// hosts, a database or a query.
		return bad("an \"@\" after a \"/\" or \"?\": percent-encode those characters in a user name or password (%%2F, %%3F), and \"@\" in a query value (%%40)")
	}
	var c Config
	defPort := "6379"
	base, secure := strings.CutPrefix(scheme, "rediss")
	if secure {
		base = "redis" + base
		c.TLS = &TLS{}
	}
	switch base {
	case "redis":
		c.Mode = Standalone
	case "redis+sentinel":
		c.Mode, defPort = Sentinel, "26379"
	case "redis+cluster":
		c.Mode = Cluster
	default:
		return bad("scheme %q: want redis, redis+sentinel or redis+cluster (rediss… for TLS)", scheme)
	}
	rest, query, hasQuery := strings.Cut(rest, "?")
	if hasQuery {
		if c.TLS == nil {
			return bad("query parameters are TLS settings: use rediss://")
		}
		q, err := url.ParseQuery(query)
		if err != nil {
			return bad("query: %v", err)
		}
		for k, v := range q {
			val := v[len(v)-1]
			switch k {
			case "tls_ca_file":
				c.TLS.CAFile = val
			case "tls_cert_file":
				c.TLS.CertFile = val
			case "tls_key_file":
				c.TLS.KeyFile = val
			case "tls_server_name":
				c.TLS.ServerName = val
			case "tls_skip_hostname_verification":
				b, err := strconv.ParseBool(val)
				if err != nil {
					return bad("tls_skip_hostname_verification=%q: want true or false", val)
				}
				c.TLS.SkipHostnameVerification = b
			default:
				what := "an unknown query parameter" // its name might be a secret
				if strings.HasPrefix(k, "tls_") {
					what = "unknown query parameter " + strconv.Quote(k)
				}
				return bad("%s (tls_ca_file, tls_cert_file, tls_key_file, tls_server_name, tls_skip_hostname_verification)", what)
			}
		}
	}
	hosts, path, _ := strings.Cut(rest, "/")
	if at := strings.LastIndexByte(hosts, '@'); at >= 0 {
		cred := hosts[:at]
		hosts = hosts[at+1:]
		if c.Mode == Sentinel {
			// the last @-part before the hosts is the master's name
			if i := strings.LastIndexByte(cred, '@'); i >= 0 {
				cred, c.MasterName = cred[:i], cred[i+1:]
			} else {
				cred, c.MasterName = "", cred
			}
		}
		if cred != "" {
			u, err := url.PathUnescape(cred)
			if err != nil {
				// The error quotes the escape, a piece of the password.
				return bad("credentials: a %% that begins no escape; percent-encode a %% in a user name or password as %%25")
			}
			c.Username, c.Password, _ = strings.Cut(u, ":")
			if !strings.Contains(u, ":") {
				c.Username, c.Password = "", u
			}
		}
	}
	if c.Mode == Sentinel && c.MasterName == "" {
		return bad("a sentinel URL names the master: redis+sentinel://mymaster@h1:26379,h2:26379")
	}
	if c.Mode == Sentinel && strings.Contains(c.MasterName, ":") {
		// "mymaster:secret@h1" reads as a master's name, but is most
		// likely a name and a password, which would then be shown
		// wherever the master is named.
		return bad("the master's name holds a \":\", as a password would: the credentials come before the master's name, redis+sentinel://[user:]password@mymaster@h1:26379")
	}
	for _, h := range strings.Split(hosts, ",") {
		if h == "" {
			continue
		}
		host, port, err := net.SplitHostPort(h)
		if err != nil {
			host, port = h, defPort
		}
		if host == "" {
			return bad("address %q has no host", h)
		}
		if p, err := strconv.Atoi(port); err != nil || p < 1 || p > 65535 {
			return bad("address %q: port must be from 1 to 65535", h)
		}
		c.Addrs = append(c.Addrs, net.JoinHostPort(host, port))
	}
	if len(c.Addrs) == 0 {
		return bad("no address")
	}
	if c.Mode == Standalone && len(c.Addrs) > 1 {
		return bad("a standalone server has one address; use redis+cluster:// or redis+sentinel:// for several")
	}
	if path != "" {
		if c.Mode == Cluster {
			return bad("a cluster has no database number")
		}
		db, err := strconv.Atoi(path)
		if err != nil || db < 0 || db > 15 {
			return bad("database %q: want a number from 0 to 15", path)
		}
		c.DB = db
	}
	return c, nil
}

// Redact returns a store URL with its credentials hidden, for logs and
// error messages: everything between the scheme and the URL's last '@',
// but a Sentinel master's name (the last '@'-part before the hosts), is
// "***", and so is every query parameter but the TLS settings ParseURL
// reads. The master's name is shown only when it is a plain name
// (letters, digits, '.', '-' and '_', as master names are):
// "mymaster:secret@h1" is "***@h1". It holds for a URL that does not parse as
// well: a password may hold '/', '?', '#' or '@' not percent-encoded. A
// string without "://" that holds an '@' is "***" whole.
func Redact(s string) string {
	scheme, rest, ok := strings.Cut(s, "://")
	if !ok {
		if strings.Contains(s, "@") {
			return "***"
		}
		return s
	}
	var b strings.Builder
	b.WriteString(scheme)
	b.WriteString("://")
	if at := strings.LastIndexByte(rest, '@'); at >= 0 {
		cred := rest[:at]
		rest = rest[at+1:]
		if strings.HasSuffix(scheme, "+sentinel") {
			master := cred
			if i := strings.LastIndexByte(cred, '@'); i >= 0 {
				cred, master = cred[:i], cred[i+1:]
			} else {
				cred = ""
			}
			if cred != "" {
				b.WriteString("***@")
			}
			if redishook.PlainName(master) {
				b.WriteString(master)
			} else {
				b.WriteString("***")
			}
			b.WriteByte('@')
		} else {
			b.WriteString("***@")
		}
	}
	rest, query, hasQuery := strings.Cut(rest, "?")
	b.WriteString(rest)
	if !hasQuery {
		return b.String()
	}
	b.WriteByte('?')
	for i, p := range strings.Split(query, "&") {
		if i > 0 {
			b.WriteByte('&')
		}
		if k, _, _ := strings.Cut(p, "="); tlsParam[k] {
			b.WriteString(p)
		} else {
			b.WriteString("***")
		}
	}
	return b.String()
}

// tlsParam are the query parameters of a store URL, which Redact shows.
var tlsParam = map[string]bool{"tls_ca_file": true, "tls_cert_file": true, "tls_key_file": true, "tls_server_name": true, "tls_skip_hostname_verification": true}

// String describes c without its password.
func (c Config) String() string {
	s := string(c.Mode) + " " + strings.Join(c.Addrs, ",")
	if c.MasterName != "" {
		if redishook.PlainName(c.MasterName) {
			s += " master " + c.MasterName
		} else {
			s += " master ***"
		}
	}
	if c.TLS != nil {
		s += " (TLS)"
	}
	if c.Username != "" {
		s += " as " + c.Username
	}
	return s
}

func (c Config) clientOption() (rueidis.ClientOption, error) {
	var tc *tls.Config
	if c.TLS != nil {
		var err error
		if tc, err = c.TLS.config(); err != nil {
			return rueidis.ClientOption{}, admit.Errorf(admit.CodeInvalid, "redisstore: %v", err)
		}
	}
	o := rueidis.ClientOption{
		TLSConfig:    tc,
		InitAddress:  c.Addrs,
		Username:     c.Username,
		Password:     c.Password,
		SelectDB:     c.DB,
		DisableCache: true,
		// Scripts change state: never replay one after a network error,
		// which could charge a request twice.
		DisableRetry: true,
	}
	switch c.Mode {
	case Standalone:
		o.ForceSingleClient = true
	case Sentinel:
		o.Sentinel = rueidis.SentinelOption{MasterSet: c.MasterName, Username: c.Username, Password: c.Password, TLSConfig: tc}
	}
	return o, nil
}
