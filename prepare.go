package admit

import (
	"unsafe"

	"github.com/admitdev/admit/internal/slots"
)

// A store finds the state of a charge by a hash of its key, and places a
// tenant's keys together by a hash of the key's tenant. Both read the key's
// bytes, which for a store of millions of keys is a cache miss of its own:
// a charge prepared once carries both hashes (in its slot, see package
// slots), and a store that decides it reads neither the key nor its tenant
// again. A Rule keeps what deciding by it derives in a slot too.

func init() {
	slots.RuleOffset = unsafe.Offsetof(Rule{}.prepared)
	slots.ChargeOffset = unsafe.Offsetof(Charge{}.prepared)
	slots.TenantOf = func(key string) string {
		if k, err := parseKey(key); err == nil {
			return k.Tenant
		}
		return key // a key Key did not make is its own tenant
	}
}
