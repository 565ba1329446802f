//go:build !argov2

package main

import (
	"k8s.io/klog/v2"

	"github.com/argoproj/argo-cd/v3/util/log"
)

// What v3's main does before it runs the command; it prints a CLI command's error itself.
// Its other step, grpc.DisableSRVLookups, turns off the gRPC SRV lookups that the grpclb
// balancer switches on when linked: this binary does not link it, so they are off already
// (the call panics here for that reason: "enableSRVLookups expected to be true").
func setup(isCLI bool) (silenced bool) {
	klog.SetLogger(log.NewLogrusLogger(log.NewWithCurrentConfig()))
	return isCLI
}
