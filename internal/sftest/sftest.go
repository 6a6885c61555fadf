// Package sftest parses Structured Field Values for HTTP (RFC 9651)
// strictly, for tests of the fields Admit writes (RateLimit,
// RateLimit-Policy): a field value that is not exactly of the RFC's
// grammar is an error, never a guess.
//
// It parses Lists (with Inner Lists), Items and their Parameters. Bare
// items are returned as int64 (Integer), float64 (Decimal), string
// (String), Token, []byte (Byte Sequence), bool (Boolean), Date and
// DisplayString. Where the RFC lets a parser be lenient it is not: a
// Byte Sequence must be base64 with its padding and zero pad bits, as a
// serializer writes it.
package sftest

import (
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"
)

// Token is a Token bare item.
type Token string

// Date is a Date bare item: seconds since the Unix epoch.
type Date int64

// DisplayString is a Display String bare item, decoded.
type DisplayString string

// Param is one parameter: a key and its bare item (true when the
// parameter has no value).
type Param struct {
	Key   string
	Value any
}

// Params are the parameters of an Item or an Inner List, in order, each
// key once: a key given twice keeps its place and takes its last value,
// as RFC 9651 parses it.
type Params []Param

// Get returns the value of key, false when p has none.
func (p Params) Get(key string) (any, bool) {
	for _, kv := range p {
		if kv.Key == key {
			return kv.Value, true
		}
	}
	return nil, false
}

// Item is a bare item with its parameters.
type Item struct {
	Value  any
	Params Params
}

// Member is a member of a List: an Item, or an Inner List (Inner set).
type Member struct {
	Item
	// Inner holds the items of an Inner List, whose parameters are
	// Item.Params; nil for an Item.
	Inner []Item
}

// IsInner reports whether m is an Inner List.
func (m Member) IsInner() bool { return m.Inner != nil }

// ParseList parses a List field value, the field's lines joined by
// commas as HTTP combines them.
func ParseList(s string) ([]Member, error) {
	p := parser{s: s}
	p.skipSP()
	var list []Member
	for !p.done() {
		m, err := p.member()
		if err != nil {
			return nil, err
		}
		list = append(list, m)
		p.skipOWS()
		if p.done() {
			return list, nil
		}
		if p.next() != ',' {
			return nil, p.errorf("want a comma between members")
		}
		p.skipOWS()
		if p.done() {
			return nil, p.errorf("a comma ends the list")
		}
	}
	return list, nil
}

// ParseItem parses an Item field value.
func ParseItem(s string) (Item, error) {
	p := parser{s: s}
	p.skipSP()
	it, err := p.item()
	if err != nil {
		return Item{}, err
	}
	p.skipSP()
	if !p.done() {
		return Item{}, p.errorf("data after the item")
	}
	return it, nil
}

type parser struct {
	s string
	i int
}

func (p *parser) done() bool { return p.i >= len(p.s) }

func (p *parser) peek() byte {
	if p.done() {
		return 0
	}
	return p.s[p.i]
}

func (p *parser) next() byte {
	c := p.peek()
	p.i++
	return c
}

func (p *parser) skipSP() {
	for p.peek() == ' ' && !p.done() {
		p.i++
	}
}

func (p *parser) skipOWS() {
	for !p.done() && (p.peek() == ' ' || p.peek() == '\t') {
		p.i++
	}
}

func (p *parser) errorf(format string, args ...any) error {
	return fmt.Errorf("sftest: at byte %d of %q: %s", p.i, p.s, fmt.Sprintf(format, args...))
}

func (p *parser) member() (Member, error) {
	if p.peek() == '(' {
		return p.innerList()
	}
	it, err := p.item()
	return Member{Item: it}, err
}

func (p *parser) innerList() (Member, error) {
	p.i++ // (
	inner := []Item{}
	for !p.done() {
		p.skipSP()
		if p.peek() == ')' {
			p.i++
			params, err := p.params()
			return Member{Item: Item{Params: params}, Inner: inner}, err
		}
		it, err := p.item()
		if err != nil {
			return Member{}, err
		}
		inner = append(inner, it)
		if c := p.peek(); c != ' ' && c != ')' {
			return Member{}, p.errorf("want a space or ) after an inner list's item")
		}
	}
	return Member{}, p.errorf("an inner list without its )")
}

