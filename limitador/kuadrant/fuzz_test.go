package kuadrant

import (
	"strings"
	"testing"
)

// FuzzImport: whatever the manifests, Import neither panics nor runs
// unbounded, every refusal names its file, and what it converts writes.
// The input is split at "\n%%\n" into a policy file and a route file.
func FuzzImport(f *testing.F) {
	f.Add(rlp("shop", "p", "HTTPRoute r", limits("a", "b")) + "\n%%\n" + httpRoute("shop", "r", ext, "", "x"))
	f.Add(rlp("gateway-system", "gw", "Gateway external#https", within("overrides", "merge", limits("a"))) + trlp("shop", "t", "HTTPRoute r#x", limits("a")) + "\n%%\n" + httpRoute("shop", "r", ext))
	f.Add("apiVersion: v1\nkind: List\nitems:\n- &a {kind: RateLimitPolicy}\n- *a\n")
	f.Add("a: &a [*a]\n---\n{{{")
	f.Fuzz(func(t *testing.T, data string) {
		if len(data) > 64<<10 {
			return
		}
		policies, routes, _ := strings.Cut(data, "\n%%\n")
		res, err := Import([]File{{Name: "p.yaml", Data: []byte(policies)}}, []File{{Name: "r.yaml", Data: []byte(routes)}}, Options{Namespace: "ns"})
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range res.Refused {
			if r.File != "p.yaml" && r.File != "r.yaml" {
				t.Fatalf("refusal without its file: %v", r)
			}
		}
		if len(res.Limits) > MaxEntries {
			t.Fatalf("%d limits", len(res.Limits))
		}
		var b strings.Builder
		if err := Write(&b, res.Limits); err != nil {
			t.Fatal(err)
		}
	})
}

// TestImportBounds: inputs over the bounds are refused, not read.
func TestImportBounds(t *testing.T) {
	if _, err := Import(make([]File, MaxFiles+1), nil, Options{}); err == nil {
		t.Error("too many files: no error")
	}
	if _, err := Import([]File{{Name: "big.yaml", Data: make([]byte, MaxFileSize+1)}}, nil, Options{}); err == nil {
		t.Error("a file too large: no error")
	}
	many := strings.Repeat("---\nkind: Secret\n", MaxDocuments+5)
	res, _ := Import([]File{{Name: "many.yaml", Data: []byte(many)}}, nil, Options{})
	if n := len(res.Refused); n != MaxDocuments+1 || !strings.Contains(res.Refused[n-1].Msg, "more than 2000 documents") {
		t.Errorf("%d refused, the last %v", n, res.Refused[n-1])
	}
	var rates strings.Builder
	rates.WriteString("  limits:\n    a:\n      rates:\n")
	for i := 0; i <= MaxRates; i++ {
		rates.WriteString("      - {limit: 1, window: 1s}\n")
	}
	res, _ = Import([]File{{Name: "p.yaml", Data: []byte(rlp("shop", "p", "HTTPRoute r", rates.String()))}}, nil, Options{})
	if len(res.Refused) != 1 || !strings.Contains(res.Refused[0].Msg, "17 items; at most 16 are read") {
		t.Errorf("too many rates: %v", res.Refused)
	}
	// Seven policies without a creationTimestamp on one route are more
	// orders than are weighed.
	var seven string
	for i := range 7 {
		seven += rlp("shop", "p"+string(rune('a'+i)), "HTTPRoute r", limits("a"))
	}
	res, _ = Import([]File{{Name: "p.yaml", Data: []byte(seven)}}, nil, Options{})
	if len(res.Limits) != 0 || len(res.Refused) != 7 || !strings.Contains(res.Refused[0].Msg, "more than six RateLimitPolicies target HTTPRoute shop/r") {
		t.Errorf("seven unordered policies: %d limits, %v", len(res.Limits), res.Refused)
	}
}
