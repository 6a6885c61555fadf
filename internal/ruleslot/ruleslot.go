// Package ruleslot reaches the slot in which an admit.Rule keeps its
// preparation, for the engine of this module. The slot is an unexported
// field of Rule, so that the preparation stays out of the package a user
// reads; package admit records the field's offset here when it starts.
package ruleslot

import "unsafe"

// Offset is the offset of the slot within a Rule, set by package admit's
// initialization, which runs before any package that imports admit.
var Offset uintptr

// Of returns the slot of the rule r points to.
func Of(r unsafe.Pointer) *unsafe.Pointer {
	return (*unsafe.Pointer)(unsafe.Add(r, Offset))
}
