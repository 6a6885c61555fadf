package kuadrant

import (
	"bytes"
	"io"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"
)

// Write writes limits as a Limitador limits file: a YAML list of entries
// with namespace, max_value, seconds, conditions, variables, name and, when
// set, id, in the order given (Import's is stable, so the same manifests
// give the same bytes). No limits write an empty list, "[]".
func Write(w io.Writer, limits []Limit) error {
	if len(limits) == 0 {
		_, err := io.WriteString(w, "[]\n")
		return err
	}
	list := &yaml.Node{Kind: yaml.SequenceNode}
	for _, l := range limits {
		entry := &yaml.Node{Kind: yaml.MappingNode}
		add := func(key string, value *yaml.Node) {
			entry.Content = append(entry.Content, str(key), value)
		}
		add("namespace", str(l.Namespace))
		add("max_value", integer(l.MaxValue))
		add("seconds", integer(l.Seconds))
		add("conditions", strs(l.Conditions))
		add("variables", strs(l.Variables))
		if l.Name != "" {
			add("name", str(l.Name))
		}
		if l.ID != "" {
			add("id", str(l.ID))
		}
		list.Content = append(list.Content, entry)
	}
	var buf bytes.Buffer
	enc := yaml.NewEncoder(&buf)
	enc.SetIndent(2)
	if err := enc.Encode(list); err != nil {
		return err
	}
	if err := enc.Close(); err != nil {
		return err
	}
	_, err := w.Write(buf.Bytes())
	return err
}

// str is a string, quoted where a YAML 1.1 reader would take it for a
// boolean or null ("yes", "off", "~"): the names come from manifests.
func str(s string) *yaml.Node {
	n := &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: s}
	switch strings.ToLower(s) {
	case "y", "yes", "n", "no", "on", "off", "true", "false", "null", "~":
		n.Style = yaml.DoubleQuotedStyle
	}
	return n
}

func integer(n int64) *yaml.Node {
	return &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!int", Value: strconv.FormatInt(n, 10)}
}

// strs is a list of strings; an empty one is written [].
func strs(items []string) *yaml.Node {
	n := &yaml.Node{Kind: yaml.SequenceNode}
	if len(items) == 0 {
		n.Style = yaml.FlowStyle
	}
	for _, s := range items {
		n.Content = append(n.Content, str(s))
	}
	return n
}
