// Package slots reaches what an admit.Rule and an admit.Charge keep of
// their preparation, for the engine of this module: a rule's derived
// parameters, a charge's key hashes. Both live in unexported fields, so
// that the preparation stays out of the package a user reads; package
// admit records the fields' offsets here when it starts, and the engine
// reaches them with one addition and no lookup.
package slots

import (
	"hash/maphash"
	"unsafe"
)

// RuleOffset and ChargeOffset are the offsets of the slots within a Rule
// and a Charge, set by package admit's initialization, which runs before
// any package that imports admit.
var RuleOffset, ChargeOffset uintptr

// Rule returns the preparation slot of the rule r points to.
func Rule(r unsafe.Pointer) *unsafe.Pointer {
	return (*unsafe.Pointer)(unsafe.Add(r, RuleOffset))
}

// Charge returns the prepared key of the charge c points to.
func Charge(c unsafe.Pointer) *Key {
	return (*Key)(unsafe.Add(c, ChargeOffset))
}

// Key is what preparing a charge computed of its key. It holds while the
// charge's key is the very string it was computed from: the same bytes at
// the same address, which a Go string, immutable, cannot change.
type Key struct {
	data      *byte
	len       uint32
	hasTenant bool
	hash      uint64
	tenant    uint64
}

// TenantOf returns the tenant of key, a key package admit made, or key
// itself for one it did not make; set by package admit.
var TenantOf func(key string) string

// Prepare returns the prepared hashes of key: a key too long to prepare
// (past 4 GiB) prepares nothing and is hashed on every use.
func Prepare(key string) Key { return Of(key, TenantOf(key)) }

// Of is Prepare for a key whose tenant is known ("" for none): a Limiter
// builds its keys and knows their tenants.
func Of(key, tenant string) Key {
	if uint64(len(key)) > 1<<32-1 {
		return Key{}
	}
	k := Key{data: unsafe.StringData(key), len: uint32(len(key)), hash: Hash(key)}
	if tenant != "" {
		k.tenant, k.hasTenant = TenantHash(tenant), true
	}
	return k
}

// Holds reports whether k was prepared from key.
func (k *Key) Holds(key string) bool {
	return k.hash != 0 && k.data == unsafe.StringData(key) && int(k.len) == len(key)
}

// KeyHash returns the hash of key, as k holds it when it was prepared from
// key.
func (k *Key) KeyHash(key string) uint64 {
	if k.Holds(key) {
		return k.hash
	}
	return Hash(key)
}

// TenantHash returns the hash of key's tenant and whether it has one, as k
// holds it when it was prepared from key.
func (k *Key) TenantHash(key string) (uint64, bool) {
	if k.Holds(key) {
		return k.tenant, k.hasTenant
	}
	if t := TenantOf(key); t != "" {
		return TenantHash(t), true
	}
	return 0, false
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
