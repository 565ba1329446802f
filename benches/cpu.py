"""What a request costs the whole machine (issue 51): CPU measured system-wide, not only in the
server's own processes.

A profile of the server's processes misses what the kernel does on its behalf elsewhere:
namespace teardown in kernel workers (`cleanup_net`), mount and tmpfs release after RCU grace
periods, cgroup offlining, RCU callbacks. So each cell counts the machine's busy time from
/proc/stat (user, nice, system, irq, softirq, steal) over a batch of calls, minus the load
client's own CPU (its rusage, exact: it is reaped), and divides by the calls. Beside it, the
part inside the server's process tree (utime + stime of every process under it, children it
reaped included) and the rest, outside it.

The servers, each in turn and in ABBA order within a cell, with the same client as `versus`
(a new connection per call, a new archive every call): the floor (`cmpfloor`: receives and
checks the stream, nothing else), Argo CD's `argocd-cmp-server` (BENCH_UPSTREAM as in
`versus`; `none` skips it) and cmp-warden with the default policy (tree cache off). Nothing
else may run on the machine meanwhile: everything busy counts.
"""
import json, os, resource, shutil, subprocess, sys, tempfile, time

from common import ROOT, cache_policy, log, make_tree
from versus import CAT, Server, config_dir, go_tool, upstream_binary

# files, calls per batch, ABBA rounds (each server that many batches per cell).
FULL_SIZES = [(100, 40, 4), (1000, 16, 2), (5000, 6, 2)]
QUICK_SIZES = [(20, 8, 2)]
TICK = os.sysconf("SC_CLK_TCK")


def busy_ticks():
    """The machine's busy time so far: every CPU's user, nice, system, irq, softirq, steal."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    return v[0] + v[1] + v[2] + v[5] + v[6] + v[7]


def tree_ticks(root):
    """CPU of `root` and every process under it, by PID: utime + stime + the reaped children's."""
    kids, ticks = {}, {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as f:
                rest = f.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        kids.setdefault(int(rest[1]), []).append(int(pid))
        ticks[int(pid)] = sum(int(x) for x in rest[11:15])
    out, todo = {}, [root]
    while todo:
        p = todo.pop()
        if p in ticks:
            out[p] = ticks[p]
        todo += kids.get(p, [])
    return out


def measured_batch(client, server, repo, calls, conc):
    """One batch of cold calls: the machine's busy seconds, the client's, the server tree's."""
    before_tree = tree_ticks(server.proc.pid)
    before_client = resource.getrusage(resource.RUSAGE_CHILDREN)
    before = busy_ticks()
    out = subprocess.run([client, "-socket", server.sock, "-dir", repo, "-requests", str(calls),
                          "-concurrency", str(conc), "-timeout", "120s", "-vary"],
                         capture_output=True, text=True)
    # The server answers before it reclaims: let the reclaim (and the kernel's work after it)
    # land in this batch, not the next server's.
    time.sleep(0.5)
    busy = busy_ticks() - before
    after_client = resource.getrusage(resource.RUSAGE_CHILDREN)
    after_tree = tree_ticks(server.proc.pid)
    if out.returncode != 0 or json.loads(out.stdout)["errors"]:
        sys.exit(f"cpu: {server.name}: load client failed: {out.stderr[-1000:]} {out.stdout[-1000:]}")
    client_s = (after_client.ru_utime + after_client.ru_stime) - (before_client.ru_utime + before_client.ru_stime)
    own = sum(after_tree.values()) - sum(t for p, t in before_tree.items() if p in after_tree)
    return busy / TICK, client_s, own / TICK


def cell(client, servers, repo, calls, conc, rounds):
    acc = {s.name: {"calls": 0, "system_s": 0.0, "client_s": 0.0, "own_s": 0.0} for s in servers}
    for rnd in range(rounds):
        for s in (servers if rnd % 2 == 0 else servers[::-1]):
            busy, client_s, own = measured_batch(client, s, repo, calls, conc)
            a = acc[s.name]
            a["calls"] += calls
            a["system_s"] += busy - client_s
            a["client_s"] += client_s
            a["own_s"] += own
    by = {}
    for name, a in acc.items():
        n = a["calls"]
        by[name] = {"calls": n, "system_ms": round(1000 * a["system_s"] / n, 2),
                    "own_ms": round(1000 * a["own_s"] / n, 2),
                    "outside_ms": round(1000 * (a["system_s"] - a["own_s"]) / n, 2),
                    "client_ms": round(1000 * a["client_s"] / n, 2)}
    floor = by["floor"]["system_ms"]
    for s in by.values():
        s["over_floor_ms"] = round(s["system_ms"] - floor, 2)
    ratio = None
    if "upstream" in by and by["upstream"]["over_floor_ms"] > 0:
        ratio = round(by["cmp-warden"]["over_floor_ms"] / by["upstream"]["over_floor_ms"], 2)
    return {"servers": by, "ratio_over_floor": ratio}


def run(binary, quick):
    upstream = upstream_binary()
    sizes = QUICK_SIZES if quick else FULL_SIZES
    concurrency = (1, 2) if quick else (1, 4)
    work = tempfile.mkdtemp(prefix="cmpw-cpu-", dir=os.environ.get("BENCH_WORKDIR", "/dev/shm"))
    os.chmod(work, 0o755)  # jails (leased UIDs) reach the work root by path
    res = {"upstream": upstream, "cells": []}
    if not upstream:
        res["not_measured"] = "upstream: BENCH_UPSTREAM=none"
    client = go_tool(work, "cmpclient")
    servers = [Server("floor", work, [go_tool(work, "cmpfloor"), "-socket", "{sock}"])]
    try:
        if upstream:
            servers.append(Server("upstream", work, [upstream, "--config-dir-path",
                                                     config_dir(work, "upstream", CAT), "--loglevel", "warn"]))
        servers.append(Server("cmp-warden", work, [
            binary, "--loglevel", "warn", "--config-dir-path", config_dir(work, "cmp-warden", CAT),
            "--policy", cache_policy(work, False), "--work-dir", os.path.join(work, "srv-cmp-warden", "tmp")]))
        for files, calls, rounds in sizes:
            repo = os.path.join(work, f"repo-{files}")
            make_tree(repo, files - 1, (files - 1) * 2048)
            for conc in concurrency:
                n = max(calls, 2 * conc)
                log(f"cpu: {files} files, concurrency {conc}, {n} calls × {rounds} per server")
                for s in servers:  # warm-up, unmeasured
                    measured_batch(client, s, repo, conc, conc)
                res["cells"].append({"files": files, "concurrency": conc, "rounds": rounds,
                                     **cell(client, servers, repo, n, conc, rounds)})
    finally:
        for s in servers:
            s.stop()
        shutil.rmtree(work, ignore_errors=True)
    return res
