// Package yamlconf reports the problems of YAML configuration files the way
// every loader of Admit does: each with its file, line and column, and the
// field it is about when there is one, all of a file's problems together.
// Admit's configuration (cmd/admit) and the envoyproxy/ratelimit files
// (envoyrls) share it.
package yamlconf

import (
	"cmp"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"syscall"

	"go.yaml.in/yaml/v3"
)

// Error is one problem in a configuration file, with its position.
type Error struct {
	File      string
	Line, Col int    // 0 when the problem is the whole file's
	Path      string // the field, like tiers.free.rules[0].rate; may be empty
	Msg       string
}

func (e Error) Error() string {
	where := e.File
	if e.Line > 0 {
		where = fmt.Sprintf("%s:%d:%d", e.File, e.Line, e.Col)
	}
	if e.Path != "" {
		return fmt.Sprintf("%s: %s: %s", where, e.Path, e.Msg)
	}
	return fmt.Sprintf("%s: %s", where, e.Msg)
}

// At returns the problem msg at node n of file (n may be nil: the whole
// file's problem).
func At(file string, n *yaml.Node, path, msg string) Error {
	e := Error{File: file, Path: path, Msg: msg}
	if n != nil {
		e.Line, e.Col = n.Line, n.Column
	}
	return e
}

// Errors lists every problem found, one a line.
type Errors []Error

func (e Errors) Error() string {
	lines := make([]string, len(e))
	for i, ce := range e {
		lines[i] = ce.Error()
	}
	return strings.Join(lines, "\n")
}

// SyntaxError turns the YAML decoder's error ("yaml: line 3: …") into an
// Error at that line.
func SyntaxError(file string, err error) Error {
	msg := strings.TrimPrefix(err.Error(), "yaml: ")
	e := Error{File: file, Msg: msg}
	var line int
	if n, _ := fmt.Sscanf(msg, "line %d:", &line); n == 1 {
		e.Line, e.Col = line, 1
		e.Msg = strings.TrimSpace(msg[strings.Index(msg, ":")+1:])
	}
	return e
}

// DuplicateKeys returns an Error for every key of a mapping under n
// that the mapping holds already, at the later key, naming the line of the
// first. A YAML decoder into a node keeps both, and whoever reads them
// next keeps one: a second "acme:" entry that drops acme's API keys, or a
// "burst: 1000000" after "burst: 2", would be taken silently.
func DuplicateKeys(file string, n *yaml.Node) Errors {
	var errs Errors
	var walk func(n *yaml.Node)
	walk = func(n *yaml.Node) {
		if n == nil {
			return
		}
		if n.Kind == yaml.MappingNode {
			seen := make(map[string]*yaml.Node, len(n.Content)/2)
			for i := 0; i+1 < len(n.Content); i += 2 {
				k := n.Content[i]
				if k.Kind == yaml.ScalarNode {
					if first, ok := seen[k.Value]; ok {
						errs = append(errs, At(file, k, "", fmt.Sprintf("duplicate key %q (first at line %d): each key appears once in a mapping", k.Value, first.Line)))
					} else {
						seen[k.Value] = k
					}
				}
			}
		}
		for _, c := range n.Content {
			walk(c)
		}
	}
	walk(n)
	slices.SortStableFunc(errs, func(a, b Error) int { return cmp.Or(cmp.Compare(a.Line, b.Line), cmp.Compare(a.Col, b.Col)) })
	return errs
}

// KindName describes what a node is, for a message that says what was
// found instead of what was wanted: "a mapping", "a list", "an alias", or
// the scalar's value, quoted.
func KindName(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	case yaml.AliasNode:
		return "an alias"
	}
	return fmt.Sprintf("%q", n.Value)
}

// ReadFile reads a configuration file of at most max bytes. It reads no
// more than that whatever is there, and only from a regular file: a file
// that grows while it is read, or a name (a symbolic link, say) for
// /dev/zero or a named pipe, is refused rather than read without end. It
// never waits on what it opens: a pipe is opened without blocking (an
// open for reading otherwise waits for a writer, for ever) and refused.
func ReadFile(name string, max int64) ([]byte, error) {
	f, err := os.OpenFile(name, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !st.Mode().IsRegular() {
		return nil, fmt.Errorf("%s is not a regular file (%v)", name, st.Mode().Type())
	}
	if st.Size() > max {
		return nil, fmt.Errorf("%d bytes; at most %d", st.Size(), max)
	}
	data, err := io.ReadAll(io.LimitReader(f, max+1))
	if err != nil {
		return nil, err
	}
	if int64(len(data)) > max {
		return nil, fmt.Errorf("more than %d bytes; at most %d", max, max)
	}
	return data, nil
}
