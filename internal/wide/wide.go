// Package wide is the one home of Admit's 128-bit arithmetic: the
// products of counts and nanosecond periods (a rate × a time, a cost ×
// a price), which overflow 64 bits (4e9 × one year ≈ 1.3e26), computed
// exactly, with no floating point.
package wide

import (
	"math"
	"math/bits"
)

// U128 is an unsigned 128-bit integer.
type U128 struct{ Hi, Lo uint64 }

// Mul returns a × b.
func Mul(a, b uint64) U128 {
	hi, lo := bits.Mul64(a, b)
	return U128{hi, lo}
}

// Add returns x + y (wrapping past 2^128, which no product of two 64-bit
// values and a few sums reaches).
func (x U128) Add(y U128) U128 {
	lo, c := bits.Add64(x.Lo, y.Lo, 0)
	hi, _ := bits.Add64(x.Hi, y.Hi, c)
	return U128{hi, lo}
}

// Sub returns x − y, for y ≤ x.
func (x U128) Sub(y U128) U128 {
	lo, b := bits.Sub64(x.Lo, y.Lo, 0)
	hi, _ := bits.Sub64(x.Hi, y.Hi, b)
	return U128{hi, lo}
}

// Less reports whether x < y.
func (x U128) Less(y U128) bool { return x.Hi < y.Hi || (x.Hi == y.Hi && x.Lo < y.Lo) }

// Div returns x / d, saturated at math.MaxInt64, and the remainder (0
// when saturated).
func (x U128) Div(d uint64) (q int64, r uint64) {
	if x.Hi >= d {
		return math.MaxInt64, 0
	}
	uq, ur := bits.Div64(x.Hi, x.Lo, d)
	if uq > math.MaxInt64 {
		return math.MaxInt64, ur
	}
	return int64(uq), ur
}

// DivUp returns x / d rounded up, saturated at math.MaxInt64.
func (x U128) DivUp(d uint64) int64 {
	q, r := x.Div(d)
	if r > 0 && q < math.MaxInt64 {
		q++
	}
	return q
}

// MulDiv returns a × b / d rounded down, saturated at math.MaxInt64: how
// many events of a rate of b per d happen in a (a rate × a time).
func MulDiv(a, b, d uint64) int64 {
	q, _ := Mul(a, b).Div(d)
	return q
}

// MulDivUp returns a × b / d rounded up, saturated at math.MaxInt64: how
// long a events take at a rate of d per b.
func MulDivUp(a, b, d uint64) int64 { return Mul(a, b).DivUp(d) }
