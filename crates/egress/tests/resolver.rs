//! The proxy against a DNS server it does not control: a stub run here that answers a name
//! differently the second time (DNS rebinding) and answers the search-domain forms of names
//! with loopback, with `search corp.test` and `ndots:5` in `resolv.conf` as a pod has.
//!
//! As root, the test re-runs itself in a private network and mount namespace (loopback only;
//! `/etc/resolv.conf` naming the stub on 127.0.0.1:53). Without root it cannot, and says so
//! (a failure under `CMP_WARDEN_TESTS_MUST_RUN`).

use std::io::{Read, Write};
use std::net::{Ipv4Addr, TcpListener, TcpStream, UdpSocket};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use egress::{Limits, Proxy};
use vocab::egress::{AllowList, HostPattern, Rule, Target};

const CHILD: &str = "EGRESS_RESOLVER_TEST_CHILD";

#[test]
fn names_are_resolved_once_as_absolute_names_against_a_resolver_that_rebinds() {
    if std::env::var_os(CHILD).is_some() {
        return in_private_namespaces();
    }
    if !rustix::process::geteuid().is_root() {
        let why = "needs root for a private network and mount namespace";
        assert!(
            std::env::var_os("CMP_WARDEN_TESTS_MUST_RUN").is_none(),
            "this test must run here (CMP_WARDEN_TESTS_MUST_RUN), but it cannot: {why}"
        );
        #[allow(clippy::print_stderr)] // A skip says why, as every root-only test here does.
        {
            eprintln!("SKIP: {why}");
        }
        return;
    }
    let dir = tempfile::tempdir().expect("tmp");
    let conf = dir.path().join("resolv.conf");
    std::fs::write(
        &conf,
        "nameserver 127.0.0.1\nsearch corp.test\noptions ndots:5 timeout:1 attempts:1\n",
    )
    .expect("resolv.conf");
    let exe = std::env::current_exe().expect("exe");
    let out = std::process::Command::new("unshare")
        .args(["--net", "--mount", "--propagation", "private", "--"])
        .args([
            "sh",
            "-c",
            "ip link set lo up && mount --bind \"$0\" /etc/resolv.conf && exec \"$1\" --exact names_are_resolved_once_as_absolute_names_against_a_resolver_that_rebinds --nocapture --test-threads=1",
        ])
        .arg(&conf)
        .arg(&exe)
        .env(CHILD, "1")
        .output()
        .expect("unshare");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{text}");
    assert!(text.contains("1 passed"), "{text}");
}

/// The stub: A queries answered from `answers` (by name, the n-th query of a name getting the
/// n-th address, the last one repeated); AAAA and unknown names answered with no address.
/// Every question asked is kept, in order.
struct Stub {
    asked: Arc<Mutex<Vec<(String, u16)>>>,
}

