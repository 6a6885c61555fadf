package admit

import (
	"hash/maphash"
	"math"
	"unsafe"
)

// A store finds the state of a charge by a hash of its key, and places a
// tenant's keys together by a hash of the key's tenant. Both read the key's
// bytes, which for a store of millions of keys is a cache miss of its own:
// a charge prepared once (Prepare) carries both hashes, and a store that
// decides it reads neither the key nor its tenant again.

// keySeed makes keyHash random per process, so that no one can choose keys
// that collide.
var keySeed = maphash.MakeSeed()

// keyHash returns a 64-bit hash of key, never 0. It is the same for equal
// keys within a process, and random across processes: stores of one
// process index their state by it.
func keyHash(key string) uint64 {
	h := maphash.String(keySeed, key)
	if h == 0 {
		h = 1
	}
	return h
}

// keyTenantHash returns a 64-bit hash of the tenant of key (see Key), the same
// in every process and version (FNV-1a), so that stores shared by several
// processes can place a tenant's keys together; and whether key has a
// tenant. A key that Key did not make is its own tenant.
func keyTenantHash(key string) (uint64, bool) {
	tenant := key
	if k, err := ParseKey(key); err == nil {
		tenant = k.Tenant
	}
	if tenant == "" {
		return 0, false
	}
	return tenantHash(tenant), true
}

// tenantHash is keyTenantHash of a key whose tenant is tenant: FNV-1a.
func tenantHash(tenant string) uint64 {
	h := uint64(14695981039346656037)
	for i := 0; i < len(tenant); i++ {
		h ^= uint64(tenant[i])
		h *= 1099511628211
	}
	return h
}

// preparedKey is what Prepare computed of a charge's key. It holds while
// the charge's Key is the very string it was computed from: the same bytes
// at the same address, which a Go string, immutable, cannot change.
type preparedKey struct {
	data      *byte
	len       uint32
	hasTenant bool
	key       uint64
	tenant    uint64
}

// Prepare computes once what a store computes of c on every decision: the
// hash of its key (KeyHash) and of its key's tenant (TenantHash). Charges
// decided many times gain most; policy.Resolve prepares every charge it
// makes. A prepared charge is never wrong, only faster: when c.Key is
// replaced by another string, the hashes no longer hold and are computed
// afresh.
func (c *Charge) Prepare() {
	if uint64(len(c.Key)) > math.MaxUint32 {
		c.prepared = preparedKey{}
		return
	}
	c.prepared = preparedKey{data: unsafe.StringData(c.Key), len: uint32(len(c.Key)), key: keyHash(c.Key)}
	c.prepared.tenant, c.prepared.hasTenant = keyTenantHash(c.Key)
}

func (c *Charge) preparedHolds() bool {
	return c.prepared.key != 0 && c.prepared.data == unsafe.StringData(c.Key) && int(c.prepared.len) == len(c.Key)
}

// KeyHash returns a 64-bit hash of c.Key, never 0, as Prepare computed it
// if it still holds. It is the same for equal keys within a process, and
// random across processes: stores of one process index their state by it.
func (c *Charge) KeyHash() uint64 {
	if c.preparedHolds() {
		return c.prepared.key
	}
	return keyHash(c.Key)
}

// TenantHash returns a 64-bit hash of the tenant of c.Key (see Key), the
// same in every process and version (FNV-1a), so that stores shared by
// several processes can place a tenant's keys together; and whether the
// key has a tenant. A key that Key did not make is its own tenant. It is
// as Prepare computed it if that still holds.
func (c *Charge) TenantHash() (uint64, bool) {
	if c.preparedHolds() {
		return c.prepared.tenant, c.prepared.hasTenant
	}
	return keyTenantHash(c.Key)
}
