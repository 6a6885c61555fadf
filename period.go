package admit

// Period is the length of a Quota rule's period: a calendar day, week,
// month or year.
type Period uint8

// The periods.
const (
	Day Period = iota + 1
	Week
	Month
	Year
)

var periodNames = [...]string{Day: "day", Week: "week", Month: "month", Year: "year"}

// String returns "day", "week", "month" or "year".
func (p Period) String() string {
	if p > 0 && int(p) < len(periodNames) {
		return periodNames[p]
	}
	return "invalid"
}
