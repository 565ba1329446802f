"""Helpers shared by the benchmark suite (benches/run): building, timing, trees, memory."""
import json, os, random, shutil, statistics, subprocess, sys, threading, time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def log(msg):
    print(f"[bench] {msg}", file=sys.stderr, flush=True)


def build(quick):
    """The binary under test: release for real runs, the debug build for --quick smoke runs."""
    if quick:
        subprocess.run(["cargo", "build", "-q", "-p", "cmp-warden"], cwd=ROOT, check=True)
        return os.path.join(ROOT, "target", "debug", "cmp-warden")
    subprocess.run(["cargo", "build", "--release", "-q", "-p", "cmp-warden"], cwd=ROOT, check=True)
    return os.path.join(ROOT, "target", "release", "cmp-warden")


def argo_build(quick, *extra):
    """Argo CD v3 from scripts/argo-build: its directory and its version. A full run compares with
    the release's own optimisation (--optimized); a smoke run takes the tests' build
    (scripts/goflags.py)."""
    args = ["v3", *extra] + ([] if quick else ["--optimized"])
    out = subprocess.run([os.path.join(ROOT, "scripts/argo-build"), *args], capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"scripts/argo-build {' '.join(args)}: {out.stderr[-2000:]}")
    argo = out.stdout.strip().splitlines()[-1]
    return argo, os.path.basename(argo).removesuffix("-optimized")


def build_bench_layers():
    """The release build with the layer pass's switches (cargo feature `bench-layers`), copied
    aside as target/release/cmp-warden-bench-layers; then the shipped build is put back in
    place (cargo keeps both, so that is a copy, not a compile)."""
    out = subprocess.run(["cargo", "build", "--release", "-q", "-p", "cmp-warden", "--features", "bench-layers",
                          "--message-format=json"], cwd=ROOT, check=True, capture_output=True, text=True).stdout
    exe = [m["executable"] for m in map(json.loads, out.splitlines())
           if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] == "cmp-warden"]
    dest = os.path.join(ROOT, "target", "release", "cmp-warden-bench-layers")
    shutil.copy2(exe[-1], dest)
    subprocess.run(["cargo", "build", "--release", "-q", "-p", "cmp-warden"], cwd=ROOT, check=True)
    return dest


def extract_cmd(binary, who, tgz, dest):
    """The command extracting `tgz` into `dest`: ours ("ours": `archive extract`, unconfined,
    one process) or GNU tar ("tar")."""
    if who == "ours":
        return [binary, "archive", "extract", "--max-compressed", "1Gi", "--into", dest, tgz]
    return ["tar", "-xzf", tgz, "-C", dest]


def median(xs):
    return statistics.median(xs)


def pct(xs, p):
    """Nearest-rank percentile."""
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


def timed(cmd, **kw):
    t = time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, **kw)
    return time.perf_counter() - t, r


def timed_rss(cmd):
    """Wall time and peak RSS (KiB, from GNU time) of one command; a failure stops the suite."""
    t0 = time.perf_counter()
    out = subprocess.run(["/usr/bin/time", "-f", "%M"] + cmd, capture_output=True, text=True)
    dt = time.perf_counter() - t0
    if out.returncode != 0:
        sys.exit(f"command failed: {cmd}\n{out.stderr}")
    return dt, int(out.stderr.strip().splitlines()[-1])


WORDS = ["apiVersion", "kind", "metadata", "name", "labels", "spec", "replicas", "image",
         "containers", "ports", "env", "value", "resources", "limits", "cpu", "memory"]


def text_pool(seed, size=4 * 1024 * 1024):
    """YAML-like text (deflates ~4x, as manifests do); files are slices of it."""
    rnd = random.Random(seed)
    parts, n = [], 0
    while n < size:
        line = f"{rnd.choice(WORDS)}: {rnd.choice(WORDS)}-{rnd.randint(0, 99999)}\n"
        parts.append(line)
        n += len(line)
    return "".join(parts)


