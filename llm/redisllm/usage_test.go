package redisllm_test

import (
	"context"
	"testing"
	"time"

	"github.com/admitdev/admit/llm/redisllm"
	"github.com/admitdev/admit/llm/usagetest"
	"github.com/admitdev/admit/redisstore"
	"github.com/admitdev/admit/redistest"
)

func TestUsage(t *testing.T) {
	srv := redistest.Start(t)
	s, err := redisstore.Open(context.Background(), "redis://"+srv.Addr, &redisstore.Options{Timeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	// Its days are long past: kept 10,000 days so that they have not
	// expired.
	usagetest.Run(t, redisllm.New(s, 10_000))
}
