#!/usr/bin/env python3
"""Archive ingest benchmark: `cmp-warden archive extract` vs GNU `tar -xzf`, A/B in one run.

Usage: python3 benches/archive.py [--runs N] [--out benches/out/archive.json]
Builds the release binary, generates (a) a repo-like archive of 10,000 small files and
(b) five large files totalling 500 MiB, then alternates the two extractors N times on each,
reporting median wall time, MB/s of tar payload, the ratio ours/tar and peak RSS.
"""
import argparse, json, os, random, shutil, statistics, subprocess, sys, tempfile, time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def build():
    subprocess.run(["cargo", "build", "--release", "-q", "-p", "cmp-warden"], cwd=ROOT, check=True)
    return os.path.join(ROOT, "target", "release", "cmp-warden")


def make_repo(d):
    rnd = random.Random(42)
    words = ["apiVersion", "kind", "metadata", "name", "labels", "spec", "replicas", "image",
             "containers", "ports", "env", "value", "resources", "limits", "cpu", "memory"]
    for i in range(10_000):
        p = os.path.join(d, f"team-{i % 50:02d}", f"app-{i % 200:03d}", f"m{i:05d}.yaml")
        os.makedirs(os.path.dirname(p), exist_ok=True)
        n = rnd.randint(200, 3000)
        with open(p, "w") as f:
            while n > 0:
                line = f"{rnd.choice(words)}: {rnd.choice(words)}-{rnd.randint(0, 9999)}\n"
                f.write(line)
                n -= len(line)


def make_large(d):
    # base64 of random bytes: realistic deflate work (ratio ~1.3), 5 x 100 MiB.
    for i in range(5):
        with open(os.path.join(d, f"blob{i}.b64"), "wb") as f:
            subprocess.run(f"head -c {75 * 1024 * 1024} /dev/urandom | base64 -w 76",
                           shell=True, stdout=f, check=True)


def timed(cmd):
    t0 = time.perf_counter()
    out = subprocess.run(["/usr/bin/time", "-f", "%M"] + cmd, capture_output=True, text=True)
    dt = time.perf_counter() - t0
    if out.returncode != 0:
        sys.exit(f"command failed: {cmd}\n{out.stderr}")
    rss_kib = int(out.stderr.strip().splitlines()[-1])
    return dt, rss_kib


def bench(name, tgz, tar_bytes, binary, runs, work):
    res = {"ours": [], "tar": []}
    rss = {"ours": 0, "tar": 0}
    for i in range(runs):
        for who in (("ours", "tar") if i % 2 == 0 else ("tar", "ours")):
            dest = os.path.join(work, f"out-{who}")
            shutil.rmtree(dest, ignore_errors=True)
            os.makedirs(dest)
            if who == "ours":
                cmd = [binary, "archive", "extract", "--max-compressed", "1Gi", "--into", dest, tgz]
            else:
                cmd = ["tar", "-xzf", tgz, "-C", dest]
            dt, r = timed(cmd)
            res[who].append(dt)
            rss[who] = max(rss[who], r)
    med = {k: statistics.median(v) for k, v in res.items()}
    return {
        "case": name,
        "runs": runs,
        "tar_stream_bytes": tar_bytes,
        "compressed_bytes": os.path.getsize(tgz),
        "ours_median_s": round(med["ours"], 4),
        "tar_median_s": round(med["tar"], 4),
        "ratio_ours_over_tar": round(med["ours"] / med["tar"], 3),
        "ours_MBps": round(tar_bytes / med["ours"] / 1e6, 1),
        "tar_MBps": round(tar_bytes / med["tar"] / 1e6, 1),
        "ours_peak_rss_MiB": round(rss["ours"] / 1024, 1),
        "tar_peak_rss_MiB": round(rss["tar"] / 1024, 1),
        "note": "GNU tar -z runs gzip -d in a second process (2 cores)",
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--out", default=os.path.join(ROOT, "benches", "out", "archive.json"))
    a = ap.parse_args()
    binary = build()
    work = tempfile.mkdtemp(prefix="cmpw-bench-", dir=os.environ.get("BENCH_DIR", "/var/tmp"))
    try:
        results = []
        for name, maker in (("repo-10k-small-files", make_repo), ("large-500MiB", make_large)):
            src = os.path.join(work, "src-" + name)
            os.makedirs(src)
            maker(src)
            tgz = os.path.join(work, name + ".tgz")
            subprocess.run(["tar", "--format=ustar", "-czf", tgz, "-C", src, "."], check=True)
            tar_bytes = int(subprocess.run(f"gzip -dc {tgz} | wc -c", shell=True, capture_output=True,
                                           text=True, check=True).stdout)
            shutil.rmtree(src)
            results.append(bench(name, tgz, tar_bytes, binary, a.runs, work))
        hdr = f"{'case':24} {'ours s':>8} {'tar s':>8} {'ratio':>6} {'ours MB/s':>10} {'tar MB/s':>9} {'ours RSS':>9} {'tar RSS':>8}"
        print(hdr)
        for r in results:
            print(f"{r['case']:24} {r['ours_median_s']:8.3f} {r['tar_median_s']:8.3f} {r['ratio_ours_over_tar']:6.2f} "
                  f"{r['ours_MBps']:10.1f} {r['tar_MBps']:9.1f} {r['ours_peak_rss_MiB']:8.1f}M {r['tar_peak_rss_MiB']:7.1f}M")
        os.makedirs(os.path.dirname(a.out), exist_ok=True)
        with open(a.out, "w") as f:
            json.dump({"benchmark": "archive", "machine": os.uname().nodename, "nproc": os.cpu_count(),
                       "results": results}, f, indent=2)
        print(f"wrote {a.out}")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
