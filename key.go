package admit

import (
	"strconv"
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
