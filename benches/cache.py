"""The tree cache (`spec.cache`): the same requests against two servers of the same
build, one with the cache on and one with it off, alternating A/B in one run.

- cached vs uncached: GenerateManifest of one archive at 1,000 and 5,000 files (`cat` of one
  file, so the server's work is what is measured); the cached server has the tree already;
  reported as the ratio of server-side p50s (first message to response, the server's own log);
- the monorepo pattern: one archive holding 20 applications, and for it one MatchRepository,
  one GetParametersAnnouncement and 20 GenerateManifest calls with 20 different `appRelPath`s,
  as the repo-server makes them for 20 Applications at one revision; the total server time of
  the sequence with the cache (the first call fills it) against without;
- small archives (10 to 1,000 files): what a hit and what a fill (an archive the cached server
  has not seen) cost against the uncached request, in the same alternation, to place the
  size below which the cache is skipped (`spec.cache.minArchiveBytes`);
- peak memory of the cached server's process tree (server, keeper, jails, commands) at
  concurrency 16 on the 5,000-file archive.
Everything runs on tmpfs (BENCH_WORKDIR, default /dev/shm), as a memory-backed emptyDir would.
"""
import concurrent.futures as cf, os, shutil, sys, tempfile, time

from common import PeakTreeRss, cache_policy, log, make_tree, median, pack, pct, timed

from e2e import Server

FULL_SIZES = [("1k", 1000, 4 << 20, 15), ("5k", 5000, 20 << 20, 11)]
QUICK_SIZES = [("1k", 200, 400 << 10, 3)]
# Small archives: (files, bytes in all); requests per server for hits and for fills.
FULL_SMALL = [(10, 4 << 10), (20, 8 << 10), (40, 16 << 10), (70, 28 << 10), (100, 40 << 10),
              (300, 120 << 10)]
QUICK_SMALL = [(10, 4 << 10), (100, 40 << 10)]
APPS = 20

PLUGIN = """apiVersion: argoproj.io/v1alpha1
kind: ConfigManagementPlugin
metadata: {name: bench}
spec:
  discover:
    find:
      command: [sh, -c, "ls apps"]
  parameters:
    dynamic:
      command: [echo, '[{"name": "apps", "string": "20"}]']
  generate:
    command: [cat, manifest.yaml]
"""


def start(binary, work, on):
    d = os.path.join(work, "cache-on" if on else "cache-off")
    os.makedirs(d)
    os.chmod(d, 0o755)
    srv = Server(binary, d, ("--policy", cache_policy(work, on)), plugin=PLUGIN,
                 leases=os.path.join(work, "leases"))
    if on:
        # The cache starts once the start-up probe is done (after the socket exists).
        for _ in range(200):
            with open(srv.log_path) as f:
                text = f.read()
            if '"tree_cache":"on (' in text:
                break
            if '"tree_cache":' in text and '"sandbox enforced"' in text:
                sys.exit("the tree cache did not start:\n" + text[-4000:])
            time.sleep(0.05)
        else:
            sys.exit("no start-up report from the cached server")
    return srv


def client(binary, sock, rpc, repo, tgz, app="."):
    return [binary, "client", "--socket", sock, rpc, repo, "--archive", tgz, "--app-rel-path", app,
            "--chunk-size", "1024"]


def ok(cmd):
    dt, r = timed(cmd)
    if r.returncode != 0:
        sys.exit(f"request failed: {' '.join(cmd)}\n{r.stderr.decode()}")
    return dt


def monorepo(work, files, total):
    """A repository of 20 applications (apps/app-NN/manifest.yaml) beside `files` other files."""
    repo = os.path.join(work, "mono")
    make_tree(repo, files, total)
    for i in range(APPS):
        d = os.path.join(repo, "apps", f"app-{i:02d}")
        os.makedirs(d)
        with open(os.path.join(d, "manifest.yaml"), "w") as f:
            f.write(f"apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: app-{i:02d}\n")
    tgz = os.path.join(work, "mono.tgz")
    pack(repo, tgz)
    return repo, tgz


def sequence(binary, srv, repo, tgz):
    """The repo-server's calls for 20 Applications at one revision; server seconds in all."""
    mark = srv.mark()
    ok(client(binary, srv.sock, "match", repo, tgz))
    ok(client(binary, srv.sock, "params", repo, tgz, "apps/app-00"))
    for i in range(APPS):
        ok(client(binary, srv.sock, "generate", repo, tgz, f"apps/app-{i:02d}"))
    secs = srv.server_seconds(mark)
    if len(secs) != APPS + 2:
        sys.exit(f"expected {APPS + 2} finished requests in the server log, found {len(secs)}")
    return sum(secs)


