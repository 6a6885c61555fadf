package httplimit

import (
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/admitdev/admit/memstore"
	"github.com/admitdev/admit/policy"
)

// TestActionSpellings: every spelling of a path that a common framework
// routes to an action is that action (one case per variant, and their
// combinations), with a catch-all pattern beside it that must not swallow
// them; other paths are not; StrictPaths matches exactly as ServeMux does.
func TestActionSpellings(t *testing.T) {
	p := testPolicy(t)
	actions := []Action{
		{Pattern: "POST /login", Name: "login"},
		{Pattern: "GET /search", Name: "search"},
		{Pattern: "/files/", Name: "files"},
		{Pattern: "GET /sitemap.xml", Name: "sitemap"},
		{Pattern: "GET /docs/{id}", Name: "doc"},
		{Pattern: "POST /Reports/{id}/{$}", Name: "report"},
		{Pattern: "api.example.com/v2/", Name: "v2"},
		{Pattern: "/", Name: "other"},
	}
	lims := map[bool]*Limiter{}
	for _, strict := range []bool{false, true} {
		lim, err := New(Options{Store: memstore.New(nil), Policy: func() *policy.Policy { return p }, Actions: actions, StrictPaths: strict})
		if err != nil {
			t.Fatal(err)
		}
		defer lim.Close()
		lims[strict] = lim
	}
	for _, tc := range []struct {
		why, method, target string
		folded, strict      string // the action, by default and with StrictPaths
	}{
		{"exact", "POST", "/login", "login", "login"},
		{"trailing slash (Rails, Express, Spring 5)", "POST", "/login/", "login", "other"},
		{"trailing slashes", "POST", "/login//", "login", ""},
		{"upper case (Express, ASP.NET)", "POST", "/LOGIN", "login", "other"},
		{"mixed case", "POST", "/Login", "login", "other"},
		{"escaped upper case", "POST", "/%4Cogin", "login", "other"},
		{"path parameters (Servlet, Spring)", "POST", "/login;jsessionid=0123", "login", "other"},
		{"a path parameter and a slash", "POST", "/login;x/", "login", "other"},
		{"format suffix (Rails, Spring 5.2)", "POST", "/login.json", "login", "other"},
		{"another format", "POST", "/login.html", "login", "other"},
		{"all at once", "POST", "/LOGIN;x.JSON/", "login", "other"},
		{"repeated slashes (Rails; ServeMux redirects)", "POST", "//login", "login", ""},
		{"dot segments (ServeMux redirects)", "POST", "/a/../login", "login", ""},
		{"a method in lower case", "post", "/login", "login", "other"},
		{"another path", "POST", "/logins", "other", "other"},
		{"below it", "POST", "/login/x", "other", "other"},
		{"another method", "GET", "/login", "other", "other"},
		{"a literal extension", "GET", "/sitemap.xml", "sitemap", "sitemap"},
		{"a literal extension in upper case", "GET", "/SITEMAP.XML", "sitemap", "other"},
		{"another extension of a literal one", "GET", "/sitemap.json", "other", "other"},
		{"a format on a wildcard", "GET", "/docs/42.json", "doc", "doc"},
		{"a wildcard's own case", "GET", "/docs/ABC", "doc", "doc"},
		{"a format on a GET action (Rails routes it too)", "GET", "/search.js", "search", "other"},
		{"a dot file", "GET", "/.well-known", "other", "other"},
		{"a subtree", "GET", "/files/a/b", "files", "files"},
		{"a subtree in upper case", "GET", "/FILES/a", "files", "other"},
		{"a subtree's root without its slash (ServeMux redirects)", "GET", "/files", "files", ""},
		{"a subtree's root with a format", "GET", "/files.json", "files", "other"},
		{"a pattern's upper case and {$}", "POST", "/reports/7", "report", "other"},
		{"as written", "POST", "/Reports/7/", "report", "report"},
		{"a host", "GET", "http://api.example.com/v2/x", "v2", "v2"},
		{"a host in upper case", "GET", "http://API.Example.com/v2/x", "v2", "other"},
		{"a host and a port", "GET", "http://api.example.com:8443/v2/x", "v2", "v2"},
	} {
		for strict, want := range map[bool]string{false: tc.folded, true: tc.strict} {
			r := httptest.NewRequest(tc.method, tc.target, nil)
			var req policy.Request
			if err := lims[strict].Identify(r, &req); err != nil {
				t.Fatal(err)
			}
			if req.Action != want {
				t.Errorf("%s: %s %s (strict %v): action %q, want %q", tc.why, tc.method, tc.target, strict, req.Action, want)
			}
		}
	}
}

// TestActionConflictsOnceFolded: patterns that differ only as folding
// erases are one route, refused with the reason; StrictPaths tells them
// apart.
func TestActionConflictsOnceFolded(t *testing.T) {
	p := testPolicy(t)
	for _, pair := range [][2]string{
		{"/login", "/LOGIN"},
		{"POST /login", "POST /login/{$}"},
		{"/a;x", "/a"},
	} {
		for _, strict := range []bool{false, true} {
			lim, err := New(Options{Store: memstore.New(nil), Policy: func() *policy.Policy { return p }, StrictPaths: strict,
				Actions: []Action{{Pattern: pair[0], Name: "a"}, {Pattern: pair[1], Name: "b"}}})
			if strict && err != nil {
				t.Errorf("%q and %q, strict: %v", pair[0], pair[1], err)
			}
			if !strict && (err == nil || !strings.Contains(err.Error(), "StrictPaths")) {
				t.Errorf("%q and %q: %v, want a conflict that names StrictPaths", pair[0], pair[1], err)
			}
			if lim != nil {
				lim.Close()
			}
		}
	}
}

func TestFoldPath(t *testing.T) {
	for in, want := range map[string]string{
		"":                  "/",
		"/":                 "/",
		"/a/b":              "/a/b",
		"/A/B/":             "/a/b",
		"/a;x=1/b;y":        "/a/b",
		"//a//b//":          "/a/b",
		"/a/./b/../c":       "/a/c",
		"/../a":             "/a",
		"/É":                "/é",
		"*":                 "*",
		"/v1/models/gpt-4o": "/v1/models/gpt-4o",
	} {
		if got := foldPath(in); got != want {
			t.Errorf("foldPath(%q) = %q, want %q", in, got, want)
		}
	}
	p := "/v1/docs/42/summary"
	if n := testing.AllocsPerRun(100, func() { _ = foldPath(p) }); n != 0 {
		t.Errorf("folding a folded path: %v allocations", n)
	}
}
