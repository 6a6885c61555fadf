package engine

import (
	"math"
	"math/bits"
)

// u128 is an unsigned 128-bit integer for the products of counts and
// nanosecond periods, which overflow 64 bits (4e9 × one year ≈ 1.3e26).
type u128 struct{ hi, lo uint64 }

func mul(a, b uint64) u128 {
	hi, lo := bits.Mul64(a, b)
	return u128{hi, lo}
}

func (x u128) add(y u128) u128 {
	lo, c := bits.Add64(x.lo, y.lo, 0)
	hi, _ := bits.Add64(x.hi, y.hi, c)
	return u128{hi, lo}
}

func (x u128) sub(y u128) u128 {
	lo, b := bits.Sub64(x.lo, y.lo, 0)
	hi, _ := bits.Sub64(x.hi, y.hi, b)
	return u128{hi, lo}
}

func (x u128) less(y u128) bool { return x.hi < y.hi || (x.hi == y.hi && x.lo < y.lo) }

// div returns x / d, saturated at math.MaxInt64, and the remainder.
func (x u128) div(d uint64) (q int64, r uint64) {
	if x.hi >= d {
		return math.MaxInt64, 0
	}
	uq, ur := bits.Div64(x.hi, x.lo, d)
	if uq > math.MaxInt64 {
		return math.MaxInt64, ur
	}
	return int64(uq), ur
}