def small(binary, work, on, off, quick):
    """Hit and fill against uncached, by archive size. Each fill sends an archive the cached
    server has not seen (a new revision file), to both servers alike."""
    runs = 3 if quick else 15
    out = []
    for files, total in QUICK_SMALL if quick else FULL_SMALL:
        log(f"cache: small archive, {files} files, {runs} hits and {runs} fills per server")
        repo = os.path.join(work, f"small-{files}")
        make_tree(repo, files, total)
        tgzs = []
        for r in range(runs + 1):
            with open(os.path.join(repo, "revision"), "w") as f:
                f.write(str(r))
            tgz = os.path.join(work, f"small-{files}-{r}.tgz")
            pack(repo, tgz)
            tgzs.append(tgz)
        ok(client(binary, off.sock, "generate", repo, tgzs[0]))
        ok(client(binary, on.sock, "generate", repo, tgzs[0]))  # fills the tree hit below
        m_on, m_off = on.mark(), off.mark()
        for _ in range(runs):
            ok(client(binary, off.sock, "generate", repo, tgzs[0]))
            ok(client(binary, on.sock, "generate", repo, tgzs[0]))
        hit, off_hit = on.server_seconds(m_on), off.server_seconds(m_off)
        m_on, m_off = on.mark(), off.mark()
        for tgz in tgzs[1:]:
            ok(client(binary, off.sock, "generate", repo, tgz))
            ok(client(binary, on.sock, "generate", repo, tgz))
        fill, off_fill = on.server_seconds(m_on), off.server_seconds(m_off)
        uncached = median(off_hit + off_fill)
        saved, extra = uncached - median(hit), median(fill) - uncached
        out.append({
            "files": files + 2, "archive_bytes": os.path.getsize(tgzs[0]),
            "uncached_p50_ms": round(uncached * 1e3, 2), "hit_p50_ms": round(median(hit) * 1e3, 2),
            "fill_p50_ms": round(median(fill) * 1e3, 2),
            # How many hits repay one fill (none: a hit saves nothing).
            "hits_to_repay_a_fill": round(extra / saved, 1) if saved > 0 else None,
        })
        shutil.rmtree(repo)
    return out


def run(binary, quick):
    sizes = QUICK_SIZES if quick else FULL_SIZES
    work = tempfile.mkdtemp(prefix="cmpw-cache-", dir=os.environ.get("BENCH_WORKDIR", "/dev/shm"))
    os.chmod(work, 0o755)
    on = off = None
    try:
        off, on = start(binary, work, False), start(binary, work, True)
        by_size = []
        for name, files, total, runs in sizes:
            log(f"cache: {name} archive, {files:,} files, {runs} requests per server")
            repo = os.path.join(work, "repo-" + name)
            make_tree(repo, files, total)
            tgz = os.path.join(work, name + ".tgz")
            pack(repo, tgz)
            cmd_on = client(binary, on.sock, "generate", repo, tgz)
            cmd_off = client(binary, off.sock, "generate", repo, tgz)
            ok(cmd_off)  # warm-up (page cache, spare jail)
            ok(cmd_on)  # fills the tree
            m_on, m_off = on.mark(), off.mark()
            for _ in range(runs):
                ok(cmd_off)
                ok(cmd_on)
            s_on, s_off = on.server_seconds(m_on), off.server_seconds(m_off)
            if len(s_on) != runs or len(s_off) != runs:
                sys.exit(f"expected {runs} finished requests per server, found {len(s_on)} and {len(s_off)}")
            by_size.append({
                "size": name, "files": files + 1, "requests": runs,
                "uncached_p50_s": round(median(s_off), 4), "cached_p50_s": round(median(s_on), 4),
                "cached_p99_s": round(pct(s_on, 99), 4),
                "ratio": round(median(s_on) / median(s_off), 3),
            })
            shutil.rmtree(repo)
        by_small = small(binary, work, on, off, quick)
        log(f"cache: monorepo, {APPS} applications, match + parameters + {APPS} generate")
        files, total = (200, 400 << 10) if quick else (5000, 20 << 20)
        repo, tgz = monorepo(work, files, total)
        rounds = 1 if quick else 3
        t_on, t_off = [], []
        for r in range(rounds):
            # Each round is a new revision: an archive neither server has seen, so the cached
            # server's first call fills its tree.
            with open(os.path.join(repo, "apps", "revision"), "w") as f:
                f.write(str(r))
            pack(repo, tgz)
            t_off.append(sequence(binary, off, repo, tgz))
            t_on.append(sequence(binary, on, repo, tgz))
        mono = {"applications": APPS, "files": files, "rounds": rounds,
                "uncached_total_s": round(median(t_off), 4), "cached_total_s": round(median(t_on), 4),
                "ratio": round(median(t_on) / median(t_off), 3)}
        conc = 4 if quick else 16
        n = conc * 4
        log(f"cache: concurrency {conc} on the monorepo archive, {n} requests, peak memory")
        cmd = client(binary, on.sock, "generate", repo, tgz, "apps/app-01")
        with PeakTreeRss(on.proc.pid) as peak, cf.ThreadPoolExecutor(conc) as ex:
            res = list(ex.map(lambda _: timed(cmd), range(n)))
        failures = sum(1 for _, r in res if r.returncode != 0)
        return {"sizes": by_size, "small": by_small, "monorepo": mono,
                "concurrency": {"concurrency": conc, "requests": n, "failures": failures,
                                "tree_peak_rss_MiB": round(peak.peak_kib / 1024, 1)}}
    finally:
        for s in (on, off):
            if s:
                s.stop()
        shutil.rmtree(work, ignore_errors=True)
