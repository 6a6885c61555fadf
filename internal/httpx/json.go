package httpx

import (
	"bytes"
	"encoding/json"
	"math"
	"strings"
	"unicode"
	"unicode/utf8"
)

// DuplicateKey returns a key that an object of data, a JSON text, holds
// twice (the second time it is written, unescaped), and reports whether
// there is one, at any depth. encoding/json decodes such an object with
// the last value winning, while a proxy, a firewall or the service in
// front of Admit may have read the first: a body whose fields two readers
// read apart is refused instead.
//
// Keys are compared as encoding/json decodes them ("\u0074enant" is
// "tenant"; bytes that are not UTF-8 are U+FFFD), and with fold, also
// ignoring case as strings.EqualFold does, since
// encoding/json matches a struct field's name in any case ("Tenant" sets
// the tenant field). data should be valid JSON (decode it first);
// DuplicateKey reports nothing it cannot read.
//
// It allocates nothing for a text of up to 32 keys open at once, 16
// levels deep, with no escape in a key, which every body of the API is;
// an object of more keys is checked through a map, so that the time
// stays linear in the size of data.
func DuplicateKey(data []byte, fold bool) (string, bool) {
	if fold {
		return duplicateKey(data, math.MaxInt)
	}
	return duplicateKey(data, 0)
}

// DuplicateFieldKey is DuplicateKey for a JSON object decoded into a
// struct whose fields keep nested values as they are (json.RawMessage):
// the outermost object's keys are compared in any case, as encoding/json
// matches them to the struct's fields, and the keys of the objects within
// exactly, as whoever reads those values next may tell "a" from "A".
func DuplicateFieldKey(data []byte) (string, bool) {
	return duplicateKey(data, 1)
}

// duplicateKey is DuplicateKey with the keys of objects nested less than
// foldDepth deep (the outermost is 0) compared in any case.
func duplicateKey(data []byte, foldDepth int) (string, bool) {
	// For each object and array open, innermost last: where its keys
	// begin in keys (-1 for an array), whether a key comes next, and,
	// once it has more than linearKeys keys, a map of them normalized
	// (see normal). The lists start in arrays of this frame, and all is
	// in this one function, so that the bodies of the API need no
	// allocation.
	var (
		keyArr   [linearKeys][]byte
		startArr [16]int
		inKeyArr [16]bool
		bigArr   [16]map[string]struct{}
	)
	keys, starts, inKey, big := keyArr[:0], startArr[:0], inKeyArr[:0], bigArr[:0]
	for i := 0; i < len(data); i++ {
		switch data[i] {
		case '{', '[':
			start := len(keys)
			if data[i] == '[' {
				start = -1 // an array has no keys
			}
			starts, inKey, big = append(starts, start), append(inKey, data[i] == '{'), append(big, nil)
		case '}', ']':
			if n := len(starts); n > 0 {
				if starts[n-1] >= 0 {
					keys = keys[:starts[n-1]]
				}
				starts, inKey, big = starts[:n-1], inKey[:n-1], big[:n-1]
			}
		case ',':
			if n := len(starts); n > 0 && starts[n-1] >= 0 {
				inKey[n-1] = true
			}
		case ':':
			if n := len(starts); n > 0 {
				inKey[n-1] = false
			}
		case '"':
			end := stringEnd(data, i+1)
			if end < 0 {
				return "", false
			}
			raw := data[i+1 : end]
			i = end
			top := len(starts) - 1
			if top < 0 || starts[top] < 0 || !inKey[top] {
				continue // a value
			}
			fold := top < foldDepth
			if m := big[top]; m != nil {
				n := normal(raw, fold)
				if _, dup := m[n]; dup {
					return unquote(raw), true
				}
				m[n] = struct{}{}
				continue
			}
			for _, k := range keys[starts[top]:] {
				if same(k, raw, fold) {
					return unquote(raw), true
				}
			}
			keys = append(keys, raw)
			if len(keys)-starts[top] > linearKeys {
				// Many keys: from here on, a map of the object's keys,
				// and they leave the list that nested objects share.
				m := make(map[string]struct{}, 4*linearKeys)
				for _, k := range keys[starts[top]:] {
					m[normal(k, fold)] = struct{}{}
				}
				big[top], keys = m, keys[:starts[top]]
			}
		}
	}
	return "", false
}

// linearKeys is how many keys an object may have before they are kept in
// a map rather than compared one by one.
const linearKeys = 32

// same reports whether two raw keys are one key once decoded (escapes
// read, and bytes that are not UTF-8 made U+FFFD, as encoding/json does).
func same(a, b []byte, fold bool) bool {
	if plain(a) && plain(b) {
		if fold {
			return bytes.EqualFold(a, b)
		}
		return bytes.Equal(a, b)
	}
	if fold {
		return strings.EqualFold(unquote(a), unquote(b))
	}
	return unquote(a) == unquote(b)
}

