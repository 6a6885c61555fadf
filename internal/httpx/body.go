package httpx

import (
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
)

// CloseUnreadBody makes the server close the connection of r, refused
// before its body was read, rather than read the body first: net/http
// reads up to 256 KiB of a body the handler left unread, without a
// deadline, before it writes the response, so a client that declared a
// small body and stalled held its connection, unanswered, for as long as
// it liked. The response says "Connection: close", and the connection's
// read deadline, now, ends the server's read of the rest. Call it before
// the response's header is written. HTTP/2 resets the stream itself.
func CloseUnreadBody(w http.ResponseWriter, r *http.Request) {
	if r.ProtoMajor != 1 || r.Body == nil || r.Body == http.NoBody || r.ContentLength == 0 {
		return
	}
	w.Header().Set("Connection", "close")
	_ = http.NewResponseController(w).SetReadDeadline(time.Now())
}

// Query parses a URL's raw query strictly: a parameter given twice
// (which readers take first-wins or last-wins apart), an escape that is
// not one, or a name or value that is not UTF-8 once unescaped is an
// error naming the parameter.
func Query(raw string) (url.Values, error) {
	q := url.Values{}
	for raw != "" {
		var part string
		part, raw, _ = strings.Cut(raw, "&")
		if part == "" {
			continue
		}
		k, v, _ := strings.Cut(part, "=")
		key, err := url.QueryUnescape(k)
		if err != nil {
			return nil, &QueryError{Param: strings.ToValidUTF8(k, "?"), Msg: "is not a query parameter's name (a bad escape)"}
		}
		val, err := url.QueryUnescape(v)
		if err != nil {
			return nil, &QueryError{Param: strings.ToValidUTF8(key, "?"), Msg: "has a bad escape"}
		}
		if !utf8.ValidString(key) || !utf8.ValidString(val) {
			return nil, &QueryError{Param: strings.ToValidUTF8(key, "?"), Msg: "is not UTF-8 text"}
		}
		if _, dup := q[key]; dup {
			return nil, &QueryError{Param: key, Msg: "is given twice"}
		}
		q[key] = []string{val}
	}
	return q, nil
}

// QueryError is Query's error: what is wrong with which parameter.
type QueryError struct {
	Param, Msg string
}

func (e *QueryError) Error() string { return "query parameter " + strconv.Quote(e.Param) + " " + e.Msg }
