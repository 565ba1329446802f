// Prints containerd's built-in default seccomp profile (what Kubernetes calls RuntimeDefault on
// containerd nodes) for a container whose bounding capability set is given as the arguments,
// e.g. CAP_SETUID CAP_SETGID CAP_SETPCAP: the profile is computed from the capabilities, as
// `ctr run --seccomp` and the CRI plugin compute it. Built by tests/system/containerd-test as the
// module beside it (go.mod: containerd v2, from the module proxy), with containerd's
// contrib/seccomp copied in as ./seccomp at build time (its GOARCH made a variable, so one build
// prints any architecture's profile; PROFILE_ARCH chooses).
package main

import (
	"encoding/json"
	"os"

	"cmpwarden.test/containerd-seccomp/seccomp"
	specs "github.com/opencontainers/runtime-spec/specs-go"
)

func main() {
	if a := os.Getenv("PROFILE_ARCH"); a != "" {
		seccomp.Arch = a
	}
	spec := &specs.Spec{Process: &specs.Process{
		Capabilities: &specs.LinuxCapabilities{Bounding: os.Args[1:]},
	}}
	out := json.NewEncoder(os.Stdout)
	out.SetIndent("", "  ")
	if err := out.Encode(seccomp.DefaultProfile(spec)); err != nil {
		os.Exit(1)
	}
}
