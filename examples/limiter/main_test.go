package main

import (
	"strings"
	"testing"

	"github.com/admitdev/admit/memstore"
	"github.com/admitdev/admit/storetest"
)

// On a stopped clock nothing refills, so the output is exact.
func TestExample(t *testing.T) {
	store := memstore.New(&memstore.Options{Clock: storetest.NewClock().Now})
	defer store.Close()
	var out strings.Builder
	if err := run(store, &out); err != nil {
		t.Fatal(err)
	}
	want := `alice admitted 50, refused by user 10, by tenant  0
bob   admitted 50, refused by user 10, by tenant  0
carol admitted 50, refused by user 10, by tenant  0
dave  admitted 50, refused by user 10, by tenant  0
erin  admitted  0, refused by user  0, by tenant 60
`
	if out.String() != want {
		t.Errorf("got\n%s\nwant\n%s", out.String(), want)
	}
}