// normal is a raw key unescaped and, with fold, every rune replaced by the
// smallest of its case-folding orbit, so that keys strings.EqualFold
// matches have one normal form.
func normal(raw []byte, fold bool) string {
	k := unquote(raw)
	if !fold {
		return k
	}
	return strings.Map(func(r rune) rune {
		least := r
		for f := unicode.SimpleFold(r); f != r; f = unicode.SimpleFold(f) {
			least = min(least, f)
		}
		return least
	}, k)
}

// stringEnd returns the index of the quote that ends the string whose
// content starts at i, or -1 if it does not end.
func stringEnd(b []byte, i int) int {
	for i < len(b) {
		j := bytes.IndexAny(b[i:], `"\`)
		if j < 0 {
			return -1
		}
		i += j
		if b[i] == '"' {
			return i
		}
		i += 2 // an escape: the backslash and the character after it
	}
	return -1
}

// plain reports whether a raw key is its own decoding: UTF-8 without
// escapes.
func plain(raw []byte) bool { return bytes.IndexByte(raw, '\\') < 0 && utf8.Valid(raw) }

// unquote returns the raw content of a JSON string decoded, or as it is
// when it does not decode.
func unquote(raw []byte) string {
	if plain(raw) {
		return string(raw)
	}
	var s string
	q := make([]byte, 0, len(raw)+2)
	q = append(append(append(q, '"'), raw...), '"')
	if json.Unmarshal(q, &s) != nil {
		return string(raw)
	}
	return s
}

// BadText reports where JSON text data holds a string that is not text:
// bytes that are not UTF-8, or an escape of half a UTF-16 surrogate pair
// ("\ud800" alone). encoding/json decodes both as U+FFFD, so that two
// different values would be one (one bucket, one key): they are refused
// instead. It returns the key the string is, or is the value of (as
// written; "" at the top or in an array of the top), and whether there is
// one. data is valid JSON otherwise, or what BadText says is meaningless.
func BadText(data []byte) (key string, bad bool) {
	var lastKey []byte
	for i := 0; i < len(data); i++ {
		if data[i] != '"' {
			continue
		}
		// A string: find its end, checking what it holds.
		start := i + 1
		ok := true
		j := start
		for j < len(data) && data[j] != '"' {
			switch c := data[j]; {
			case c == '\\' && j+1 < len(data) && data[j+1] == 'u':
				r, n := escapedRune(data[j:])
				if r < 0 {
					ok = false
				}
				j += n
			case c == '\\':
				j += 2
			case c < utf8.RuneSelf:
				j++
			default:
				r, n := utf8.DecodeRune(data[j:])
				if r == utf8.RuneError && n == 1 {
					ok = false
				}
				j += n
			}
		}
		s := data[start:min(j, len(data))]
		// A key is a string followed by a colon.
		k := j + 1
		for k < len(data) && (data[k] == ' ' || data[k] == '\t' || data[k] == '\n' || data[k] == '\r') {
			k++
		}
		isKey := k < len(data) && data[k] == ':'
		if !ok {
			if isKey {
				return string(s), true
			}
			return string(lastKey), true
		}
		if isKey {
			lastKey = s
		}
		i = j
	}
	return "", false
}

// escapedRune decodes the \uXXXX escape at the start of b (a surrogate
// pair's two escapes together) and returns its rune and length: -1 for
// half a pair, or an escape that is not four hex digits.
func escapedRune(b []byte) (rune, int) {
	hex4 := func(b []byte) rune {
		if len(b) < 6 || b[0] != '\\' || b[1] != 'u' {
			return -1
		}
		var r rune
		for _, c := range b[2:6] {
			switch {
			case '0' <= c && c <= '9':
				r = r<<4 | rune(c-'0')
			case 'a' <= c && c <= 'f':
				r = r<<4 | rune(c-'a'+10)
			case 'A' <= c && c <= 'F':
				r = r<<4 | rune(c-'A'+10)
			default:
				return -1
			}
		}
		return r
	}
	r := hex4(b)
	switch {
	case r < 0:
		return -1, 2
	case 0xD800 <= r && r < 0xDC00:
		lo := hex4(b[6:])
		if 0xDC00 <= lo && lo < 0xE000 {
			return 0x10000 + (r-0xD800)<<10 + (lo - 0xDC00), 12
		}
		return -1, 6
	case 0xDC00 <= r && r < 0xE000:
		return -1, 6
	}
	return r, 6
}
