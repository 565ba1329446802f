#!/usr/bin/env python3
"""The kernel matrix's initramfs (tests/system/kernel-matrix-test): a newc cpio, gzip'd, written here so that no
cpio tool is needed and every entry is root-owned whoever builds it.

Holds Debian's busybox-static for the guest's architecture (every applet a link to it), the
static cmp-warden and the cgns helper, the guest's init, scenarios, plugin config, apps and
policy (with the repository's seccomp profile beside it), the kernel modules given, Debian's
apparmor_parser with its C library (--extra), and the AppArmor profiles it loads (containerd's
default as documented, deploy/apparmor's).

  tests/vm/mkinitramfs.py --busybox BB --applets LIST --binary BIN --cgns CGNS \
      --seccomp JSON [--module KO]... OUT.gz
"""
import argparse
import gzip
import os
import stat

HERE = os.path.dirname(os.path.abspath(__file__))


class Cpio:
    def __init__(self):
        self.buf = bytearray()
        self.ino = 1
        self.dirs = set()

    def _entry(self, name, mode, data=b""):
        fields = [self.ino, mode, 0, 0, 1, 0, len(data), 0, 0, 0, 0, len(name) + 1, 0]
        self.buf += ("070701" + "".join("%08X" % v for v in fields)).encode()
        self.buf += name.encode() + b"\0"
        self.buf += b"\0" * (-len(self.buf) % 4)
        self.buf += data
        self.buf += b"\0" * (-len(self.buf) % 4)
        self.ino += 1

    def dir(self, name, mode=0o755):
        parts = name.strip("/").split("/")
        for i in range(1, len(parts) + 1):
            d = "/".join(parts[:i])
            if d not in self.dirs:
                self.dirs.add(d)
                self._entry(d, stat.S_IFDIR | (mode if i == len(parts) else 0o755))

    def file(self, name, data, mode=0o644):
        name = name.strip("/")
        if "/" in name:
            self.dir(os.path.dirname(name))
        self._entry(name, stat.S_IFREG | mode, data)

    def link(self, name, target):
        name = name.strip("/")
        self.dir(os.path.dirname(name))
        self._entry(name, stat.S_IFLNK | 0o777, target.encode())

    def tree(self, src, dst, mode=0o644):
        for d, dirs, files in os.walk(src):
            dirs.sort()
            rel = os.path.relpath(d, src)
            base = dst if rel == "." else f"{dst}/{rel}"
            self.dir(base)
            for f in sorted(files):
                self.file(f"{base}/{f}", open(os.path.join(d, f), "rb").read(), mode)

    def write(self, out):
        self._entry("TRAILER!!!", 0)
        with gzip.open(out, "wb", compresslevel=1) as f:
            f.write(self.buf)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--busybox", required=True)
    ap.add_argument("--applets", required=True, help="file listing busybox's applets")
    ap.add_argument("--binary", required=True)
    ap.add_argument("--cgns", required=True)
    ap.add_argument("--seccomp", required=True)
    ap.add_argument("--module", action="append", default=[])
    ap.add_argument("--extra", action="append", default=[],
                    help="SRC:DST, a file of the host put at DST (apparmor_parser and its libc)")
    ap.add_argument("out")
    a = ap.parse_args()
    guest = os.path.join(HERE, "guest")
    c = Cpio()
    for d in ["proc", "sys", "dev", "tmp", "work", "plugins", "out", "root"]:
        c.dir(d)
    c.file("bin/busybox", open(a.busybox, "rb").read(), 0o755)
    for applet in open(a.applets).read().split():
        if applet != "busybox":
            c.link(f"bin/{applet}", "busybox")
    c.file("usr/local/bin/cmp-warden", open(a.binary, "rb").read(), 0o755)
    c.file("usr/local/bin/cgns", open(a.cgns, "rb").read(), 0o755)
    c.file("init", open(os.path.join(guest, "init"), "rb").read(), 0o755)
    c.file("matrix.sh", open(os.path.join(guest, "matrix.sh"), "rb").read())
    c.tree(os.path.join(guest, "config"), "config")
    c.tree(os.path.join(guest, "apps"), "apps")
    c.file("etc/cmp-warden/policy.yaml", open(os.path.join(guest, "policy.yaml"), "rb").read())
    c.file("etc/cmp-warden/seccomp/default.json", open(a.seccomp, "rb").read())
    c.file("etc/passwd", b"root:x:0:0:root:/root:/bin/sh\n")
    c.file("etc/group", b"root:x:0:\n")
    for m in a.module:
        c.file(f"lib/modules/{os.path.basename(m)}", open(m, "rb").read())
    for e in a.extra:
        src, dst = e.split(":", 1)
        c.file(dst, open(os.path.realpath(src), "rb").read(), 0o755)
    for f in sorted(os.listdir(os.path.join(guest, "apparmor"))):
        c.file(f"etc/apparmor/{f}", open(os.path.join(guest, "apparmor", f), "rb").read())
    c.file("etc/apparmor/cmp-warden",
           open(os.path.join(HERE, "..", "..", "deploy/apparmor/cmp-warden"), "rb").read())
    c.write(a.out)


if __name__ == "__main__":
    main()
