package main

import _ "embed"

// demoConfig is the built-in demo configuration (demo.yaml).
//
//go:embed demo.yaml
var demoConfig []byte
