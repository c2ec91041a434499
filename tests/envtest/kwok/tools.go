//go:build tools

// Package tools pins the command scripts/envtest.sh builds, so `go mod tidy` keeps its dependencies.
package tools

import _ "sigs.k8s.io/kwok/cmd/kwok"
