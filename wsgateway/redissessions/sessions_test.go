package redissessions_test

import (
	"context"
	"testing"
	"time"

	"github.com/admitdev/admit/redisstore"
	"github.com/admitdev/admit/redistest"
	"github.com/admitdev/admit/wsgateway"
	"github.com/admitdev/admit/wsgateway/redissessions"
	"github.com/admitdev/admit/wsgateway/sessionstest"
)

// open returns two servers' sessions on the deployment at url.
func open(url string) func(t *testing.T) (a, b wsgateway.Sessions) {
	return func(t *testing.T) (a, b wsgateway.Sessions) {
		server := func() wsgateway.Sessions {
			st, err := redisstore.Open(context.Background(), url, &redisstore.Options{Timeout: 10 * time.Second})
			if err != nil {
				t.Fatal(err)
			}
			ss := redissessions.New(st)
			t.Cleanup(func() { ss.Close(); st.Close() })
			return ss
		}
		return server(), server()
	}
}

func TestSessionsStandalone(t *testing.T) {
	srv := redistest.Start(t)
	sessionstest.Run(t, open("redis://"+srv.Addr))
}

func TestSessionsCluster(t *testing.T) {
	nodes := redistest.StartCluster(t, 3)
	sessionstest.Run(t, open("redis+cluster://"+nodes[0].Addr+","+nodes[1].Addr))
}
