package httpx

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"testing"
)

func TestDuplicateKey(t *testing.T) {
	many := func(n int, last string) string {
		var b strings.Builder
		b.WriteString(`{"x":{`)
		for i := range n {
			fmt.Fprintf(&b, `"k%d":%d,`, i, i)
		}
		b.WriteString(last + `}}`)
		return b.String()
	}
	for _, tc := range []struct {
		json string
		fold bool
		key  string // "" for none
	}{
		{`{"tenant":"a","cost":1}`, true, ""},
		{`{"tenant":"a","cost":1,"cost":2}`, true, "cost"},
		{`{"tenant":"a","Tenant":"b"}`, true, "Tenant"},
		{`{"tenant":"a","Tenant":"b"}`, false, ""},
		{`{"\u0074enant":"a","tenant":"b"}`, false, "tenant"},
		{`{"te\"nant":"a","te\"nant":"b"}`, false, `te"nant`},
		{`{"s":1,"ſ":2}`, true, "ſ"}, // encoding/json matches ſ to s as well
		{`{"a":{"b":1},"c":{"b":2}}`, true, ""},
		{`{"a":{"b":1,"b":2}}`, true, "b"},
		{`{"a":[{"b":1},{"b":2}],"b":3}`, true, ""},
		{`{"a":"{\"b\":1,\"b\":2}"}`, true, ""}, // keys inside a string value are no keys
		{`[{"a":1},{"a":1,"a":2}]`, true, "a"},
		{`{"a":["b","b"],"c":{"b":"b"}}`, true, ""},
		{`"just a string"`, true, ""},
		{"{\"\xbf\":0,\"\xe7\":0}", false, "\ufffd"}, // not UTF-8: both decode to U+FFFD
		{many(100, `"K7":0`), true, "K7"},
		{many(100, `"k100":0`), true, ""},
		{many(40, `"y":{"k1":1,"k1":2}`), true, "k1"},
		{many(40, `"y":{"k1":1}`), true, ""},
	} {
		k, dup := DuplicateKey([]byte(tc.json), tc.fold)
		if k != tc.key || dup != (tc.key != "") {
			t.Errorf("DuplicateKey(%.60s, %v) = %q, %v; want %q", tc.json, tc.fold, k, dup, tc.key)
		}
	}
}

// TestDuplicateFieldKey: the outermost object's keys are compared as
// encoding/json matches them to a struct's fields, in any case; the keys
// of the values it keeps raw, exactly.
func TestDuplicateFieldKey(t *testing.T) {
	for _, tc := range []struct{ json, key string }{
		{`{"route":"silo","id":"1","data":{"a":1,"A":2}}`, ""},
		{`{"route":"silo","Route":"pool"}`, "Route"},
		{`{"route":"silo","route":"pool"}`, "route"},
		{`{"route":"silo","data":{"a":1,"a":2}}`, "a"},
		{`{"route":"silo","data":[{"ID":1,"id":2}]}`, ""},
		{`{"data":{"x":{"k":1,"k":2}}}`, "k"},
	} {
		k, dup := DuplicateFieldKey([]byte(tc.json))
		if k != tc.key || dup != (tc.key != "") {
			t.Errorf("DuplicateFieldKey(%s) = %q, %v; want %q", tc.json, k, dup, tc.key)
		}
	}
	frame := []byte(`{"route":"silo","id":"m1","data":{"text":"hello","Text":"x"}}`)
	if n := testing.AllocsPerRun(100, func() { DuplicateFieldKey(frame) }); n != 0 {
		t.Errorf("%v allocations a check", n)
	}
}

// TestDuplicateKeyAllocations: the bodies of the API (objects of a few
// keys, an attributes object inside) are checked without allocating.
func TestDuplicateKeyAllocations(t *testing.T) {
	body := []byte(`{"tenant":"acme","user":"alice","action":"search","cost":1,"ip":"203.0.113.9","attributes":{"plan":"pro","region":"eu"}}`)
	if n := testing.AllocsPerRun(100, func() { DuplicateKey(body, true) }); n != 0 {
		t.Errorf("%v allocations a check", n)
	}
}

