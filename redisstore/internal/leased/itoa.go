package leased

import "strconv"

// itoa formats v in decimal, for the arguments of the regions' scripts.
func itoa(v int64) string { return strconv.FormatInt(v, 10) }
