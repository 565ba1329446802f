//! ApplicationSet generator throughput and latency, A/B in one run (needs root):
//! - `static`: the generator answers a static list (HTTP + TLS + token, no sandbox);
//! - `command`: a trivial command (`cat >/dev/null; echo '[{"n":1}]'`) in the jail per request;
//!
//! each at concurrency 1, 8 and 32, every request on a fresh TLS connection as the
//! ApplicationSet controller makes them. The difference between the two rows is the sandbox's
//! share. `BENCH_REQUESTS` (default 600) per cell. Figures in BENCHMARKS.md.
#![allow(clippy::print_stdout, clippy::print_stderr)]

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};

const TOKEN: &str = "bench-token";

struct Server {
    child: Child,
    addr: String,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start(dir: &Path, spec: &str, cert: &Path, key: &Path) -> Server {
    let cfg = dir.join(format!("gen-{}.yaml", spec.len()));
    std::fs::write(
        &cfg,
        format!("apiVersion: cmp-warden.io/v1alpha1\nkind: AppSetGenerator\nmetadata: {{name: bench}}\nspec:\n{spec}"),
    )
    .expect("config");
    let log = dir.join(format!("log-{}", spec.len()));
    let child = Command::new(env!("CARGO_BIN_EXE_cmp-warden"))
        .args([
            "appset",
            "serve",
            "--loglevel",
            "info",
            "--listen",
            "127.0.0.1:0",
        ])
        .arg("--config")
        .arg(&cfg)
        .arg("--tls-cert")
        .arg(cert)
        .arg("--tls-key")
        .arg(key)
        .arg("--token-file")
        .arg(dir.join("token"))
        .arg("--audit-log")
        .arg(dir.join("audit.jsonl"))
        .arg("--work-dir")
        .arg(dir)
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).expect("log"))
        .spawn()
        .expect("spawn");
    // Owned by `Server` from here: its Drop kills and waits, on every path.
    let mut srv = Server {
        child,
        addr: String::new(),
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        if let Some(line) = text.lines().find(|l| l.contains("generator on")) {
            let v: serde_json::Value = serde_json::from_str(line).expect("json");
            srv.addr = v["address"].as_str().expect("address").to_owned();
            return srv;
        }
        assert!(Instant::now() < deadline, "not serving:\n{text}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn request(addr: &str, tls: &Arc<rustls::ClientConfig>) -> bool {
    let body = "{\"applicationSetName\":\"bench\",\"input\":{\"parameters\":{}}}\n";
    let tcp = TcpStream::connect(addr).expect("connect");
    let name = rustls_pki_types::ServerName::try_from("localhost").expect("name");
    let conn = rustls::ClientConnection::new(tls.clone(), name).expect("tls");
    let mut s = rustls::StreamOwned::new(conn, tcp);
    let req = format!(
        "POST /api/v1/getparams.execute HTTP/1.1\r\nHost: {addr}\r\nUser-Agent: argocd-applicationset\r\nContent-Type: application/json\r\nAuthorization: Bearer {TOKEN}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    if s.write_all(req.as_bytes()).is_err() {
        return false;
    }
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    out.starts_with(b"HTTP/1.1 200")
}

fn cell(
    addr: &str,
    tls: &Arc<rustls::ClientConfig>,
    conc: usize,
    n: usize,
) -> (f64, f64, f64, usize) {
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let t = Instant::now();
    let threads: Vec<_> = (0..conc)
        .map(|_| {
            let (next, tls, addr) = (next.clone(), tls.clone(), addr.to_owned());
            std::thread::spawn(move || {
                let mut lat = Vec::new();
                let mut errors = 0;
                while next.fetch_add(1, std::sync::atomic::Ordering::SeqCst) < n {
                    let t = Instant::now();
                    if !request(&addr, &tls) {
                        errors += 1;
                    }
                    lat.push(t.elapsed());
                }
                (lat, errors)
            })
        })
        .collect();
    let mut all = Vec::new();
    let mut errors = 0;
    for th in threads {
        let (l, e) = th.join().expect("thread");
        all.extend(l);
        errors += e;
    }
    let wall = t.elapsed().as_secs_f64();
    all.sort();
    let pct = |p: usize| all[(all.len() * p / 100).min(all.len() - 1)].as_secs_f64() * 1e3;
    (n as f64 / wall, pct(50), pct(99), errors)
}

fn main() {
    if !rustix::process::geteuid().is_root() {
        eprintln!("appset bench: SKIPPED (needs root to lease UIDs for the command source)");
        return;
    }
    let n: usize = std::env::var("BENCH_REQUESTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(600);
    let dir = tempfile::tempdir().expect("tmp");
    let d = dir.path();
    std::fs::write(d.join("token"), TOKEN).expect("token");
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).expect("params");
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca =
        CertifiedIssuer::self_signed(ca_params, KeyPair::generate().expect("key")).expect("ca");
    let key = KeyPair::generate().expect("key");
    let leaf = CertificateParams::new(vec!["localhost".to_owned()])
        .expect("params")
        .signed_by(&key, &ca)
        .expect("sign");
    std::fs::write(d.join("ca.crt"), ca.pem()).expect("write");
    std::fs::write(d.join("tls.crt"), leaf.pem()).expect("write");
    std::fs::write(d.join("tls.key"), key.serialize_pem()).expect("write");
    let tls = server::tls::client_config(&d.join("ca.crt"), None, &[b"http/1.1"]).expect("tls");

    println!(
        "generator requests: {n} per cell, fresh TLS connection each, 2 cores shared with the client"
    );
    println!(
        "{:<9} {:>5} {:>9} {:>9} {:>9} {:>7}",
        "source", "conc", "req/s", "p50 ms", "p99 ms", "errors"
    );
    for (name, spec) in [
        ("static", "  static: [{n: 1}]\n  limits: {concurrency: 32}\n".to_owned()),
        (
            "command",
            "  command: [sh, -c, 'cat >/dev/null; echo \"[{\\\"n\\\": 1}]\"']\n  limits: {concurrency: 32}\n"
                .to_owned(),
        ),
    ] {
        let srv = start(d, &spec, &d.join("tls.crt"), &d.join("tls.key"));
        for _ in 0..20 {
            request(&srv.addr, &tls);
        }
        for conc in [1, 8, 32] {
            let (rps, p50, p99, errors) = cell(&srv.addr, &tls, conc, n);
            println!("{name:<9} {conc:>5} {rps:>9.0} {p50:>9.2} {p99:>9.2} {errors:>7}");
        }
    }
}
