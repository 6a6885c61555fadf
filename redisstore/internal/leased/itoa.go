package leased

import (
	"strconv"

	"github.com/redis/rueidis"
)

// itoa formats v in decimal, for the arguments of the regions' scripts.
func itoa(v int64) string { return strconv.FormatInt(v, 10) }

// replyInts reads the first len(x) values of a script's reply into x, as
// integers.
func replyInts(v []rueidis.RedisMessage, x []int64) error {
	for i := range x {
		n, err := v[i].AsInt64()
		if err != nil {
			return err
		}
		x[i] = n
	}
	return nil
}
