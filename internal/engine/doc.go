// Package engine is the decision engine the stores of this module share:
// the pure transitions of the counter algorithms (Step, StepTo,
// StepReserve, StepCancel, StepRefund) over 16-byte States, the sliding
// log (Log) and concurrency leases (LeaseSet), fair shares of a shared
// limit (PreparedRule.DecideShare), and what a store derives from a rule
// once and reuses (Prepare, RuleCache).
//
// Time is passed in as Unix nanoseconds and the arithmetic is integer
// only, with no float and no drift, so that the memory store, the Redis
// store's function and the simulator decide alike and share one set of
// test vectors.
package engine
