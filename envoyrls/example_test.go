package envoyrls_test

import (
	"fmt"

	"github.com/admitdev/admit/envoyrls"
)

// An envoyproxy/ratelimit file is parsed once; Lookup then says which limit
// a request descriptor falls under.
func ExampleConfig_Lookup() {
	cfg, err := envoyrls.Parse(envoyrls.File{Name: "messaging.yaml", Data: []byte(`
domain: messaging
descriptors:
  - key: message_type
    value: marketing
    descriptors:
      - key: to_number
        rate_limit: {unit: day, requests_per_unit: 5}
  - key: to_number
    rate_limit: {unit: day, requests_per_unit: 100}
`)})
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, entries := range [][]envoyrls.Entry{
		{{Key: "message_type", Value: "marketing"}, {Key: "to_number", Value: "2061111111"}},
		{{Key: "to_number", Value: "2061111111"}},
		{{Key: "message_type", Value: "marketing"}},
	} {
		if m := cfg.Lookup("messaging", entries); m.Limit != nil {
			fmt.Printf("%s: %d per %s\n", m.Limit.FullKey, m.Limit.RequestsPerUnit, m.Limit.Unit)
		} else {
			fmt.Println("no limit")
		}
	}
	// Output:
	// messaging.message_type_marketing.to_number: 5 per DAY
	// messaging.to_number: 100 per DAY
	// no limit
}
