package redisstore

import (
	"net"
	"net/url"
	"strconv"
	"strings"

	"github.com/redis/rueidis"

	"github.com/admitdev/admit"
)

// Mode is how a Redis deployment is reached.
type Mode string

// The modes of DESIGN §7 (store.redis.mode).
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
	Username   string
	Password   string
}

// ParseURL parses a --store URL:
//
//	redis://[user:password@]host:port[/db]
//	redis+sentinel://[user:password@]master@host:port,host:port[/db]
//	redis+cluster://[user:password@]host:port,host:port,host:port
//
// The port defaults to 6379 (26379 for sentinels).
func ParseURL(s string) (Config, error) {
	bad := func(format string, args ...any) (Config, error) {
		return Config{}, admit.Errorf(admit.CodeInvalid, "store URL %q: "+format, append([]any{redact(s)}, args...)...)
	}
	scheme, rest, ok := strings.Cut(s, "://")
	if !ok {
		return bad("want redis://host:port/db, redis+sentinel://master@h1:p,h2:p or redis+cluster://h1:p,h2:p")
	}
	var c Config
	defPort := "6379"
	switch scheme {
	case "redis":
		c.Mode = Standalone
	case "redis+sentinel":
		c.Mode, defPort = Sentinel, "26379"
	case "redis+cluster":
		c.Mode = Cluster
	default:
		return bad("scheme %q: want redis, redis+sentinel or redis+cluster", scheme)
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
				return bad("credentials: %v", err)
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

// redact hides a URL's password in error messages.
func redact(s string) string {
	scheme, rest, ok := strings.Cut(s, "://")
	at := strings.IndexByte(rest, '@')
	colon := strings.IndexByte(rest, ':')
	if !ok || at < 0 || colon < 0 || colon > at {
		return s
	}
	return scheme + "://" + rest[:colon] + ":***" + rest[at:]
}

// String describes c without its password.
func (c Config) String() string {
	s := string(c.Mode) + " " + strings.Join(c.Addrs, ",")
	if c.MasterName != "" {
		s += " master " + c.MasterName
	}
	return s
}

func (c Config) clientOption() rueidis.ClientOption {
	o := rueidis.ClientOption{
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
		o.Sentinel = rueidis.SentinelOption{MasterSet: c.MasterName, Username: c.Username, Password: c.Password}
	}
	return o
}
