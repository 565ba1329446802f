"""End to end: `cmp-warden client` -> `cmp-warden serve` GenerateManifest.

For each repo size the archive is packed once and streamed by the client at the repo-server's
1 KiB chunk size (`client --archive`: packing is the repo-server's cost, kept out of the
measurement). generate is `cat` of one small file, so what is measured is the server: receive,
hand the stream to a confined jail, extract, run the command, reply. Reported:
- server-side latency p50/p99 (first message to response, from the server's own log) and the
  client's wall time;
- the floor on the same data in the same run, alternating with the requests (one floor
  measurement before each request): `cmp-warden archive extract` (unconfined, one process)
  plus a bare `cat`; GNU `tar -xzf` is shown beside it;
- throughput and latency at concurrency 1, 4 and 16 on the medium repo, and peak memory:
  the server process (VmHWM) and the whole tree (server + jails + commands, sampled);
- the admission queue: concurrency 64 against a server admitting 4 at once (`--max-in-flight
  4`): every request must succeed, waiting its turn; latency grows with the queue's depth.
Everything runs on tmpfs (BENCH_WORKDIR, default /dev/shm), as a memory-backed emptyDir would.
"""
import concurrent.futures as cf, json, os, shutil, subprocess, sys, tempfile, time

from common import PeakTreeRss, cache_policy, extract_cmd, log, make_tree, median, pack, pct, timed, vm_hwm_kib, wait_for_socket

FULL_SIZES = [("small", 100, 400 << 10, 30), ("1k", 1000, 4 << 20, 20), ("medium", 5000, 20 << 20, 15),
              ("20k", 20_000, 80 << 20, 6), ("large", 50_000, 200 << 20, 5)]
QUICK_SIZES = [("small", 20, 20 << 10, 3), ("medium", 200, 400 << 10, 3), ("large", 500, 1 << 20, 3)]


PLUGIN = ("apiVersion: argoproj.io/v1alpha1\nkind: ConfigManagementPlugin\nmetadata: {name: bench}\n"
          "spec:\n  generate:\n    command: [cat, manifest.yaml]\n")


class Server:
    def __init__(self, binary, work, extra=(), plugin=PLUGIN, leases=None):
        cfg, socks = os.path.join(work, "cfg"), os.path.join(work, "socks")
        os.makedirs(cfg)
        os.makedirs(socks)
        with open(os.path.join(cfg, "plugin.yaml"), "w") as f:
            f.write(plugin)
        env = dict(os.environ, ARGOCD_PLUGINSOCKFILEPATH=socks, ARGOCD_CMP_WORKDIR=work)
        if leases:
            # Servers running at once on one UID range share their leases, as sidecars of one
            # pod do through the socket directory (else the second refuses to start).
            env["CMP_WARDEN_LEASE_DIR"] = leases
        self.log_path = os.path.join(work, "server.log")
        self.proc = subprocess.Popen([binary, "--loglevel", "info", "--config-dir-path", cfg,
                                      "--max-compressed", "1Gi", *extra], env=env,
                                     stderr=open(self.log_path, "w"))
        self.sock = os.path.join(socks, "bench.sock")
        wait_for_socket(self.sock, self.proc, self.log_path, "server")

    def mark(self):
        return os.path.getsize(self.log_path)

    def server_seconds(self, since):
        """`ms` of every finished request logged after `since` (a mark)."""
        time.sleep(0.2)  # the log line follows the response
        with open(self.log_path) as f:
            f.seek(since)
            return [json.loads(l)["us"] / 1e6 for l in f if '"request finished"' in l]

    def stop(self):
        self.proc.terminate()
        self.proc.wait(timeout=30)


def client_cmd(binary, sock, repo, tgz):
    return [binary, "client", "--socket", sock, "generate", repo, "--archive", tgz, "--chunk-size", "1024"]


def one(cmd):
    dt, r = timed(cmd)
    if r.returncode != 0:
        sys.exit(f"request failed: {r.stderr.decode()}")
    return dt


def extract_once(binary, work, tgz, who):
    """One floor extraction into a fresh directory: ours (unconfined) or GNU tar."""
    dest = os.path.join(work, f"floor-{who}")
    os.makedirs(dest)
    dt, r = timed(extract_cmd(binary, who, tgz, dest))
    if r.returncode != 0:
        sys.exit(f"floor extract failed: {r.stderr.decode()}")
    shutil.rmtree(dest)
    return dt


