package engine

import (
	"math"
	"reflect"
	"testing"
	"time"

	"github.com/admitdev/admit"
)

// tokenModel is a bucket kept as tokens, as x/time/rate keeps one: it
// refills at the rate of the rule that last decided it, up to that rule's
// burst, and a rule taking it over caps it at its own burst. A debit puts
// it into debt, of at most one burst; a rule taking over a debt keeps it
// as the time the old rate takes to repay it. A full bucket
// is full under the new rule too: a store forgets a full bucket (it is a
// key never seen), and a key never seen starts full.
type tokenModel struct {
	tokens float64
	at     int64
	rule   *admit.Rule
}

func (m *tokenModel) advance(r *admit.Rule, now int64) {
	if m.rule == nil {
		m.tokens, m.at, m.rule = float64(r.Burst), now, r
		return
	}
	if now > m.at {
		perToken := float64(m.rule.Rate.Per) / float64(m.rule.Rate.N)
		m.tokens = math.Min(float64(m.rule.Burst), m.tokens+float64(now-m.at)/perToken)
		m.at = now
	}
	if m.tokens >= float64(m.rule.Burst)-1e-9 {
		// A full bucket is a key never seen: full under any rule. (The
		// margin is the model's rounding, against the stores' exact
		// arithmetic: full is a step, which a hair either side flips.)
		m.tokens = float64(r.Burst)
	}
	if m.tokens < 0 {
		// A debt, kept as the old rate's time for it.
		perOld := float64(m.rule.Rate.Per) / float64(m.rule.Rate.N)
		perNew := float64(r.Rate.Per) / float64(r.Rate.N)
		m.tokens *= perOld / perNew
	}
	m.tokens = math.Min(m.tokens, float64(r.Burst))
	m.rule = r
}

// FuzzRuleChange changes a token bucket's rule between decisions (rate and
// burst from the input), debits among them, and checks every decision
// against tokenModel: the
// engine never admits what the model would not (nobody gains capacity by
// a change), and admits whatever the model admits with a margin of the
// rounding adoption is allowed (a few nanoseconds of a token per change:
// nobody is locked out by one).
func FuzzRuleChange(f *testing.F) {
	f.Add([]byte{1, 2, 3, 4, 5, 6, 7, 8}, []byte{0, 10, 1, 1, 0, 2, 2, 5, 1, 3, 200, 1, 0, 1, 1})
	f.Add([]byte{9, 0, 1, 255, 3, 3, 4, 7}, []byte{0, 0, 3, 1, 1, 1, 0, 50, 2, 2, 0, 1, 3, 99, 3})
	f.Add([]byte{0x31, 9, 0x05, 4, 1, 1, 0x22, 7}, []byte{0, 0, 0xdf, 1, 2, 1, 0, 3, 0xc9, 1, 40, 2, 0, 200, 1})
	pers := [...]time.Duration{10 * time.Millisecond, time.Second, time.Minute, time.Hour}
	f.Fuzz(func(t *testing.T, shapes, steps []byte) {
		if len(shapes) < 8 {
			return
		}
		var rules [4]*admit.Rule
		for i := range rules {
			a, b := shapes[2*i], shapes[2*i+1]
			alg := admit.TokenBucket
			if a&0x80 != 0 {
				alg = admit.GCRA
			}
			rules[i] = &admit.Rule{Name: "r", Algorithm: alg, Rate: admit.Rate{N: int64(a%10) + 1, Per: pers[(a>>4)%4]}, Burst: int64(b%20) + 1}
		}
		shortest := math.Inf(1)
		for _, r := range rules {
			shortest = math.Min(shortest, float64(r.Rate.Per)/float64(r.Rate.N))
		}
		var st [2]State
		var m tokenModel
		now := int64(time.Hour)
		changes := 0
		var last *admit.Rule
		for len(steps) >= 3 {
			r := rules[steps[0]%4]
			now += int64(steps[1]) * int64(pers[(steps[0]>>2)%4]) / 16
			cost, debit := int64(steps[2]%3)+1, steps[2] >= 0xc0
			if debit {
				cost = int64(steps[2]&0x1f) + 1
			}
			steps = steps[3:]
			if cost > r.Burst && !debit {
				continue
			}
			if last != nil && last != r {
				changes++
			}
			last = r
			m.advance(r, now)
			if debit {
				p, err := Prepare(r)
				if err != nil {
					t.Fatal(err)
				}
				var res admit.Result
				st = p.StepTo(&res, st, now, cost, true)
				m.tokens = math.Max(m.tokens-float64(cost), -float64(r.Burst))
				continue
			}
			next, res := Step(r, st, now, cost)
			// Each change rounds a nanosecond down, of the interval it
			// changes to: a few ns of the shortest per change at most.
			slack := float64(changes)*4/shortest + 1e-9
			switch {
			case res.Allowed && m.tokens < float64(cost)-1e-9:
				t.Fatalf("admitted cost %d under %v burst %d with %.9f tokens in the model", cost, r.Rate, r.Burst, m.tokens)
			case !res.Allowed && m.tokens >= float64(cost)+slack:
				t.Fatalf("refused cost %d under %v burst %d with %.9f tokens in the model (retry %v)", cost, r.Rate, r.Burst, m.tokens, res.RetryAfter)
			}
			if res.Allowed {
				m.tokens -= float64(cost)
			}
			st = next
		}
	})
}

// TestResetResultClearsEveryField: resetting a result that held anything
// leaves what a fresh composite literal would, field by field — a field
// added to admit.Result and not reset would carry one decision's value
// into the next.
func TestResetResultClearsEveryField(t *testing.T) {
	r := &admit.Rule{Name: "r", Algorithm: admit.TokenBucket, Rate: admit.PerSecond(1), Burst: 7, Shadow: true}
	var res admit.Result
	v := reflect.ValueOf(&res).Elem()
	for i := range v.NumField() {
		f := v.Field(i)
		switch f.Kind() {
		case reflect.String:
			f.SetString("stale")
		case reflect.Bool:
			f.SetBool(true)
		case reflect.Int64:
			f.SetInt(99)
		case reflect.Uint8:
			f.SetUint(3)
		default:
			t.Fatalf("field %s of kind %v: teach this test to fill it", v.Type().Field(i).Name, f.Kind())
		}
	}
	resetResult(&res, r, false, r.Capacity())
	if want := (admit.Result{Rule: "r", Shadow: true, Limit: 7}); res != want {
		t.Errorf("reset to %+v, want %+v", res, want)
	}
}
