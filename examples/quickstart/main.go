// Command quickstart decides a request of user alice of tenant acme
// against her own limit and her tenant's, all or nothing.
package main

import (
	"context"
	"fmt"
	"log"

	"github.com/admitdev/admit"
	"github.com/admitdev/admit/memstore"
)

func main() {
	limiter, err := admit.NewLimiter(memstore.New(nil),
		admit.Bucket("user", admit.PerSecond(100), 50).Per(admit.PerTenant, admit.PerUser),
		admit.Bucket("tenant", admit.PerSecond(1000), 200).Per(admit.PerTenant),
	)
	if err != nil {
		log.Fatal(err) // a limit's parameters, with the field at fault
	}
	d, err := limiter.Allow(context.Background(), admit.Who{Tenant: "acme", User: "alice"})
	if err != nil {
		log.Fatal(err) // a Who without a tenant or user, or the store failed
	}
	fmt.Println(d.Allowed, d.Remaining) // true 49: all or nothing, both charged
}
