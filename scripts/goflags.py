"""How the Go programs the tests run are compiled (scripts/argo-build, node-build, pulumi-build):
the same flags wherever a package may be shared, so that Go's build cache holds it once.

GOFLAGS, for every program:
- `-mod=mod`: the generated modules are tidied, not vendored;
- `-gcflags=all=-dwarf=false`: the binaries are stripped (`-ldflags -s -w`) or only run by
  tests, so the compiler's DWARF is never read; a cold build takes about 12 % less CPU
  (containerd: 112 against 128 CPU-s).

FIXTURE_GOFLAGS adds `-l` (no inlining) for the programs functional tests run, whose speed no
test reads: the Pulumi tools and Argo CD (both lines; `scripts/argo-build` builds them so by
default). Their cold compile takes about a fifth less CPU (client-go with its dependencies, a
cold cache each time: 101, 107, 115 against 139, 134, 118 CPU-s), and packages the Pulumi tools
and Argo CD v3 require at the same versions compile once for both. The benchmarks' full run
compares with Argo CD v3 compiled as its release is (`scripts/argo-build v3 --optimized`: GOFLAGS,
a build of its own); their smoke run (`benches/run --quick`, in the test command) takes the
tests' build. The node runs under TCG in the kubelet test's VM and keeps the compiler's inlining.
The flags are part of each build's cache key, so a change rebuilds.
"""

GOFLAGS = "-mod=mod -gcflags=all=-dwarf=false"
FIXTURE_GOFLAGS = '-mod=mod "-gcflags=all=-dwarf=false -l"'
