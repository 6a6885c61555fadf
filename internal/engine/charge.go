package engine

import (
	"unsafe"

	"github.com/admitdev/admit"
	"github.com/admitdev/admit/internal/slots"
)

// PrepareCharge computes once what a store computes of c on every
// decision: the hash of its key (KeyHash) and of its key's tenant
// (TenantHash). Charges decided many times gain most; policy.Resolve
// prepares every charge it makes. A prepared charge is never wrong, only
// faster: when c.Key is replaced by another string, the hashes no longer
// hold and are computed afresh.
func PrepareCharge(c *admit.Charge) {
	*slots.Charge(unsafe.Pointer(c)) = slots.Prepare(c.Key)
}

// PrepareChargeOf is PrepareCharge for a charge whose key's tenant is
// known to its maker ("" for a key of no tenant): the tenant is hashed as
// it is, not parsed back out of the key.
func PrepareChargeOf(c *admit.Charge, tenant string) {
	*slots.Charge(unsafe.Pointer(c)) = slots.Of(c.Key, tenant)
}

// KeyHash returns a 64-bit hash of c.Key, never 0, as PrepareCharge (or
// the Limiter that made c) computed it if it still holds. It is the same
// for equal keys within a process, and random across processes: stores of
// one process index their state by it.
func KeyHash(c *admit.Charge) uint64 {
	return slots.Charge(unsafe.Pointer(c)).KeyHash(c.Key)
}

// TenantHash returns a 64-bit hash of the tenant of c.Key (see admit.Key),
// the same in every process and version (FNV-1a), so that stores shared
// by several processes can place a tenant's keys together; and whether the
// key has a tenant. A key admit.Key did not make is its own tenant.
func TenantHash(c *admit.Charge) (uint64, bool) {
	return slots.Charge(unsafe.Pointer(c)).TenantHash(c.Key)
}

// The slots are reached by the offsets package admit records when it
// starts, before this package's init: an offset of 0 would read a rule's
// or a charge's first field as its slot.
func init() {
	if slots.RuleOffset == 0 || slots.ChargeOffset == 0 {
		panic("engine: package admit recorded no slot offsets")
	}
}