def run(binary, quick):
    sizes = QUICK_SIZES if quick else FULL_SIZES
    concurrency = (1, 2, 4) if quick else (1, 4, 16)
    work = tempfile.mkdtemp(prefix="cmpw-e2e-", dir=os.environ.get("BENCH_WORKDIR", "/dev/shm"))
    os.chmod(work, 0o755)  # jails (leased UIDs) reach the work root by path
    srv = None
    try:
        # The cold path: every request extracts its archive (the tree cache, on by default,
        # would serve the same archive from the second request on; `benches/run --only cache`
        # measures that).
        srv = Server(binary, work, ("--policy", cache_policy(work, False)))
        by_size = []
        repos = {}
        for name, files, total, runs in sizes:
            log(f"e2e: {name} repo, {files:,} files / {total >> 20 or total >> 10}{'MiB' if total >> 20 else 'KiB'}, {runs} requests")
            repo = os.path.join(work, "repo-" + name)
            make_tree(repo, files, total)
            tgz = os.path.join(work, name + ".tgz")
            pack(repo, tgz)
            repos[name] = (repo, tgz)
            cmd = client_cmd(binary, srv.sock, repo, tgz)
            one(cmd)  # warm-up (page cache, spare jail)
            extract_once(binary, work, tgz, "ours")
            mark = srv.mark()
            # A/B alternation: each request follows one measurement of the floor (and GNU tar),
            # so both see the same moment of a noisy machine.
            wall, f_ours, f_tar, f_cat = [], [], [], []
            for _ in range(runs):
                f_ours.append(extract_once(binary, work, tgz, "ours"))
                f_tar.append(extract_once(binary, work, tgz, "tar"))
                f_cat.append(timed(["cat", os.path.join(repo, "manifest.yaml")])[0])
                wall.append(one(cmd))
            f_ours, f_tar, f_cat = median(f_ours), median(f_tar), median(f_cat)
            server = srv.server_seconds(mark)
            if len(server) != runs:
                sys.exit(f"expected {runs} finished requests in the server log, found {len(server)}")
            fl = f_ours + f_cat
            p50 = median(server)
            by_size.append({
                "size": name, "files": files + 1, "repo_bytes": total, "tgz_bytes": os.path.getsize(tgz),
                "requests": runs, "chunk": 1024,
                "server_p50_s": round(p50, 4), "server_p99_s": round(pct(server, 99), 4),
                "client_wall_p50_s": round(median(wall), 4), "client_wall_p99_s": round(pct(wall, 99), 4),
                "floor_extract_s": round(f_ours, 4), "floor_cat_s": round(f_cat, 4),
                "gnu_tar_extract_s": round(f_tar, 4), "floor_s": round(fl, 4),
                "overhead_p50_s": round(p50 - fl, 4), "overhead_ratio": round(p50 / fl - 1, 3),
            })
            if name != "medium":
                shutil.rmtree(repo)
        repo, tgz = repos["medium"]
        cmd = client_cmd(binary, srv.sock, repo, tgz)
        by_conc = []
        for conc in concurrency:
            n = conc * (2 if quick else 4)
            log(f"e2e: medium repo at concurrency {conc}, {n} requests")
            mark = srv.mark()
            t0 = time.perf_counter()
            with PeakTreeRss(srv.proc.pid) as peak, cf.ThreadPoolExecutor(conc) as ex:
                res = list(ex.map(lambda _: timed(cmd), range(n)))
            elapsed = time.perf_counter() - t0
            wall = [dt for dt, r in res if r.returncode == 0]
            server = srv.server_seconds(mark)
            by_conc.append({
                "concurrency": conc, "requests": n, "failures": sum(1 for _, r in res if r.returncode != 0),
                "req_per_s": round(n / elapsed, 2),
                "client_wall_p50_s": round(median(wall), 4) if wall else None,
                "client_wall_p99_s": round(pct(wall, 99), 4) if wall else None,
                "server_p50_s": round(median(server), 4) if server else None,
                "tree_peak_rss_MiB": round(peak.peak_kib / 1024, 1),
            })
        hwm = vm_hwm_kib(srv.proc.pid)
        srv.stop()
        srv = None
        queue = run_queue(binary, work, cmd, quick)
        return {"sizes": by_size, "concurrency": by_conc, "server_peak_rss_MiB": round(hwm / 1024, 1),
                "queue": queue}
    finally:
        if srv:
            srv.stop()
        shutil.rmtree(work, ignore_errors=True)


def run_queue(binary, work, cmd, quick):
    """Concurrency far above the server's admission cap: all requests wait their turn, none fails."""
    cap, conc = (2, 16) if quick else (4, 64)
    n = conc * 2
    qwork = os.path.join(work, "queue")
    os.makedirs(qwork)
    os.chmod(qwork, 0o755)
    srv = Server(binary, qwork, ("--policy", cache_policy(qwork, False), "--max-in-flight", str(cap)))
    try:
        sock = os.path.join(qwork, "socks", "bench.sock")
        qcmd = [sock if c == cmd[cmd.index("--socket") + 1] else c for c in cmd]
        one(qcmd)
        log(f"e2e: admission queue, concurrency {conc} against --max-in-flight {cap}, {n} requests")
        mark = srv.mark()
        t0 = time.perf_counter()
        with cf.ThreadPoolExecutor(conc) as ex:
            res = list(ex.map(lambda _: timed(qcmd), range(n)))
        elapsed = time.perf_counter() - t0
        wall = [dt for dt, r in res if r.returncode == 0]
        server = srv.server_seconds(mark)
        return {
            "max_in_flight": cap, "concurrency": conc, "requests": n,
            "failures": sum(1 for _, r in res if r.returncode != 0),
            "req_per_s": round(n / elapsed, 2),
            "client_wall_p50_s": round(median(wall), 4) if wall else None,
            "client_wall_p99_s": round(pct(wall, 99), 4) if wall else None,
            # Server time counts from the first message, so it includes the wait for a slot.
            "server_p50_s": round(median(server), 4) if server else None,
        }
    finally:
        srv.stop()
