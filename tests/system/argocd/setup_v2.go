//go:build argov2

package main

import (
	"github.com/argoproj/argo-cd/v3/cmd/util"
)

// What v2's main does before it runs the command; cobra prints a command's error.
func setup(isCLI bool) (silenced bool) {
	util.SetAutoMaxProcs(isCLI)
	return false
}