fn stub(answers: Vec<(&'static str, Vec<Ipv4Addr>)>) -> Stub {
    let sock = UdpSocket::bind("127.0.0.1:53").expect("bind the stub on 127.0.0.1:53");
    let asked = Arc::new(Mutex::new(Vec::new()));
    let log = asked.clone();
    std::thread::spawn(move || {
        let mut buf = [0u8; 512];
        while let Ok((n, from)) = sock.recv_from(&mut buf) {
            let Some((name, qtype, end)) = question(&buf[..n]) else {
                continue;
            };
            let seen = {
                let mut l = log.lock().expect("lock");
                l.push((name.clone(), qtype));
                l.iter().filter(|(q, t)| *q == name && *t == qtype).count()
            };
            let addr = answers
                .iter()
                .find(|(q, _)| q.eq_ignore_ascii_case(&name))
                .filter(|_| qtype == 1)
                .map(|(_, list)| list[(seen - 1).min(list.len() - 1)]);
            let mut r = Vec::with_capacity(end + 16);
            r.extend_from_slice(&buf[..2]); // the query's ID
            let rcode = if answers.iter().any(|(q, _)| q.eq_ignore_ascii_case(&name)) {
                0
            } else {
                3 // NXDOMAIN
            };
            r.extend_from_slice(&[
                0x81,
                0x80 | rcode,
                0,
                1,
                0,
                u8::from(addr.is_some()),
                0,
                0,
                0,
                0,
            ]);
            r.extend_from_slice(&buf[12..end]);
            if let Some(a) = addr {
                r.extend_from_slice(&[0xc0, 0x0c, 0, 1, 0, 1, 0, 0, 0, 0, 0, 4]);
                r.extend_from_slice(&a.octets());
            }
            let _ = sock.send_to(&r, from);
        }
    });
    Stub { asked }
}

/// The question of a query: its name (no trailing dot), type, and where it ends.
fn question(q: &[u8]) -> Option<(String, u16, usize)> {
    let mut i = 12;
    let mut labels = Vec::new();
    loop {
        let len = usize::from(*q.get(i)?);
        i += 1;
        if len == 0 {
            break;
        }
        labels.push(String::from_utf8_lossy(q.get(i..i + len)?).into_owned());
        i += len;
    }
    let qtype = u16::from_be_bytes([*q.get(i)?, *q.get(i + 1)?]);
    Some((labels.join("."), qtype, i + 4))
}

fn proxy(search_domains: bool, port: u16) -> (egress::ProxyHandle, u16) {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    let at = l.local_addr().expect("addr").port();
    let host = |h: &str| Rule {
        target: Target::Host(HostPattern::parse(h).expect("host")),
        ports: vec![port],
        internal: false,
    };
    let list = AllowList {
        rules: vec![
            host("rebind.example.test"),
            host("vault.example.test"),
            host("missing.example.test"),
        ],
        audit: false,
        hosts: Vec::new(),
        search_domains,
    };
    let limits = Limits {
        connect_timeout: Duration::from_secs(3),
        ..Limits::default()
    };
    (Proxy::new(list, limits).start(l).expect("start"), at)
}

/// `CONNECT name:port`: the status line and the body.
fn connect(proxy: u16, name: &str, port: u16) -> (String, String) {
    let mut s = TcpStream::connect(("127.0.0.1", proxy)).expect("proxy");
    s.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    write!(s, "CONNECT {name}:{port} HTTP/1.1\r\n\r\n").expect("write");
    let mut text = String::new();
    let _ = s.read_to_string(&mut text);
    let status = text.lines().next().unwrap_or_default().to_owned();
    (status, text)
}

fn in_private_namespaces() {
    // What a rebinding or search-domain answer would reach: loopback, where this listens.
    let target = TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = target.local_addr().expect("addr").port();
    target.set_nonblocking(true).expect("nonblocking");
    let public = |last: u8| Ipv4Addr::new(198, 51, 100, last);
    let stub = stub(vec![
        // First an external address (admitted), then loopback.
        ("rebind.example.test", vec![public(7), Ipv4Addr::LOCALHOST]),
        ("vault.example.test", vec![public(8)]),
        // The search-domain form of the listed name: loopback.
        ("vault.example.test.corp.test", vec![Ipv4Addr::LOCALHOST]),
    ]);
    let (p, at) = proxy(false, port);

    // Rebinding: the first lookup's external address is what the proxy connects to (there
    // is no route to it here: 502 naming it); the second lookup's loopback is refused.
    let (status, text) = connect(at, "rebind.example.test", port);
    assert!(status.starts_with("HTTP/1.1 502"), "{text}");
    assert!(text.contains(&format!("198.51.100.7:{port}")), "{text}");
    let (status, text) = connect(at, "rebind.example.test", port);
    assert!(status.starts_with("HTTP/1.1 403"), "{text}");
    assert!(
        text.contains("resolves only to internal addresses (127.0.0.1)"),
        "{text}"
    );
    let a_queries = |name: &str| {
        stub.asked
            .lock()
            .expect("lock")
            .iter()
            .filter(|(q, t)| q == name && *t == 1)
            .count()
    };
    // One lookup per connection: nothing resolved twice.
    assert_eq!(a_queries("rebind.example.test"), 2);

    // Absolute names: with ndots:5 a relative lookup asks for the search-domain form first
    // (answered with loopback); the proxy asks only for the name itself.
    let (status, text) = connect(at, "vault.example.test", port);
    assert!(status.starts_with("HTTP/1.1 502"), "{text}");
    assert!(text.contains(&format!("198.51.100.8:{port}")), "{text}");
    assert_eq!(a_queries("vault.example.test.corp.test"), 0);
    assert!(target.accept().is_err(), "loopback was reached");
    let (records, _) = p.finish();
    assert_eq!(records.len(), 3);

    // An unresolvable name says how it was resolved and what to do.
    let (p, at) = proxy(false, port);
    let (status, text) = connect(at, "missing.example.test", port);
    assert!(status.starts_with("HTTP/1.1 403"), "{text}");
    assert!(
        text.contains("resolved as an absolute name") && text.contains("searchDomains: true"),
        "{text}"
    );
    drop(p);

    // `searchDomains: true` asks as the pod's resolver would — the search-domain form first
    // — and its loopback answer is still refused.
    let (p, at) = proxy(true, port);
    let (status, text) = connect(at, "vault.example.test", port);
    assert_eq!(a_queries("vault.example.test.corp.test"), 1, "{text}");
    assert!(status.starts_with("HTTP/1.1 403"), "{text}");
    assert!(text.contains("127.0.0.1"), "{text}");
    assert!(target.accept().is_err(), "loopback was reached");
    drop(p);
}
