"""How the Go programs the tests run are compiled (scripts/argo-build, node-build, pulumi-build):
the same flags wherever a package may be shared, so that Go's build cache holds it once.

GOFLAGS, for every program:
- `-mod=mod`: the generated modules are tidied, not vendored;
- `-gcflags=all=-dwarf=false`: the binaries are stripped (`-ldflags -s -w`) or only run by
  tests, so the compiler's DWARF is never read; a cold build takes about 12 % less CPU
  (containerd: 112 against 128 CPU-s).

FIXTURE_GOFLAGS adds `-l` (no inlining) for the programs only functional tests run, whose speed
no test and no benchmark reads: the Pulumi tools and Argo CD v2. Their cold compile takes about a
fifth less CPU (client-go with its dependencies, a cold cache each time: 101, 107, 115 against
139, 134, 118 CPU-s). Argo CD v3 is the benchmarks' upstream (benches/versus.py,
benches/reposerver.py) and the node runs under TCG in the kubelet test's VM: both keep the
compiler's inlining. The flags are part of each build's cache key, so a change rebuilds.
"""

GOFLAGS = "-mod=mod -gcflags=all=-dwarf=false"
FIXTURE_GOFLAGS = '-mod=mod "-gcflags=all=-dwarf=false -l"'
