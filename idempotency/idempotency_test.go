package idempotency_test

import (
	"testing"

	"github.com/admitdev/admit/idempotency"
	"github.com/admitdev/admit/idempotency/idemtest"
)

func TestMemoryIdempotencyConformance(t *testing.T) {
	idemtest.Run(t, func(t *testing.T, perScope int) idempotency.Store {
		return idempotency.NewMemory(perScope, 0)
	})
}
