package limitador_test

import (
	"context"
	"fmt"

	"github.com/admitdev/admit/limitador"
	"github.com/admitdev/admit/memstore"
	"github.com/admitdev/admit/policy"
)

// A limits file decided as Limitador decides it: two GETs a minute per
// user, counted in the memory store.
func ExampleLimiter() {
	limits, err := limitador.Parse("limits.yaml", []byte(`
- namespace: shop
  max_value: 2
  seconds: 60
  name: per-user
  conditions: ["descriptors[0]['method'] == 'GET'"]
  variables: ["descriptors[0]['user']"]
`))
	if err != nil {
		fmt.Println(err)
		return
	}
	store := memstore.New(nil)
	defer store.Close()
	lim, err := limitador.New(limitador.Options{Decider: policy.NewDecider(store, 1), Limits: limits})
	if err != nil {
		fmt.Println(err)
		return
	}
	alice := []map[string]string{{"method": "GET", "user": "alice"}}
	for range 3 {
		res, err := lim.Decide(context.Background(), limitador.CheckAndReport, "shop", alice, 1, false)
		if err != nil {
			fmt.Println(err)
			return
		}
		if res.Limited {
			fmt.Println("refused by", res.LimitName)
		} else {
			fmt.Println("admitted")
		}
	}
	// Output:
	// admitted
	// admitted
	// refused by per-user
}
