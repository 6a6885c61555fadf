// Command admit is Admit's server and command line.
//
//	admit serve                    run the server (decisions, admin API, Envoy service, gateway, metrics)
//	admit check                    decide one request
//	admit proxy --upstream URL     a rate limiting reverse proxy
//	admit simulate                 draw what rules do to a pattern of requests
//	admit ratelimit                run as envoyproxy/ratelimit, configured by its environment variables
//	admit config validate FILE...  check configuration files
//	admit config example           print the built-in demo configuration
//	admit config import kuadrant POLICY.yaml... [--route ROUTE.yaml...]
//	                               print the Limitador limits of Kuadrant policies
//	admit healthcheck [--url URL]  exit 0 if a running server answers /healthz
//	admit version                  print the version, commit and Go version
//	admit help                     show this help
//
// Exit codes: 0 success (check: admitted), 1 refused (check) or invalid
// (config validate), 2 usage or runtime error.
package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	_ "time/tzdata" // quotas' time zones on hosts and images without a zone database

	"go.yaml.in/yaml/v3"

	"github.com/admitdev/admit/envoyrls"
	"github.com/admitdev/admit/limitador"
	"github.com/admitdev/admit/yamlconf"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	args := os.Args[1:]
	if filepath.Base(os.Args[0]) == "ratelimit" {
		// Started as envoyproxy/ratelimit's binary (/bin/ratelimit, a link
		// to admit in the image): configured as it is.
		args = append([]string{"ratelimit"}, args...)
	}
	code := run(ctx, args, &env{stdout: os.Stdout, stderr: os.Stderr, getenv: os.Getenv})
	stop()
	os.Exit(code)
}

// env is what a command sees of the process, so that tests can run
// commands in-process.
type env struct {
	stdout, stderr io.Writer
	getenv         func(string) string
	// listening, if set, is told the HTTP address serve listens on.
	listening func(addr string)
	// listeningGRPC, if set, is told the gRPC address serve listens on.
	listeningGRPC func(addr string)
	// reloadEnvoy, if set, triggers a reload of the --envoy-config files.
	reloadEnvoy chan struct{}
	// reload, if set, triggers a configuration reload in serve (tests use
	// it instead of SIGHUP).
	reload chan struct{}
}

const usageText = `admit: multi-tenant rate limiting

Usage:
  admit serve [flags]            run the server (see admit serve --help)
  admit check [flags]            decide one request (see admit check --help)
  admit proxy --upstream URL     a rate limiting reverse proxy (see admit proxy --help)
  admit simulate [flags]         draw what rules do to a pattern of requests (see admit simulate --help)
  admit ratelimit                run as envoyproxy/ratelimit, configured by its environment variables
  admit config validate FILE...  check configuration files
  admit config example           print the built-in demo configuration
  admit config import kuadrant POLICY.yaml... [--route ROUTE.yaml...]
                                 print the Limitador limits of Kuadrant policies
  admit healthcheck [--url URL]  exit 0 if a running server answers /healthz
  admit version                  print the version, commit and Go version
  admit help                     show this help

Exit codes: 0 success (check: admitted), 1 refused (check) or invalid
(config validate), 2 usage or runtime error.
`

// run runs one command line and returns the exit code.
func run(ctx context.Context, args []string, e *env) int {
	if len(args) == 0 {
		fmt.Fprint(e.stderr, usageText)
		return 2
	}
	switch args[0] {
	case "serve":
		return serve(ctx, args[1:], e)
	case "check":
		return check(ctx, args[1:], e)
	case "proxy":
		return proxy(ctx, args[1:], e)
	case "config":
		return configCmd(args[1:], e)
	case "simulate":
		return simulateCmd(ctx, args[1:], e)
	case "ratelimit":
		return ratelimitCmd(ctx, args[1:], e)
	case "version", "--version":
		return versionCmd(e)
	case "healthcheck":
		return healthcheck(ctx, args[1:], e)
	case "help", "-h", "-help", "--help":
		fmt.Fprint(e.stdout, usageText)
		return 0
	}
	fmt.Fprintf(e.stderr, "admit: unknown command %q\n\n%s", args[0], usageText)
	return 2
}

