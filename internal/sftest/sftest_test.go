package sftest

import (
	"bytes"
	"reflect"
	"testing"
)

// TestParseList: lists as RFC 9651 serializes them parse to their
// members; anything off the grammar is an error.
func TestParseList(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want []Member
	}{
		{``, nil},
		{`"a";q=1, "b";q=2;w=60`, []Member{
			{Item: Item{Value: "a", Params: Params{{"q", int64(1)}}}},
			{Item: Item{Value: "b", Params: Params{{"q", int64(2)}, {"w", int64(60)}}}},
		}},
		{`"x\"y\\z";pk=:AQID:;qu="concurrent-requests"`, []Member{
			{Item: Item{Value: `x"y\z`, Params: Params{{"pk", []byte{1, 2, 3}}, {"qu", "concurrent-requests"}}}},
		}},
		{`tok/en;a;b=?0;c=-1.5;d=@1700000000;e=%"caf%c3%a9"`, []Member{
			{Item: Item{Value: Token("tok/en"), Params: Params{{"a", true}, {"b", false}, {"c", -1.5}, {"d", Date(1700000000)}, {"e", DisplayString("café")}}}},
		}},
		{`(1 2);x=1,	3`, []Member{
			{Item: Item{Params: Params{{"x", int64(1)}}}, Inner: []Item{{Value: int64(1)}, {Value: int64(2)}}},
			{Item: Item{Value: int64(3)}},
		}},
		{`1;a=1;a=2;b=3`, []Member{{Item: Item{Value: int64(1), Params: Params{{"a", int64(2)}, {"b", int64(3)}}}}}},
		{`999999999999999`, []Member{{Item: Item{Value: int64(999999999999999)}}}},
	} {
		got, err := ParseList(tc.in)
		if err != nil {
			t.Errorf("ParseList(%q): %v", tc.in, err)
			continue
		}
		if !reflect.DeepEqual(got, tc.want) {
			t.Errorf("ParseList(%q) = %#v, want %#v", tc.in, got, tc.want)
		}
	}
	for _, in := range []string{
		`"a",`, `"a" "b"`, `"a";Q=1`, `"a";q=`, `"a`, `"a\n"`, `"é"`, `1000000000000000`,
		`1.2345`, `1.`, `:AQI:`, `:AQ==`, `:AQ?=:`, `?2`, `"a";;q=1`, `(1 2`, `(1,2)`, `,"a"`, `%"A%C3"`,
	} {
		if got, err := ParseList(in); err == nil {
			t.Errorf("ParseList(%q) = %#v, want an error", in, got)
		}
	}
}

// TestParseItem: one item and nothing after it.
func TestParseItem(t *testing.T) {
	it, err := ParseItem(`:cHJldGVuZA==:;x`)
	if err != nil || !bytes.Equal(it.Value.([]byte), []byte("pretend")) || len(it.Params) != 1 {
		t.Errorf("ParseItem = %#v, %v", it, err)
	}
	if _, err := ParseItem(`1, 2`); err == nil {
		t.Error("ParseItem of a list: no error")
	}
}
