"""What a request costs the whole machine: CPU measured system-wide, not only in the
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

from common import ROOT, build_bench_layers, cache_policy, log, make_tree
from versus import CAT, Server, config_dir, go_tool, upstream_binary

# Each layer's cost at the small request (100 files, concurrency 4): cmp-warden with one layer
# left out at a time, beside the default and upstream, all in one ABBA rotation. Namespaces by
# `spec.namespaces` (the user namespace comes with any of the others); the rest by a build of
# its own (cargo feature `bench-layers`, `CMP_WARDEN_BENCH_OFF`: supervisor::bench), with the
# policy no longer requiring what is switched off; "bench build" is that build with nothing
# off (it should cost what the shipped one does). The unique UID and no_new_privs stay.
# Each: (name, namespaces, protections dropped from spec.require, CMP_WARDEN_BENCH_OFF,
# tree cache as shipped, what the layer buys: SECURITY.md's words, shortened).
ALL_NS = ["mount", "pid", "net", "ipc", "uts", "cgroup"]
LAYERS = [
    ("without net", [n for n in ALL_NS if n != "net"], [], "", False,
     "no network interface but loopback; Landlock TCP and seccomp's socket rules stay"),
    ("without mount (and its tmpfs)", [n for n in ALL_NS if n != "mount"], [], "", False,
     "private mounts, the request's disk limit (tmpfs), the tree cache's attach"),
    ("without pid", [n for n in ALL_NS if n != "pid"], [], "", False,
     "commands see only their own processes; daemons die with the request"),
    ("without ipc, uts", [n for n in ALL_NS if n not in ("ipc", "uts")], [], "", False,
     "private System V IPC, message queues, hostname"),
    ("without cgroup", [n for n in ALL_NS if n != "cgroup"], [], "", False,
     "commands see their own cgroup as the root"),
    ("no namespaces (nor user)", [], [], "", False, "all five above"),
    ("bench build, nothing off", ALL_NS, [], "", False, "— (the control: the same as the default)"),
    ("without Landlock", ALL_NS, ["landlock"], "landlock", False,
     "no file outside the request's tree and the policy's paths; TCP and signal scoping"),
    ("without seccomp (and its listener)", ALL_NS, ["seccomp"], "seccomp", False,
     "no namespace, mount, BPF, io_uring, ptrace, keyring, inet socket (network: none); the denial named in the audit event"),
    ("without per-request cgroups", ALL_NS, [], "cgroups", False,
     "memory, pids and CPU bounded per request; OOM named"),
    ("without the spare jail", ALL_NS, [], "spare", False,
     "nothing (latency: a jail prepared before the request arrives)"),
    ("without audit event and metrics", ALL_NS, [], "audit", False,
     "one audit event per request; the request metrics"),
    ("with the tree cache (as shipped)", ALL_NS, [], "", True,
     "— (a cost or a saving: archives above minArchiveBytes are extracted once)"),
]
LAYER_CELL = (100, 40, 4, 4)  # files, calls per batch, rounds, concurrency

# files, calls per batch, ABBA rounds (each server that many batches per cell).
FULL_SIZES = [(100, 40, 4), (1000, 16, 2), (5000, 6, 2)]
# The smoke run's cell: at 8 calls a batch the floor's ~1 ms a call was lost in the ticks'
# noise and measured negative (see `tick_ms`).
QUICK_SIZES = [(20, 40, 2)]
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


def settle(limit=5.0):
    """Wait until the machine is idle (at most one tick busy in each of two 100 ms samples, or
    `limit` seconds): the work a batch leaves behind (a reclaim after the answer, the kernel's
    deferred teardown) is counted in that batch, and none of it in the next server's."""
    quiet, end = 0, time.monotonic() + limit
    while quiet < 2 and time.monotonic() < end:
        t = busy_ticks()
        time.sleep(0.1)
        quiet = quiet + 1 if busy_ticks() - t <= 1 else 0


def measured_batch(client, server, repo, calls, conc):
    """One batch of cold calls: the machine's busy seconds, the client's, the server tree's."""
    settle()
    before_tree = tree_ticks(server.proc.pid)
    before_client = resource.getrusage(resource.RUSAGE_CHILDREN)
    before = busy_ticks()
    out = subprocess.run([client, "-socket", server.sock, "-dir", repo, "-requests", str(calls),
                          "-concurrency", str(conc), "-timeout", "120s", "-vary"],
                         capture_output=True, text=True)
    # The server answers before it reclaims: the reclaim and the kernel's work after it land
    # in this batch, not the next server's.
    settle()
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
    # /proc/stat charges each CPU's busy time a whole tick at a time, to whatever runs when the
    # tick comes (a sample, not a measurement): one tick per CPU per batch, per call, is the
    # figures' grain. Their error can be larger, the floor's small figure most of all.
    tick = round(1000 * (os.cpu_count() or 1) / TICK / calls, 2)
    ratio = None
    if "upstream" in by and by["upstream"]["over_floor_ms"] > 0:
        ratio = round(by["cmp-warden"]["over_floor_ms"] / by["upstream"]["over_floor_ms"], 2)
    return {"servers": by, "ratio_over_floor": ratio, "tick_ms": tick}


