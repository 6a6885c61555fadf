package attack

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"

	"github.com/admitdev/admit/proctest"
)

// TestActionSpellings: admit proxy limits POST /login to 2 per client
// address. The client then logs in as frameworks also route a login
// (Rails, Express, Spring, Servlet containers): a trailing slash, upper
// case, a ;parameter, a .json format, doubled slashes. Each is the login
// action, refused, and never reaches the upstream.
func TestActionSpellings(t *testing.T) {
	var reached atomic.Int64
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/healthz" {
			reached.Add(1)
		}
	}))
	defer up.Close()
	cfg := "version: 1\nhttp:\n  actions:\n    - {match: \"POST /login\", action: login}\n    - {match: \"/\", action: other}\n" +
		"global:\n  - {name: logins-per-ip, scope: ip, actions: [login], algorithm: fixed_window, limit: 2, window: 1h}\n" +
		"  - {name: all, scope: ip, algorithm: token_bucket, rate: 1/s, burst: 1000}\n"
	listen := proctest.FreeAddr(t)
	p := proctest.Start(t, admitBin, listen, nil, "proxy", "--listen", listen, "--upstream", up.URL, "--keys-optional",
		"--data-dir", t.TempDir(), "--config", writeFile(t, "admit.yaml", cfg))
	post := func(path string) int {
		req, _ := http.NewRequest("POST", p.URL+path, nil)
		resp, err := proctest.Client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	for i := range 2 {
		if code := post("/login"); code != 200 {
			t.Fatalf("login %d: %d", i, code)
		}
	}
	spellings := []string{"/login/", "/LOGIN", "/Login", "/login;jsessionid=1", "/login.json", "/LOGIN.JSON/", "//login", "/a/../login", "/%4Cogin"}
	var passed []string
	for _, s := range spellings {
		if code := post(s); code != 429 {
			passed = append(passed, fmt.Sprintf("%s: %d", s, code))
		}
	}
	report(t, "of 9 spellings of POST /login after 2 logins, not refused", len(passed))
	if len(passed) > 0 || reached.Load() != 2 {
		t.Errorf("spellings of /login past its limit: %v; the upstream saw %d logins, want 2", passed, reached.Load())
	}
	if code := post("/logins"); code != 200 {
		t.Errorf("POST /logins, another path: %d", code)
	}
}
