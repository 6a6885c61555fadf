package link

import (
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/rueidis"
)

// The Cluster client keeps a map of which master serves each slot, and
// after a failover it learns the promoted replica only at its next refresh
// of that map, which it delays at random by up to a second so that many
// clients do not ask at once. A store does not wait for it: a call that
// cannot reach a slot's master asks the cluster itself who serves the slot
// now (CLUSTER NODES, at most every clusterViewTTL) and makes the call
// there.

// clusterViewTTL is how long an answer of CLUSTER NODES is used.
const clusterViewTTL = 100 * time.Millisecond

// clusterView is the cluster's own account of its masters.
type clusterView struct {
	at      time.Time
	masters []clusterMaster
}

// clusterMaster is a master that serves slots.
type clusterMaster struct {
	addr  string
	slots [][2]int // inclusive ranges
}

// clusterViews keeps the last clusterView; its zero value is ready.
type clusterViews struct {
	mu   sync.Mutex
	last *clusterView
}

// parseClusterNodes reads the masters that serve slots from the reply of
// CLUSTER NODES; replicas, and masters that serve none (one failed over),
// are left out.
func parseClusterNodes(text string) *clusterView {
	v := &clusterView{}
	for _, line := range strings.Split(text, "\n") {
		// <id> <ip:port@cport[,hostname]> <flags> <master> <ping> <pong> <epoch> <link> <slot>...
		f := strings.Fields(line)
		if len(f) < 9 || !strings.Contains(f[2], "master") {
			continue
		}
		m := clusterMaster{}
		m.addr, _, _ = strings.Cut(f[1], "@")
		for _, r := range f[8:] {
			if strings.HasPrefix(r, "[") {
				continue // a slot being migrated or imported
			}
			lo, hi, isRange := strings.Cut(r, "-")
			if !isRange {
				hi = lo
			}
			l, err1 := strconv.Atoi(lo)
			h, err2 := strconv.Atoi(hi)
			if err1 == nil && err2 == nil {
				m.slots = append(m.slots, [2]int{l, h})
			}
		}
		if len(m.slots) > 0 {
			v.masters = append(v.masters, m)
		}
	}
	return v
}

// owner returns the master that serves slot, or "".
func (v *clusterView) owner(slot int) string {
	for _, m := range v.masters {
		for _, r := range m.slots {
			if r[0] <= slot && slot <= r[1] {
				return m.addr
			}
		}
	}
	return ""
}

// keySlot returns the Cluster slot of key: that of its hash tag, the part
// between the first "{" and the next "}" if not empty, or of the whole key
// (see slotOf).
func keySlot(key string) int {
	if i := strings.IndexByte(key, '{'); i >= 0 {
		if j := strings.IndexByte(key[i+1:], '}'); j > 0 {
			key = key[i+1 : i+1+j]
		}
	}
	return int(SlotOf(key))
}

// isRedirect reports a MOVED or ASK reply.
func isRedirect(re *rueidis.RedisError) bool {
	_, moved := re.IsMoved()
	_, ask := re.IsAsk()
	return moved || ask
}

// SlotOf returns the Redis Cluster hash slot of keys tagged tag: CRC16
// (XMODEM) of the tag, modulo 16384.
func SlotOf(tag string) uint16 {
	var crc uint16
	for i := 0; i < len(tag); i++ {
		crc ^= uint16(tag[i]) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return crc & 16383
}
