// Prints containerd's built-in default seccomp profile (what Kubernetes calls RuntimeDefault on
// containerd nodes) for a container whose bounding capability set is given as the arguments,
// e.g. CAP_SETUID CAP_SETGID CAP_SETPCAP: the profile is computed from the capabilities, as
// `ctr run --seccomp` and the CRI plugin compute it. Built by scripts/containerd-test against
// the containerd sources Debian packages (GOPATH mode, no module proxy).
package main

import (
	"encoding/json"
	"os"

	"github.com/containerd/containerd/contrib/seccomp"
	specs "github.com/opencontainers/runtime-spec/specs-go"
)

func main() {
	spec := &specs.Spec{Process: &specs.Process{
		Capabilities: &specs.LinuxCapabilities{Bounding: os.Args[1:]},
	}}
	out := json.NewEncoder(os.Stdout)
	out.SetIndent("", "  ")
	if err := out.Encode(seccomp.DefaultProfile(spec)); err != nil {
		os.Exit(1)
	}
}
