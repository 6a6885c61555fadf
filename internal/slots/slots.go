// Package slots holds what an admit.Rule and an admit.Charge keep of
// their preparation, for the engine of this module: a rule's derived
// parameters (Rule) and a charge's key hashes (Key). Package admit
// declares them as the Prepared fields of its Rule and Charge, opaque to
// a user, which the engine fills and reads like any other field.
package slots

import (
	"hash/maphash"
	"strconv"
	"strings"
	"sync/atomic"
	"unsafe"
)

// Rule is the slot of a rule's preparation: the engine's, stored the
// first time a store decides by the rule and again when its parameters
// have changed. The zero Rule holds none.
type Rule struct{ v atomic.Value }

// Load returns the preparation r holds, or nil.
func (r *Rule) Load() any { return r.v.Load() }

// Store makes p r's preparation; every preparation is of one type.
func (r *Rule) Store(p any) { r.v.Store(p) }

// Key is what preparing a charge computed of its key. It holds while the
// charge's key is the string it was computed from (see Holds). The zero
// Key holds nothing, and the key is hashed on every use.
type Key struct {
	data      *byte // the key it was computed from: its bytes' address
	len       int
	hasTenant bool
	hash      uint64
	tenant    uint64
}

// Of returns the prepared hashes of key, whose tenant its maker knows (""
// for a key of no tenant): a Limiter and a policy build their keys and
// know their tenants.
func Of(key, tenant string) Key {
	k := Key{data: unsafe.StringData(key), len: len(key), hash: Hash(key)}
	if tenant != "" {
		k.tenant, k.hasTenant = TenantHash(tenant), true
	}
	return k
}

// Holds reports whether k was prepared from key: the very string, the
// same bytes at the same address, which a Go string, immutable, cannot
// change. Its address is compared, never followed (unsafe.StringData
// reads a string's address and nothing else), so that a prepared charge's
// check costs two comparisons rather than a comparison of its bytes.
func (k *Key) Holds(key string) bool {
	return k.hash != 0 && k.data == unsafe.StringData(key) && k.len == len(key)
}

// KeyHash returns the hash of key, as k holds it when it was prepared from
// key.
func (k *Key) KeyHash(key string) uint64 {
	if k.Holds(key) {
		return k.hash
	}
	return Hash(key)
}

// TenantHash returns the hash of key's tenant and whether it has one, as
// k holds it when it was prepared from key; held is false when k was not,
// and the caller finds the tenant itself.
func (k *Key) TenantHash(key string) (hash uint64, ok, held bool) {
	if k.Holds(key) {
		return k.tenant, k.hasTenant, true
	}
	return 0, false, false
}

// Fields decodes a key admit.Key made (its String) into its five fields,
// scope, tenant, subject, action and rule, each written as its length in
// decimal, a colon and its bytes; false for a key it did not make.
func Fields(s string) (f [5]string, ok bool) {
	rest := s
	for i := range f {
		n, tail, found := strings.Cut(rest, ":")
		size, err := strconv.Atoi(n)
		if !found || err != nil || size < 0 || size > len(tail) || (len(n) > 1 && n[0] == '0') || n[0] == '+' || n[0] == '-' {
			return f, false
		}
		f[i], rest = tail[:size], tail[size:]
	}
	return f, rest == ""
}

// seed makes Hash random per process, so that no one can choose keys that
// collide.
var seed = maphash.MakeSeed()

// Hash returns a 64-bit hash of key, never 0. It is the same for equal
// keys within a process, and random across processes: stores of one
// process index their state by it.
func Hash(key string) uint64 {
	h := maphash.String(seed, key)
	if h == 0 {
		h = 1
	}
	return h
}

// TenantHash returns a 64-bit hash of tenant, the same in every process
// and version (FNV-1a), so that stores shared by several processes can
// place a tenant's keys together.
func TenantHash(tenant string) uint64 {
	h := uint64(14695981039346656037)
	for i := 0; i < len(tenant); i++ {
		h ^= uint64(tenant[i])
		h *= 1099511628211
	}
	return h
}
