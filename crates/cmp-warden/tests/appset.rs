//! The ApplicationSet plugin generator: a real `cmp-warden appset serve` over TLS, spoken to
//! exactly as the ApplicationSet controller does (POST, `Content-Type: application/json`,
//! `Authorization: Bearer`, `User-Agent: argocd-applicationset`, Go's JSON encoder output with
//! its trailing newline), plus every refusal the contract and our limits call for, the command
//! confined like a CMP command, and a load run.
#![allow(clippy::print_stderr)]

#[macro_use]
mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::pki::Ca;
use common::{bin, write_policy};

/// Why these tests need root (printed when one skips).
const NEEDS_ROOT: &str = "generator tests confine commands with leased UIDs, which needs root";

const TOKEN: &str = "appset-s3cret-token";

struct Gen {
    child: Option<Child>,
    dir: tempfile::TempDir,
    addr: String,
    tls: Arc<rustls::ClientConfig>,
    uid_range: (u32, u32),
}

impl Gen {
    /// Start with this generator `spec:` body (YAML, indented two spaces), TLS and a token.
    fn start(spec: &str) -> Gen {
        Self::start_config(None, spec)
    }

    /// Start with a generator config file as given (`config`), or one written from `spec`.
    fn start_config(config: Option<&Path>, spec: &str) -> Gen {
        Self::start_full(config, spec, &[], &[], |_| {})
    }

    /// Start with `policy` edits, `args` after the usual flags, and `data` filling the
    /// generator's data directory after the default files.
    fn start_full(
        config: Option<&Path>,
        spec: &str,
        policy: &[(&str, &str)],
        args: &[&str],
        data: impl FnOnce(&Path),
    ) -> Gen {
        let dir = tempfile::tempdir().expect("tmp");
        let d = dir.path();
        let ca = Ca::new("appset test CA");
        let (cert, key) = ca.leaf(d, "server", false, false);
        let ca_path = ca.write(d, "ca.crt");
        std::fs::create_dir_all(d.join("data")).expect("mkdir");
        std::fs::write(d.join("data/environments"), "dev\nstaging\nprod\n").expect("write");
        data(&d.join("data"));
        std::fs::write(
            d.join("generator.yaml"),
            format!(
                "apiVersion: cmp-warden.io/v1alpha1\nkind: AppSetGenerator\nmetadata: {{name: test}}\nspec:\n{spec}"
            ),
        )
        .expect("write");
        std::fs::write(d.join("token"), format!("{TOKEN}\n")).expect("token");
        let uid_range = write_policy(&d.join("policy/policy.yaml"), policy);
        std::fs::create_dir_all(d.join("work")).expect("mkdir");
        let log = std::fs::File::create(d.join("server.log")).expect("log");
        let child = Command::new(bin())
            .args([
                "appset",
                "serve",
                "--loglevel",
                "debug",
                "--listen",
                "127.0.0.1:0",
            ])
            .arg("--config")
            .arg(config.map_or_else(|| d.join("generator.yaml"), Path::to_path_buf))
            .arg("--tls-cert")
            .arg(&cert)
            .arg("--tls-key")
            .arg(&key)
            .arg("--token-file")
            .arg(d.join("token"))
            .arg("--policy")
            .arg(d.join("policy/policy.yaml"))
            .arg("--work-dir")
            .arg(d.join("work"))
            .args(args)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("spawn");
        let tls = server::tls::client_config(&ca_path, None, &[b"http/1.1"]).expect("tls");
        let mut g = Gen {
            child: Some(child),
            dir,
            addr: String::new(),
            tls,
            uid_range,
        };
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            if let Some(line) = g
                .logs()
                .lines()
                .find(|l| l.contains("ApplicationSet plugin generator on"))
            {
                let v: serde_json::Value = serde_json::from_str(line).expect("json log");
                g.addr = v["address"].as_str().expect("address").to_owned();
                return g;
            }
            if let Some(st) = g.child.as_mut().and_then(|c| c.try_wait().ok().flatten()) {
                panic!("appset serve exited ({st}):\n{}", g.logs());
            }
            assert!(Instant::now() < deadline, "never served:\n{}", g.logs());
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn logs(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("server.log")).unwrap_or_default()
    }

