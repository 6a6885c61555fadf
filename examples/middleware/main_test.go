package main

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/admitdev/admit/internal/readmetest"
	"github.com/admitdev/admit/memstore"
	"github.com/admitdev/admit/storetest"
)

func TestExample(t *testing.T) {
	store := memstore.New(&memstore.Options{Clock: storetest.NewClock().Now})
	defer store.Close()
	h, err := newHandler(store)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	defer srv.Close()
	status := func(tenant, path string) int {
		req, _ := http.NewRequest(http.MethodGet, srv.URL+path, nil)
		if tenant != "" {
			req.Header.Set("X-Tenant", tenant)
		}
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		return res.StatusCode
	}
	for i := range 20 {
		if got := status("acme", "/summary"); got != http.StatusOK {
			t.Fatalf("request %d: %d", i+1, got)
		}
	}
	for _, tc := range []struct {
		tenant, path string
		want         int
	}{
		{"acme", "/summary", http.StatusTooManyRequests},
		{"acme", "/export", http.StatusOK},
		{"globex", "/summary", http.StatusOK},
		{"", "/summary", http.StatusBadRequest},
	} {
		if got := status(tc.tenant, tc.path); got != tc.want {
			t.Errorf("tenant %q %s: %d, want %d", tc.tenant, tc.path, got, tc.want)
		}
	}
}

// TestREADME: the middleware block of README.md is the middle of
// newHandler, to the byte but for its indentation, so that what a reader
// copies compiles and does what TestExample checks.
func TestREADME(t *testing.T) {
	block := readmetest.Block(t, "In a `net/http` server (`examples/middleware`):", "go")
	indented := "\t" + strings.ReplaceAll(strings.TrimSuffix(block, "\n"), "\n", "\n\t") + "\n"
	if !strings.Contains(readmetest.File(t, "main.go"), indented) {
		t.Errorf("README.md's middleware block is not in examples/middleware/main.go:\n%s", block)
	}
}