func (p *parser) item() (Item, error) {
	v, err := p.bareItem()
	if err != nil {
		return Item{}, err
	}
	params, err := p.params()
	return Item{Value: v, Params: params}, err
}

func (p *parser) params() (Params, error) {
	var params Params
	for p.peek() == ';' && !p.done() {
		p.i++
		p.skipSP()
		key, err := p.key()
		if err != nil {
			return nil, err
		}
		var v any = true
		if p.peek() == '=' && !p.done() {
			p.i++
			if v, err = p.bareItem(); err != nil {
				return nil, err
			}
		}
		replaced := false
		for j := range params {
			if params[j].Key == key {
				params[j].Value, replaced = v, true
			}
		}
		if !replaced {
			params = append(params, Param{key, v})
		}
	}
	return params, nil
}

func (p *parser) key() (string, error) {
	start := p.i
	if c := p.peek(); p.done() || !(isLCAlpha(c) || c == '*') {
		return "", p.errorf("want a key: a lowercase letter or *")
	}
	for !p.done() {
		c := p.peek()
		if !(isLCAlpha(c) || isDigit(c) || c == '_' || c == '-' || c == '.' || c == '*') {
			break
		}
		p.i++
	}
	return p.s[start:p.i], nil
}

func (p *parser) bareItem() (any, error) {
	if p.done() {
		return nil, p.errorf("want an item, got the end")
	}
	switch c := p.peek(); {
	case c == '-' || isDigit(c):
		return p.number()
	case c == '"':
		return p.str()
	case c == '*' || isAlpha(c):
		return p.token(), nil
	case c == ':':
		return p.byteSeq()
	case c == '?':
		return p.boolean()
	case c == '@':
		p.i++
		n, err := p.number()
		if err != nil {
			return nil, err
		}
		d, ok := n.(int64)
		if !ok {
			return nil, p.errorf("a date that is not an integer")
		}
		return Date(d), nil
	case c == '%':
		return p.displayString()
	}
	return nil, p.errorf("%q starts no item", p.peek())
}

func (p *parser) number() (any, error) {
	start := p.i
	if p.peek() == '-' {
		p.i++
	}
	if !isDigit(p.peek()) || p.done() {
		return nil, p.errorf("want a digit")
	}
	digits, dot := 0, -1
	for !p.done() {
		c := p.peek()
		if isDigit(c) {
			digits++
		} else if c == '.' && dot < 0 {
			if digits > 12 {
				return nil, p.errorf("a decimal of more than 12 integer digits")
			}
			dot = digits
		} else {
			break
		}
		p.i++
		if digits > 15 {
			return nil, p.errorf("a number of more than 15 digits")
		}
	}
	text := p.s[start:p.i]
	if dot < 0 {
		n, err := strconv.ParseInt(text, 10, 64)
		if err != nil {
			return nil, p.errorf("%v", err)
		}
		return n, nil
	}
	if frac := digits - dot; frac < 1 || frac > 3 {
		return nil, p.errorf("a decimal with %d fractional digits; want 1 to 3", frac)
	}
	f, err := strconv.ParseFloat(text, 64)
	if err != nil {
		return nil, p.errorf("%v", err)
	}
	return f, nil
}

func (p *parser) str() (string, error) {
	p.i++ // "
	var b strings.Builder
	for !p.done() {
		c := p.next()
		switch {
		case c == '\\':
			if p.done() {
				return "", p.errorf("a string ends in a backslash")
			}
			e := p.next()
			if e != '"' && e != '\\' {
				return "", p.errorf("the escape \\%c in a string", e)
			}
			b.WriteByte(e)
		case c == '"':
			return b.String(), nil
		case c < 0x20 || c > 0x7e:
			return "", p.errorf("the byte %#x in a string", c)
		default:
			b.WriteByte(c)
		}
	}
	return "", p.errorf("a string without its closing quote")
}

