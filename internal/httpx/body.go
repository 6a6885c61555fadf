package httpx

import (
	"net/http"
	"time"
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
