//go:build !argov2

package main

import "github.com/argoproj/argo-cd/gitops-engine/pkg/utils/kube"

// splitYAMLToString is the cmp-server's split of a generate command's output (v3's import).
func splitYAMLToString(b []byte) ([]string, error) { return kube.SplitYAMLToString(b) }
