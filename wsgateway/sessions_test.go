package wsgateway_test

import (
	"testing"

	"github.com/admitdev/admit/wsgateway"
	"github.com/admitdev/admit/wsgateway/sessionstest"
)

func TestMemorySessionsConformance(t *testing.T) {
	sessionstest.Run(t, func(t *testing.T) (a, b wsgateway.Sessions) {
		s := wsgateway.NewMemorySessions(nil)
		return s, s
	})
}
