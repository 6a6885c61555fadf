package main

import (
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// TestDocListsTheUsage: the package doc, which go doc shows, lists the
// same commands as the usage text the command prints.
func TestDocListsTheUsage(t *testing.T) {
	src, err := os.ReadFile("main.go")
	if err != nil {
		t.Fatal(err)
	}
	doc, _, _ := strings.Cut(string(src), "package main")
	re := regexp.MustCompile(`(?m)^(?://\t|  )admit ([a-z]+(?: [a-z]+)?)`)
	commands := func(text string) []string {
		var out []string
		for _, m := range re.FindAllStringSubmatch(text, -1) {
			out = append(out, m[1])
		}
		return out
	}
	inDoc, inUsage := commands(doc), commands(usage)
	if len(inUsage) < 8 || !slices.Equal(inDoc, inUsage) {
		t.Errorf("the package doc lists %q, the usage %q", inDoc, inUsage)
	}
}
