package policy_test

import (
	"testing"

	"github.com/admitdev/admit/policy"
	"github.com/admitdev/admit/policy/idemtest"
)

func TestMemoryIdempotencyConformance(t *testing.T) {
	idemtest.Run(t, func(t *testing.T, perScope int) policy.IdempotencyStore {
		return policy.NewMemoryIdempotency(perScope, 0)
	})
}
