package main

import (
	"bytes"
	"fmt"
	"strings"

	"github.com/admitdev/admit/limitador"
	"github.com/admitdev/admit/limitador/kuadrant"
	"github.com/admitdev/admit/yamlconf"
)

const importUsage = `Usage:
  admit config import kuadrant POLICY.yaml... [--route ROUTE.yaml...] [--namespace NS]

Prints the Limitador limits file the Kuadrant operator would write for the
RateLimitPolicy (kuadrant.io/v1) and TokenRateLimitPolicy
(kuadrant.io/v1alpha1) manifests of the POLICY files. The HTTPRoute and
GRPCRoute manifests of the --route files (gateway.networking.k8s.io/v1)
tell which routes a policy reaches: a policy on a Gateway is written once
for each route attached to it. Files may hold several documents (---).

  --route FILE      a file of routes (repeat for more)
  --namespace NS    the namespace of manifests that name none (as kubectl apply -n)

Whatever cannot be converted from the files given is named on stderr
(file:line:col: reason) and the rest is printed. Exit codes: 0 all
converted, 1 something was refused, 2 usage error or unreadable file.
`

// configImport runs "admit config import".
func configImport(args []string, e *env) int {
	if len(args) == 0 {
		fmt.Fprint(e.stderr, "admit config import: name the format (kuadrant) and the files\n\n"+importUsage)
		return 2
	}
	switch args[0] {
	case "-h", "--help", "-help", "help":
		fmt.Fprint(e.stdout, importUsage)
		return 0
	case "kuadrant":
	default:
		fmt.Fprintf(e.stderr, "admit config import: unknown format %q (kuadrant is the one there is)\n\n%s", args[0], importUsage)
		return 2
	}
	var policyNames, routeNames []string
	var opts kuadrant.Options
	rest := args[1:]
	for len(rest) > 0 {
		arg := rest[0]
		rest = rest[1:]
		name, value, hasValue := strings.Cut(strings.TrimLeft(arg, "-"), "=")
		switch {
		case arg == "--":
			policyNames = append(policyNames, rest...)
			rest = nil
			continue
		case !strings.HasPrefix(arg, "-") || arg == "-":
			policyNames = append(policyNames, arg)
			continue
		case name == "h" || name == "help":
			fmt.Fprint(e.stdout, importUsage)
			return 0
		case name != "route" && name != "namespace" && name != "n":
			fmt.Fprintf(e.stderr, "admit config import: unknown flag %s\n\n%s", arg, importUsage)
			return 2
		}
		if !hasValue {
			if len(rest) == 0 {
				fmt.Fprintf(e.stderr, "admit config import: %s needs a value\n\n%s", arg, importUsage)
				return 2
			}
			value, rest = rest[0], rest[1:]
		}
		if name == "route" {
			routeNames = append(routeNames, value)
		} else {
			opts.Namespace = value
		}
	}
	if len(policyNames) == 0 {
		fmt.Fprint(e.stderr, "admit config import kuadrant: name one or more policy files\n\n"+importUsage)
		return 2
	}
	policies, ok := readImportFiles(policyNames, e)
	routes, ok2 := readImportFiles(routeNames, e)
	if !ok || !ok2 {
		return 2
	}
	res, err := kuadrant.Import(policies, routes, opts)
	if err != nil {
		fmt.Fprintf(e.stderr, "admit config import: %v\n", err)
		return 2
	}
	var out bytes.Buffer
	if err := kuadrant.Write(&out, res.Limits); err != nil {
		fmt.Fprintf(e.stderr, "admit config import: %v\n", err)
		return 2
	}
	_, _ = e.stdout.Write(out.Bytes())
	for _, r := range res.Refused {
		fmt.Fprintln(e.stderr, r)
	}
	if len(res.Refused) > 0 {
		fmt.Fprintf(e.stderr, "admit config import: %d refused; the limits above are the rest\n", len(res.Refused))
		return 1
	}
	// What Kuadrant would write, admit serve may still refuse (a window
	// past the Redis store's span, an expression past its bounds): say so
	// now, not at the next reload.
	if len(res.Limits) > 0 {
		if _, err := limitador.Parse("(the limits written)", out.Bytes()); err != nil {
			fmt.Fprintf(e.stderr, "admit config import: admit serve --limitador-config would refuse the limits written:\n%v\n", err)
			return 1
		}
	}
	return 0
}

// readImportFiles reads the named files, each of at most
// kuadrant.MaxFileSize bytes, reporting those it cannot read.
func readImportFiles(names []string, e *env) ([]kuadrant.File, bool) {
	files := make([]kuadrant.File, 0, len(names))
	ok := true
	for _, name := range names {
		data, err := yamlconf.ReadFile(name, kuadrant.MaxFileSize)
		if err != nil {
			fmt.Fprintln(e.stderr, yamlconf.Error{File: name, Msg: err.Error()})
			ok = false
			continue
		}
		files = append(files, kuadrant.File{Name: name, Data: data})
	}
	return files, ok
}
