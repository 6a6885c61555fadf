// Command limiter limits users, their tenant and everyone together, all or
// nothing: user 100 requests a second (bursts of 50), tenant 1,000 (bursts
// of 200), global 10,000 (bursts of 1,000). A request counts against all
// three or none, so a user refused by its own limit costs the tenant
// nothing.
//
//	go run ./examples/limiter
//
// Five users of one tenant each ask for 60 requests at once: each gets 50
// (its burst) until the tenant's 200 run out.
package main

import (
	"context"
	"fmt"
	"io"
	"log"
	"os"

	"github.com/admitdev/admit"
	"github.com/admitdev/admit/memstore"
)

func main() {
	store := memstore.New(nil)
	defer store.Close()
	if err := run(store, os.Stdout); err != nil {
		log.Fatal(err)
	}
}

func run(store admit.Store, out io.Writer) error {
	limiter, err := admit.NewLimiter(store,
		admit.Bucket("user", admit.PerSecond(100), 50).Per(admit.PerTenant, admit.PerUser),
		admit.Bucket("tenant", admit.PerSecond(1000), 200).Per(admit.PerTenant),
		admit.Bucket("global", admit.PerSecond(10000), 1000),
	)
	if err != nil {
		return err
	}
	ctx := context.Background()
	for _, user := range []string{"alice", "bob", "carol", "dave", "erin"} {
		admitted, deniedBy := 0, map[string]int{}
		for range 60 {
			d, err := limiter.Allow(ctx, admit.Who{Tenant: "acme", User: user})
			if err != nil {
				return err
			}
			if d.Allowed {
				admitted++
			} else {
				deniedBy[d.DeniedBy]++
			}
		}
		fmt.Fprintf(out, "%-5s admitted %2d, refused by user %2d, by tenant %2d\n", user, admitted, deniedBy["user"], deniedBy["tenant"])
	}
	return nil
}