def make_tree(d, files, total_bytes, seed=7):
    """A repo-like tree: `files` files in two directory levels, `total_bytes` in all, plus the
    plugin's `manifest.yaml`."""
    pool = text_pool(seed)
    rnd = random.Random(seed)
    per = max(1, total_bytes // files)
    for i in range(files):
        p = os.path.join(d, f"team-{i % 100:03d}", f"app-{i % 7}", f"m{i:06d}.yaml")
        os.makedirs(os.path.dirname(p), exist_ok=True)
        off = rnd.randrange(0, len(pool) - per)
        with open(p, "w") as f:
            f.write(pool[off:off + per])
    with open(os.path.join(d, "manifest.yaml"), "w") as f:
        f.write("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: bench\n")


def pack(src, tgz):
    subprocess.run(["tar", "--format=ustar", "-czf", tgz, "-C", src, "."], check=True)


def tar_bytes(tgz):
    r = subprocess.run(f"gzip -dc {tgz} | wc -c", shell=True, capture_output=True, text=True, check=True)
    return int(r.stdout)


def tree_rss_kib(root_pid):
    """Memory of `root_pid` and all its descendants (server, jails, plugin commands): the sum of
    their PSS (proportional set size), so pages shared between processes — the binary's text,
    mapped by every jail — count once, as they do in the pod's memory."""
    parent = {}
    rss = {}
    for e in os.listdir("/proc"):
        if not e.isdigit():
            continue
        try:
            with open(f"/proc/{e}/stat") as f:
                stat = f.read()
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{e}/smaps_rollup") as f:
                kib = next((int(l.split()[1]) for l in f if l.startswith("Pss:")), 0)
        except (OSError, ValueError, IndexError):
            continue
        parent[int(e)] = ppid
        rss[int(e)] = kib
    total = 0
    for pid, kib in rss.items():
        p, hops = pid, 0
        while p and p != root_pid and hops < 64:
            p, hops = parent.get(p, 0), hops + 1
        if p == root_pid:
            total += kib
    return total


class PeakTreeRss:
    """Samples tree_rss_kib (summed PSS) every 20 ms on a thread; `.peak_kib` once stopped."""

    def __init__(self, pid):
        self.pid, self.peak_kib, self._stop = pid, 0, threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.is_set():
            self.peak_kib = max(self.peak_kib, tree_rss_kib(self.pid))
            self._stop.wait(0.02)

    def __enter__(self):
        self._t.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._t.join()


def vm_hwm_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        return next(int(l.split()[1]) for l in f if l.startswith("VmHWM"))


def cache_policy(work, on):
    """A copy of `policies/` (the default policy names its seccomp profile relative to itself)
    with `spec.cache.enabled` set; when on, every archive is cached however small
    (`minArchiveBytes: 0`), since the cache part measures what caching small ones costs."""
    d = os.path.join(work, "policies-%s" % ("on" if on else "off"))
    shutil.copytree(os.path.join(ROOT, "policies"), d)
    path = os.path.join(d, "default.yaml")
    with open(path) as f:
        text = f.read()
    on_line = "cache: {enabled: true, bytes: 512Mi}"
    if on_line not in text:
        sys.exit("policies/default.yaml has no `" + on_line + "` line to switch")
    with open(path, "w") as f:
        f.write(text.replace(on_line, on_line[:-1] + ", minArchiveBytes: 0}") if on
                else text.replace(on_line, on_line.replace("true", "false")))
    return path


def wait_for_socket(sock, proc, log_path, what, tries=400):
    """Return once `sock` exists; exit with the server's log if `proc` ends or it never does."""
    for _ in range(tries):
        if os.path.exists(sock):
            return
        if proc.poll() is not None:
            break
        time.sleep(0.05)
    sys.exit(f"{what} did not start:\n" + open(log_path).read())
