package httplimit

import (
	"fmt"
	"net/http"
	"net/url"
	"path"
	"strings"

	"github.com/admitdev/admit/internal/bounds"
)

// The action of a request is found by ServeMux patterns (Options.Actions).
// ServeMux itself matches paths exactly: "/login" is not "/login/",
// "/LOGIN", "/login;x" or "/login.json". The application behind Admit may
// well route all of those to its login handler, and then a client that
// spells its path so passes every limit of the login action. Unless
// Options.StrictPaths, a request is therefore matched as the common web
// frameworks route it, on a folded path (foldPath):
//
//   - a trailing slash is dropped: Rails, Express (strict routing off, its
//     default) and Spring MVC before 6 route "/login/" to "/login";
//   - repeated slashes and dot segments are resolved: Rails squeezes
//     slashes, and ServeMux redirects "//login" to "/login" (307 keeps
//     the method);
//   - letters are folded to lower case, on both sides: Express (by
//     default) and ASP.NET route "/LOGIN" to "/login";
//   - ";parameters" are cut from every segment: Servlet containers, and
//     so Spring, route "/login;jsessionid=x" to "/login";
//   - a final ".extension" is dropped when the path with it matches no
//     pattern whose last segment is literal: Rails routes "/login.json"
//     to "/login" with format json (and runs the action before it finds
//     the format unknown), as Spring did before 5.3.
//
// Method names are folded to upper case and host names to lower case. A
// request that folding gives an action is one the application would
// route there, or a path it does not serve at all (a 404 charged to its
// sender's limits).
// Patterns are folded the same way, wildcards aside, so that two patterns
// that differ only by case, or by a trailing "/{$}", are one route and
// refused as conflicting.

// actionPattern is a compiled pattern: its action, and whether its path
// ends in a literal segment (not a wildcard, nor the root).
type actionPattern struct {
	name    string
	literal bool
}

// compileActions compiles the action patterns into l.actions and
// l.patterns, folded unless StrictPaths. ServeMux panics on an invalid or
// conflicting pattern; that becomes an error here.
func (l *Limiter) compileActions() (err error) {
	mux := http.NewServeMux()
	patterns := make(map[string]actionPattern, len(l.opts.Actions))
	firsts := map[string]int{} // the first action of each folded pattern
	for i, a := range l.opts.Actions {
		name := a.Name
		if name == "" {
			name = a.Pattern
		}
		if len(name) > bounds.MaxNameLen {
			return optionError("Actions", i, "action %d: the action name is %d bytes; at most %d", i, len(name), bounds.MaxNameLen)
		}
		pat := a.Pattern
		if !l.opts.StrictPaths {
			pat = foldPattern(pat)
			if j, ok := firsts[pat]; ok {
				return optionError("Actions", i, "action %d: pattern %q is the route of action %d's %q: paths are matched as web frameworks route them (as %q); StrictPaths (http.strict_paths) matches them exactly",
					i, a.Pattern, j, l.opts.Actions[j].Pattern, pat)
			}
			firsts[pat] = i
		}
		func() {
			defer func() {
				if p := recover(); p != nil {
					msg := fmt.Sprint(p)
					if pat != a.Pattern {
						msg += fmt.Sprintf(" (matched as %q: paths are matched as web frameworks route them; StrictPaths (http.strict_paths) matches them exactly)", pat)
					}
					err = optionError("Actions", i, "action %d: pattern %q: %s", i, a.Pattern, msg)
				}
			}()
			mux.Handle(pat, actionHandler(name))
		}()
		if err != nil {
			return err
		}
		patterns[pat] = actionPattern{name: name, literal: literalLast(pat)}
	}
	l.actions, l.patterns = mux, patterns
	return nil
}