const configUsage = `Usage:
  admit config validate FILE...  report every error of each file (file:line:col: field: reason)
  admit config example           print the built-in demo configuration
  admit config import kuadrant POLICY.yaml... [--route ROUTE.yaml...]
                                 print the Limitador limits file of Kuadrant policies
                                 (see admit config import --help)

validate reads each FILE as what it is: an Admit configuration, an
envoyproxy/ratelimit file (one with a domain: and descriptors:, as
--envoy-config reads them), or a Limitador limits file (a list of limits,
as --limitador-config reads it); a directory is a --envoy-config directory,
its *.yaml files checked together. It exits 0 when every file is valid,
1 when one is not, 2 on usage errors.
`

func configCmd(args []string, e *env) int {
	if len(args) == 0 {
		fmt.Fprint(e.stderr, configUsage)
		return 2
	}
	switch args[0] {
	case "validate":
		files := args[1:]
		if len(files) == 0 {
			fmt.Fprint(e.stderr, "admit config validate: name one or more files\n\n"+configUsage)
			return 2
		}
		if files[0] == "-h" || files[0] == "--help" || files[0] == "-help" {
			fmt.Fprint(e.stdout, configUsage)
			return 0
		}
		code := 0
		for _, f := range files {
			kind, err := validate(f)
			if err != nil {
				fmt.Fprintln(e.stderr, err)
				code = 1
				continue
			}
			fmt.Fprintf(e.stdout, "%s: ok (%s)\n", f, kind)
		}
		return code
	case "example":
		if len(args) > 1 && args[1] != "-h" && args[1] != "--help" {
			fmt.Fprintf(e.stderr, "admit config example: unexpected %q\n", args[1])
			return 2
		}
		_, _ = e.stdout.Write(demoConfig)
		return 0
	case "import":
		return configImport(args[1:], e)
	case "-h", "--help", "-help", "help":
		fmt.Fprint(e.stdout, configUsage)
		return 0
	}
	fmt.Fprintf(e.stderr, "admit config: unknown command %q\n\n%s", args[0], configUsage)
	return 2
}

// validate checks the file or directory name as what it is (see
// configUsage), and says what it took it for.
func validate(name string) (kind string, err error) {
	if fi, err := os.Stat(name); err == nil && fi.IsDir() {
		_, err := envoyrls.LoadDir(name)
		return "envoyproxy/ratelimit directory", err
	}
	data, err := yamlconf.ReadFile(name, max(MaxConfigSize, envoyrls.MaxFileSize))
	if err != nil {
		return "", yamlconf.Errors{{File: name, Msg: err.Error()}}
	}
	if envoyFile(data) {
		_, err := envoyrls.Parse(envoyrls.File{Name: name, Data: data})
		return "envoyproxy/ratelimit file", err
	}
	if limitsFile(data) {
		_, err := limitador.Parse(name, data)
		return "Limitador limits file", err
	}
	_, err = ParseConfig(name, data)
	return "Admit configuration", err
}

// limitsFile reports whether data reads as a Limitador limits file: a
// list (Admit's configuration and envoyproxy/ratelimit's files are
// mappings).
func limitsFile(data []byte) bool {
	var root yaml.Node
	return yaml.Unmarshal(data, &root) == nil && len(root.Content) == 1 && root.Content[0].Kind == yaml.SequenceNode
}

// envoyFile reports whether data reads as an envoyproxy/ratelimit file: a
// mapping with a domain or descriptors (its domain misspelt) and no
// version.
func envoyFile(data []byte) bool {
	var root yaml.Node
	if yaml.Unmarshal(data, &root) != nil || len(root.Content) != 1 || root.Content[0].Kind != yaml.MappingNode {
		return false
	}
	keys := map[string]bool{}
	m := root.Content[0]
	for i := 0; i+1 < len(m.Content); i += 2 {
		keys[m.Content[i].Value] = true
	}
	return (keys["domain"] || keys["descriptors"]) && !keys["version"]
}
