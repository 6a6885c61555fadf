package admit

import "github.com/admitdev/admit/internal/slots"

// ParseKey decodes a key Key.String made, for the tests of package
// admit_test that look inside the keys a Limiter builds.
var ParseKey = parseKey

// parseKey decodes a string made by Key.String.
func parseKey(s string) (Key, error) {
	f, ok := slots.Fields(s)
	if !ok {
		return Key{}, Errorf(CodeInvalid, "key %q is not one Key.String makes", s)
	}
	return Key{Scope: f[0], Tenant: f[1], Subject: f[2], Action: f[3], Rule: f[4]}, nil
}
