// Command hierarchy runs a three-scope limit (user, tenant, global, all or
// nothing) with the Charge-level API on the embedded
// memory store: users of one tenant hammer it for a second, and the program
// prints how many requests each scope let through.
//
//	go run ./examples/hierarchy
package main

import (
	"context"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/admitdev/admit"
	"github.com/admitdev/admit/memstore"
)

func main() {
	store := memstore.New(nil)
	defer store.Close()

	user := &admit.Rule{Name: "user-requests", Algorithm: admit.TokenBucket, Rate: admit.PerSecond(100), Burst: 50}
	tenant := &admit.Rule{Name: "tenant-requests", Algorithm: admit.TokenBucket, Rate: admit.PerSecond(1000), Burst: 200}
	global := &admit.Rule{Name: "global-requests", Algorithm: admit.TokenBucket, Rate: admit.PerSecond(10000), Burst: 1000}

	const users = 20
	var mu sync.Mutex
	admitted, deniedBy := map[string]int{}, map[string]int{}
	start := time.Now()
	var wg sync.WaitGroup
	for u := range users {
		wg.Add(1)
		go func() {
			defer wg.Done()
			name := fmt.Sprintf("user-%02d", u)
			charges := []admit.Charge{
				{Key: admit.Key{Scope: "user", Tenant: "acme", Subject: name}.String(), Rule: user, Cost: 1},
				{Key: admit.Key{Scope: "tenant", Tenant: "acme"}.String(), Rule: tenant, Cost: 1},
				{Key: admit.Key{Scope: "global"}.String(), Rule: global, Cost: 1},
			}
			var d admit.Decision
			for time.Since(start) < time.Second {
				if err := store.Decide(context.Background(), charges, &d); err != nil {
					fmt.Fprintln(os.Stderr, err)
					os.Exit(1)
				}
				mu.Lock()
				if d.Allowed {
					admitted[name]++
				} else {
					deniedBy[d.DeniedBy]++
				}
				mu.Unlock()
				time.Sleep(time.Millisecond) // each user offers about 1000/s
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	total := 0
	for _, n := range admitted {
		total += n
	}
	fmt.Printf("%d users of tenant acme for %v\n", users, elapsed.Round(time.Millisecond))
	fmt.Printf("admitted %d requests (tenant bound: 200 + 1000/s × elapsed = %d)\n", total, 200+int(elapsed.Seconds()*1000))
	fmt.Printf("user-00 admitted %d (user bound: 50 + 100/s × elapsed = %d)\n", admitted["user-00"], 50+int(elapsed.Seconds()*100))
	fmt.Printf("refusals by rule: %v\n", deniedBy)
	fmt.Printf("live keys in the store: %d\n", store.Stats().Keys)
}
