#!/usr/bin/env python3
"""End-to-end GenerateManifest benchmark: `cmp-warden client` → `cmp-warden serve`.

Usage: python3 benches/e2e.py [--runs N] [--out benches/out/e2e.json]
A 5,000-file / ~20 MiB repo is streamed at the repo-server's 1 KiB chunk size to a plugin whose
generate is `cat` of one small file (so the command costs ~nothing). Reported:
- server-side latency p50/p99 (first message to response, from the server's own log) and the
  client's wall time (which includes packing: the repo-server's cost, not the server's);
- the floor measured in the same run on the same filesystem: `cmp-warden archive extract` of the
  same archive plus a bare `cat`; server overhead = server p50 − floor;
- throughput at concurrency 1, 4, 16 and failures; server peak RSS (VmHWM).
The work dir is on tmpfs (BENCH_WORKDIR, default /dev/shm), as a memory-backed emptyDir would be:
on this VM's ext4, creating thousands of inodes right after deleting thousands spends most of
its time in ext4's `recently_deleted` inode scan, for us and for GNU tar alike.
"""
import argparse, concurrent.futures as cf, json, os, random, shutil, statistics, subprocess, sys, tempfile, time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.path.join(ROOT, "target", "release", "cmp-warden")


def make_repo(d, files=5000, total=20 * 1024 * 1024):
    rnd = random.Random(7)
    per = total // files
    alphabet = "abcdefghijklmnopqrstuvwxyz0123456789 :-\n"
    for i in range(files):
        p = os.path.join(d, f"dir{i % 100:03d}", f"sub{i % 7}", f"f{i:05d}.yaml")
        os.makedirs(os.path.dirname(p), exist_ok=True)
        with open(p, "w") as f:
            f.write("".join(rnd.choice(alphabet) for _ in range(per)))
    with open(os.path.join(d, "manifest.yaml"), "w") as f:
        f.write("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: bench\n")


def timed(cmd, **kw):
    t = time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, **kw)
    return time.perf_counter() - t, r


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--out", default=os.path.join(ROOT, "benches", "out", "e2e.json"))
    a = ap.parse_args()
    subprocess.run(["cargo", "build", "--release", "-q", "-p", "cmp-warden"], cwd=ROOT, check=True)
    work = tempfile.mkdtemp(prefix="cmpw-e2e-", dir=os.environ.get("BENCH_WORKDIR", "/dev/shm"))
    os.chmod(work, 0o755)  # jails (leased UIDs) reach the work root by path
    try:
        repo = os.path.join(work, "repo")
        make_repo(repo)
        cfg, socks = os.path.join(work, "cfg"), os.path.join(work, "socks")
        os.makedirs(cfg); os.makedirs(socks)
        with open(os.path.join(cfg, "plugin.yaml"), "w") as f:
            f.write("apiVersion: argoproj.io/v1alpha1\nkind: ConfigManagementPlugin\nmetadata: {name: bench}\n"
                    "spec:\n  generate:\n    command: [cat, manifest.yaml]\n")
        env = dict(os.environ, ARGOCD_PLUGINSOCKFILEPATH=socks, ARGOCD_CMP_WORKDIR=work)
        log_path = os.path.join(work, "server.log")
        log = open(log_path, "w")
        srv = subprocess.Popen([BIN, "--loglevel", "info", "--config-dir-path", cfg, "--max-compressed", "1Gi"],
                               env=env, stderr=log)
        sock = os.path.join(socks, "bench.sock")
        for _ in range(200):
            if os.path.exists(sock):
                break
            time.sleep(0.05)
        client = [BIN, "client", "--socket", sock, "generate", repo, "--chunk-size", "1024"]

        # Floors measured in the same run.
        tgz = os.path.join(work, "repo.tgz")
        subprocess.run(f"tar --format=ustar -czf {tgz} -C {repo} .", shell=True, check=True)
        tar_bytes = os.path.getsize(tgz)
        extract_t, cat_t = [], []
        for i in range(5):
            dest = os.path.join(work, f"x{i}")
            dt, _ = timed([BIN, "archive", "extract", "--max-compressed", "1Gi", "--into", dest, tgz])
            extract_t.append(dt)
            shutil.rmtree(dest)
            dt, _ = timed(["cat", os.path.join(repo, "manifest.yaml")])
            cat_t.append(dt)

        wall = []
        for _ in range(a.runs):
            dt, r = timed(client)
            if r.returncode != 0:
                sys.exit(f"request failed: {r.stderr.decode()}")
            wall.append(dt)
        time.sleep(0.2)
        server_ms = [json.loads(l)["ms"] / 1000 for l in open(log_path) if '"request finished"' in l]
        floor = statistics.median(extract_t) + statistics.median(cat_t)
        p50, p99 = statistics.median(server_ms), pct(server_ms, 99)

        thr = {}
        for conc in (1, 4, 16):
            n = conc * 4
            t0 = time.perf_counter()
            with cf.ThreadPoolExecutor(conc) as ex:
                res = list(ex.map(lambda _: subprocess.run(client, capture_output=True).returncode, range(n)))
            el = time.perf_counter() - t0
            thr[str(conc)] = {"requests": n, "failures": sum(1 for r in res if r != 0), "req_per_s": round(n / el, 2)}
        with open(f"/proc/{srv.pid}/status") as f:
            hwm = next(int(l.split()[1]) for l in f if l.startswith("VmHWM"))
        srv.terminate()
        srv.wait(timeout=30)
        result = {
            "benchmark": "e2e-generate", "files": 5001, "repo_bytes": 20 * 1024 * 1024, "tgz_bytes": tar_bytes,
            "chunk": 1024, "runs": a.runs,
            "server_latency_p50_s": round(p50, 4), "server_latency_p99_s": round(p99, 4),
            "client_wall_p50_s": round(statistics.median(wall), 4), "client_wall_p99_s": round(pct(wall, 99), 4),
            "floor_extract_s": round(statistics.median(extract_t), 4),
            "floor_bare_cat_s": round(statistics.median(cat_t), 4),
            "server_overhead_p50_s": round(p50 - floor, 4),
            "throughput": thr, "server_peak_rss_MiB": round(hwm / 1024, 1),
        }
        print(json.dumps(result, indent=2))
        os.makedirs(os.path.dirname(a.out), exist_ok=True)
        with open(a.out, "w") as f:
            json.dump(result, f, indent=2)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
