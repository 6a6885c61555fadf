package server

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
)

// BenchmarkCheck measures the /v1/check handler without the network: JSON
// decoding, resolution, the decision, headers, metrics and the answer.
func BenchmarkCheck(b *testing.B) {
	h := start(b, testSpec(), "")
	bodies := make([]string, 1000)
	for i := range bodies {
		bodies[i] = fmt.Sprintf(`{"tenant":"t%d","user":"user-%d","action":"read","cost":0}`, 1+i%2, i)
	}
	var next atomic.Int64
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			w := httptest.NewRecorder()
			i := next.Add(1)
			req := httptest.NewRequest(http.MethodPost, "/v1/check", strings.NewReader(bodies[i%int64(len(bodies))]))
			h.srv.ServeHTTP(w, req)
			if w.Code != 200 {
				b.Fatalf("status %d: %s", w.Code, w.Body)
			}
		}
	})
}
