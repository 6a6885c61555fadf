package httpx

import (
	"net/http"
	"strings"

	"github.com/admitdev/admit"
)

// IdempotencyHeader names a request's idempotency key
// (draft-ietf-httpapi-idempotency-key-header): a retry of a charge made
// with the same key, by the same caller, within a window is charged once.
const IdempotencyHeader = "Idempotency-Key"

// MaxIdempotencyKey bounds a key's length, in bytes.
const MaxIdempotencyKey = 255

// IdempotencyKey returns r's idempotency key, "" when it has none: a
// structured-field string ("…") or the same text bare, of visible ASCII
// without quotes, backslashes or commas. Its error, of code admit.CodeInvalid and
// field IdempotencyHeader, says what is wrong with a key given.
func IdempotencyKey(r *http.Request) (string, error) {
	vs := r.Header[IdempotencyHeader]
	switch len(vs) {
	case 0:
		return "", nil
	case 1:
	default:
		return "", badKey("%s given %d times; give it once", IdempotencyHeader, len(vs))
	}
	k := strings.TrimSpace(vs[0])
	if len(k) >= 2 && k[0] == '"' && k[len(k)-1] == '"' {
		k = k[1 : len(k)-1]
	}
	if k == "" || len(k) > MaxIdempotencyKey {
		return "", badKey("%s: 1 to %d characters, got %d", IdempotencyHeader, MaxIdempotencyKey, len(k))
	}
	for i := 0; i < len(k); i++ {
		// A comma would be two keys a proxy folded into one field.
		if c := k[i]; c < 0x20 || c > 0x7e || c == '"' || c == '\\' || c == ',' {
			return "", badKey("%s: printable ASCII without quotes, backslashes or commas, got %q at %d", IdempotencyHeader, c, i)
		}
	}
	return k, nil
}

func badKey(format string, args ...any) error {
	e := admit.Errorf(admit.CodeInvalid, format, args...)
	e.Field = IdempotencyHeader
	return e
}
