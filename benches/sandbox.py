"""Sandbox cost: the Rust harness crates/cmp-warden/benches/sandbox.rs (root), read as JSON.

Full runs use `cargo bench` (release); --quick runs the same harness through `cargo test`
(debug build, few iterations) so the suite itself is exercised by the test command.
"""
import json, os, subprocess, sys

from common import ROOT, log


def harness(quick, extra_env, what):
    env = dict(os.environ, BENCH_ITERATIONS="10" if quick else os.environ.get("BENCH_ITERATIONS", "300"),
               **extra_env)
    verb = ["test"] if quick else ["bench"]
    log(f"sandbox: cargo {verb[0]} --bench sandbox, {what} ({env['BENCH_ITERATIONS']} iterations per case)")
    r = subprocess.run(["cargo", *verb, "-q", "-p", "cmp-warden", "--bench", "sandbox"],
                       cwd=ROOT, env=env, capture_output=True, text=True)
    sys.stderr.write(r.stdout)
    if r.returncode != 0:
        sys.exit(f"sandbox bench failed:\n{r.stderr}")
    lines = [l for l in r.stdout.splitlines() if l.startswith("{")]
    if not lines:
        sys.exit(f"sandbox bench printed no result (not root?):\n{r.stderr}")
    return json.loads(lines[-1])


def run(quick):
    res = harness(quick, {}, "every case")
    # Each namespace's cost to us and to bwrap, layer by layer (BENCH_LAYERS).
    res["layers"] = harness(quick, {"BENCH_LAYERS": "1"}, "layer by layer against bwrap")["layers"]
    return res
