package admit

import (
	"strings"
	"time"
)

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

// ParsePeriod returns the Period named s, in any case.
func ParsePeriod(s string) (Period, error) {
	for p, name := range periodNames {
		if p > 0 && strings.EqualFold(name, s) {
			return Period(p), nil
		}
	}
	return 0, Errorf(CodeInvalid, "unknown period %q (want day, week, month or year)", s)
}

// PeriodAt returns the calendar period of a Quota rule that t falls in,
// [start, end). Periods are counted in r.Location's time (UTC when nil)
// from r.Anchor's position in its period: its time of day for a day, its
// weekday and time for a week, its day of the month and time for a month,
// its date and time for a year. The zero Anchor is the calendar's:
// midnight, Monday, the 1st, the 1st of January. An anchor day that a
// month lacks (the 31st, or the 29th of February) falls back to that
// month's last day. Periods follow the zone's clock, so a day across a
// daylight saving change lasts 23 or 25 hours.
func (r *Rule) PeriodAt(t time.Time) (start, end time.Time) {
	loc := r.Location
	if loc == nil {
		loc = time.UTC
	}
	lt := t.In(loc)
	a := r.Anchor.In(loc)
	if r.Anchor.IsZero() {
		a = time.Date(2001, time.January, 1, 0, 0, 0, 0, loc) // a Monday
	}
	h, mi, s := a.Clock()
	at := func(y int, m time.Month, d int) time.Time { return time.Date(y, m, d, h, mi, s, 0, loc) }
	y, m, d := lt.Date()
	switch r.Period {
	case Day:
		start = at(y, m, d)
		if start.After(lt) {
			start = at(y, m, d-1)
		}
		sy, sm, sd := start.Date()
		return start, at(sy, sm, sd+1)
	case Week:
		back := (int(lt.Weekday()) - int(a.Weekday()) + 7) % 7
		start = at(y, m, d-back)
		if start.After(lt) {
			start = at(y, m, d-back-7)
		}
		sy, sm, sd := start.Date()
		return start, at(sy, sm, sd+7)
	case Month:
		day := a.Day()
		of := func(y int, m time.Month) time.Time { return at(y, m, min(day, daysIn(y, m))) }
		start = of(y, m)
		if start.After(lt) {
			return of(y, m-1), start
		}
		return start, of(y, m+1)
	case Year:
		am, day := a.Month(), a.Day()
		of := func(y int) time.Time { return at(y, am, min(day, daysIn(y, am))) }
		start = of(y)
		if start.After(lt) {
			return of(y - 1), start
		}
		return start, of(y + 1)
	}
	return t, t
}

// daysIn returns the number of days of month m of year y (m may be out of
// range: month 0 is December of the year before).
func daysIn(y int, m time.Month) int {
	return time.Date(y, m+1, 0, 0, 0, 0, 0, time.UTC).Day()
}
