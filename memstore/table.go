package memstore

import "github.com/admitdev/admit/internal/engine"

// slot is one key: its 64-bit hash (0 marks an empty slot) and its state.
// Keys are not stored, only hashed, which is what keeps a key at 24 bytes
// of table; see the package comment for what that costs in accuracy.
type slot struct {
	h  uint64
	st engine.State
}

// table is an open-addressing hash table with linear probing and
// backward-shift deletion (no tombstones), indexed by the low bits of the
// hash; the high bits chose the shard. It grows by doubling at 7/8 load.
type table struct {
	slots []slot
	count int
}

const minTableSize = 16

func (t *table) find(h uint64) int {
	if len(t.slots) == 0 {
		return -1
	}
	mask := uint64(len(t.slots) - 1)
	for i := h & mask; ; i = (i + 1) & mask {
		switch t.slots[i].h {
		case h:
			return int(i)
		case 0:
			return -1
		}
	}
}

func (t *table) get(h uint64) engine.State {
	if i := t.find(h); i >= 0 {
		return t.slots[i].st
	}
	return engine.State{}
}

// insert adds h, which must be absent, growing the table when needed.
func (t *table) insert(h uint64, st engine.State) {
	if (t.count+1)*8 > len(t.slots)*7 {
		t.resize(max(2*len(t.slots), minTableSize))
	}
	mask := uint64(len(t.slots) - 1)
	i := h & mask
	for t.slots[i].h != 0 {
		i = (i + 1) & mask
	}
	t.slots[i] = slot{h: h, st: st}
	t.count++
}

func (t *table) resize(size int) {
	old := t.slots
	t.slots = make([]slot, size)
	t.count = 0
	mask := uint64(size - 1)
	for _, s := range old {
		if s.h == 0 {
			continue
		}
		i := s.h & mask
		for t.slots[i].h != 0 {
			i = (i + 1) & mask
		}
		t.slots[i] = s
		t.count++
	}
}

// deleteAt empties slot i and shifts back the entries of its probe run so
// that every remaining key stays reachable from its home slot. Entries only
// move towards i, so a forward scan that re-examines i after a deletion
// never skips an entry.
func (t *table) deleteAt(i int) {
	mask := len(t.slots) - 1
	hole := i
	for j := (i + 1) & mask; t.slots[j].h != 0; j = (j + 1) & mask {
		home := int(t.slots[j].h) & mask
		// The entry at j may fill the hole iff its home is not cyclically
		// within (hole, j].
		if (hole <= j && (home <= hole || home > j)) || (hole > j && home <= hole && home > j) {
			t.slots[hole] = t.slots[j]
			hole = j
		}
	}
	t.slots[hole] = slot{}
	t.count--
	if t.count == 0 && len(t.slots) > minTableSize {
		t.slots = nil // give an emptied shard's memory back
	}
}
