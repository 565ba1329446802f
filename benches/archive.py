"""Archive ingest: `cmp-warden archive extract` vs GNU `tar -xzf`, A/B in one run.

Two archives: a repo-like one (10,000 small YAML files) and a large-file one (5 files, 500 MiB
of base64). The extractors alternate on each; reported are median wall time, MB/s of tar
payload, the ratio ours/tar and peak RSS. Runs on tmpfs (BENCH_DIR, default /dev/shm): on this
VM's ext4, creating 10,000 inodes right after deleting 10,000 makes every `openat` scan the
inode tables (ext4 `recently_deleted`, ~0.5 ms per file), so a disk run measures the
filesystem's deletion history (the same archive took 0.36 s to 11.5 s), not the extractor.
"""
import os, shutil, subprocess, tempfile

from common import extract_cmd, log, median, make_tree, pack, tar_bytes, timed_rss


def make_large(d, total):
    # base64 of random bytes: realistic deflate work (ratio ~1.3), five files.
    for i in range(5):
        with open(os.path.join(d, f"blob{i}.b64"), "wb") as f:
            subprocess.run(f"head -c {total * 3 // 4 // 5} /dev/urandom | base64 -w 76",
                           shell=True, stdout=f, check=True)


def bench(name, tgz, binary, runs, work):
    payload = tar_bytes(tgz)
    times = {"ours": [], "tar": []}
    rss = {"ours": 0, "tar": 0}
    for i in range(runs):
        for who in (("ours", "tar") if i % 2 == 0 else ("tar", "ours")):
            dest = os.path.join(work, f"out-{who}")
            shutil.rmtree(dest, ignore_errors=True)
            os.makedirs(dest)
            dt, r = timed_rss(extract_cmd(binary, who, tgz, dest))
            times[who].append(dt)
            rss[who] = max(rss[who], r)
    shutil.rmtree(os.path.join(work, "out-ours"), ignore_errors=True)
    shutil.rmtree(os.path.join(work, "out-tar"), ignore_errors=True)
    ours, tar = median(times["ours"]), median(times["tar"])
    return {
        "case": name,
        "runs": runs,
        "tar_stream_bytes": payload,
        "compressed_bytes": os.path.getsize(tgz),
        "ours_median_s": round(ours, 4),
        "tar_median_s": round(tar, 4),
        "ratio_ours_over_tar": round(ours / tar, 3),
        "ours_MBps": round(payload / ours / 1e6, 1),
        "tar_MBps": round(payload / tar / 1e6, 1),
        "ours_peak_rss_MiB": round(rss["ours"] / 1024, 1),
        "tar_peak_rss_MiB": round(rss["tar"] / 1024, 1),
    }


def run(binary, quick):
    small_files, large_total, runs = (300, 8 << 20, 2) if quick else (10_000, 500 << 20, 5)
    work = tempfile.mkdtemp(prefix="cmpw-bench-", dir=os.environ.get("BENCH_DIR", "/dev/shm"))
    try:
        out = []
        cases = (("small-files", f"{small_files:,} small YAML files",
                  lambda d: make_tree(d, small_files, small_files * 1600, seed=42)),
                 ("large-files", f"5 large files, {large_total >> 20} MiB",
                  lambda d: make_large(d, large_total)))
        for key, label, maker in cases:
            log(f"archive: {label}")
            src = os.path.join(work, "src-" + key)
            os.makedirs(src)
            maker(src)
            tgz = os.path.join(work, key + ".tgz")
            pack(src, tgz)
            shutil.rmtree(src)
            r = bench(key, tgz, binary, runs, work)
            r["label"] = label
            out.append(r)
            os.unlink(tgz)
        return out
    finally:
        shutil.rmtree(work, ignore_errors=True)
