"""What an Argo CD user waits for: Argo CD's own repo-server's `GenerateManifest`,
through Argo's own client package, in front of cmp-warden and in front of upstream's
`argocd-cmp-server` of the same release (v3.5.7, both built by scripts/argo-build).

A git server on loopback (git http-backend), redis, and two repo-servers, each with one plugin
(`cat manifest.yaml`): one on cmp-warden's socket (the default policy, tree cache on), one on
upstream's (as uid 999, as Argo's image runs it). Per repository size (100, 1,000, 5,000
files): `cold` calls each see a new commit (one more small file: the repo-server fetches it
and sends a new archive, as after every push); `repeated` calls ask for the same commit with
the repo-server's manifest cache bypassed (`noCache`, as a hard refresh), so the plugin runs
on the same archive. Both servers alternate in ABBA order; reported: each side's p50/p99 as the
caller sees it (the driver's time) and cmp-warden's ÷ upstream's. Everything on tmpfs
(BENCH_WORKDIR, default /dev/shm).
"""
import json, os, shutil, subprocess, sys, tempfile

from common import ROOT, argo_build, log, make_tree, median, pct

sys.path.insert(0, os.path.join(ROOT, "tests", "system"))
import lib  # noqa: E402

FULL = [(100, 12, 2), (1000, 8, 2), (5000, 4, 2)]
QUICK = [(20, 2, 1)]
PLUGIN = ("apiVersion: argoproj.io/v1alpha1\nkind: ConfigManagementPlugin\nmetadata: {name: bench}\n"
          "spec:\n  generate:\n    command: [cat, manifest.yaml]\n")


