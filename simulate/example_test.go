package simulate_test

import (
	"fmt"

	"github.com/admitdev/admit/policy"
	"github.com/admitdev/admit/simulate"
)

// Two requests a second through seed 004's token bucket: it spends its 5
// tokens, then admits one request a second.
func ExampleRun() {
	spec, _ := simulate.ParseRule("token_bucket rate=2/2s burst=5")
	rules, _ := simulate.Compile([]policy.RuleSpec{spec})
	pattern, _ := simulate.ParsePattern("bursts n=2 every=1s duration=8s")
	events, _ := pattern.Events(simulate.Identity{}, 0)
	res, _ := simulate.Run(rules, events, simulate.Options{})
	l := res.Lanes[0]
	for i, o := range l.Outcomes {
		if i > 0 {
			fmt.Print(" ")
		}
		fmt.Printf("%v:%s", l.At[i].Seconds(), map[simulate.Outcome]string{simulate.Admitted: "A", simulate.Refused: "R"}[o])
	}
	fmt.Printf("\nadmitted %d, refused %d\n", l.Summary.Admitted, l.Summary.Refused)
	// Output:
	// 0:A 0:A 1:A 1:A 2:A 2:A 3:A 3:A 4:A 4:R 5:A 5:R 6:A 6:R 7:A 7:R
	// admitted 12, refused 4
}
