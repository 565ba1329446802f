// containerd's default seccomp profile (RuntimeDefault on containerd nodes), printed by
// dump-seccomp.go; its contrib/seccomp sources are copied from this module's own containerd
// at build time by tests/system/containerd-test (GOARCH made a variable), nothing of them committed.
module cmpwarden.test/containerd-seccomp

go 1.26.6

require (
	github.com/containerd/containerd/v2 v2.2.9
	github.com/opencontainers/runtime-spec v1.3.0
	golang.org/x/sys v0.48.0
)