func (p *parser) token() Token {
	start := p.i
	p.i++
	for !p.done() && (isTchar(p.peek()) || p.peek() == ':' || p.peek() == '/') {
		p.i++
	}
	return Token(p.s[start:p.i])
}

func (p *parser) byteSeq() ([]byte, error) {
	p.i++ // :
	end := strings.IndexByte(p.s[p.i:], ':')
	if end < 0 {
		return nil, p.errorf("a byte sequence without its closing colon")
	}
	text := p.s[p.i : p.i+end]
	for i := 0; i < len(text); i++ {
		if c := text[i]; !(isAlpha(c) || isDigit(c) || c == '+' || c == '/' || c == '=') {
			return nil, p.errorf("the byte %q in a byte sequence", c)
		}
	}
	b, err := base64.StdEncoding.Strict().DecodeString(text)
	if err != nil {
		return nil, p.errorf("a byte sequence that is not base64 with its padding: %v", err)
	}
	p.i += end + 1
	return b, nil
}

func (p *parser) boolean() (bool, error) {
	p.i++ // ?
	switch p.next() {
	case '0':
		return false, nil
	case '1':
		return true, nil
	}
	p.i--
	return false, p.errorf("a boolean that is not ?0 or ?1")
}

func (p *parser) displayString() (DisplayString, error) {
	p.i++ // %
	if p.next() != '"' {
		p.i--
		return "", p.errorf("want \" after %% of a display string")
	}
	var b []byte
	for !p.done() {
		c := p.next()
		switch {
		case c == '%':
			if p.i+2 > len(p.s) {
				return "", p.errorf("a percent escape cut short")
			}
			hex := p.s[p.i : p.i+2]
			if strings.ToLower(hex) != hex {
				return "", p.errorf("a percent escape in upper case")
			}
			n, err := strconv.ParseUint(hex, 16, 8)
			if err != nil {
				return "", p.errorf("the percent escape %%%s", hex)
			}
			b = append(b, byte(n))
			p.i += 2
		case c == '"':
			if !utf8.Valid(b) {
				return "", errors.New("sftest: a display string that is not UTF-8")
			}
			return DisplayString(b), nil
		case c < 0x20 || c > 0x7e:
			return "", p.errorf("the byte %#x in a display string", c)
		default:
			b = append(b, c)
		}
	}
	return "", p.errorf("a display string without its closing quote")
}

func isDigit(c byte) bool   { return '0' <= c && c <= '9' }
func isLCAlpha(c byte) bool { return 'a' <= c && c <= 'z' }
func isAlpha(c byte) bool   { return isLCAlpha(c) || 'A' <= c && c <= 'Z' }

// isTchar reports whether c is a tchar of RFC 9110.
func isTchar(c byte) bool {
	return isAlpha(c) || isDigit(c) || strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0
}

// RateLimitFields parses the RateLimit-Policy and RateLimit fields of h with a
// strict RFC 9651 parser, by policy name, failing t on any syntax error
// or on a name the two fields do not both list once.
func RateLimitFields(t testing.TB, h http.Header) (policies, limits map[string]Params) {
	t.Helper()
	parse := func(field string) (map[string]Params, []string) {
		list, err := ParseList(h.Get(field))
		if err != nil {
			t.Fatalf("%s: %v", field, err)
		}
		byName := map[string]Params{}
		var names []string
		for _, m := range list {
			name, ok := m.Value.(string)
			if m.IsInner() || !ok {
				t.Fatalf("%s: a member %#v that is not a String item", field, m)
			}
			if _, dup := byName[name]; dup {
				t.Fatalf("%s: %q twice", field, name)
			}
			byName[name] = m.Params
			names = append(names, name)
		}
		return byName, names
	}
	policies, pn := parse("RateLimit-Policy")
	limits, ln := parse("RateLimit")
	if !reflect.DeepEqual(pn, ln) {
		t.Fatalf("RateLimit-Policy names %q, RateLimit %q", pn, ln)
	}
	return policies, limits
}
