"""Against what users would otherwise run, over the floor, in one rotation.

The same GenerateManifest calls, made as Argo CD's repo-server makes them (tests/interop's
grpc-go client in load mode: a new connection per call, the repository packed with Go's
archive/tar + gzip, streamed in 1 KiB chunks, the reply awaited), to:
- floor: `cmpfloor` (tests/interop/go/cmpfloor), a server that receives the stream and
  checks its SHA-256, then answers; it extracts nothing and runs nothing. The client's own
  packing and the gRPC transport are in the floor, so time over the floor is what a server adds;
- upstream: Argo CD's own `argocd-cmp-server`, v3.5.7 built from its release module by
  scripts/argo-build, optimised as the release is in a full run (BENCH_UPSTREAM=PATH another
  binary; BENCH_UPSTREAM=none skips it),
  generate command `cat manifest.yaml`;
- upstream+bwrap: the same server with the command wrapped in `bwrap --unshare-all` (what a
  security-minded user does today: no Landlock, seccomp, unique UID or cgroup);
- cmp-warden: the default policy; cold calls with the tree cache off.
With BENCH_UPSTREAM=none the two upstream servers are reported as not measured (with why), and
only the floor and cmp-warden run.

Each cell (files × concurrency × cold/repeated) runs every server in ABBA order, 6 batches
each at 100 files and 2 above, so all see the same moments of a noisy machine. Cold: a new archive every call
(one more small file with a nonce); repeated: the same archive every call. Reported per cell:
each server's client-side p50/p99, its p50 over the floor, and cmp-warden's over-floor ratio
to each upstream's. Throughput: calls per second and p99 at concurrency 16 and 64 with
`--max-in-flight`, and the cmp-warden server's peak RSS (VmHWM) over the whole part.
Everything runs on tmpfs (BENCH_WORKDIR, default /dev/shm).
"""
import json, os, shutil, subprocess, sys, tempfile

from common import ROOT, argo_build, cache_policy, log, make_tree, median, pct, vm_hwm_kib, wait_for_socket

# files, calls per batch at concurrency 1, ABBA rounds (each server that many batches per cell,
# in mirrored order). The small repository's cells decide the hardest target and are
# cheap, so they get more rounds: with two, their over-floor figures moved by 30-60% between
# runs.
FULL_SIZES = [(100, 30, 6), (1000, 16, 2), (5000, 6, 2)]
QUICK_SIZES = [(20, 4, 2)]
PLUGIN = ("apiVersion: argoproj.io/v1alpha1\nkind: ConfigManagementPlugin\nmetadata: {name: bench}\n"
          "spec:\n  generate:\n    command: %s\n")
CAT = "[cat, manifest.yaml]"
# bwrap needs the app directory writable and current; `sh` only to name it.
BWRAP = ("[sh, -c, 'exec bwrap --ro-bind / / --bind \"$PWD\" \"$PWD\" --chdir \"$PWD\" "
         "--unshare-all --die-with-parent cat manifest.yaml']")


def go_tool(work, program):
    """tests/interop's grpc-go client (load mode) or the floor server (the Go module
    tests/interop/go)."""
    out = os.path.join(work, program)
    subprocess.run(["bash", os.path.join(ROOT, "tests/interop/build-go-client.sh"), out, program], check=True)
    return out


class Server:
    """A CMP server on a unix socket in its own directory under `work`."""

    def __init__(self, name, work, cmd, env=None, sock_name="bench.sock", grace=30):
        # grace: seconds stop() waits after SIGTERM. Upstream's argocd-cmp-server does not exit
        # on SIGTERM at all (it waited the whole 30 s, three times per smoke run); cmp-warden
        # reclaims its jails on the way out and gets the time.
        self.name, self.dir, self.grace = name, os.path.join(work, "srv-" + name), grace
        os.makedirs(os.path.join(self.dir, "socks"))
        os.makedirs(os.path.join(self.dir, "tmp"))
        self.sock = os.path.join(self.dir, "socks", sock_name)
        self.log_path = os.path.join(self.dir, "server.log")
        env = dict(os.environ, ARGOCD_PLUGINSOCKFILEPATH=os.path.join(self.dir, "socks"),
                   TMPDIR=os.path.join(self.dir, "tmp"), **(env or {}))
        self.proc = subprocess.Popen([a.replace("{sock}", self.sock) for a in cmd], env=env,
                                     stderr=open(self.log_path, "w"), stdout=subprocess.DEVNULL)
        wait_for_socket(self.sock, self.proc, self.log_path, name, tries=600)

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(timeout=self.grace)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def config_dir(work, name, command):
    cfg = os.path.join(work, "cfg-" + name)
    os.makedirs(cfg)
    with open(os.path.join(cfg, "plugin.yaml"), "w") as f:
        f.write(PLUGIN % command)
    return cfg


def start_servers(binary, work, upstream, cache_on, max_in_flight=None):
    """The servers of one rotation, in its order."""
    servers = [Server("floor", work, [go_tool(work, "cmpfloor"), "-socket", "{sock}"])]
    if upstream:
        for name, command in (("upstream", CAT), ("upstream+bwrap", BWRAP)):
            servers.append(Server(name, work, [upstream, "--config-dir-path", config_dir(work, name, command),
                                               "--loglevel", "warn"], grace=1))
    policy = cache_policy(work, True) if cache_on else cache_policy(work, False)
    extra = ["--max-in-flight", str(max_in_flight)] if max_in_flight else []
    servers.append(Server("cmp-warden", work, [binary, "--loglevel", "warn", "--config-dir-path",
                                               config_dir(work, "cmp-warden", CAT), "--policy", policy,
                                               "--work-dir", os.path.join(work, "srv-cmp-warden", "tmp"),
                                               *extra]))
    return servers


