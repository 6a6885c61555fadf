package admit

// ParseKey decodes a key Key.String made, for the tests of package
// admit_test that look inside the keys a Limiter builds.
var ParseKey = parseKey
