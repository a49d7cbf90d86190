//go:build tools

// Package peers pins containerd 1.7.x, the NRI v0.8 runtime our e2e tests run against.
// `go install` refuses the module directly (its go.mod has exclude directives), so the
// harness builds its commands from this wrapper module.
package peers

import (
	_ "github.com/containerd/containerd/cmd/containerd"
	_ "github.com/containerd/containerd/cmd/containerd-shim-runc-v2"
	_ "github.com/containerd/containerd/cmd/ctr"
)
