#!/usr/bin/env python3
"""grpcio (C-core) interop client: `unix:` channel, generic calls, hand-encoded protobuf.

Usage: grpcio_client.py SOCKET REPO_DIR  → prints {"check":…, "match":…, "generate":[…]} as JSON.
Debian's python3-grpcio ships no protobuf codegen, and the CMP messages are tiny, so they are
encoded here directly (field numbers from proto/plugin.proto).
"""
import hashlib
import io
import json
import sys
import tarfile

import grpc

SVC = "/plugin.ConfigManagementPluginService/"


def varint(n):
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def field(num, wire, payload):
    key = varint(num << 3 | wire)
    if wire == 2:
        return key + varint(len(payload)) + payload
    return key + varint(payload)


def decode(buf):
    """Generic decode: {field: [values]} (bytes for length-delimited, int for varints)."""
    out, i = {}, 0
    while i < len(buf):
        key, i = read_varint(buf, i)
        num, wire = key >> 3, key & 7
        if wire == 0:
            v, i = read_varint(buf, i)
        elif wire == 2:
            n, i = read_varint(buf, i)
            v, i = buf[i:i + n], i + n
        else:
            raise ValueError("unexpected wire type %d" % wire)
        out.setdefault(num, []).append(v)
    return out


def read_varint(buf, i):
    shift = n = 0
    while True:
        b = buf[i]
        i += 1
        n |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            return n, i


def pack(repo):
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w:gz", format=tarfile.PAX_FORMAT) as t:
        t.add(repo, arcname=".")
    return raw.getvalue()


def stream(data, app_rel_path="."):
    meta = (field(1, 2, b"app") + field(2, 2, app_rel_path.encode())
            + field(3, 2, hashlib.sha256(data).hexdigest().encode()) + field(4, 0, len(data)))
    yield field(1, 2, meta)
    for off in range(0, len(data), 1024):
        yield field(2, 2, field(1, 2, data[off:off + 1024]))


def main():
    sock, repo = sys.argv[1], sys.argv[2]
    ident = lambda b: b
    with grpc.insecure_channel("unix:" + sock) as ch:
        check = decode(ch.unary_unary(SVC + "CheckPluginConfiguration", request_serializer=ident,
                                      response_deserializer=ident)(b"", timeout=10))
        data = pack(repo)
        match = decode(ch.stream_unary(SVC + "MatchRepository", request_serializer=ident,
                                       response_deserializer=ident)(stream(data), timeout=10))
        gen = decode(ch.stream_unary(SVC + "GenerateManifest", request_serializer=ident,
                                     response_deserializer=ident)(stream(data), timeout=10))
    print(json.dumps({
        "check": {"isDiscoveryConfigured": bool(check.get(1, [0])[0]), "provideGitCreds": bool(check.get(2, [0])[0])},
        "match": {"isSupported": bool(match.get(1, [0])[0]), "isDiscoveryEnabled": bool(match.get(2, [0])[0])},
        "generate": [m.decode() for m in gen.get(1, [])],
    }))


if __name__ == "__main__":
    main()
