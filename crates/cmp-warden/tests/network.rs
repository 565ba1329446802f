//! Plugins as services: the CMP gRPC service on TCP with TLS, mutual TLS and bearer tokens,
//! driven by `cmp-warden client` (rustls) and by grpcio (BoringSSL) — real handshakes against a
//! real server, each refusal checked together with the request that must still work.
#![allow(clippy::print_stderr)]

#[macro_use]
mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use common::pki::Ca;
use common::{Limit, Server, bin, plugin, repo};

/// Why these tests need root (printed when one skips).
const NEEDS_ROOT: &str =
    "network tests start the confined server, which needs root (CI runs as root)";

const PLUGIN: &str = "  generate:\n    command: [sh, -c, 'echo \"{\\\"kind\\\": \\\"ConfigMap\\\", \\\"metadata\\\": {\\\"name\\\": \\\"tcp\\\"}}\"']\n";

/// The TCP address from the server's log line.
fn tcp_addr(s: &Server) -> String {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(line) = s.logs().lines().find(|l| l.contains("on tcp://")) {
            let v: serde_json::Value = serde_json::from_str(line).expect("json log");
            return v["address"].as_str().expect("address").to_owned();
        }
        assert!(
            Instant::now() < deadline,
            "no TCP address logged:\n{}",
            s.logs()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn call(addr: &str, rpc: &str, dir: Option<&Path>, extra: &[&str]) -> Output {
    Command::new(bin())
        .args(["client", "--address", addr, rpc])
        .args(dir)
        .args(extra)
        .output()
        .expect("client")
}

fn ok_json(out: &Output) -> serde_json::Value {
    assert!(
        out.status.success(),
        "expected success: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("json")
}

fn failed_with(out: &Output, needle: &str) {
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains(needle),
        "expected a failure containing {needle:?}, got status {:?}: {err}",
        out.status
    );
}

/// The server refused a TLS handshake and logged `reason` (the client's own error text is
/// generic: the server's log is where the refusal is told apart from any other failure).
fn refused_for(srv: &Server, reason: &str) {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let logs = srv.logs();
        if logs
            .lines()
            .any(|l| l.contains("TLS handshake refused") && l.contains(reason))
        {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "no handshake refusal for {reason:?} in:\n{logs}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

struct Pki {
    dir: tempfile::TempDir,
    ca: PathBuf,
    other_ca: PathBuf,
    cert: PathBuf,
    key: PathBuf,
    expired: (PathBuf, PathBuf),
    client: (PathBuf, PathBuf),
    rogue_client: (PathBuf, PathBuf),
    ca_obj: Ca,
}

fn pki() -> Pki {
    let dir = tempfile::tempdir().expect("tmp");
    let ca = Ca::new("cmp-warden test CA");
    let other = Ca::new("some other CA");
    let (cert, key) = ca.leaf(dir.path(), "server", false, false);
    Pki {
        ca: ca.write(dir.path(), "ca.crt"),
        other_ca: other.write(dir.path(), "other-ca.crt"),
        expired: ca.leaf(dir.path(), "expired", false, true),
        client: ca.leaf(dir.path(), "repo-server", true, false),
        rogue_client: other.leaf(dir.path(), "rogue", true, false),
        cert,
        key,
        ca_obj: ca,
        dir,
    }
}

fn s(p: &Path) -> &str {
    p.to_str().expect("utf8")
}

/// The grpc-go client (Argo CD's client stack) against the TCP port.
fn go_tcp(addr: &str, rpc: &str, args: &[&str]) -> common::CallResult {
    let out = Command::new(common::go_client())
        .args(["-address", addr, "-rpc", rpc])
        .args(args)
        .output()
        .expect("go client");
    common::parse_client_output(&out)
}

/// A server with the CMP service on 127.0.0.1:<any> over TLS with this certificate, plus `extra`.
fn tls_server(cert: &str, key: &str, extra: &[&str]) -> Server {
    let mut args = vec![
        "--listen",
        "127.0.0.1:0",
        "--tls-cert",
        cert,
        "--tls-key",
        key,
    ];
    args.extend_from_slice(extra);
    Server::start(&plugin(PLUGIN), &args)
}

#[test]
fn tls_serves_the_same_rpcs_and_refuses_untrusted_and_expired_certificates() {
    needs_root!(NEEDS_ROOT);
    let k = pki();
    let srv = tls_server(s(&k.cert), s(&k.key), &[]);
    let addr = tcp_addr(&srv);
    let r = repo(&[("a.yaml", "x: 1\n")]);
    let ca = ["--tls-ca", s(&k.ca)];

    let v = ok_json(&call(&addr, "generate", Some(r.path()), &ca));
    assert_eq!(
        v["manifests"][0],
        r#"{"kind": "ConfigMap", "metadata": {"name": "tcp"}}"#
    );
    assert_eq!(
        ok_json(&call(&addr, "health", None, &ca))["status"],
        "SERVING"
    );
    assert_eq!(
        ok_json(&call(&addr, "check", None, &ca))["isDiscoveryConfigured"],
        false
    );
    // The unix socket keeps working beside it.
    let out = Command::new(bin())
        .args(["client", "--socket"])
        .arg(&srv.sock)
        .arg("generate")
        .arg(r.path())
        .output()
        .expect("client");
    ok_json(&out);

    // A client that trusts another CA refuses the server.
    failed_with(
        &call(&addr, "check", None, &["--tls-ca", s(&k.other_ca)]),
        "UnknownIssuer",
    );
    // Plaintext against the TLS port gets nowhere, and is told why: a gRPC client a status
    // naming TLS and the flag, an HTTP/1 client a 400 (as Go's net/http answers).
    failed_with(
        &call(&addr, "check", None, &["--insecure"]),
        "this port serves gRPC over TLS and the client connected without TLS",
    );
    refused_for(&srv, "the client spoke plaintext HTTP/2");
    let out = Command::new("curl")
        .args(["-sS", "--max-time", "10", "-i"])
        .arg(format!("http://{addr}/"))
        .output()
        .expect("curl");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.starts_with("HTTP/1.1 400")
            && text.contains("Client sent an HTTP request to an HTTPS server"),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    drop(srv);

    // A server with an expired certificate is refused by a client that trusts its CA.
    let srv = tls_server(s(&k.expired.0), s(&k.expired.1), &[]);
    failed_with(
        &call(&tcp_addr(&srv), "check", None, &ca),
        "certificate expired",
    );
    drop(k.dir);
}

#[test]
fn mutual_tls_requires_a_client_certificate_from_the_configured_ca() {
    needs_root!(NEEDS_ROOT);
    let k = pki();
    let srv = tls_server(s(&k.cert), s(&k.key), &["--tls-client-ca", s(&k.ca)]);
    let addr = tcp_addr(&srv);
    let ca = ["--tls-ca", s(&k.ca)];
    // No client certificate: the handshake fails (the server logs why).
    failed_with(&call(&addr, "check", None, &ca), "error");
    refused_for(&srv, "no certificates");
    // A certificate from another CA: refused.
    let rogue = [
        "--tls-ca",
        s(&k.ca),
        "--tls-cert",
        s(&k.rogue_client.0),
        "--tls-key",
        s(&k.rogue_client.1),
    ];
    failed_with(&call(&addr, "check", None, &rogue), "error");
    refused_for(&srv, "UnknownIssuer");
    // The repo-server's certificate: served.
    let good = [
        "--tls-ca",
        s(&k.ca),
        "--tls-cert",
        s(&k.client.0),
        "--tls-key",
        s(&k.client.1),
    ];
    let r = repo(&[("a.yaml", "x: 1\n")]);
    let v = ok_json(&call(&addr, "generate", Some(r.path()), &good));
    assert_eq!(v["manifests"].as_array().map(Vec::len), Some(1));
    // grpc-go with the repo-server's certificate, too.
    let v = go_tcp(
        &addr,
        "generate",
        &[
            "-dir",
            r.path().to_str().expect("utf8"),
            "-tls-ca",
            s(&k.ca),
            "-tls-cert",
            s(&k.client.0),
            "-tls-key",
            s(&k.client.1),
        ],
    )
    .expect("grpc-go with a client certificate");
    assert_eq!(v["manifests"].as_array().map(Vec::len), Some(1));
    let logs = srv.logs();
    assert!(
        logs.contains("TLS handshake refused"),
        "refusals are logged:\n{logs}"
    );
}

#[test]
fn bearer_token_is_required_on_tcp_but_not_for_health_or_the_unix_socket() {
    needs_root!(NEEDS_ROOT);
    let k = pki();
    let token = k.dir.path().join("token");
    std::fs::write(&token, "correct-horse-battery-staple\n").expect("token");
    let wrong = k.dir.path().join("wrong");
    std::fs::write(&wrong, "correct-horse-battery-stapler").expect("token");
    let collector = common::otlp::Collector::start();
    let otlp = format!("127.0.0.1:{}", collector.port);
    let srv = tls_server(
        s(&k.cert),
        s(&k.key),
        &["--token-file", s(&token), "--otlp-address", &otlp],
    );
    let addr = tcp_addr(&srv);
    let r = repo(&[("a.yaml", "x: 1\n")]);
    let ca = ["--tls-ca", s(&k.ca)];
    failed_with(
        &call(&addr, "generate", Some(r.path()), &ca),
        "code=Unauthenticated message=missing bearer token",
    );
    failed_with(
        &call(
            &addr,
            "check",
            None,
            &["--tls-ca", s(&k.ca), "--token-file", s(&wrong)],
        ),
        "code=Unauthenticated message=invalid bearer token",
    );
    let good = ["--tls-ca", s(&k.ca), "--token-file", s(&token)];
    let v = ok_json(&call(&addr, "generate", Some(r.path()), &good));
    assert_eq!(v["manifests"].as_array().map(Vec::len), Some(1));
    // grpc-go, as a Go repo-server would dial a plugin service: TLS + token metadata.
    // Each call sampled by its caller: only the authenticated one is traced (a refused
    // caller's sampling flag is not trusted, so refusals cost no span).
    let dir = r.path().to_str().expect("utf8");
    let (refused_trace, wrong_trace, ok_trace) = (
        "11111111111111111111111111111111",
        "22222222222222222222222222222222",
        "33333333333333333333333333333333",
    );
    let traced_generate = |token: Option<&str>, trace: &str| {
        let tp = format!("00-{trace}-00f067aa0ba902b7-01");
        let mut args = vec!["-dir", dir, "-tls-ca", s(&k.ca), "-traceparent", &tp];
        if let Some(t) = token {
            args.extend(["-token", t]);
        }
        go_tcp(&addr, "generate", &args)
    };
    let e = traced_generate(None, refused_trace).expect_err("no token");
    assert_eq!(e.0, 16, "Unauthenticated: {e:?}");
    let e = traced_generate(Some("correct-horse-battery-stapler"), wrong_trace)
        .expect_err("a wrong token");
    assert_eq!(e.0, 16, "Unauthenticated: {e:?}");
    let v = traced_generate(Some("correct-horse-battery-staple"), ok_trace)
        .expect("grpc-go over TLS with the token");
    assert_eq!(v["manifests"].as_array().map(Vec::len), Some(1));
    let traced = collector.trace(ok_trace);
    assert!(
        traced.iter().any(|s| s["kind"] == 2),
        "the authenticated call was not traced: {traced:#?}"
    );
    // Batches arrive in order: the later trace is in, so the refused ones never will be.
    let refused_spans: Vec<_> = collector
        .spans
        .lock()
        .expect("lock")
        .iter()
        .filter(|s| s["traceId"] == refused_trace || s["traceId"] == wrong_trace)
        .cloned()
        .collect();
    assert!(
        refused_spans.is_empty(),
        "refused calls exported spans: {refused_spans:#?}"
    );
    // Kubernetes gRPC probes send no headers.
    assert_eq!(
        ok_json(&call(&addr, "health", None, &ca))["status"],
        "SERVING"
    );
    // The unix socket is authenticated by peer credentials, not the token.
    let out = Command::new(bin())
        .args(["client", "--socket"])
        .arg(&srv.sock)
        .arg("check")
        .output()
        .expect("client");
    ok_json(&out);
    // The token never appears in the logs.
    assert!(
        !srv.logs().contains("correct-horse"),
        "token leaked into logs"
    );
    assert!(srv.logs().contains("request refused: authentication"));
    // Each refused call is an audit event too.
    let refused = srv
        .audit_events()
        .into_iter()
        .filter(|e| e.code == "Unauthenticated" && e.limit == Some(Limit::Authentication))
        .count();
    assert!(refused >= 2, "refusals audited: {refused}\n{}", srv.logs());
    // ... within a budget: anyone who reaches the port can send them. At most 50 per 10 s are
    // audited one by one (the rest counted), and the authentication warning is said at most
    // every 10 s. Refused calls are sent until their number exceeds what the windows they
    // span allow (the first window began with the refusals above, hence the +2): a server
    // without the budget audits every one and fails the bound below.
    let t0 = Instant::now();
    let windows = || (t0.elapsed().as_secs() / 10 + 2) as usize;
    let mut sent = refused;
    while sent <= 50 * windows() + 20 {
        assert!(sent < 2_000, "refused calls too slow to exceed the budget");
        failed_with(
            &call(&addr, "generate", Some(r.path()), &ca),
            "code=Unauthenticated",
        );
        sent += 1;
    }
    let windows = windows();
    let logs = srv.logs();
    let refused = common::audit_events_in(&logs)
        .into_iter()
        .filter(|e| e.code == "Unauthenticated")
        .count();
    assert!(
        (50..=50 * windows).contains(&refused),
        "{refused} of {sent} refusals audited in {windows} windows"
    );
    let warned = logs
        .lines()
        .filter(|l| {
            l.contains("request refused: authentication") && l.contains("\"level\":\"warning\"")
        })
        .count();
    assert!(warned <= windows, "{warned} authentication warnings");
}

#[test]
fn plaintext_tcp_needs_insecure_and_grpcio_speaks_tls() {
    needs_root!(NEEDS_ROOT);
    // Refused without --insecure (fail closed, exit 20, a message that says what to do).
    let dir = tempfile::tempdir().expect("tmp");
    std::fs::write(dir.path().join("plugin.yaml"), plugin(PLUGIN)).expect("write");
    let out = Command::new(bin())
        .args(["serve", "--config-dir-path"])
        .arg(dir.path())
        .args(["--socket-dir"])
        .arg(dir.path())
        .args(["--listen", "127.0.0.1:0", "--no-unix-socket"])
        .output()
        .expect("serve");
    assert_eq!(out.status.code(), Some(20));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("without TLS"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // With --insecure: served, TCP only; its connections are capped as TLS ones are (10
    // silent ones under a cap of 4: the oldest 6 closed at once).
    let srv = Server::start(
        &plugin(PLUGIN),
        &[
            "--listen",
            "127.0.0.1:0",
            "--insecure",
            "--listen-max-connections",
            "4",
        ],
    );
    let addr = tcp_addr(&srv);
    assert!(srv.logs().contains("PLAINTEXT TCP"));
    let silent: Vec<_> = (0..10)
        .map(|_| std::net::TcpStream::connect(&addr).expect("connect"))
        .collect();
    for c in &silent {
        c.set_read_timeout(Some(Duration::from_millis(5)))
            .expect("timeout");
    }
    // A closed one ends in EOF (the server's HTTP/2 settings may come first); once closed it
    // stays closed, so counting again is checking sooner, not counting twice.
    let closed_now = || {
        silent
            .iter()
            .filter(|c| {
                let mut b = [0u8; 64];
                loop {
                    match std::io::Read::read(&mut &**c, &mut b) {
                        Ok(0) => break true,
                        Ok(_) => continue,
                        Err(e) => {
                            break e.kind() != std::io::ErrorKind::WouldBlock
                                && e.kind() != std::io::ErrorKind::TimedOut;
                        }
                    }
                }
            })
            .count()
    };
    let mut closed = 0;
    // Checked as soon as it holds; well inside the idle timeout, so the cap closed them.
    common::wait_until(Duration::from_secs(3), || {
        closed = closed_now();
        closed >= 6
    });
    assert!(
        closed >= 6,
        "{closed} of 10 silent plaintext connections closed at the cap of 4"
    );
    ok_json(&call(&addr, "check", None, &["--insecure"]));

    // grpcio (C-core + BoringSSL): TLS health check and a CMP call with a token.
    let k = pki();
    let token = k.dir.path().join("token");
    std::fs::write(&token, "tok-123").expect("token");
    let srv = tls_server(s(&k.cert), s(&k.key), &["--token-file", s(&token)]);
    let addr = tcp_addr(&srv);
    let py = r#"
import sys, grpc
addr, ca, token = sys.argv[1:4]
creds = grpc.ssl_channel_credentials(root_certificates=open(ca, 'rb').read())
ch = grpc.secure_channel(addr, creds, options=[('grpc.ssl_target_name_override', 'localhost')])
health = ch.unary_unary('/grpc.health.v1.Health/Check', request_serializer=lambda x: x, response_deserializer=lambda x: x)
print('health', health(b'', timeout=10).hex())
check = ch.unary_unary('/plugin.ConfigManagementPluginService/CheckPluginConfiguration', request_serializer=lambda x: x, response_deserializer=lambda x: x)
try:
    check(b'', timeout=10)
    print('no-token allowed')
except grpc.RpcError as e:
    print('no-token', e.code().name)
print('token', check(b'', timeout=10, metadata=[('authorization', 'Bearer ' + token)]).hex() or 'ok')
"#;
    let out = Command::new("/usr/bin/python3")
        .args(["-c", py, &addr, s(&k.ca), "tok-123"])
        .output()
        .expect("python3 (python3-grpcio: scripts/setup)");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "grpcio: {text} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    // SERVING = field 1, value 1.
    assert!(text.contains("health 0801"), "{text}");
    assert!(text.contains("no-token UNAUTHENTICATED"), "{text}");
    assert!(text.contains("token ok"), "{text}");
}

/// 600 sockets that connect to the TLS port and send nothing, more than the 256 handshakes
/// that may be under way: accepting never waits for a place (the oldest pending handshake
/// is dropped for a new connection), so grpc-go's call, with its 10 s dial deadline, is
/// answered beside them (it waited for a place to free, 10 s, and more before); the silent
/// sockets dropped are closed, and the refusals are logged sparsely.
#[test]
fn silent_sockets_on_the_tls_port_do_not_starve_an_honest_call() {
    needs_root!(NEEDS_ROOT);
    let k = pki();
    let srv = tls_server(s(&k.cert), s(&k.key), &[]);
    let addr = tcp_addr(&srv);
    // Built before the clock of the silent sockets starts.
    common::go_client();
    let silent: Vec<std::net::TcpStream> = (0..600)
        .map(|_| std::net::TcpStream::connect(&addr).expect("connect"))
        .collect();
    for c in &silent {
        c.set_nonblocking(true).expect("nonblocking");
    }
    // The oldest silent sockets are dropped for newer connections: closed, not left open.
    // Closed reads 0 at once; open would block.
    let closed_now = || {
        silent
            .iter()
            .filter(|c| matches!(std::io::Read::read(&mut &**c, &mut [0u8; 1]), Ok(0)))
            .count()
    };
    let mut closed = 0;
    // The honest call comes once the server holds as many as it keeps.
    common::wait_until(Duration::from_secs(10), || {
        closed = closed_now();
        closed >= 600 - 256
    });
    let v = go_tcp(&addr, "check", &["-tls-ca", s(&k.ca), "-timeout", "5s"])
        .unwrap_or_else(|e| panic!("the honest call was starved: {e:?}\n{}", srv.logs()));
    assert_eq!(v["isDiscoveryConfigured"], false, "{v}");
    assert!(
        closed >= 600 - 256,
        "only {closed} silent sockets were closed"
    );
    let logs = srv.logs();
    let warned = logs
        .lines()
        .filter(|l| l.contains("oldest dropped for a new connection"))
        .count();
    assert!((1..=2).contains(&warned), "{warned} warnings:\n{logs}");
}

/// TLS connections that finish their handshake and then send nothing are tracked: at the
/// cap (`--listen-max-connections 32` here) a new connection closes the one idle the
/// longest, so 100 of them cannot keep out grpc-go's call, and one idle for
/// `--listen-idle-timeout` (3 s here) is closed. (Once, 20,100 idle connections reached the
/// descriptor limit and starved every honest request.)
#[test]
fn idle_tls_connections_are_capped_and_reclaimed() {
    needs_root!(NEEDS_ROOT);
    let k = pki();
    let srv = tls_server(
        s(&k.cert),
        s(&k.key),
        &[
            "--listen-max-connections",
            "32",
            "--listen-idle-timeout",
            "3",
        ],
    );
    let addr = tcp_addr(&srv);
    common::go_client();
    let cfg = server::tls::client_config(&k.ca, None, &[b"h2"]).expect("tls");
    let mut idle: Vec<rustls::StreamOwned<rustls::ClientConnection, std::net::TcpStream>> = (0
        ..100)
        .map(|_| {
            let tcp = std::net::TcpStream::connect(&addr).expect("connect");
            let name = rustls_pki_types::ServerName::try_from("localhost").expect("name");
            let conn = rustls::ClientConnection::new(cfg.clone(), name).expect("tls");
            let mut s = rustls::StreamOwned::new(conn, tcp);
            s.conn.complete_io(&mut s.sock).expect("handshake");
            s
        })
        .collect();
    let closed =
        |idle: &mut Vec<rustls::StreamOwned<rustls::ClientConnection, std::net::TcpStream>>| {
            let mut n = 0;
            for c in idle.iter_mut() {
                c.sock
                    .set_read_timeout(Some(Duration::from_millis(5)))
                    .expect("timeout");
                let mut b = [0u8; 64];
                // The server's HTTP/2 settings may come first; a closed one ends in EOF.
                let ended = loop {
                    match std::io::Read::read(c, &mut b) {
                        Ok(0) => break true,
                        Ok(_) => continue,
                        Err(e) => {
                            break !matches!(
                                e.kind(),
                                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                            );
                        }
                    }
                };
                n += usize::from(ended);
            }
            n
        };
    assert!(
        // Within a second: the idle timeout (3 s) must not be what closed them.
        common::wait_until(Duration::from_secs(1), || closed(&mut idle) >= 100 - 32),
        "the cap did not close idle connections"
    );
    let v = go_tcp(&addr, "check", &["-tls-ca", s(&k.ca), "-timeout", "5s"])
        .unwrap_or_else(|e| panic!("the honest call was kept out: {e:?}\n{}", srv.logs()));
    assert_eq!(v["isDiscoveryConfigured"], false, "{v}");
    // Idle for the timeout (3 s, looked for every 5 s): all of them closed.
    assert!(
        common::wait_until(Duration::from_secs(15), || closed(&mut idle) == 100),
        "idle connections outlived the idle timeout"
    );
}

/// The fourth attack round's first medium finding, attacked again: a client without a token
/// opens connections up to the cap, and on each more `grpc.health.v1.Health/Check` streams
/// than it may, whose request never ends. Before, each such stream made its connection busy:
/// the cap could evict none, the idle timeout closed none, and honest channels got
/// UNAVAILABLE for as long as the attacker stayed. Now a stream without the token makes no
/// connection busy, a connection holds at most 4 of them (the rest are refused at once,
/// RESOURCE_EXHAUSTED), and each is answered within 10 s (DEADLINE_EXCEEDED): the honest
/// authenticated call gets in while the attacker holds everything it can, evicting one of
/// the attacker's connections.
#[test]
fn unauthenticated_streams_never_hold_the_listeners_connection_cap() {
    needs_root!(NEEDS_ROOT);
    let srv = Server::start_env(
        &plugin(PLUGIN),
        &[
            "--listen",
            "127.0.0.1:0",
            "--insecure",
            "--token-env",
            "CMPW_TEST_TOKEN",
            "--listen-max-connections",
            "8",
        ],
        &[("CMPW_TEST_TOKEN", "correct-horse")],
    );
    let addr = tcp_addr(&srv);
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    // 8 connections (the cap), 6 never-ending checks on each.
    let (refused, pending, drivers) = rt.block_on(async {
        let mut refused = 0;
        let mut pending = Vec::new();
        let mut drivers = Vec::new();
        for _ in 0..8 {
            let tcp = tokio::net::TcpStream::connect(&addr)
                .await
                .expect("connect");
            let (client, conn) = h2::client::handshake(tcp).await.expect("h2");
            let (closed_tx, closed_rx) = tokio::sync::oneshot::channel::<()>();
            drivers.push(closed_rx);
            tokio::spawn(async move {
                let _ = conn.await;
                let _ = closed_tx.send(());
            });
            let mut client = client.ready().await.expect("ready");
            for _ in 0..6 {
                let req = http::Request::post(format!("http://{addr}/grpc.health.v1.Health/Check"))
                    .header("content-type", "application/grpc")
                    .header("te", "trailers")
                    .body(())
                    .expect("request");
                // Headers only: the request never ends.
                let (mut resp, body) = client.send_request(req, false).expect("stream");
                let answer = tokio::time::timeout(Duration::from_millis(500), &mut resp).await;
                match answer {
                    Ok(Ok(r)) => {
                        assert_eq!(
                            r.headers().get("grpc-status").map(|v| v.as_bytes()),
                            Some(&b"8"[..]),
                            "{r:?}"
                        );
                        refused += 1;
                    }
                    Ok(Err(e)) => panic!("stream failed: {e}"),
                    Err(_) => pending.push((resp, body)),
                }
                client = client.ready().await.expect("ready");
            }
        }
        (refused, pending, drivers)
    });
    assert_eq!(
        (refused, pending.len()),
        (8 * 2, 8 * 4),
        "4 unauthenticated streams per connection, the rest refused at once"
    );
    // While every one of them is open: the honest call with the token gets in.
    let v = go_tcp(
        &addr,
        "check",
        &["-token", "correct-horse", "-timeout", "5s"],
    )
    .unwrap_or_else(|e| panic!("the honest call was kept out: {e:?}\n{}", srv.logs()));
    assert_eq!(v["isDiscoveryConfigured"], false, "{v}");
    // It took the place of one of the attacker's connections (none of them was busy).
    let evicted = rt.block_on(async {
        let mut n = 0;
        for d in drivers {
            if tokio::time::timeout(Duration::from_secs(2), d)
                .await
                .is_ok()
            {
                n += 1;
            }
        }
        n
    });
    assert!(
        evicted >= 1,
        "no attacker connection was closed for the honest one"
    );
    // The rest are answered within their 10 s: DEADLINE_EXCEEDED, or their connection closed.
    let answered = rt.block_on(async {
        let mut late = 0;
        for (resp, _body) in pending {
            match tokio::time::timeout(Duration::from_secs(12), resp).await {
                Ok(Ok(r)) => {
                    assert_eq!(
                        r.headers().get("grpc-status").map(|v| v.as_bytes()),
                        Some(&b"4"[..]),
                        "{r:?}"
                    );
                    late += 1;
                }
                Ok(Err(_)) => {}
                Err(_) => panic!("an unauthenticated stream outlived its deadline"),
            }
        }
        late
    });
    assert!(answered >= 4, "{answered} answered DEADLINE_EXCEEDED");
}

#[test]
fn a_rotated_certificate_is_served_without_a_restart() {
    needs_root!(NEEDS_ROOT);
    let k = pki();
    let live_cert = k.dir.path().join("live.crt");
    let live_key = k.dir.path().join("live.key");
    std::fs::copy(&k.cert, &live_cert).expect("copy");
    std::fs::copy(&k.key, &live_key).expect("copy");
    let srv = tls_server(s(&live_cert), s(&live_key), &[]);
    let addr = tcp_addr(&srv);
    ok_json(&call(&addr, "check", None, &["--tls-ca", s(&k.ca)]));
    // Rotate to a certificate from a new CA (as cert-manager would, files replaced in place).
    let next = Ca::new("rotated CA");
    let (c, key) = next.leaf(k.dir.path(), "rotated", false, false);
    let next_ca = next.write(k.dir.path(), "next-ca.crt");
    std::fs::copy(&key, &live_key).expect("copy");
    std::fs::copy(&c, &live_cert).expect("copy");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let out = call(&addr, "check", None, &["--tls-ca", s(&next_ca)]);
        if out.status.success() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "rotated certificate never served: {}\n{}",
            String::from_utf8_lossy(&out.stderr),
            srv.logs()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    failed_with(
        &call(&addr, "check", None, &["--tls-ca", s(&k.ca)]),
        "UnknownIssuer",
    );
    assert!(srv.logs().contains("TLS certificate reloaded"));
    let _ = &k.ca_obj;
}
