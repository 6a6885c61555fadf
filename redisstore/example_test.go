package redisstore_test

import (
	"fmt"
	"time"

	"github.com/admitdev/admit"
	"github.com/admitdev/admit/redisstore"
)

// A limit the Redis store cannot decide — here a window longer than the
// about 52 days its arithmetic allows — is refused when the Limiter is
// made (the store is an engine.RuleChecker), not at every request. The
// store is dialled lazily, so nothing here needs a Redis.
func ExampleStore_CheckRule() {
	cfg, err := redisstore.ParseURL("redis://127.0.0.1:6379/0")
	if err != nil {
		panic(err)
	}
	store, err := redisstore.DialLazy(cfg, nil)
	if err != nil {
		panic(err)
	}
	defer store.Close()
	_, err = admit.NewLimiter(store, admit.Window("quarterly", 1000, 90*24*time.Hour))
	fmt.Println(err)
	l, err := admit.NewLimiter(store, admit.Window("daily", 1000, 24*time.Hour))
	fmt.Println(err)
	l.Close()
	// Output:
	// rule "quarterly": window of 2160h0m0s is longer than the Redis store's 1250h59m59s
	// <nil>
}
