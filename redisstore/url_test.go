package redisstore_test

import (
	"net/url"
	"strings"
	"testing"

	"github.com/admitdev/admit/redisstore"
)

// TestRedact: the credentials of every form of store URL, percent-encoded
// or not, well formed or not, are hidden; the hosts, a Sentinel master's
// name, the database and the TLS settings are shown.
func TestRedact(t *testing.T) {
	for in, want := range map[string]string{
		"redis://h:1/0":                                      "redis://h:1/0",
		"redis://pw@h:1":                                     "redis://***@h:1",
		"redis://u:pw@h:1/2":                                 "redis://***@h:1/2",
		"redis://:pw/with/slashes@h:1/0":                     "redis://***@h:1/0",
		"redis://u:pw?and=query@h:1":                         "redis://***@h:1",
		"redis://u:p@ss#x@h:1":                               "redis://***@h:1",
		"redis://u:p%2Fw%3F@h:1":                             "redis://***@h:1",
		"redis+sentinel://m@h1,h2":                           "redis+sentinel://m@h1,h2",
		"redis+sentinel://:pw@m@h1":                          "redis+sentinel://***@m@h1",
		"redis+sentinel://u:p/w?x@m@h1/1":                    "redis+sentinel://***@m@h1/1",
		"redis+sentinel://mymaster:pw@h1":                    "redis+sentinel://***@h1",
		"redis+sentinel://:pw@m:pw2@h1":                      "redis+sentinel://***@***@h1",
		"redis+sentinel://m%3Apw@h1":                         "redis+sentinel://***@h1",
		"redis+cluster://:p/w@a:1,b:2":                       "redis+cluster://***@a:1,b:2",
		"rediss://u:pw@h:1/0?tls_ca_file=/ca.pem":            "rediss://***@h:1/0?tls_ca_file=/ca.pem",
		"rediss://h:1?password=pw&tls_server_name=r.example": "rediss://h:1?***&tls_server_name=r.example",
		"rediss://h:1?pw":                                    "rediss://h:1?***",
		"user:pw@h":                                          "***",
		"memcached://u:pw@h":                                 "memcached://***@h",
	} {
		if got := redisstore.Redact(in); got != want {
			t.Errorf("Redact(%q) = %q, want %q", in, got, want)
		}
	}
}

// FuzzRedact: whatever a password holds ('/', '?', '#', '@', '%', a
// line break) and whichever form the URL takes (standalone, Sentinel,
// Cluster, TLS, with a user or without, a database, a query; a Sentinel
// master's name followed by ":password"), neither Redact nor an error of
// ParseURL shows it, encoded or not, nor does a Config it parses to.
func FuzzRedact(f *testing.F) {
	for _, s := range [][2]string{{"", "pw"}, {"admit", "p/w?x"}, {"u", "p@ss#w%zz"}, {"", "a%2Fb"}, {"u", "x\ny:z"}} {
		f.Add(uint8(0), s[0], s[1], "mymaster", "0", "tls_ca_file=/ca.pem")
		f.Add(uint8(3), s[0], s[1], "m", "", "")
		f.Add(uint8(0x42), "", s[1], "mymaster", "", "")
	}
	schemes := []string{"redis", "rediss", "redis+sentinel", "rediss+sentinel", "redis+cluster", "rediss+cluster", "memcached"}
	f.Fuzz(func(t *testing.T, form uint8, user, pass, master, db, query string) {
		const mark = "Zq"
		for _, s := range []string{user, master, db, query} {
			if strings.Contains(s, mark) {
				return // the secret could be read there, not from the password
			}
		}
		secret := mark + pass + mark
		scheme := schemes[int(form)%len(schemes)]
		var b strings.Builder
		b.WriteString(scheme + "://")
		if user != "" {
			b.WriteString(user + ":")
		}
		encoded := form&0x80 != 0
		if encoded {
			b.WriteString(url.PathEscape(secret))
		} else {
			b.WriteString(secret)
		}
		b.WriteString("@")
		if strings.Contains(scheme, "sentinel") {
			if form&0x40 != 0 {
				// The password after the master's name, as
				// "master:password", without credentials before it.
				b.Reset()
				b.WriteString(scheme + "://" + master + ":")
				if encoded {
					b.WriteString(url.PathEscape(secret))
				} else {
					b.WriteString(secret)
				}
				b.WriteString("@")
			} else {
				b.WriteString(master + "@")
			}
		}
		b.WriteString("h1:6379,h2:6380")
		if db != "" {
			b.WriteString("/" + db)
		}
		if query != "" {
			b.WriteString("?" + query)
		}
		u := b.String()
		shown := []string{secret, url.PathEscape(secret), url.QueryEscape(secret)}
		if r := redisstore.Redact(u); containsAny(r, shown) {
			t.Errorf("Redact(%q) = %q shows the password", u, r)
		}
		c, err := redisstore.ParseURL(u)
		if err != nil && containsAny(err.Error(), shown) {
			t.Errorf("ParseURL(%q): %v shows the password", u, err)
		}
		if err == nil && containsAny(c.String(), shown) {
			t.Errorf("ParseURL(%q) = %s, which shows the password", u, c)
		}
	})
}

func containsAny(s string, subs []string) bool {
	for _, sub := range subs {
		if strings.Contains(s, sub) {
			return true
		}
	}
	return false
}
