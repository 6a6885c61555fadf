package admit

import (
	"strconv"
	"strings"
)

// Key identifies one bucket: the scope it is counted in, the tenant, the
// subject within the scope (a user id, an IP address, an API key hash, a
// session id; empty for tenant and global scopes), the action and the rule.
//
// Its encoding is injective: two different Keys never encode to the same
// string, whatever bytes their fields hold, because every field is written
// as its length in decimal, a colon, and its bytes. The encoding is also
// readable, which helps when looking at a store:
//
//	Key{Scope: "user", Tenant: "acme", Subject: "alice", Action: "search", Rule: "search-floor"}
//	→ "4:user4:acme5:alice6:search12:search-floor"
type Key struct {
	Scope   string
	Tenant  string
	Subject string
	Action  string
	Rule    string
}

// String returns the encoding of k.
func (k Key) String() string {
	n := len(k.Scope) + len(k.Tenant) + len(k.Subject) + len(k.Action) + len(k.Rule) + 5*3
	return string(k.Append(make([]byte, 0, n)))
}

// Append appends the encoding of k to dst and returns the extended slice. It
// does not allocate when dst has room.
func (k Key) Append(dst []byte) []byte {
	for _, f := range [...]string{k.Scope, k.Tenant, k.Subject, k.Action, k.Rule} {
		dst = strconv.AppendInt(dst, int64(len(f)), 10)
		dst = append(dst, ':')
		dst = append(dst, f...)
	}
	return dst
}

// parseKey decodes a string made by Key.String.
func parseKey(s string) (Key, error) {
	var f [5]string
	rest := s
	for i := range f {
		n, tail, ok := strings.Cut(rest, ":")
		size, err := strconv.Atoi(n)
		if !ok || err != nil || size < 0 || size > len(tail) || (len(n) > 1 && n[0] == '0') || n[0] == '+' || n[0] == '-' {
			return Key{}, Errorf(CodeInvalid, "key %q: field %d is not length-prefixed", s, i+1)
		}
		f[i], rest = tail[:size], tail[size:]
	}
	if rest != "" {
		return Key{}, Errorf(CodeInvalid, "key %q: trailing bytes", s)
	}
	return Key{Scope: f[0], Tenant: f[1], Subject: f[2], Action: f[3], Rule: f[4]}, nil
}
