#!/usr/bin/env python3
"""Regenerate the small committed seed corpora (python3 fuzz/make_seeds.py)."""
import gzip, io, os, tarfile

HERE = os.path.dirname(os.path.abspath(__file__))

def tar_bytes(members, fmt=tarfile.USTAR_FORMAT):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=fmt) as t:
        for name, kind, arg in members:
            ti = tarfile.TarInfo(name)
            ti.mtime = 1700000000
            if kind == "dir":
                ti.type, ti.mode = tarfile.DIRTYPE, 0o755
                t.addfile(ti)
            elif kind == "sym":
                ti.type, ti.linkname = tarfile.SYMTYPE, arg
                t.addfile(ti)
            elif kind == "hard":
                ti.type, ti.linkname = tarfile.LNKTYPE, arg
                t.addfile(ti)
            else:
                ti.size, ti.mode = len(arg), 0o644
                t.addfile(ti, io.BytesIO(arg))
    return buf.getvalue()

SEEDS = {
    "argo": [(".", "dir", None), ("app", "dir", None), ("app/a.yaml", "file", b"a: 1\n"),
             ("app/link", "sym", "../README.md"), ("README.md", "file", b"# r\n")],
    "escape-symlink": [("l", "sym", "../../etc"), ("l/x", "file", b"x")],
    "dotdot": [("../x", "file", b"x")],
    "hardlink": [("a", "file", b"x"), ("h", "hard", "a")],
    "pax-long": [("d/" + "n" * 200, "file", b"x"), ("ü", "file", b"y")],
}

for d in ("tar", "tgz", "entries"):
    os.makedirs(os.path.join(HERE, "corpus", d), exist_ok=True)
for name, members in SEEDS.items():
    fmt = tarfile.PAX_FORMAT if name.startswith("pax") else tarfile.USTAR_FORMAT
    raw = tar_bytes(members, fmt)
    with open(os.path.join(HERE, "corpus", "tar", name), "wb") as f:
        f.write(raw)
    with open(os.path.join(HERE, "corpus", "tgz", name), "wb") as f:
        f.write(gzip.compress(raw, mtime=0))
for i, seed in enumerate([b"\x00" * 64, bytes(range(256)), b"\x01\x02\x03\x04" * 40]):
    with open(os.path.join(HERE, "corpus", "entries", f"seed{i}"), "wb") as f:
        f.write(seed)
