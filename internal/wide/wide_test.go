package wide

import (
	"math"
	"math/big"
	"testing"
)

// FuzzMulDiv: MulDiv and MulDivUp agree with big-integer arithmetic,
// saturated at math.MaxInt64, for every operand.
func FuzzMulDiv(f *testing.F) {
	f.Add(uint64(4_000_000_000), uint64(366*24*3600*1e9), uint64(7))
	f.Add(uint64(0), uint64(1), uint64(1))
	f.Add(uint64(math.MaxUint64), uint64(math.MaxUint64), uint64(math.MaxUint64))
	f.Add(uint64(3), uint64(10), uint64(4))
	f.Fuzz(func(t *testing.T, a, b, d uint64) {
		if d == 0 {
			return
		}
		p := new(big.Int).Mul(new(big.Int).SetUint64(a), new(big.Int).SetUint64(b))
		q, r := new(big.Int).QuoRem(p, new(big.Int).SetUint64(d), new(big.Int))
		limit := big.NewInt(math.MaxInt64)
		down := q
		up := new(big.Int).Set(q)
		if r.Sign() > 0 {
			up.Add(up, big.NewInt(1))
		}
		want := func(x *big.Int) int64 {
			if x.Cmp(limit) > 0 {
				return math.MaxInt64
			}
			return x.Int64()
		}
		if got := MulDiv(a, b, d); got != want(down) {
			t.Fatalf("MulDiv(%d, %d, %d) = %d, want %d", a, b, d, got, want(down))
		}
		if got := MulDivUp(a, b, d); got != want(up) {
			t.Fatalf("MulDivUp(%d, %d, %d) = %d, want %d", a, b, d, got, want(up))
		}
	})
}
