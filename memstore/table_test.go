package memstore

import (
	"math/rand/v2"
	"testing"

	"github.com/admitdev/admit/internal/engine"
)

// TestTableModel checks the open-addressing table, including backward-shift
// deletion in crowded probe runs, against a map.
func TestTableModel(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	var tb table
	model := map[uint64]int64{}
	for i := range 200_000 {
		// Few distinct hashes with shared low bits make long probe runs
		// that wrap around the end of the table.
		h := uint64(rng.IntN(3000)+1)<<8 | uint64(rng.IntN(4))
		switch j := tb.find(h); {
		case rng.IntN(3) == 0 && j >= 0:
			tb.deleteAt(j)
			delete(model, h)
		case j >= 0:
			tb.slots[j].st.Expiry = int64(i)
			model[h] = int64(i)
		default:
			tb.insert(h, engine.State{Expiry: int64(i)})
			model[h] = int64(i)
		}
		if i%10_000 == 0 || i == 199_999 {
			if tb.count != len(model) {
				t.Fatalf("count %d, model %d", tb.count, len(model))
			}
			for h, a := range model {
				if got := tb.get(h); got.Expiry != a {
					t.Fatalf("get(%x) = %d, want %d", h, got.Expiry, a)
				}
			}
		}
	}
}
