package admit

// Fair shares of a shared limit.
//
// A limit that many tenants share — a global rule — is first come, first
// served unless something divides it: one tenant sending a hundred times
// its part would take it all. A charge that carries a Share is decided
// with the share of its class: the limit is divided among the classes
// that want it, weighted, and what a class does not use the others may.
//
// Each class has an assured part of the limit, kept as a bucket of its
// own (a rate and a burst in proportion to its weight among the classes
// active in the last two epochs). A charge is admitted when the rule
// admits it and either the class's assured bucket holds the cost (it is
// within its share) or, after the charge, the rule keeps what the other
// active classes may still claim of their shares (it borrows capacity
// nobody else wants). The rule itself is decided as always, so a share
// never lets more through than the rule; it only refuses a class that is
// over its share while others want theirs.
//
// Concurrency limits hold their capacity rather than spend it: a class
// takes slots within its entitled part, or beyond it up to a ceiling and
// only while no class below its part has been refused (its claim).

// Share names who a charge of a shared limit is made for, so that a store
// divides the limit fairly among those that want it (see the package's
// fair shares). The zero Share is no share: the limit is first come,
// first served.
type Share struct {
	// Class is the caller's class among those sharing the key: a tenant,
	// or the anonymous callers. Classes are weighted by Weight.
	Class string
	// Weight is the class's weight, from 1 to 10,000.
	Weight int64
	// Sub divides the class's part equally among its members, such as
	// the client addresses of anonymous callers; "" for none.
	Sub string
}

// SharePath says how a charge of a shared limit was decided (Result.Share).
type SharePath uint8

const (
	// ShareNone: the charge carries no share, or the rule refused it.
	ShareNone SharePath = iota
	// ShareAssured: within the class's share.
	ShareAssured
	// ShareBorrowed: beyond the class's share, from capacity no other
	// active class may claim.
	ShareBorrowed
	// ShareRefused: the rule would admit it, but the class is over its
	// share while others want theirs.
	ShareRefused
)

var sharePathNames = [...]string{ShareNone: "", ShareAssured: "assured", ShareBorrowed: "borrowed", ShareRefused: "over_share"}

// String returns "assured", "borrowed", "over_share" or "".
func (p SharePath) String() string {
	if int(p) < len(sharePathNames) {
		return sharePathNames[p]
	}
	return "invalid"
}
