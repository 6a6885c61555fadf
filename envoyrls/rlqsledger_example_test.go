package envoyrls_test

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/admitdev/admit/envoyrls"
)

// A QuotaLedger's Update reads a limit's state, lets the caller compute the
// next one, and stores it all or nothing: here, a count of updates.
func ExampleMemoryLedger() {
	l := envoyrls.NewMemoryLedger(nil)
	for range 3 {
		_ = l.Update(context.Background(), "limit", time.Minute, func(_ time.Time, state []byte) ([]byte, bool, error) {
			n, _ := strconv.Atoi(string(state))
			return []byte(strconv.Itoa(n + 1)), true, nil
		})
	}
	_ = l.Update(context.Background(), "limit", time.Minute, func(_ time.Time, state []byte) ([]byte, bool, error) {
		fmt.Println(string(state))
		return nil, false, nil
	})
	// Output: 3
}