// action returns the action of r, or "".
func (l *Limiter) action(r *http.Request) string {
	if l.opts.StrictPaths {
		if h, _ := l.actions.Handler(r); h != nil {
			if a, ok := h.(actionHandler); ok {
				return string(a)
			}
		}
		return ""
	}
	method, host, p := foldMethod(r.Method), strings.ToLower(r.Host), foldPath(r.URL.Path)
	m := r
	if method != r.Method || host != r.Host || p != r.URL.Path || r.URL.RawPath != "" {
		m = &http.Request{Method: method, Host: host, URL: &url.URL{Path: p}}
	}
	name, literal := l.lookup(m)
	if literal {
		return name
	}
	stem := stripExtension(p)
	if stem == p {
		return name
	}
	m = &http.Request{Method: method, Host: host, URL: &url.URL{Path: stem}}
	if s, lit := l.lookup(m); lit || name == "" {
		return s
	}
	return name
}

// lookup returns the action of the pattern that matches m, or that m is
// redirected to ("/api" to "/api/"), and whether its last segment is
// literal.
func (l *Limiter) lookup(m *http.Request) (string, bool) {
	_, pat := l.actions.Handler(m)
	a, ok := l.patterns[pat]
	return a.name, ok && a.literal
}

// foldMethod returns method in upper case.
func foldMethod(method string) string {
	for i := 0; i < len(method); i++ {
		if c := method[i]; c >= 'a' && c <= 'z' {
			return strings.ToUpper(method)
		}
	}
	return method
}

// foldPath returns p as it is matched: ";parameters" cut from every
// segment, in lower case, cleaned (no repeated slashes, no dot segments)
// and without a trailing slash. A path that is already so is returned as
// it is, without allocating.
func foldPath(p string) string {
	if p == "" {
		return "/"
	}
	if p[0] != '/' {
		return p // "*", of OPTIONS *
	}
	folded := true
	for i := 0; i < len(p) && folded; i++ {
		c := p[i]
		folded = !(c >= 'A' && c <= 'Z' || c == ';' || c >= 0x80)
	}
	if folded {
		return path.Clean(p) // allocates only to change p
	}
	var b strings.Builder
	b.Grow(len(p))
	for seg := range strings.SplitSeq(p[1:], "/") {
		if i := strings.IndexByte(seg, ';'); i >= 0 {
			seg = seg[:i]
		}
		b.WriteByte('/')
		b.WriteString(strings.ToLower(seg))
	}
	return path.Clean(b.String())
}

// stripExtension returns p without the ".extension" of its last segment,
// if it has one ("/login.json": "/login"; "/.well-known": itself).
func stripExtension(p string) string {
	last := p[strings.LastIndexByte(p, '/')+1:]
	if i := strings.LastIndexByte(last, '.'); i > 0 {
		return p[:len(p)-len(last)+i]
	}
	return p
}

// foldPattern returns a ServeMux pattern with its literal path segments
// folded as foldPath folds requests' (wildcards are kept as they are), its
// host in lower case, and a final "/{$}" dropped, since a request's
// trailing slash is. Its method is kept: ServeMux refuses a method that
// is not upper case as it would a request's.
func foldPattern(pat string) string {
	method, rest := "", pat
	if i := strings.IndexAny(pat, " \t"); i >= 0 {
		method, rest = pat[:i+1], strings.TrimLeft(pat[i+1:], " \t")
	}
	slash := strings.IndexByte(rest, '/')
	if slash < 0 {
		return pat // ServeMux says what is wrong with it
	}
	host, p := strings.ToLower(rest[:slash]), rest[slash:]
	if len(p) > len("/{$}") && strings.HasSuffix(p, "/{$}") {
		p = strings.TrimSuffix(p, "/{$}")
	}
	segs := strings.Split(p[1:], "/")
	for i, s := range segs {
		if strings.HasPrefix(s, "{") {
			continue
		}
		if j := strings.IndexByte(s, ';'); j >= 0 {
			s = s[:j]
		}
		segs[i] = strings.ToLower(s)
	}
	return method + host + "/" + strings.Join(segs, "/")
}

// literalLast reports whether a pattern's path ends in a literal segment
// (before a subtree's final slash): "/login", "/files/", not "/",
// "/{id}" or "/{$}".
func literalLast(pat string) bool {
	p := pat[strings.IndexByte(pat, '/'):]
	p = strings.TrimSuffix(p, "/")
	last := p[strings.LastIndexByte(p, '/')+1:]
	return last != "" && !strings.HasPrefix(last, "{")
}
