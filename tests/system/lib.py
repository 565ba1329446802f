"""What the system tests share: processes started and stopped, free ports, a git server over
HTTP, audit events read back, and the verdict lines (`PASS|FAIL <case>`, then `N passed, M
failed`) every system test prints (the shell ones through lib.sh, in the same format)."""

import base64
import http.server
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def say(what):
    print(what, flush=True)


class Verdicts:
    """One `PASS|FAIL <name>` line per case, and the count at the end."""

    def __init__(self):
        self.passed = 0
        self.failed = 0

    def check(self, name, ok, why=""):
        if ok:
            self.passed += 1
            say(f"PASS {name}")
        else:
            self.failed += 1
            say(f"FAIL {name}: {why}"[:4000])
        return ok

    def finish(self):
        say(f"{self.passed} passed, {self.failed} failed")
        return 0 if self.failed == 0 and self.passed > 0 else 1

    def fatal(self, name, why=""):
        """A failed case after which nothing else can run: its line, the count, exit 1."""
        self.check(name, False, why)
        self.finish()
        sys.exit(1)


def free_port():
    """A port nothing listens on now (for programs that cannot be told port 0)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(what, cond, timeout=60, proc=None):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if cond():
            return
        if proc is not None and proc.popen.poll() is not None:
            raise RuntimeError(f"{what}: {proc.name} exited {proc.popen.returncode}:\n{proc.tail()}")
        time.sleep(0.1)
    raise RuntimeError(f"{what}: not within {timeout} s" + (f"\n{proc.tail()}" if proc else ""))


def port_open(port):
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


class Proc:
    """A background process with its output in a log file; stopped as Kubernetes stops a
    container (SIGTERM, then SIGKILL after a grace)."""

    def __init__(self, name, cmd, log, env=None, cwd=None, preexec=None):
        self.name, self.log = name, log
        self.out = open(log, "ab")
        self.popen = subprocess.Popen(cmd, stdout=self.out, stderr=subprocess.STDOUT, env=env,
                                      cwd=cwd, start_new_session=True, preexec_fn=preexec)

    def tail(self, n=3000):
        try:
            return open(self.log, errors="replace").read()[-n:]
        except OSError:
            return ""

    def text(self):
        return open(self.log, errors="replace").read()

    def stop(self, grace=5):
        if self.popen.poll() is None:
            try:
                os.killpg(self.popen.pid, signal.SIGTERM)
                self.popen.wait(grace)
            except (subprocess.TimeoutExpired, ProcessLookupError):
                try:
                    os.killpg(self.popen.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                self.popen.wait()
        self.out.close()


def as_user(uid, gid):
    """A preexec function that drops to uid/gid with no supplementary groups."""
    def drop():
        os.setgroups([])
        os.setgid(gid)
        os.setuid(uid)
    return drop


def audit_events(text):
    """The audit events among a server's log lines."""
    out = []
    for line in text.splitlines():
        if '"log":"audit"' not in line:
            continue
        try:
            out.append(json.loads(line))
        except ValueError:
            pass
    return out


def cmp_warden_binary():
    """target/debug/cmp-warden, built if missing (CI builds it before the system tests)."""
    binary = os.path.join(ROOT, "target/debug/cmp-warden")
    if not os.path.exists(binary):
        subprocess.run(["cargo", "build", "-q", "-p", "cmp-warden"], cwd=ROOT, check=True)
    return binary


def git(*args, cwd=None, env=None):
    e = dict(os.environ, GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@example.test",
             GIT_COMMITTER_NAME="t", GIT_COMMITTER_EMAIL="t@example.test",
             GIT_CONFIG_NOSYSTEM="1", HOME=cwd or "/tmp", **(env or {}))
    r = subprocess.run(["git", *args], cwd=cwd, env=e, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"git {' '.join(args)}: {r.stderr}")
    return r.stdout


def bare_repo(root, name, files):
    """A bare repository `root/name.git` whose one commit holds `files` (path → text, or
    bytes); returns its commit."""
    work = os.path.join(root, f".work-{name}")
    os.makedirs(work)
    for path, content in files.items():
        p = os.path.join(work, path)
        os.makedirs(os.path.dirname(p), exist_ok=True)
        mode = "wb" if isinstance(content, bytes) else "w"
        with open(p, mode) as f:
            f.write(content)
    git("init", "-q", "-b", "main", cwd=work)
    git("add", "-A", cwd=work)
    git("commit", "-q", "-m", "manifests", cwd=work)
    bare = os.path.join(root, f"{name}.git")
    git("clone", "-q", "--bare", work, bare, cwd=root)
    # Served over the dumb and smart HTTP protocols alike.
    git("update-server-info", cwd=bare)
    return git("rev-parse", "HEAD", cwd=work).strip()


class GitServer:
    """git's own `git http-backend` (CGI) behind a small HTTP server on 127.0.0.1:<any>;
    repositories named in `private` need HTTP basic auth with `credentials`."""

    def __init__(self, root, private=(), credentials=("git", "secret"), bind="127.0.0.1"):
        self.root = root
        token = base64.b64encode(f"{credentials[0]}:{credentials[1]}".encode()).decode()
        backend = "/usr/lib/git-core/git-http-backend"

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def handle_one(self, method):
                path, _, query = self.path.partition("?")
                repo = path.lstrip("/").split("/", 1)[0]
                if repo in private and self.headers.get("Authorization") != f"Basic {token}":
                    self.send_response(401)
                    self.send_header("WWW-Authenticate", 'Basic realm="git"')
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                env = {
                    "GIT_PROJECT_ROOT": root, "GIT_HTTP_EXPORT_ALL": "1",
                    "REQUEST_METHOD": method, "PATH_INFO": path, "QUERY_STRING": query,
                    "CONTENT_TYPE": self.headers.get("Content-Type", ""),
                    "CONTENT_LENGTH": str(len(body)), "REMOTE_USER": credentials[0],
                    "HTTP_GIT_PROTOCOL": self.headers.get("Git-Protocol", ""),
                    "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
                }
                r = subprocess.run([backend], input=body, env=env, capture_output=True)
                head, _, out = r.stdout.partition(b"\r\n\r\n")
                status = 200
                headers = []
                for line in head.decode(errors="replace").split("\r\n"):
                    k, _, v = line.partition(":")
                    if k.lower() == "status":
                        status = int(v.split()[0])
                    elif k:
                        headers.append((k, v.strip()))
                self.send_response(status)
                for k, v in headers:
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

            def do_GET(self):
                self.handle_one("GET")

            def do_POST(self):
                self.handle_one("POST")

        self.httpd = http.server.ThreadingHTTPServer((bind, 0), Handler)
        self.port = self.httpd.server_address[1]
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def url(self, name):
        return f"http://127.0.0.1:{self.port}/{name}.git"

    def stop(self):
        self.httpd.shutdown()


def fail_exit(why):
    say(f"FAIL setup: {why}")
    say("0 passed, 1 failed")
    sys.exit(1)