    fn audit_events(&self) -> Vec<audit_event::AuditEvent> {
        common::audit_events_in(&self.logs())
    }

    fn rss_kib(&self) -> u64 {
        let pid = self.child.as_ref().expect("running").id();
        std::fs::read_to_string(format!("/proc/{pid}/status"))
            .expect("status")
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .expect("VmRSS")
    }

    fn tls_stream(&self) -> rustls::StreamOwned<rustls::ClientConnection, TcpStream> {
        let tcp = TcpStream::connect(&self.addr).expect("connect");
        tcp.set_read_timeout(Some(Duration::from_secs(60)))
            .expect("timeout");
        let name = rustls_pki_types::ServerName::try_from("localhost").expect("name");
        let conn = rustls::ClientConnection::new(self.tls.clone(), name).expect("tls");
        rustls::StreamOwned::new(conn, tcp)
    }

    /// Send raw request bytes over TLS; (status, headers, body).
    fn raw(&self, req: &[u8]) -> (u16, String, String) {
        let mut s = self.tls_stream();
        s.write_all(req).expect("write");
        let mut out = Vec::new();
        let _ = s.read_to_end(&mut out);
        parse_response(&out)
    }

    /// A request as the ApplicationSet controller makes it (token and body are parameters).
    fn post(&self, token: Option<&str>, body: &str) -> (u16, String, String) {
        let mut req = format!(
            "POST /api/v1/getparams.execute HTTP/1.1\r\nHost: {}\r\nUser-Agent: argocd-applicationset\r\nContent-Length: {}\r\nContent-Type: application/json\r\nAccept-Encoding: gzip\r\nConnection: close\r\n",
            self.addr,
            body.len()
        );
        if let Some(t) = token {
            req.push_str(&format!("Authorization: Bearer {t}\r\n"));
        }
        req.push_str("\r\n");
        req.push_str(body);
        self.raw(req.as_bytes())
    }
}

impl Drop for Gen {
    /// A generator with a command source retires its jails and cgroups on SIGTERM (SIGKILL
    /// left them on the host, 24 per run of this file).
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            common::stop_gracefully(&mut c, Duration::from_secs(5));
        }
    }
}

fn parse_response(raw: &[u8]) -> (u16, String, String) {
    let text = String::from_utf8_lossy(raw).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    (status, head.to_owned(), body.to_owned())
}

/// The controller's body: Go's json.Encoder with a trailing newline.
fn controller_body(appset: &str, params: &str) -> String {
    format!("{{\"applicationSetName\":\"{appset}\",\"input\":{{\"parameters\":{params}}}}}\n")
}

const ENV_COMMAND: &str = "  command: [sh, -c]\n  args:\n    - |\n      req=$(cat)\n      case \"$req\" in *'\"applicationSetName\"'*) ;; *) echo \"no request on stdin\" >&2; exit 3;; esac\n      printf '['; sep=''\n      while read -r env; do printf '%s{\"env\":\"%s\",\"appset\":\"%s\"}' \"$sep\" \"$env\" \"$APPLICATIONSET_NAME\"; sep=','; done < environments\n      printf ']\\n'\n  dataDir: data\n";

