package redisstore

import (
	"fmt"
	"strings"
	"testing"

	"github.com/admitdev/admit"
)

// TestSplitIDRefusesForgedIDs: renewing, releasing or cancelling costs two
// Redis commands per tag of the ID, so only IDs of the form this store
// issues, with no more tags than one of its decisions can hold, reach
// Redis.
func TestSplitIDRefusesForgedIDs(t *testing.T) {
	raw := "0123456789abcdef01234567"
	tag1, tag2 := "0123456789abcdef", "fedcba9876543210"
	for _, tc := range []struct {
		id      string
		maxTags int
		tags    int // -1: refused
	}{
		{raw + "." + tag1, 1, 1},
		{raw + ".g", 1, 1},
		{raw + "." + tag1 + ".g", admit.MaxCharges, 2},
		{raw + "." + tag1 + "." + tag2 + ".g", admit.MaxCharges, 3},
		{raw + "." + tag1 + ".g", 1, -1},                      // two tags on a standalone server
		{raw + ".g.g", admit.MaxCharges, -1},                  // a repeated tag
		{raw + "." + tag1 + "." + tag1, admit.MaxCharges, -1}, // a repeated tag
		{raw + ".g." + tag1, admit.MaxCharges, -1},            // the global group comes last
		{raw + "." + strings.ToUpper(tag1), 1, -1},            // not a tag this store writes
		{strings.ToUpper(raw) + "." + tag1, 1, -1},
		{raw + ".", 1, -1},
		{raw, 1, -1},
		{raw + "x." + tag1, 1, -1},
		{"", 1, -1},
		{raw + strings.Repeat(".g", 100_000), admit.MaxCharges, -1}, // the 200 KB path of the attack
		{raw + "." + distinctTags(admit.MaxCharges), admit.MaxCharges, admit.MaxCharges},
		{raw + "." + distinctTags(admit.MaxCharges+1), admit.MaxCharges, -1},
	} {
		_, tags, ok := splitID(tc.id, tc.maxTags)
		if got := map[bool]int{true: len(tags), false: -1}[ok]; got != tc.tags {
			t.Errorf("splitID(%.60q, %d) = %d tags, want %d", tc.id, tc.maxTags, got, tc.tags)
		}
	}
}

// distinctTags returns n different tags joined with dots.
func distinctTags(n int) string {
	tags := make([]string, n)
	for i := range tags {
		tags[i] = fmt.Sprintf("%016x", i)
	}
	return strings.Join(tags, ".")
}
