package link

import (
	"math/rand/v2"
	"strconv"
	"testing"

	"github.com/admitdev/admit/redistest"
)

// TestKeySlot: the slot of a key is the one Redis computes (CLUSTER
// KEYSLOT), hash tags included, for keys of every shape.
func TestKeySlot(t *testing.T) {
	srv := redistest.Start(t, "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf")
	keys := []string{"", "foo", "{}", "{}x", "x{}", "{a}", "a{b}c{d}", "{a", "a}", "}{a}", "admit:{0123456789abcdef}tenant/t/r", "{g}"}
	rng := rand.New(rand.NewPCG(1, 2))
	const alphabet = "ab{}:/é"
	for range 200 {
		b := make([]byte, rng.IntN(12))
		for i := range b {
			b[i] = alphabet[rng.IntN(len(alphabet))]
		}
		keys = append(keys, string(b))
	}
	for _, k := range keys {
		want, err := redistest.Command(srv.Addr, "CLUSTER", "KEYSLOT", k)
		if err != nil {
			t.Fatal(err)
		}
		if got := strconv.Itoa(keySlot(k)); got != want {
			t.Errorf("keySlot(%q) = %s, Redis says %s", k, got, want)
		}
	}
}

// TestParseClusterNodes: masters that serve slots, with their ranges;
// replicas, masters without slots and migration markers left out.
func TestParseClusterNodes(t *testing.T) {
	text := "" +
		"a1 127.0.0.1:7001@17001 myself,master - 0 0 1 connected 0-5460 [5461->-b2]\n" +
		"b2 127.0.0.1:7002@17002 master - 0 0 2 connected 5461 5462-10922\n" +
		"c3 127.0.0.1:7003@17003,host master,fail - 0 0 3 disconnected\n" +
		"d4 127.0.0.1:7004@17004 master - 0 0 7 connected 10923-16383\n" +
		"e5 127.0.0.1:7005@17005 slave a1 0 0 1 connected\n"
	v := parseClusterNodes(text)
	if len(v.masters) != 3 {
		t.Fatalf("%d masters, want 3: %+v", len(v.masters), v.masters)
	}
	for slot, want := range map[int]string{0: "127.0.0.1:7001", 5460: "127.0.0.1:7001", 5461: "127.0.0.1:7002", 10922: "127.0.0.1:7002", 10923: "127.0.0.1:7004", 16383: "127.0.0.1:7004"} {
		if got := v.owner(slot); got != want {
			t.Errorf("owner(%d) = %q, want %q", slot, got, want)
		}
	}
}
