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

# Policies: the default, each tenant policy alone, and each as a directory with the default
# (files separated by NUL bytes, as the target splits them).
ROOT = os.path.dirname(HERE)
os.makedirs(os.path.join(HERE, "corpus", "policy"), exist_ok=True)
default = open(os.path.join(ROOT, "policies", "default.yaml")).read()
with open(os.path.join(HERE, "corpus", "policy", "default.yaml"), "w") as f:
    f.write(default)
tenants = os.path.join(ROOT, "deploy", "components", "tenants")
for name in sorted(os.listdir(tenants)):
    text = open(os.path.join(tenants, name)).read()
    if "kind: SandboxPolicy" not in text:
        continue
    with open(os.path.join(HERE, "corpus", "policy", "tenant-" + name), "w") as f:
        f.write(text)
    with open(os.path.join(HERE, "corpus", "policy", "dir-" + name), "w") as f:
        f.write(default + "\0" + text)

# The generator's HTTP front door: requests as the ApplicationSet controller sends them
# (the fuzz target's token is "fuzz-token"), and near misses.
os.makedirs(os.path.join(HERE, "corpus", "appset_http"), exist_ok=True)
BODY = open(os.path.join(ROOT, "examples", "appset-generator", "request.json")).read().strip()

def req(path="/api/v1/getparams.execute", method="POST", tok="Bearer fuzz-token",
        ct="application/json", body=BODY):
    h = f"{method} {path} HTTP/1.1\r\nHost: x\r\n"
    if tok:
        h += f"Authorization: {tok}\r\n"
    if ct:
        h += f"Content-Type: {ct}\r\n"
    return h + f"Content-Length: {len(body.encode())}\r\n\r\n" + body

HTTP = {
    "ok": req(),
    "chunked": "POST /api/v1/getparams.execute HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer fuzz-token\r\n"
               "Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n5\r\n{\"a\":\r\n3\r\n1}\n\r\n0\r\n\r\n",
    "get": req(method="GET"),
    "notoken": req(tok=None),
    "badjson": req(body="{nope"),
    "big": req(body='{"applicationSetName":"' + "x" * 5000 + '"}'),
    "path": req(path="/x"),
}
# The body shapes of server::appset's unit test.
for i, body in enumerate([
    '{"applicationSetName":"a","input":{"parameters":{"x":1}}}', '{"applicationSetName":"a","input":{}}',
    '{"applicationSetName":"a"}', '', '  \n', '[]', '{', '{"input":{}}', '{"applicationSetName":1}',
    '{"applicationSetName":"a","input":[]}', '{"applicationSetName":"a","input":{"parameters":[1]}}',
]):
    HTTP[f"body{i}"] = req(body=body)
for name, text in HTTP.items():
    with open(os.path.join(HERE, "corpus", "appset_http", name), "w") as f:
        f.write(text)
