package limitador

import (
	"context"
	"strings"
	"testing"

	"github.com/admitdev/admit"
)

func FuzzParse(f *testing.F) {
	f.Add([]byte(perUser))
	f.Add([]byte("---\n- namespace: n\n  max_value: 1\n  seconds: 1\n  conditions:\n  variables:\n"))
	f.Add([]byte("- {namespace: n, max_value: 1, seconds: 1, conditions: ['descriptors.all(d, d.x == \"1\")'], variables: ['size(descriptors)'], algorithm: quota, period: day}"))
	f.Add([]byte("[]"))
	f.Fuzz(func(t *testing.T, data []byte) {
		ls, err := Parse("f.yaml", data)
		if err != nil {
			if !strings.HasPrefix(err.Error(), "f.yaml") {
				t.Fatalf("an error without its file: %v", err)
			}
			return
		}
		for _, l := range ls.All() {
			if l.Namespace == "" || l.identity == "" || l.rule == nil {
				t.Fatalf("a limit half made: %+v", l)
			}
		}
	})
}

// FuzzDecide sends descriptors of any content through limits that read
// them every way: nothing panics, and a failure is the request's
// (CodeInvalid), never the server's.
func FuzzDecide(f *testing.F) {
	f.Add("GET", "alice", "3", uint64(1))
	f.Add("", "", "x", uint64(0))
	f.Add("POST", "\x00\xff", "-9223372036854775808", uint64(1<<63))
	f.Fuzz(func(t *testing.T, method, user, n string, delta uint64) {
		l, _ := newLimiter(t, `
- {namespace: n, max_value: 3, seconds: 60, conditions: ["descriptors[0].m == 'GET'"], variables: ["descriptors[0].u"]}
- {namespace: n, max_value: 5, seconds: 1, conditions: ["descriptors.exists(d, d.m.startsWith('P'))"], variables: ["int(descriptors[0].n) + 1"]}
- {namespace: n, max_value: 0, seconds: 60, conditions: ["descriptors[0].u == 'blocked'"], variables: []}
- {namespace: n, max_value: 9, seconds: 0, conditions: [], variables: ["descriptors[1].u"]}
`)
		ds := desc("m", method, "u", user, "n", n)
		for _, mode := range []Mode{CheckAndReport, Check, Report} {
			_, err := l.Decide(context.Background(), mode, "n", ds, delta, true)
			if err != nil && admit.ErrorCode(err) != admit.CodeInvalid {
				t.Fatalf("%v: %v", mode, err)
			}
		}
	})
}

// FuzzEntryForms holds the expressions read without CEL to CEL's reading
// of them, on descriptors of any content.
func FuzzEntryForms(f *testing.F) {
	f.Add("GET", "k", "v", uint8(1))
	f.Add("", "", "", uint8(0))
	f.Add("x'y", "limit.a__b", "1", uint8(2))
	sources := []string{
		"descriptors[0]['k'] == 'GET'", "descriptors[0].k != 'GET'", "'GET' == descriptors[0]['k']",
		"descriptors[1]['k'] == 'v'", "descriptors[0]['limit.a__b'] == '1'", "descriptors[0]['k']", "descriptors[1].k",
	}
	var exprs []*expr
	for _, s := range sources {
		e, err := compile(s)
		if err != nil || e.entry == nil {
			f.Fatalf("%s: %v, entry %v", s, err, e)
		}
		exprs = append(exprs, e)
	}
	f.Fuzz(func(t *testing.T, value, key, other string, n uint8) {
		ds := make([]map[string]string, n%3)
		for i := range ds {
			ds[i] = map[string]string{key: value, "k": other, "limit.a__b": value}
		}
		for i, e := range exprs {
			slow := *e
			slow.entry = nil
			var fast, full request
			fast.reset(ds)
			full.reset(ds)
			if e.entry.op != "" {
				a, errA := e.test(&fast)
				b, errB := slow.test(&full)
				if a != b || (errA == nil) != (errB == nil) {
					t.Fatalf("%s on %v: %v %v, CEL %v %v", sources[i], ds, a, errA, b, errB)
				}
				continue
			}
			a, okA, errA := e.value(&fast)
			b, okB, errB := slow.value(&full)
			if a != b || okA != okB || (errA == nil) != (errB == nil) {
				t.Fatalf("%s on %v: %q %v %v, CEL %q %v %v", sources[i], ds, a, okA, errA, b, okB, errB)
			}
		}
	})
}