#[test]
fn answers_the_controller_exactly_with_a_confined_command() {
    needs_root!(NEEDS_ROOT);
    let g = Gen::start(ENV_COMMAND);
    let (status, head, body) = g.post(Some(TOKEN), &controller_body("shop", r#"{"region":"eu"}"#));
    assert_eq!(status, 200, "{head}\n{body}\n{}", g.logs());
    assert!(
        head.to_ascii_lowercase()
            .contains("content-type: application/json"),
        "{head}"
    );
    let v: serde_json::Value = serde_json::from_str(&body).expect("json");
    assert_eq!(
        v,
        serde_json::json!({"output": {"parameters": [
            {"env": "dev", "appset": "shop"},
            {"env": "staging", "appset": "shop"},
            {"env": "prod", "appset": "shop"},
        ]}})
    );
    // An input without parameters (Go's omitempty gives {}), too.
    let (status, _, _) = g.post(Some(TOKEN), "{\"applicationSetName\":\"x\",\"input\":{}}\n");
    assert_eq!(status, 200);
    // One audit event per request, named after the ApplicationSet, with the command's record.
    let audit = g.audit_events();
    assert_eq!(audit.len(), 2, "{}", g.logs());
    assert_eq!(audit[0].rpc, "getparams.execute");
    assert_eq!(audit[0].app, "shop");
    assert_eq!(audit[0].code, "200");
    let uid = audit[0].uid.expect("leased uid");
    assert!((g.uid_range.0..g.uid_range.0 + g.uid_range.1).contains(&uid));
    assert_eq!(audit[0].commands[0].phase, common::Phase::Generator);
}

#[test]
fn refuses_unauthenticated_and_malformed_requests_with_json_errors() {
    needs_root!(NEEDS_ROOT);
    let g = Gen::start(&format!(
        "{ENV_COMMAND}  limits: {{bodyBytes: 4Ki, timeoutSeconds: 3}}\n"
    ));
    let good = controller_body("shop", "{}");
    let expect = |r: (u16, String, String), status: u16, needle: &str| {
        assert_eq!(r.0, status, "{}\n{}", r.1, r.2);
        let v: serde_json::Value = serde_json::from_str(&r.2).expect("JSON error body");
        let msg = v["message"].as_str().expect("message");
        assert!(v["error"].is_string() && msg.contains(needle), "{v}");
    };
    expect(g.post(None, &good), 401, "missing bearer token");
    expect(
        g.post(Some("not-the-token"), &good),
        401,
        "invalid bearer token",
    );
    expect(g.post(Some(TOKEN), ""), 400, "empty request body");
    expect(g.post(Some(TOKEN), "{not json"), 400, "not JSON");
    expect(g.post(Some(TOKEN), "[]"), 400, "JSON object");
    expect(
        g.post(Some(TOKEN), r#"{"input":{}}"#),
        400,
        "applicationSetName is missing",
    );
    expect(
        g.post(
            Some(TOKEN),
            r#"{"applicationSetName":"a","input":{"parameters":[]}}"#,
        ),
        400,
        "input.parameters must be an object",
    );
    // Oversize, by Content-Length and by a chunked body that never says its size.
    expect(
        g.post(
            Some(TOKEN),
            &controller_body("a", &format!("{{\"x\":\"{}\"}}", "y".repeat(8192))),
        ),
        413,
        "larger than 4096",
    );
    let chunk = "z".repeat(3000);
    let chunked = format!(
        "POST /api/v1/getparams.execute HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nAuthorization: Bearer {TOKEN}\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n{:x}\r\n{chunk}\r\n{:x}\r\n{chunk}\r\n0\r\n\r\n",
        chunk.len(),
        chunk.len()
    );
    expect(g.raw(chunked.as_bytes()), 413, "larger than 4096");
    // Wrong path, method, media type.
    expect(
        g.raw(format!("POST /api/v1/other HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n").as_bytes()),
        404,
        "no such endpoint",
    );
    let (status, head, _) = g.raw(
        format!("GET /api/v1/getparams.execute HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\nConnection: close\r\n\r\n").as_bytes(),
    );
    assert_eq!(status, 405);
    assert!(head.to_ascii_lowercase().contains("allow: post"), "{head}");
    expect(
        g.raw(format!("POST /api/v1/getparams.execute HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\nContent-Type: text/plain\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{{}}").as_bytes()),
        415,
        "application/json",
    );
    // A slow client: headers, then half the body, then nothing: 408 once the timeout passes.
    let mut s = g.tls_stream();
    let t = Instant::now();
    s.write_all(
        format!("POST /api/v1/getparams.execute HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nAuthorization: Bearer {TOKEN}\r\nContent-Length: 100\r\nConnection: close\r\n\r\n{{\"applicationSetName\":").as_bytes(),
    )
    .expect("write");
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    let r = parse_response(&out);
    assert_eq!(r.0, 408, "{r:?}");
    assert!(t.elapsed() < Duration::from_secs(20));
    // Plaintext HTTP to the TLS port gets no HTTP answer.
    let mut tcp = TcpStream::connect(&g.addr).expect("connect");
    tcp.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    tcp.write_all(b"POST /api/v1/getparams.execute HTTP/1.1\r\nHost: x\r\n\r\n")
        .expect("write");
    let mut out = Vec::new();
    let _ = tcp.read_to_end(&mut out);
    assert!(!String::from_utf8_lossy(&out).contains("HTTP/1.1 200"));
    // The good request still works, and the token never reached the logs.
    assert_eq!(g.post(Some(TOKEN), &good).0, 200);
    assert!(!g.logs().contains(TOKEN), "token leaked into logs");
}

/// Requests refused before authentication (unknown paths, no token) cost the audit log and
/// the logs little: each refusal's text echoes at most 256 bytes of the path, at most 50 are
/// audited one by one per 10 s (once, 4 x 5,000 of them wrote 332 MB of audit in 2.2 s),
/// and an honest request beside them is answered and audited.
#[test]
fn refusals_before_authentication_are_audited_within_a_budget_and_echo_little() {
    needs_root!(NEEDS_ROOT);
    let g = Gen::start(ENV_COMMAND);
    let t0 = Instant::now();
    let long = "a".repeat(8000);
    for i in 0..300 {
        let req = if i % 2 == 0 {
            format!("GET /{long} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        } else {
            "POST /api/v1/getparams.execute HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}".to_owned()
        };
        let (status, _, body) = g.raw(req.as_bytes());
        assert!(status == 404 || status == 401, "{status} {body}");
        assert!(body.len() < 1024, "{} bytes echoed: {body}", body.len());
    }
    let windows = t0.elapsed().as_secs() / 10 + 1;
    assert_eq!(g.post(Some(TOKEN), &controller_body("shop", "{}")).0, 200);
    let logs = g.logs();
    let audited = common::audit_events_in(&logs);
    let refused = audited.iter().filter(|e| e.code != "200").count() as u64;
    assert!(
        (50..=50 * windows).contains(&refused),
        "{refused} refusals audited in {windows} window(s)"
    );
    assert!(
        audited.iter().any(|e| e.code == "200"),
        "the honest request was not audited"
    );
    let warned = logs
        .lines()
        .filter(|l| {
            l.contains("request refused: authentication") && l.contains("\"level\":\"warning\"")
        })
        .count() as u64;
    assert!(warned <= windows, "{warned} authentication warnings");
}

/// Connections are capped before any authentication: at `--listen-max-connections` (16
/// here) a new one closes the one idle the longest, so 60 that finished their handshake and
/// say nothing cannot keep the controller out; one with a request open is never the one
/// closed.
#[test]
fn idle_connections_are_capped_and_one_with_a_request_open_is_kept() {
    needs_root!(NEEDS_ROOT);
    let g = Gen::start_full(
        None,
        "  command: [sh, -c, 'sleep 2; echo \"[]\"']\n",
        &[],
        &["--listen-max-connections", "16"],
        |_| {},
    );
    // One request open (its command sleeps 2 s) before the flood.
    let taken = g.logs().matches("\"msg\":\"jail taken\"").count();
    let busy = {
        let body = controller_body("busy", "{}");
        let req = format!(
            "POST /api/v1/getparams.execute HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\nAuthorization: Bearer {TOKEN}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        );
        let mut s = g.tls_stream();
        s.write_all(req.as_bytes()).expect("write");
        s
    };
    assert!(
        common::wait_until(Duration::from_secs(15), || g
            .logs()
            .matches("\"msg\":\"jail taken\"")
            .count()
            > taken),
        "the busy request never took a jail:\n{}",
        g.logs()
    );
    let mut idle: Vec<_> = (0..60)
        .map(|_| {
            let mut s = g.tls_stream();
            s.conn.complete_io(&mut s.sock).expect("handshake");
            s
        })
        .collect();
    let mut closed_now = || {
        let mut closed = 0;
        for c in &mut idle {
            c.sock
                .set_read_timeout(Some(Duration::from_millis(5)))
                .expect("timeout");
            let mut b = [0u8; 16];
            closed += usize::from(match c.read(&mut b) {
                Ok(0) => true,
                Ok(_) => false,
                Err(e) => !matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ),
            });
        }
        closed
    };
    let mut closed = 0;
    // Within 2 s: hyper's header timeout (10 s) must not be what closed them.
    common::wait_until(Duration::from_secs(2), || {
        closed = closed_now();
        closed >= 60 - 16
    });
    assert!(
        closed >= 60 - 16,
        "only {closed} of 60 idle connections were closed at the cap"
    );
    let (status, _, body) = g.post(Some(TOKEN), &controller_body("shop", "{}"));
    assert_eq!(
        status,
        200,
        "the honest request was kept out: {body}\n{}",
        g.logs()
    );
    let mut busy = busy;
    let mut out = Vec::new();
    let _ = busy.read_to_end(&mut out);
    let (status, _, body) = parse_response(&out);
    assert_eq!(status, 200, "the request open at the cap was cut: {body}");
}

#[test]
fn the_command_is_confined_like_a_cmp_command() {
    needs_root!(NEEDS_ROOT);
    let spec = r#"  command: [sh, -c]
  args:
    - |
      try() { if e=$(sh -c "$2" 2>&1 >/dev/null); then r=allowed; else r="denied: $(printf '%s' "$e" | head -n1 | tr -d '"\\')"; fi; printf '"%s":"%s",' "$1" "$r"; }
      d=$(try write_etc 'echo x > /etc/pwned'
          try write_var_tmp 'echo x > /var/tmp/pwned-by-generator'
          try read_shadow 'cat /etc/shadow'
          try read_token 'cat /proc/1/environ'
          try unshare 'unshare -U true')
      # /tmp is the request's own (a private tmpfs): writable, and gone with the request.
      echo x > /tmp/pwned-by-generator
      legit=$(echo ok > ./own && cat ./own)
      printf '[{%s"legit":"%s","uid":"%s","nnp":"%s"}]\n' "$d" "$legit" "$(id -u)" "$(grep NoNewPrivs /proc/self/status | tr -d ' \t' | cut -d: -f2)"
"#;
    let g = Gen::start(spec);
    let (status, _, body) = g.post(Some(TOKEN), &controller_body("evil", "{}"));
    assert_eq!(status, 200, "{body}\n{}", g.logs());
    let v: serde_json::Value = serde_json::from_str(&body).expect("json");
    let p = &v["output"]["parameters"][0];
    // Each refused for the reason the sandbox gives, not any failure: /var/tmp is writable
    // by everyone (only Landlock says no there), unshare is a seccomp denial.
    for (k, why) in [
        ("write_etc", "Permission denied"),
        ("write_var_tmp", "Permission denied"),
        ("read_shadow", "Permission denied"),
        ("read_token", "Permission denied"),
        ("unshare", "Operation not permitted"),
    ] {
        let got = p[k].as_str().unwrap_or_default();
        assert!(
            got.starts_with("denied: ") && got.ends_with(why),
            "{k}: {p}"
        );
    }
    // The seccomp denial is in the request's own record, not only an errno.
    let audit = g.audit_events().into_iter().next().expect("audit event");
    assert!(
        audit
            .seccomp_audit
            .iter()
            .any(|e| e.syscall == "unshare" && e.action == common::SeccompAction::Denied),
        "{audit}"
    );
    assert_eq!(p["legit"], "ok");
    assert_eq!(p["nnp"], "1");
    let uid: u32 = p["uid"].as_str().expect("uid").parse().expect("number");
    assert!(
        (g.uid_range.0..g.uid_range.0 + g.uid_range.1).contains(&uid),
        "uid {uid}"
    );
    assert!(!Path::new("/tmp/pwned-by-generator").exists());
    assert!(!Path::new("/var/tmp/pwned-by-generator").exists());
    // Failures keep their meaning: a failing command is a 500 naming it, a hanging one a 504.
    drop(g);
    let g = Gen::start("  command: [sh, -c, 'echo broken >&2; exit 7']\n");
    let (status, _, body) = g.post(Some(TOKEN), &controller_body("a", "{}"));
    assert_eq!(status, 500, "{body}");
    assert!(
        body.contains("exit status 7") && body.contains("broken"),
        "{body}"
    );
    drop(g);
    let g = Gen::start("  command: [sh, -c, 'sleep 60']\n  limits: {timeoutSeconds: 2}\n");
    let t = Instant::now();
    let (status, _, body) = g.post(Some(TOKEN), &controller_body("a", "{}"));
    assert_eq!(status, 504, "{body}");
    assert!(t.elapsed() < Duration::from_secs(15));
    drop(g);
    let g = Gen::start("  command: [sh, -c, 'echo \"{\\\"not\\\": \\\"an array\\\"}\"']\n");
    let (status, _, body) = g.post(Some(TOKEN), &controller_body("a", "{}"));
    assert_eq!(status, 500, "{body}");
    assert!(body.contains("not a JSON array of objects"), "{body}");
}

#[test]
fn static_and_file_sources() {
    needs_root!(NEEDS_ROOT);
    let g = Gen::start(
        "  static: [{cluster: a, url: 'https://a.example'}, {cluster: b, url: 'https://b.example'}]\n",
    );
    let (status, _, body) = g.post(Some(TOKEN), &controller_body("x", "{}"));
    assert_eq!(status, 200);
    assert_eq!(
        body,
        r#"{"output":{"parameters":[{"cluster":"a","url":"https://a.example"},{"cluster":"b","url":"https://b.example"}]}}"#
    );
    drop(g);
    let g = Gen::start("  file: params.yaml\n");
    let file: PathBuf = g.dir.path().join("params.yaml");
    std::fs::write(&file, "- {team: a}\n").expect("write");
    assert!(
        g.post(Some(TOKEN), &controller_body("x", "{}"))
            .2
            .contains(r#"[{"team":"a"}]"#)
    );
    // Re-read per request.
    std::fs::write(&file, "- {team: a}\n- {team: b}\n").expect("write");
    assert!(
        g.post(Some(TOKEN), &controller_body("x", "{}"))
            .2
            .contains(r#"[{"team":"a"},{"team":"b"}]"#)
    );
}

#[test]
fn two_thousand_requests_at_concurrency_32_without_errors_or_memory_growth() {
    needs_root!(NEEDS_ROOT);
    let g = Arc::new(Gen::start(
        "  command: [sh, -c, 'cat >/dev/null; echo \"[{\\\"n\\\": 1}]\"']\n  limits: {concurrency: 8}\n",
    ));
    // Warm up (first connections, allocator arenas), then measure.
    for _ in 0..32 {
        assert_eq!(g.post(Some(TOKEN), &controller_body("load", "{}")).0, 200);
    }
    let before = g.rss_kib();
    let total = 2000;
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let failures = Arc::new(std::sync::Mutex::new(Vec::new()));
    let threads: Vec<_> = (0..32)
        .map(|_| {
            let (g, next, failures) = (g.clone(), next.clone(), failures.clone());
            std::thread::spawn(move || {
                while next.fetch_add(1, std::sync::atomic::Ordering::SeqCst) < total {
                    let (status, _, body) = g.post(Some(TOKEN), &controller_body("load", "{}"));
                    if status != 200 || body != r#"{"output":{"parameters":[{"n":1}]}}"# {
                        failures
                            .lock()
                            .expect("lock")
                            .push(format!("{status} {body}"));
                    }
                }
            })
        })
        .collect();
    for t in threads {
        t.join().expect("thread");
    }
    let failures = failures.lock().expect("lock");
    assert!(
        failures.is_empty(),
        "{} failures, first: {:?}",
        failures.len(),
        failures.first()
    );
    let after = g.rss_kib();
    eprintln!("appset load: RSS {before} KiB before, {after} KiB after {total} requests");
    assert!(
        after < before + 32 * 1024,
        "server RSS grew from {before} KiB to {after} KiB over {total} requests"
    );
    // Every request tree is gone (the last ones are reclaimed just after their responses);
    // only the spare jail kept ready for the next request may remain.
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let idle = common::idle_jails_in(&g.logs());
        assert!(idle.len() <= 1, "more than one idle jail: {idle:?}");
        let left: Vec<_> = std::fs::read_dir(g.dir.path().join("work/_cmp_appset"))
            .map(|r| r.flatten().map(|e| e.path()).collect::<Vec<_>>())
            .unwrap_or_default()
            .into_iter()
            .filter(|p| !idle.iter().any(|j| p.file_name() == Some(j.name.as_ref())))
            .collect();
        if left.is_empty() {
            break;
        }
        assert!(Instant::now() < deadline, "request trees left: {left:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn the_example_generator_answers_as_expected() {
    needs_root!(NEEDS_ROOT);
    let ex = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/appset-generator");
    let g = Gen::start_config(Some(&ex.join("generator.yaml")), "");
    let request = std::fs::read_to_string(ex.join("request.json")).expect("request.json");
    let (status, _, body) = g.post(Some(TOKEN), &request);
    assert_eq!(status, 200, "{body}\n{}", g.logs());
    let want = std::fs::read_to_string(ex.join("expected-response.json")).expect("expected");
    assert_eq!(body, want.trim_end());
    // Without the tier filter: every environment.
    let (status, _, body) = g.post(Some(TOKEN), &controller_body("all", "{}"));
    assert_eq!(status, 200);
    let v: serde_json::Value = serde_json::from_str(&body).expect("json");
    assert_eq!(v["output"]["parameters"].as_array().map(Vec::len), Some(4));
}

/// The generator's data directory is packed into the same archive a CMP request sends and
/// extracted in the jail under the policy's archive limits: every one of them (see
/// `archive_limits.rs` for `serve` and `render`).
#[test]
fn appset_serve_enforces_every_archive_limit_of_its_policy() {
    needs_root!(NEEDS_ROOT);
    for case in common::archive_cases::cases() {
        // The honest request's data files, plus the case's own in a subdirectory.
        let g = Gen::start_full(None, ENV_COMMAND, case.policy, &[], |d| {
            (case.fill)(&d.join("case"))
        });
        let (status, _, body) = g.post(Some(TOKEN), &controller_body("a", "{}"));
        assert!(status >= 400, "{}: {status} {body}", case.name);
        assert!(body.contains(case.expect), "{}: {body}", case.name);
        drop(g);
        // The same policy, without the case's files: served.
        let g = Gen::start_full(None, ENV_COMMAND, case.policy, &[], |_| {});
        let (status, _, body) = g.post(Some(TOKEN), &controller_body("a", "{}"));
        assert_eq!(status, 200, "{}: honest request: {body}", case.name);
    }
}
