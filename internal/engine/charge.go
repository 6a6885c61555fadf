package engine

import (
	"github.com/admitdev/admit"
	"github.com/admitdev/admit/internal/slots"
)

// PrepareCharge computes once what a store computes of c on every
// decision: the hash of its key (KeyHash) and of its key's tenant
// (TenantHash), the tenant parsed out of the key (see admit.Key). A
// charge's maker that knows its tenant prepares it with PrepareChargeOf.
// A prepared charge is never wrong, only faster: when c.Key is replaced by
// another string, the hashes no longer hold and are computed afresh.
func PrepareCharge(c *admit.Charge) { c.Prepared = slots.Of(c.Key, tenantOf(c.Key)) }

// PrepareChargeOf is PrepareCharge for a charge whose key's tenant is
// known to its maker ("" for a key of no tenant): the tenant is hashed as
// it is, not parsed back out of the key.
func PrepareChargeOf(c *admit.Charge, tenant string) { c.Prepared = slots.Of(c.Key, tenant) }

// KeyHash returns a 64-bit hash of c.Key, never 0, as PrepareCharge (or
// the Limiter that made c) computed it if it still holds. It is the same
// for equal keys within a process, and random across processes: stores of
// one process index their state by it.
func KeyHash(c *admit.Charge) uint64 { return c.Prepared.KeyHash(c.Key) }

// TenantHash returns a 64-bit hash of the tenant of c.Key, the same in
// every process and version (FNV-1a), so that stores shared by several
// processes can place a tenant's keys together; and whether the key has a
// tenant. The tenant is the one c's maker prepared it with, or else the
// one its key names (see admit.Key); a key admit.Key did not make is its
// own tenant.
func TenantHash(c *admit.Charge) (uint64, bool) {
	if h, ok, held := c.Prepared.TenantHash(c.Key); held {
		return h, ok
	}
	if t := tenantOf(c.Key); t != "" {
		return slots.TenantHash(t), true
	}
	return 0, false
}

// tenantOf returns the tenant of key, a key admit.Key made, or key itself
// for one it did not make.
func tenantOf(key string) string {
	if f, ok := slots.Fields(key); ok {
		return f[1]
	}
	return key
}