def batch(client, sock, repo, calls, conc, cold):
    out = subprocess.run([client, "-socket", sock, "-dir", repo, "-requests", str(calls),
                          "-concurrency", str(conc), "-timeout", "120s", *(["-vary"] if cold else [])],
                         capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"load client failed: {out.stderr}")
    r = json.loads(out.stdout)
    if r["errors"]:
        sys.exit(f"{len(r['errors'])} call(s) failed: {r['errors'][:3]}")
    return r


def cell(client, servers, repo, calls, conc, cold, rounds):
    """Every server `rounds` times in ABBA order; each server's times in ms."""
    times = {s.name: [] for s in servers}
    wall = {s.name: 0.0 for s in servers}
    for rnd in range(rounds):
        for s in (servers if rnd % 2 == 0 else servers[::-1]):
            r = batch(client, s.sock, repo, calls, conc, cold)
            times[s.name] += r["ms"]
            wall[s.name] += r["wallS"]
    return times, wall


def summarize(times, wall):
    floor = median(times["floor"])
    by = {}
    for name, ms in times.items():
        p50 = median(ms)
        by[name] = {"calls": len(ms), "p50_ms": round(p50, 2), "p99_ms": round(pct(ms, 99), 2),
                    "over_floor_ms": round(p50 - floor, 2), "per_s": round(len(ms) / wall[name], 1)}
    ours = by["cmp-warden"]["over_floor_ms"]
    ratios = {}
    for other in ("upstream", "upstream+bwrap"):
        if other in by and by[other]["over_floor_ms"] > 0:
            ratios[other] = round(ours / by[other]["over_floor_ms"], 2)
    return {"servers": by, "ratio_over_floor": ratios}


def upstream_binary(quick):
    """Argo CD's argocd-cmp-server: BENCH_UPSTREAM, else v3 built by scripts/argo-build
    (common.argo_build); None with BENCH_UPSTREAM=none."""
    upstream = os.environ.get("BENCH_UPSTREAM")
    if upstream == "none":
        return None
    if not upstream:
        upstream = os.path.join(argo_build(quick)[0], "argocd-cmp-server")
    if not os.access(upstream, os.X_OK):
        sys.exit(f"BENCH_UPSTREAM={upstream} is not an executable")
    return upstream


def run(binary, quick):
    upstream = upstream_binary(quick)
    sizes = QUICK_SIZES if quick else FULL_SIZES
    concurrency = (2,) if quick else (1, 4, 16)
    work = tempfile.mkdtemp(prefix="cmpw-vs-", dir=os.environ.get("BENCH_WORKDIR", "/dev/shm"))
    os.chmod(work, 0o755)  # jails (leased UIDs) reach the work root by path
    res = {"upstream": upstream or None, "cells": [], "throughput": []}
    if not upstream:
        res["not_measured"] = "upstream, upstream+bwrap: BENCH_UPSTREAM=none"
        log("versus: " + res["not_measured"])
    client = go_tool(work, "cmpclient")
    try:
        for cold in (True, False):
            mode = "cold" if cold else "repeated"
            cwork = os.path.join(work, mode)
            os.makedirs(cwork)
            servers = start_servers(binary, cwork, upstream, cache_on=not cold)
            try:
                for files, calls, rounds in sizes:
                    repo = os.path.join(work, f"repo-{files}")
                    if not os.path.exists(repo):
                        make_tree(repo, files - 1, (files - 1) * 2048)
                    for conc in concurrency:
                        n = max(calls, 2 * conc)
                        log(f"versus: {mode}, {files} files, concurrency {conc}, {n} calls × {rounds} per server")
                        batch(client, servers[-1].sock, repo, conc, conc, cold)  # warm-up
                        times, wall = cell(client, servers, repo, n, conc, cold, rounds)
                        res["cells"].append({"mode": mode, "files": files, "concurrency": conc,
                                             "rounds": rounds, **summarize(times, wall)})
                res.setdefault("server_hwm_kib", {})[mode] = vm_hwm_kib(servers[-1].proc.pid)
            finally:
                for s in servers:
                    s.stop()
        # Throughput and tail under load: the admission queue holds what --max-in-flight does not run.
        twork = os.path.join(work, "load")
        os.makedirs(twork)
        servers = start_servers(binary, twork, upstream, cache_on=False, max_in_flight=4 if quick else 16)
        try:
            files = sizes[0][0]
            repo = os.path.join(work, f"repo-{files}")
            for conc in ((4,) if quick else (16, 64)):
                log(f"versus: throughput, cold, {files} files, concurrency {conc}")
                times, wall = cell(client, servers, repo, 2 * conc if quick else 4 * conc, conc, True, 2)
                res["throughput"].append({"files": files, "concurrency": conc, **summarize(times, wall)})
            res["server_hwm_kib"]["load"] = vm_hwm_kib(servers[-1].proc.pid)
        finally:
            for s in servers:
                s.stop()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return res
