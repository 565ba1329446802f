//! Malformed streams, limits, cancellation, hostile archives through the server, and the
//! operational contract (socket handling, peer UIDs, shutdown, health, config errors).
#![allow(clippy::print_stderr)] // a skip must say why

#[macro_use]
mod common;

use std::path::Path;
use std::time::Duration;

use common::grpc::*;
use common::*;
use proto::plugin::AppStreamRequest;
use tonic::Code;

async fn generate(s: &Server, msgs: Vec<AppStreamRequest>) -> Result<Vec<String>, tonic::Status> {
    let mut c = client(s).await;
    c.generate_manifest(tokio_stream::iter(msgs))
        .await
        .map(|r| r.into_inner().manifests)
}

const CAT: &str = "  generate:\n    command: [cat, cm.yaml]\n";

#[test]
fn malformed_streams_get_the_right_status_and_leave_nothing() {
    let s = Server::start(&plugin(CAT), &["--max-compressed", "64Ki"]);
    let tgz = good_tgz();
    let rt = rt();
    let cases: Vec<(&str, Vec<AppStreamRequest>, Code, &str)> = vec![
        (
            "empty stream",
            vec![],
            Code::InvalidArgument,
            "error receiving stream header",
        ),
        (
            "file before metadata",
            vec![file(&tgz)],
            Code::InvalidArgument,
            "metadata is nil",
        ),
        (
            "metadata twice",
            vec![meta(&sha(&tgz), "."), meta(&sha(&tgz), ".")],
            Code::InvalidArgument,
            "stream request file is nil",
        ),
        (
            "wrong checksum",
            vec![meta(&sha(b"other"), "."), file(&tgz)],
            Code::DataLoss,
            "file checksum validation error",
        ),
        (
            "escaping appRelPath",
            vec![meta(&sha(&tgz), "../../etc"), file(&tgz)],
            Code::InvalidArgument,
            "illegal appPath",
        ),
        (
            "not gzip",
            vec![meta(&sha(b"hello"), "."), file(b"hello")],
            Code::DataLoss,
            "gzip",
        ),
        (
            "oversize",
            vec![meta("x", "."), file(&vec![0u8; 70 * 1024])],
            Code::ResourceExhausted,
            "exceeds the limit",
        ),
    ];
    for (name, msgs, code, text) in cases {
        let err = rt.block_on(generate(&s, msgs)).expect_err(name);
        assert_eq!(err.code(), code, "{name}: {}", err.message());
        assert!(err.message().contains(text), "{name}: {}", err.message());
        s.assert_work_dir_empties();
    }
    // And the legitimate request still works on the same server.
    assert_eq!(
        rt.block_on(generate(&s, vec![meta(&sha(&tgz), "."), file(&tgz)]))
            .expect("ok"),
        [r#"{"kind":"ConfigMap"}"#]
    );
}

#[test]
fn hostile_archives_are_refused_by_the_server() {
    let s = Server::start(&plugin(CAT), &[]);
    let rt = rt();
    let mut t = testkit::TarBuilder::new();
    t.dir(".")
        .file("cm.yaml", b"kind: X\n")
        .symlink("evil", "../../../../etc/shadow");
    let bad = t.tgz();
    let err = rt
        .block_on(generate(&s, vec![meta(&sha(&bad), "."), file(&bad)]))
        .expect_err("refused");
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(
        err.message().contains("symlink target escapes the root"),
        "{}",
        err.message()
    );
    let mut t = testkit::TarBuilder::new();
    t.file("../escape", b"x");
    let bad = t.tgz();
    let err = rt
        .block_on(generate(&s, vec![meta(&sha(&bad), "."), file(&bad)]))
        .expect_err("refused");
    assert_eq!(err.code(), Code::InvalidArgument);
    s.assert_work_dir_empties();
}

/// Wait (up to 15 s) until `done`; on timeout fail with `context`.
fn settle_until(done: impl Fn() -> bool, context: impl Fn() -> String) {
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    while !done() {
        assert!(std::time::Instant::now() < deadline, "{}", context());
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Wait (up to 15 s) until the server's log has `what` more than `before` times.
async fn logged_within(s: &Server, what: &str, before: usize) {
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    while s.logs().matches(what).count() == before {
        assert!(
            std::time::Instant::now() < deadline,
            "never logged: {what}\n{}",
            s.logs()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[test]
fn client_cancel_mid_stream_and_mid_command() {
    let s = Server::start(
        &plugin("  generate:\n    command: [sh, -c, 'sleep 31.5']\n"),
        &[],
    );
    let rt = rt();
    let tgz = good_tgz();
    // Mid-stream: send metadata and half the archive, then drop the call. The sender stays
    // open until the server has judged the request: closed first, the stream would end
    // cleanly (END_STREAM) before the reset, a checksum mismatch rather than an abandonment.
    let tx = rt.block_on(async {
        let (tx, rx) = tokio::sync::mpsc::channel(4);
        tx.send(meta(&sha(&tgz), ".")).await.expect("send");
        tx.send(file(&tgz[..tgz.len() / 2])).await.expect("send");
        let mut c = client(&s).await;
        let received = s.logs().matches("request received").count();
        let call = tokio::spawn(async move {
            c.generate_manifest(tokio_stream::wrappers::ReceiverStream::new(rx))
                .await
        });
        // Cancelled once the server has the metadata (whatever the machine's pace).
        logged_within(&s, "request received", received).await;
        call.abort();
        tx
    });
    s.assert_work_dir_empties();
    let abandoned = |s: &Server| s.logs().matches("request abandoned by the client").count();
    let audits = |s: &Server| s.audit_events();
    settle_until(|| audits(&s).len() == 1, || s.logs());
    drop(tx);
    assert_eq!(abandoned(&s), 1, "{}", s.logs());
    // Mid-stream: no command ran.
    assert!(audits(&s)[0].commands.is_empty());
    // Mid-command: the request is running `sleep 31.5`; cancelling must kill it promptly.
    rt.block_on(async {
        let mut c = client(&s).await;
        let msgs = vec![meta(&sha(&tgz), "."), file(&tgz)];
        let started = s.logs().matches("command started").count();
        let call = tokio::spawn(async move { c.generate_manifest(tokio_stream::iter(msgs)).await });
        logged_within(&s, "command started", started).await;
        call.abort();
    });
    s.assert_work_dir_empties();
    settle_until(|| audits(&s).len() == 2, || s.logs());
    assert_eq!(abandoned(&s), 2, "{}", s.logs());
    // The command was running and the cancellation ended it, well before its 31.5 s.
    let cmd = &audits(&s)[1].commands[0];
    assert_eq!(cmd.phase, Phase::Generate, "{cmd:?}");
    assert_eq!(cmd.ended_by, Some(Limit::Cancelled), "{cmd:?}");
    assert!(cmd.duration_ms < 10_000, "{cmd:?}");
    // The tree is removed only after the runner returned, i.e. after the command group was killed.
    let left = std::process::Command::new("pgrep")
        .args(["-f", "sleep 31.5"])
        .output()
        .expect("pgrep");
    assert!(
        left.stdout.is_empty(),
        "command survived the cancelled request"
    );
}

#[test]
fn socket_mode_stale_socket_and_shutdown() {
    // A stale file at the socket path is replaced.
    let mut s = Server::start(&plugin(CAT), &["--socket-mode", "0660"]);
    let mode = std::fs::metadata(&s.sock)
        .map(|m| std::os::unix::fs::PermissionsExt::mode(&m.permissions()) & 0o777)
        .expect("stat");
    assert_eq!(mode, 0o660);
    let sock = s.sock.clone();
    let st = s.stop();
    assert!(st.success(), "SIGTERM must exit 0: {st}");
    assert!(!sock.exists(), "socket removed on shutdown");
    assert!(s.logs().contains("shut down cleanly"));

    let pre = tempfile::tempdir().expect("tmp");
    let socks = pre.path().join("plugins");
    std::fs::create_dir_all(&socks).expect("mkdir");
    std::fs::write(socks.join("test.sock"), b"stale").expect("stale file");
    let cfg = pre.path().join("config");
    std::fs::create_dir_all(&cfg).expect("mkdir");
    std::fs::write(cfg.join("plugin.yaml"), plugin(CAT)).expect("write");
    let mut child = std::process::Command::new(bin())
        .arg("--config-dir-path")
        .arg(&cfg)
        .env("ARGOCD_PLUGINSOCKFILEPATH", &socks)
        .env("ARGOCD_CMP_WORKDIR", pre.path())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("spawn");
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !std::fs::symlink_metadata(socks.join("test.sock"))
        .map(|m| std::os::unix::fs::FileTypeExt::is_socket(&m.file_type()))
        .unwrap_or(false)
    {
        assert!(
            std::time::Instant::now() < deadline,
            "stale socket not replaced"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    let _ = child.wait();
}

/// Run the grpc-go client's CheckPluginConfiguration as another uid.
fn check_as_uid(s: &Server, uid: u32) -> std::process::Output {
    let id = uid.to_string();
    std::process::Command::new("setpriv")
        .args(["--reuid", &id, "--regid", &id, "--clear-groups"])
        .arg(go_client())
        .arg("-socket")
        .arg(&s.sock)
        .args(["-rpc", "check"])
        .output()
        .expect("setpriv")
}

/// The sidecar deploy/helm/argo-values writes (no pod-wide fsGroup): root with only SETUID,
/// SETGID, SETPCAP and CHOWN, `--socket-mode 0660 --socket-owner 0:999`. The socket is
/// root:999 0660 (uid 999 served, uid 4242 not), and CHOWN is gone before any request: the
/// supervisor keeps SETUID, SETGID and SETPCAP only.
#[test]
fn the_helm_sidecar_chowns_its_socket_then_drops_chown() {
    needs_root!("the socket's owner needs CAP_CHOWN");
    use std::os::unix::fs::MetadataExt;
    let s = Server::start_under(
        &[
            "setpriv",
            "--bounding-set",
            "-all,+setuid,+setgid,+setpcap,+chown",
        ],
        &plugin(CAT),
        &["--socket-mode", "0660", "--socket-owner", "0:999"],
        &[],
    );
    let m = std::fs::metadata(&s.sock).expect("socket");
    assert_eq!((m.mode() & 0o777, m.uid(), m.gid()), (0o660, 0, 999));
    parse_client_output(&check_as_uid(&s, 999)).expect("uid 999 is served");
    assert_ne!(check_as_uid(&s, 4242).status.code(), Some(0));
    let held = |name: &str| -> Vec<String> {
        let line = s
            .logs()
            .lines()
            .find(|l| l.contains("\"msg\":\"doctor report\""))
            .map(str::to_owned)
            .expect("doctor report logged");
        let v: serde_json::Value = serde_json::from_str(&line).expect("json");
        let r: serde_json::Value =
            serde_json::from_str(v["report"].as_str().expect("report")).expect("report json");
        r[name]
            .as_array()
            .expect("caps")
            .iter()
            .filter_map(|c| c.as_str().map(str::to_owned))
            .collect()
    };
    assert!(held("capabilitiesHeld").contains(&"CAP_CHOWN".to_owned()));
    assert_eq!(
        held("capabilitiesKept"),
        ["CAP_SETGID", "CAP_SETUID", "CAP_SETPCAP"]
    );
}

/// Run as root without socket flags, the socket is root:999 and 0660: the file system lets
/// only root and the repo-server's group open it — never a leased UID — and the peer check
/// behind it admits only the allowed UIDs. uid 999 (group 999) is served; uid 4242 cannot
/// even connect (EACCES before any peer check); with the mode opened, the peer check alone
/// refuses it (`peers_are_authorised_by_uid`).
#[test]
fn the_default_socket_lets_only_root_and_the_repo_servers_group_open_it() {
    needs_root!("the socket's default owner needs root");
    use std::os::unix::fs::MetadataExt;
    let s = Server::start(&plugin(CAT), &[]);
    let m = std::fs::metadata(&s.sock).expect("socket");
    assert_eq!((m.mode() & 0o777, m.uid(), m.gid()), (0o660, 0, 999));
    assert!(s.logs().contains("socket mode 0660: owned by root:999"));
    parse_client_output(&check_as_uid(&s, 999)).expect("uid 999 is served");
    // uid 4242 cannot even connect: EACCES from the file system.
    let out = std::process::Command::new("setpriv")
        .args(["--reuid", "4242", "--regid", "4242", "--clear-groups"])
        .args(["/usr/bin/python3", "-c"])
        .arg("import socket,sys\ntry:\n    socket.socket(socket.AF_UNIX).connect(sys.argv[1]); print('connected')\nexcept OSError as e:\n    print(e.errno)")
        .arg(&s.sock)
        .output()
        .expect("setpriv");
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "13", "EACCES");
    // Refused by the file system: the server never saw the peer.
    assert!(!s.logs().contains("peer uid 4242"), "{}", s.logs());
}

#[test]
fn peers_are_authorised_by_uid() {
    needs_root!("peers_are_authorised_by_uid runs a client as another uid");
    let s = Server::start(&plugin(CAT), &["--socket-mode", "0777"]);
    // Allowed (root is the server's own uid).
    assert!(go(&s, "check", &[]).is_ok());
    // A process as uid 4242 can reach the socket (mode 0777) but is refused by peer credentials.
    let out = check_as_uid(&s, 4242);
    assert_ne!(out.status.code(), Some(0), "uid 4242 must be refused");
    // The log line names the refused UID (a plain number, as logrus writes it).
    assert!(
        s.logs()
            .lines()
            .any(|l| l.contains("connection refused: peer uid not allowed")
                && l.contains("\"peer_uid\":4242")),
        "{}",
        s.logs()
    );
    // ... and told why in a gRPC status (grpc-go: PermissionDenied), not a broken pipe.
    assert_eq!(
        parse_client_output(&out),
        Err((
            PERMISSION_DENIED,
            "peer uid 4242 may not use this socket (allowed: 999,0); the server's --allowed-uids / CMP_WARDEN_ALLOWED_UIDS changes it".into()
        ))
    );
    // Allowing it explicitly works.
    let s = Server::start(
        &plugin(CAT),
        &["--socket-mode", "0777", "--allowed-uids", "4242"],
    );
    let out = check_as_uid(&s, 4242);
    assert!(parse_client_output(&out).is_ok());
}

#[test]
fn health_service() {
    let s = Server::start(&plugin(CAT), &[]);
    let rt = rt();
    let status = rt.block_on(async {
        let ch = channel(&s).await;
        let mut h = tonic_health::pb::health_client::HealthClient::new(ch);
        h.check(tonic_health::pb::HealthCheckRequest {
            service: String::new(),
        })
        .await
        .expect("health")
        .into_inner()
        .status
    });
    assert_eq!(
        status,
        tonic_health::pb::health_check_response::ServingStatus::Serving as i32
    );
}

/// One HTTP/2 frame: its 9-byte header and payload.
fn h2_frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = payload.len() as u32;
    let mut f = vec![(len >> 16) as u8, (len >> 8) as u8, len as u8, kind, flags];
    f.extend_from_slice(&stream.to_be_bytes());
    f.extend_from_slice(payload);
    f
}

/// Read one HTTP/2 frame: (type, flags, stream, payload).
fn h2_read(r: &mut impl std::io::Read) -> std::io::Result<(u8, u8, u32, Vec<u8>)> {
    let mut h = [0u8; 9];
    r.read_exact(&mut h)?;
    let len = (usize::from(h[0]) << 16) | (usize::from(h[1]) << 8) | usize::from(h[2]);
    let stream = u32::from_be_bytes([h[5], h[6], h[7], h[8]]) & 0x7fff_ffff;
    let mut payload = vec![0u8; len];
    r.read_exact(&mut payload)?;
    Ok((h[3], h[4], stream, payload))
}

/// An attacker opens 200 streams at once on one unix-socket connection, written as raw
/// frames (a well-behaved client library would queue them at the advertised limit): the
/// server advertises `SETTINGS_MAX_CONCURRENT_STREAMS` 128 and refuses every stream past
/// the 128 it holds open (`RST_STREAM` REFUSED_STREAM), while an honest call on another
/// connection is answered (mutant: the listener's `max_concurrent_streams` removed -> no
/// limit advertised and none refused).
#[test]
fn one_connection_holds_at_most_128_streams() {
    use std::io::Write;
    let s = Server::start(&plugin(CAT), &[]);
    let mut c = std::os::unix::net::UnixStream::connect(&s.sock).expect("connect");
    c.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    c.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
        .expect("preface");
    c.write_all(&h2_frame(0x4, 0, 0, &[])).expect("settings");
    // The server's SETTINGS: which limit it advertises.
    let advertised = loop {
        let (kind, flags, _, payload) = h2_read(&mut c).expect("the server's settings");
        if kind == 0x4 && flags & 0x1 == 0 {
            break payload
                .chunks(6)
                .find(|p| p.len() == 6 && u16::from_be_bytes([p[0], p[1]]) == 0x3)
                .map(|p| u32::from_be_bytes([p[2], p[3], p[4], p[5]]));
        }
    };
    assert_eq!(
        advertised,
        Some(server::listener::MAX_STREAMS_PER_CONNECTION),
        "SETTINGS_MAX_CONCURRENT_STREAMS"
    );
    assert_eq!(advertised, Some(128));
    c.write_all(&h2_frame(0x4, 0x1, 0, &[]))
        .expect("settings ack");
    // 200 health checks whose request message never comes: each stream stays open.
    let literal = |name: &str, value: &str| {
        let mut b = vec![0x00, name.len() as u8];
        b.extend_from_slice(name.as_bytes());
        b.push(value.len() as u8);
        b.extend_from_slice(value.as_bytes());
        b
    };
    let block: Vec<u8> = [
        (":method", "POST"),
        (":scheme", "http"),
        (":path", "/grpc.health.v1.Health/Check"),
        (":authority", "localhost"),
        ("content-type", "application/grpc"),
        ("te", "trailers"),
    ]
    .iter()
    .flat_map(|(n, v)| literal(n, v))
    .collect();
    let ids: Vec<u32> = (0..200).map(|i| 1 + 2 * i).collect();
    let burst: Vec<u8> = ids
        .iter()
        .flat_map(|id| h2_frame(0x1, 0x4, *id, &block))
        .collect();
    c.write_all(&burst).expect("the streams");
    let mut refused = std::collections::BTreeSet::new();
    while refused.len() < 72 {
        let (kind, _, stream, payload) = match h2_read(&mut c) {
            Ok(f) => f,
            Err(e) => panic!("after {} refusals: {e}", refused.len()),
        };
        match kind {
            // RST_STREAM: REFUSED_STREAM (7) is the only answer expected.
            0x3 => {
                let code = u32::from_be_bytes([payload[0], payload[1], payload[2], payload[3]]);
                assert_eq!(code, 7, "stream {stream} reset with code {code}");
                refused.insert(stream);
            }
            // GOAWAY would end the honest streams too.
            0x7 => panic!("the server sent GOAWAY: {payload:?}"),
            _ => {}
        }
    }
    // Exactly the streams past the 128th.
    assert_eq!(
        refused.into_iter().collect::<Vec<_>>(),
        ids[128..].to_vec(),
        "refused streams"
    );
    // Beside the 128 held open, an honest call on its own connection.
    let v = go(&s, "check", &[]).expect("an honest call beside the attacker's connection");
    assert_eq!(v["isDiscoveryConfigured"], false, "{v}");
}

/// `grpc.health.v1.Health/Watch` is open without authentication and keeps its stream: at
/// most 64 are open at once (each holding its place until it ends), more are refused
/// `ResourceExhausted` at once naming the bound, `Check` and CMP calls work beside them, and
/// a place freed is taken again. (Once, 200,000 watches took the server to 1.25 GB.)
#[test]
fn health_watches_are_capped_and_calls_beside_them_work() {
    let s = Server::start(&plugin(CAT), &[]);
    let rt = rt();
    rt.block_on(async {
        let ch = channel(&s).await;
        let mut h = tonic_health::pb::health_client::HealthClient::new(ch.clone());
        let req = || tonic_health::pb::HealthCheckRequest {
            service: String::new(),
        };
        let mut open = Vec::new();
        let mut refused = Vec::new();
        for _ in 0..70 {
            match h.watch(req()).await {
                Ok(w) => open.push(w.into_inner()),
                Err(e) => refused.push(e),
            }
        }
        assert_eq!(open.len(), 64, "{refused:?}");
        assert!(
            refused.iter().all(|e| e.code() == Code::ResourceExhausted
                && e.message().contains("64 health watches are open")),
            "{refused:?}"
        );
        // Each open watch got its first status.
        for w in &mut open {
            let first = w.message().await.expect("watch").expect("status");
            assert_eq!(
                first.status,
                tonic_health::pb::health_check_response::ServingStatus::Serving as i32
            );
        }
        let checked = h.check(req()).await.expect("check beside the watches");
        assert_eq!(
            checked.into_inner().status,
            tonic_health::pb::health_check_response::ServingStatus::Serving as i32
        );
        // A place given back is taken again.
        drop(open.pop());
        let mut again = None;
        for _ in 0..50 {
            if let Ok(w) = h.watch(req()).await {
                again = Some(w);
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(again.is_some(), "the freed place was never given back");
        // A CMP call beside them all (the client is another process).
        let r = repo(&[(
            "cm.yaml",
            "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: x\n",
        )]);
        go(&s, "generate", &["-dir", r.path().to_str().expect("utf8")])
            .unwrap_or_else(|e| panic!("{e:?}\n{}", s.logs()));
        drop(open);
    });
}

#[test]
fn invalid_plugin_config_exits_20_with_argo_messages() {
    for (yaml, msg) in [
        (
            "kind: ConfigManagementPlugin\nmetadata: {}\nspec: {generate: {command: [x]}}\n",
            "metadata.name should be non-empty",
        ),
        (
            "kind: Other\nmetadata: {name: x}\nspec: {generate: {command: [x]}}\n",
            "kind should be ConfigManagementPlugin, found Other",
        ),
        (
            "kind: ConfigManagementPlugin\nmetadata: {name: x}\nspec: {}\n",
            "spec.generate command should be non-empty",
        ),
    ] {
        let d = tempfile::tempdir().expect("tmp");
        std::fs::write(d.path().join("plugin.yaml"), yaml).expect("write");
        let out = std::process::Command::new(bin())
            .arg("--config-dir-path")
            .arg(d.path())
            .env("ARGOCD_PLUGINSOCKFILEPATH", d.path())
            .env("ARGOCD_CMP_WORKDIR", d.path())
            .output()
            .expect("run");
        assert_eq!(out.status.code(), Some(20));
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains(&format!("invalid plugin configuration file. {msg}")),
            "{err}"
        );
    }
}

#[test]
fn grpcio_python_client() {
    let s = Server::start(
        &plugin(&format!("{CAT}  discover:\n    fileName: cm.yaml\n")),
        &[],
    );
    let r = repo(&[("cm.yaml", "kind: ConfigMap\n")]);
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/interop/grpcio_client.py");
    let out = std::process::Command::new("/usr/bin/python3")
        .arg(&script)
        .arg(&s.sock)
        .arg(r.path())
        .output()
        .expect("python3");
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(
        v["check"],
        serde_json::json!({"isDiscoveryConfigured": true, "provideGitCreds": false})
    );
    assert_eq!(
        v["match"],
        serde_json::json!({"isSupported": true, "isDiscoveryEnabled": true})
    );
    assert_eq!(
        v["generate"],
        serde_json::json!([r#"{"kind":"ConfigMap"}"#])
    );
    s.assert_work_dir_empties();
}

/// The zombies of `pid` once none are left (polled for up to 10 s; the reaper runs every
/// second), or those still there at the end.
fn zombies_within(pid: i32) -> Vec<String> {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let z = zombies_of(pid);
        if z.is_empty() || std::time::Instant::now() >= deadline {
            return z;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Zombie children of `parent` (host view).
fn zombies_of(parent: i32) -> Vec<String> {
    std::fs::read_dir("/proc")
        .expect("proc")
        .flatten()
        .filter_map(|e| std::fs::read_to_string(e.path().join("stat")).ok())
        .filter(|st| {
            let rest = st
                .rsplit_once(')')
                .map(|(_, r)| r.to_owned())
                .unwrap_or_default();
            let f: Vec<&str> = rest.split_whitespace().collect();
            f.first() == Some(&"Z") && f.get(1).and_then(|p| p.parse::<i32>().ok()) == Some(parent)
        })
        .collect()
}

/// The plugin leaves a background process behind; without per-request namespaces (so nothing
/// but the server can take it) it is reparented to the server — PID 1 of its namespace, or, as
/// a normal process, the subreaper of everything below it — and killed with the request's UID:
/// a zombie only the server's reaper collects. Without the reaper the zombies stay (checked
/// once by disabling `start_orphan_reaper`).
#[test]
fn reaps_orphans_as_pid_1_and_as_subreaper() {
    needs_root!("reaps_orphans_… needs a new PID namespace and leased UIDs");
    let d = tempfile::tempdir().expect("tmp");
    let (cfg, socks) = (d.path().join("config"), d.path().join("plugins"));
    std::fs::create_dir_all(&cfg).expect("mkdir");
    std::fs::create_dir_all(&socks).expect("mkdir");
    let spec = "  generate:\n    command: [sh, -c, 'sleep 60 & sleep 61 & echo \"a: 1\"']\n";
    std::fs::write(cfg.join("plugin.yaml"), plugin(spec)).expect("write");
    let policy = d.path().join("policy/policy.yaml");
    write_policy(&policy, &[NO_NAMESPACES]);
    let mut unshare = std::process::Command::new("unshare")
        .args([
            "--pid",
            "--fork",
            "--mount-proc",
            bin(),
            "--config-dir-path",
        ])
        .arg(&cfg)
        .arg("--policy")
        .arg(&policy)
        .env("ARGOCD_PLUGINSOCKFILEPATH", &socks)
        .env("ARGOCD_CMP_WORKDIR", d.path())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("unshare");
    let sock = socks.join("test.sock");
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !sock.exists() {
        assert!(std::time::Instant::now() < deadline, "server did not start");
        std::thread::sleep(Duration::from_millis(20));
    }
    let children = std::fs::read_to_string(format!(
        "/proc/{}/task/{}/children",
        unshare.id(),
        unshare.id()
    ))
    .expect("children");
    let server_pid: i32 = children
        .split_whitespace()
        .next()
        .expect("server pid")
        .parse()
        .expect("pid");
    let r = repo(&[("x", "y")]);
    let generate = |sock: &Path| {
        let out = std::process::Command::new(go_client())
            .arg("-socket")
            .arg(sock)
            .args(["-rpc", "generate", "-dir"])
            .arg(r.path())
            .output()
            .expect("go");
        assert_eq!(
            parse_client_output(&out).expect("generate")["manifests"],
            serde_json::json!([r#"{"a":1}"#])
        );
    };
    generate(&sock);
    // The reaper's cadence is 1 s: reaped within a few of its rounds, whatever the load.
    let as_init = zombies_within(server_pid);
    let _ = rustix::process::kill_process(
        rustix::process::Pid::from_raw(server_pid).expect("pid"),
        rustix::process::Signal::TERM,
    );
    let _ = unshare.wait();
    assert!(as_init.is_empty(), "zombies left under PID 1: {as_init:?}");

    // The same server as an ordinary process: its orphans are still its own to reap.
    let s = Server::start(&plugin(spec), &["--policy", policy.to_str().expect("utf8")]);
    generate(&s.sock);
    let server_pid = s.child.as_ref().expect("running").id() as i32;
    let as_subreaper = zombies_within(server_pid);
    assert!(
        as_subreaper.is_empty(),
        "zombies left under the server: {as_subreaper:?}"
    );
}

/// With the default namespaces the jail is its PID namespace's init: the orphans a command
/// leaves (here five background processes whose parent shell exited at once) become its
/// zombies, reaped by the command's own poll loop (every second) while the command still runs;
/// the command counts the zombies in its private /proc after 2.5 s. Without that pass the
/// five stay (checked once by removing it).
#[test]
fn the_jail_as_pid_1_reaps_its_commands_orphans_while_they_run() {
    needs_root!("the jail as PID 1 needs namespaces and leased UIDs");
    let script = r#"for i in 1 2 3 4 5; do ( true & ); done; sleep 2.5; z=0; for f in /proc/[0-9]*/stat; do read -r l < $f; case "${l##*) }" in Z*) z=$((z+1));; esac; done; echo "zombies: $z""#;
    let spec = format!("  generate:\n    command: [sh, -c, '{script}']\n");
    let s = Server::start(&plugin(&spec), &[]);
    let r = repo(&[("x", "y")]);
    let out = std::process::Command::new(go_client())
        .arg("-socket")
        .arg(&s.sock)
        .args(["-rpc", "generate", "-dir"])
        .arg(r.path())
        .output()
        .expect("go");
    assert_eq!(
        parse_client_output(&out).expect("generate")["manifests"],
        serde_json::json!([r#"{"zombies":0}"#])
    );
}

#[test]
fn logrus_levels_are_honoured_and_a_bad_one_stops_start_up_loudly() {
    let t = tempfile::tempdir().expect("tmp");
    // `warning` (logrus' spelling) once silenced every line: a missing plugin.yaml must still
    // be said, and the exit status is Argo's start-up failure.
    let out = std::process::Command::new(bin())
        .args(["--config-dir-path"])
        .arg(t.path().join("nothing-here"))
        .env("ARGOCD_CMP_SERVER_LOGLEVEL", "warning")
        .env("ARGOCD_PLUGINSOCKFILEPATH", t.path())
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(20));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("plugin.yaml"), "{err}");
    assert!(!err.contains('\u{1b}'), "no colour into a pipe: {err}");
    // An invalid level is refused, on stderr, with exit 20.
    let out = std::process::Command::new(bin())
        .args(["--loglevel", "verbose", "--config-dir-path"])
        .arg(t.path())
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(20));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("not a valid logrus Level: \"verbose\""),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
/// The flags argo-helm sets start the server, and an unreachable collector costs requests
/// nothing (spans reaching a real collector: tests/audit.rs).
fn argo_helm_charts_otlp_flags_start_the_server_even_with_the_collector_unreachable() {
    let s = Server::start_env(
        &plugin(CAT),
        &["--otlp-address", "otel-collector:4317", "--otlp-insecure"],
        &[("ARGOCD_CMP_SERVER_OTLP_HEADERS", "x-tenant=a")],
    );
    assert!(go(&s, "check", &[]).is_ok());
    let logs = s.logs();
    assert!(
        logs.contains("OpenTelemetry: exporting") && logs.contains("http://otel-collector:4317"),
        "{logs}"
    );
}

/// A long command's stderr shows in the server's log as it is printed (in the request's
/// context, redacted, at most 200 lines per command), not only when the command ends.
#[test]
fn stderr_lines_are_logged_while_the_command_runs() {
    let s = Server::start(
        &plugin(
            "  generate:\n    command: [sh, -c]\n    args:\n      - |\n        echo 'step one' >&2\n        sleep 5\n        echo 'password=hunter2 step two' >&2\n        i=0; while [ $i -lt 300 ]; do echo \"flood $i\" >&2; i=$((i+1)); done\n        cat cm.yaml\n",
        ),
        &[],
    );
    let dir = repo(&[(
        "cm.yaml",
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n",
    )]);
    let dir_arg = dir.path().to_str().expect("utf8").to_owned();
    let sock = s.sock.clone();
    let client = go_client(); // built once per test run: before the clock of this test starts
    let call = std::thread::spawn(move || {
        let out = std::process::Command::new(client)
            .arg("-socket")
            .arg(&sock)
            .args(["-rpc", "generate", "-dir", &dir_arg])
            .output()
            .expect("run go client");
        parse_client_output(&out)
    });
    let logged = |s: &Server, what: &str| {
        s.logs()
            .lines()
            .filter(|l| l.contains("\"msg\":\"command stderr\"") && l.contains(what))
            .map(|l| serde_json::from_str::<serde_json::Value>(l).expect("json log"))
            .collect::<Vec<_>>()
    };
    settle_until(|| !logged(&s, "step one").is_empty(), || s.logs());
    // Logged while the command still sleeps: the call has not returned.
    assert!(!call.is_finished(), "the line came only with the reply");
    let first = &logged(&s, "step one")[0];
    assert_eq!(first["line"], "step one");
    assert_eq!(first["phase"], "generate");
    assert_eq!(first["rpc"], "GenerateManifest", "{first}");
    assert!(first["request_id"].is_string(), "{first}");
    call.join().expect("client").expect("the request succeeds");
    let logs = s.logs();
    assert!(logged(&s, "hunter2").is_empty(), "a secret reached the log");
    assert_eq!(logged(&s, "step two")[0]["line"], "password=*** step two");
    // 200 lines of this command, then one note that the rest is not logged live.
    assert_eq!(logged(&s, "\"phase\":\"generate\"").len(), 200);
    assert_eq!(logs.matches("further lines are not logged").count(), 1);
}