def layer_policy(work, name, namespaces, drop, cache_on, slot):
    """The default policy with `spec.namespaces` set to `namespaces`, `drop` left out of
    `spec.require`, the tree cache on or off, and a UID range of its own (`slot`): the variants
    serve at the same time, and each server's start-up sweep kills what runs in its range."""
    path = cache_policy(os.path.join(work, name), False)
    text = open(path).read()
    require = [p for p in ["uniqueUid", "noNewPrivs", "landlock", "seccomp"] if p not in drop]
    edits = [("namespaces: [" + ", ".join(ALL_NS) + "]", "namespaces: [" + ", ".join(namespaces) + "]"),
             ("require: [uniqueUid, noNewPrivs, landlock, seccomp]", "require: [" + ", ".join(require) + "]"),
             ("uidRange: {first: 20000, count: 40000}",
              "uidRange: {first: %d, count: 2000}" % (20000 + 2000 * slot))]
    if cache_on:
        edits.append(("cache: {enabled: false, bytes: 512Mi}", "cache: {enabled: true, bytes: 512Mi}"))
    for old, new in edits:
        if old not in text:
            sys.exit("policies/default.yaml has no `" + old + "` line to change")
        text = text.replace(old, new, 1)
    with open(path, "w") as f:
        f.write(text)
    return path


def layers(binary, bench_binary, work, client, upstream):
    """Each layer's system-wide cost: the small request's cell with every variant in one ABBA
    rotation, so all see the same machine."""
    files, calls, rounds, conc = LAYER_CELL
    lwork = os.path.join(work, "layers")
    os.makedirs(lwork)
    os.chmod(lwork, 0o755)
    servers = [Server("floor", lwork, [go_tool(lwork, "cmpfloor"), "-socket", "{sock}"])]
    buys = {}
    try:
        if upstream:
            servers.append(Server("upstream", lwork, [upstream, "--config-dir-path",
                                                      config_dir(lwork, "upstream", CAT), "--loglevel", "warn"],
                                  grace=1))
        variants = [("cmp-warden", ALL_NS, [], "", False, "—")] + LAYERS
        for i, (name, ns, drop, off, cache_on, what) in enumerate(variants):
            d = os.path.join(lwork, f"v{i}")
            os.makedirs(d)
            os.chmod(d, 0o755)
            bench = off or name.startswith("bench build")
            servers.append(Server(name, d, [
                bench_binary if bench else binary, "--loglevel", "warn",
                "--config-dir-path", config_dir(d, "cmp-warden", CAT),
                "--policy", layer_policy(d, "policy", ns, drop, cache_on, i),
                "--work-dir", os.path.join(d, "srv-" + name, "tmp")],
                env={"CMP_WARDEN_BENCH_OFF": off} if bench else None))
            check_switched_off(servers[-1], off)
            buys[name] = what
        repo = os.path.join(lwork, f"repo-{files}")
        make_tree(repo, files - 1, (files - 1) * 2048)
        log(f"cpu: layers, {files} files, concurrency {conc}, {calls} calls × {rounds} per server, {len(servers)} servers")
        for s in servers:
            measured_batch(client, s, repo, conc, conc)
        for s, (_, _, _, off, _, _) in zip(servers[-len(variants):], variants):
            check_after_requests(s, off)
        return {"files": files, "concurrency": conc, "rounds": rounds, "buys": buys,
                **cell(client, servers, repo, calls, conc, rounds)}
    finally:
        for s in servers:
            s.stop()


# What the start-up warnings say of a switched-off layer (doctor's gaps, from the probe jail's
# report), so a variant that did not really leave its layer out stops the pass rather than
# measure the default twice. The spare and audit switches show in no report.
SWITCHED_OFF = {"landlock": "Landlock: commands read and write whatever their UID may",
                "seccomp": "the seccomp filter: every system call is open to commands",
                "cgroups": "but the probe's jail got no cgroup", "spare": None, "audit": None}


def check_after_requests(server, off):
    """After the warm-up: the audit switch left no request event in the log, and the others
    one each; the spare switch left no jail prepared at rest, and the others theirs."""
    audited = open(server.log_path).read().count('"schema":"cmp-warden.audit/v1"')
    if ("audit" in off) != (audited == 0):
        sys.exit(f"cpu: {server.name}: {audited} audit events in its log with {off or 'nothing'} switched off")
    settle()
    jails = [n for n in os.listdir(os.path.join(server.dir, "tmp", "_cmp_server")) if n.startswith("j")]
    if ("spare" in off) != (not jails):
        sys.exit(f"cpu: {server.name}: {len(jails)} jail(s) at rest with {off or 'nothing'} switched off")


def check_switched_off(server, off):
    log_text = open(server.log_path).read()
    if off and "BENCHMARK BUILD: these protections are switched off" not in log_text:
        sys.exit(f"cpu: {server.name}: the server did not say it switched {off} off:\n{log_text[-2000:]}")
    for name in filter(None, off.split(",")):
        needle = SWITCHED_OFF[name]
        if needle and needle not in log_text:
            sys.exit(f"cpu: {server.name}: its start-up report lacks {needle!r}:\n{log_text[-2000:]}")


def run(binary, quick):
    upstream = upstream_binary(quick)
    sizes = QUICK_SIZES if quick else FULL_SIZES
    concurrency = (2,) if quick else (1, 4)
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
                                                     config_dir(work, "upstream", CAT), "--loglevel", "warn"],
                                 grace=1))
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
        for s in servers:
            s.stop()
        servers = []
        if not quick:
            res["layers"] = layers(binary, build_bench_layers(), work, client, upstream)
    finally:
        for s in servers:
            s.stop()
        shutil.rmtree(work, ignore_errors=True)
    return res
