"""Egress proxy cost (network: allowList): the Rust harness crates/egress/benches/proxy.rs, read
as JSON. A fresh connection with one short exchange and a bulk download, each direct and through
the proxy in the same run, and the memory and threads of 100 tunnels held open at once.

Full runs use `cargo bench` (release); --quick runs it through `cargo test` (debug build, few
iterations, a small download) so the harness itself is exercised by the test command.
"""
import json, os, subprocess, sys

from common import ROOT, log


def run(quick):
    env = dict(os.environ,
               BENCH_ITERATIONS="50" if quick else os.environ.get("BENCH_ITERATIONS", "2000"),
               BENCH_MIB="16" if quick else os.environ.get("BENCH_MIB", "512"))
    verb = "test" if quick else "bench"
    log(f"egress: cargo {verb} --bench proxy ({env['BENCH_ITERATIONS']} connections per case, "
        f"{env['BENCH_MIB']} MiB bulk)")
    r = subprocess.run(["cargo", verb, "-q", "-p", "cmp-warden-egress", "--bench", "proxy"],
                       cwd=ROOT, env=env, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"egress bench failed:\n{r.stdout}\n{r.stderr}")
    lines = [l for l in r.stdout.splitlines() if l.startswith("{")]
    if not lines:
        sys.exit(f"egress bench printed no result:\n{r.stdout}\n{r.stderr}")
    return json.loads(lines[-1])
