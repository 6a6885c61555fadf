package exact

import (
	"fmt"
	"strings"
	"testing"

	"github.com/admitdev/admit/internal/bounds"
)

// TestSplitIDRefusesForgedIDs: renewing, releasing or cancelling costs two
// Redis commands per tag of the ID, so only IDs of the form this store
// issues, with no more tags than one of its decisions can hold, reach
// Redis: one outside Cluster; in Cluster, a tag per tenant a decision may
// name (Options.TenantsPerDecision) and the global tag.
func TestSplitIDRefusesForgedIDs(t *testing.T) {
	raw := "0123456789abcdef01234567"
	tag1, tag2 := "0123456789abcdef", "fedcba9876543210"
	const most = bounds.MaxCharges
	standalone, cluster, oneTenant := [2]int{1, 1}, [2]int{most, most}, [2]int{2, 1}
	for _, tc := range []struct {
		id   string
		max  [2]int // all tags, tenants' tags
		tags int    // -1: refused
	}{
		{raw + "." + tag1, standalone, 1},
		{raw + ".g", standalone, 1},
		{raw + "." + tag1 + ".g", cluster, 2},
		{raw + "." + tag1 + "." + tag2 + ".g", cluster, 3},
		{raw + "." + tag1 + ".g", oneTenant, 2},
		{raw + "." + tag1, oneTenant, 1},
		{raw + ".g", oneTenant, 1},
		{raw + "." + tag1 + "." + tag2, oneTenant, -1},        // two tenants
		{raw + "." + tag1 + "." + tag2 + ".g", oneTenant, -1}, // two tenants and the global group
		{raw + "." + tag1 + ".g", standalone, -1},             // two tags on a standalone server
		{raw + ".g.g", cluster, -1},                           // a repeated tag
		{raw + "." + tag1 + "." + tag1, cluster, -1},          // a repeated tag
		{raw + ".g." + tag1, cluster, -1},                     // the global group comes last
		{raw + "." + strings.ToUpper(tag1), standalone, -1},   // not a tag this store writes
		{strings.ToUpper(raw) + "." + tag1, standalone, -1},
		{raw + ".", standalone, -1},
		{raw, standalone, -1},
		{raw + "x." + tag1, standalone, -1},
		{"", standalone, -1},
		{raw + strings.Repeat(".g", 100_000), cluster, -1}, // the 200 KB path of the attack
		{raw + "." + distinctTags(most), cluster, most},
		{raw + "." + distinctTags(most-1) + ".g", cluster, most},
		{raw + "." + distinctTags(most+1), cluster, -1},
		{raw + "." + distinctTags(31) + ".g", oneTenant, -1}, // the 64 commands of the Cluster attack
	} {
		_, tags, ok := splitID(tc.id, tc.max[0], tc.max[1])
		if got := map[bool]int{true: len(tags), false: -1}[ok]; got != tc.tags {
			t.Errorf("splitID(%.60q, %v) = %d tags, want %d", tc.id, tc.max, got, tc.tags)
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