// TestDuplicateKeyLinear: an object of many keys costs time linear in its
// size, not quadratic: 10,000 keys of a 64 KiB body are checked through a
// map, in a bounded number of allocations.
func TestDuplicateKeyLinear(t *testing.T) {
	var b strings.Builder
	b.WriteString(`{"attributes":{`)
	for i := range 10_000 {
		fmt.Fprintf(&b, `"%d":0,`, i)
	}
	b.WriteString(`"x":0}}`)
	body := []byte(b.String())
	if n := testing.AllocsPerRun(5, func() { DuplicateKey(body, true) }); n > 20_000 {
		t.Errorf("%v allocations for 10,000 keys", n)
	}
}

// FuzzDuplicateKey compares DuplicateKey with a plain reading of the same
// JSON through encoding/json's tokens, a map of keys per object.
func FuzzDuplicateKey(f *testing.F) {
	for _, s := range []string{`{"a":1,"A":2}`, `{"a":{"a":1},"b":[{"c":1,"c":2}]}`, `{"\u0041":1,"a":2}`, `[1,"a",{"k":"v"}]`, `{"ſ":1,"S":2}`} {
		f.Add(s, true)
		f.Add(s, false)
	}
	f.Fuzz(func(t *testing.T, s string, fold bool) {
		if !json.Valid([]byte(s)) {
			DuplicateKey([]byte(s), fold) // no panic
			return
		}
		want := referenceDuplicate(t, s, fold)
		if _, got := DuplicateKey([]byte(s), fold); got != want {
			t.Errorf("DuplicateKey(%q, %v) = %v, want %v", s, fold, got, want)
		}
	})
}

// referenceDuplicate reads s token by token and reports whether an object
// holds a key twice, compared after unescaping and, with fold, as
// strings.EqualFold compares.
func referenceDuplicate(t *testing.T, s string, fold bool) bool {
	dec := json.NewDecoder(strings.NewReader(s))
	dec.UseNumber()
	type frame struct {
		object bool
		keys   []string
		key    bool // a key comes next
	}
	var stack []*frame
	for {
		tok, err := dec.Token()
		if err == io.EOF {
			return false
		}
		if err != nil {
			t.Fatalf("%q: %v", s, err)
		}
		var top *frame
		if len(stack) > 0 {
			top = stack[len(stack)-1]
		}
		switch v := tok.(type) {
		case json.Delim:
			switch v {
			case '{', '[':
				if top != nil && top.object {
					top.key = true
				}
				stack = append(stack, &frame{object: v == '{', key: v == '{'})
			default:
				stack = stack[:len(stack)-1]
			}
			continue
		case string:
			if top != nil && top.object && top.key {
				for _, k := range top.keys {
					if k == v || fold && strings.EqualFold(k, v) {
						return true
					}
				}
				top.keys = append(top.keys, v)
				top.key = false
				continue
			}
		}
		if top != nil && top.object {
			top.key = true
		}
	}
}

func TestBadText(t *testing.T) {
	for _, c := range []struct {
		in, key string
		bad     bool
	}{
		{`{"tenant":"acme","user":"al\u00efce 😀 \ud83d\ude00"}`, "", false},
		{`{"tenant":"acme","user":"\ud800"}`, "user", true},
		{`{"tenant":"acme","user":"\udfff x"}`, "user", true},
		{`{"tenant":"acme","user":"\ud800\u0041"}`, "user", true},
		{"{\"tenant\":\"acme\",\"user\":\"\xff\"}", "user", true},
		{"{\"tenant\":\"acme\",\"attributes\":{\"r\xffegion\":\"eu\"}}", "r\xffegion", true},
		{`{"a":"\\ud800"}`, "", false}, // a backslash, then text
		{`{"a":["x","\ud800"]}`, "a", true},
		{`{"tenant":"\ufffd"}`, "", false}, // the character itself is text
	} {
		key, bad := BadText([]byte(c.in))
		if bad != c.bad || key != c.key {
			t.Errorf("BadText(%q) = %q, %v; want %q, %v", c.in, key, bad, c.key, c.bad)
		}
	}
}