def run(binary, quick):
    argo, version = argo_build(quick, "--driver")
    # On tmpfs for both (BENCH_WORKDIR, default /dev/shm, as the other parts): upstream's work
    # directory on a disk would measure the disk, not the server.
    work = tempfile.mkdtemp(prefix="cmpw-rs-bench-", dir=os.environ.get("BENCH_WORKDIR", "/dev/shm"))
    os.chmod(work, 0o755)
    procs = []
    res = {"argo": version, "cells": []}
    try:
        repos = os.path.join(work, "repos")
        os.makedirs(repos)
        sizes = QUICK if quick else FULL
        for files, _, _ in sizes:
            tree = os.path.join(work, f"tree-{files}")
            os.makedirs(tree)
            make_tree(tree, files, files * 2048)
            with open(os.path.join(tree, "manifest.yaml"), "w") as f:
                f.write('{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"bench"}}\n')
            lib.git("init", "-q", "-b", "main", cwd=tree)
            lib.git("add", "-A", cwd=tree)
            lib.git("commit", "-q", "-m", "tree", cwd=tree)
            lib.git("clone", "-q", "--bare", tree, os.path.join(repos, f"r{files}.git"), cwd=work)
            lib.git("update-server-info", cwd=os.path.join(repos, f"r{files}.git"))
        git = lib.GitServer(repos)
        redis_port = lib.free_port()
        procs.append(lib.Proc("redis", ["redis-server", "--port", str(redis_port), "--bind", "127.0.0.1",
                                        "--save", "", "--appendonly", "no"], os.path.join(work, "redis.log")))
        lib.wait_for("redis", lambda: lib.port_open(redis_port), proc=procs[-1])
        sides = {}
        for side in ["upstream", "cmp-warden"]:
            base = os.path.join(work, side)
            socks, cfg, tmp = (os.path.join(base, d) for d in ("socks", "cfg", "tmp"))
            for d in (base, socks, cfg, tmp):
                os.makedirs(d)
                os.chmod(d, 0o755)
            for d in (socks, tmp):
                os.chown(d, 999, 999)
            with open(os.path.join(cfg, "plugin.yaml"), "w") as f:
                f.write(PLUGIN)
            env = dict(os.environ, ARGOCD_PLUGINSOCKFILEPATH=socks)
            if side == "upstream":
                env.update(ARGOCD_CMP_WORKDIR=tmp, TMPDIR=tmp, HOME=tmp)
                p = lib.Proc(side, [os.path.join(argo, "argocd-cmp-server"), "--config-dir-path", cfg,
                                    "--loglevel", "warn"], os.path.join(base, "server.log"), env=env,
                             preexec=lib.as_user(999, 999))
            else:
                os.makedirs(os.path.join(base, "work"))
                p = lib.Proc(side, [binary, "--loglevel", "warn", "--config-dir-path", cfg,
                                    "--socket-dir", socks, "--work-dir", os.path.join(base, "work")],
                             os.path.join(base, "server.log"), env=env)
            procs.append(p)
            lib.wait_for(side, lambda s=socks: os.path.exists(os.path.join(s, "bench.sock")), proc=p)
            port, metrics = lib.free_port(), lib.free_port()
            rs_tmp = os.path.join(base, "rs-tmp")
            os.makedirs(rs_tmp)
            os.chown(rs_tmp, 999, 999)
            args = [os.path.join(argo, "argocd-repo-server"), "--disable-tls", "--address", "127.0.0.1",
                    "--port", str(port), "--metrics-address", "127.0.0.1", "--metrics-port", str(metrics),
                    "--redis", f"127.0.0.1:{redis_port}", "--loglevel", "warn"]
            if version.startswith("v3"):
                args += ["--client-ca-path", ""]
            rs = lib.Proc(f"repo-server-{side}", args, os.path.join(base, "repo-server.log"),
                          env=dict(PATH=f"{argo}:/usr/local/bin:/usr/bin:/bin", HOME=rs_tmp, TMPDIR=rs_tmp,
                                   ARGOCD_GPG_ENABLED="false", ARGOCD_PLUGINSOCKFILEPATH=socks,
                                   ARGOCD_ASK_PASS_SOCK=os.path.join(rs_tmp, "askpass.sock")),
                          preexec=lib.as_user(999, 999))
            procs.append(rs)
            lib.wait_for("repo-server", lambda p=port: lib.port_open(p), proc=rs)
            sides[side] = port
        driver = os.path.join(argo, "repo-server-driver")

        def call(side, files, revision, no_cache):
            req = {"repo": git.url(f"r{files}"), "path": ".", "revision": revision, "appName": f"bench-{files}",
                   "namespace": "apps", "project": "default", "noCache": no_cache,
                   "plugin": {"name": "bench"}}
            r = subprocess.run([driver, "-address", f"127.0.0.1:{sides[side]}", "-rpc", "generate",
                                "-request", json.dumps(req)], capture_output=True, text=True)
            a = json.loads(r.stdout) if r.returncode == 0 else {"ok": False, "error": r.stderr}
            if not a.get("ok"):
                sys.exit(f"reposerver bench: {side} {files} files: {a.get('error')}")
            return a["ms"]

        n = 0
        for files, calls, rounds in sizes:
            tree = os.path.join(work, f"tree-{files}")
            bare = os.path.join(repos, f"r{files}.git")
            for mode in ("cold", "repeated"):
                times = {"upstream": [], "cmp-warden": []}
                for rnd in range(rounds):
                    order = ["upstream", "cmp-warden"] if rnd % 2 == 0 else ["cmp-warden", "upstream"]
                    for side in order:
                        for _ in range(calls):
                            if mode == "cold":
                                # A new commit: one more small file, pushed.
                                n += 1
                                with open(os.path.join(tree, f"nonce-{n}.txt"), "w") as f:
                                    f.write(f"{n}\n")
                                lib.git("add", "-A", cwd=tree)
                                lib.git("commit", "-q", "-m", f"n{n}", cwd=tree)
                                lib.git("push", "-q", bare, "main", cwd=tree)
                                lib.git("update-server-info", cwd=bare)
                                rev = lib.git("rev-parse", "HEAD", cwd=tree).strip()
                                times[side].append(call(side, files, rev, True))
                            else:
                                rev = lib.git("rev-parse", "HEAD", cwd=tree).strip()
                                times[side].append(call(side, files, rev, True))
                cell = {"files": files, "mode": mode, "sides": {}}
                for side, ts in times.items():
                    cell["sides"][side] = {"p50_ms": median(ts), "p99_ms": pct(ts, 99), "n": len(ts)}
                cell["ratio"] = round(cell["sides"]["cmp-warden"]["p50_ms"] / max(1, cell["sides"]["upstream"]["p50_ms"]), 2)
                log(f"reposerver {files} files {mode}: upstream p50 {cell['sides']['upstream']['p50_ms']} ms, "
                    f"cmp-warden p50 {cell['sides']['cmp-warden']['p50_ms']} ms ({cell['ratio']}×)")
                res["cells"].append(cell)
        git.stop()
    finally:
        for p in reversed(procs):
            p.stop()
        shutil.rmtree(work, ignore_errors=True)
    return res
