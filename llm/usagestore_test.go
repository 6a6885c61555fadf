package llm_test

import (
	"testing"

	"github.com/admitdev/admit/llm"
	"github.com/admitdev/admit/llm/usagetest"
)

func TestMemoryUsage(t *testing.T) { usagetest.Run(t, llm.NewMemoryUsage(0, 0)) }
