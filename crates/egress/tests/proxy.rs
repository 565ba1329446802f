//! The proxy against real sockets: allowed tunnels and forwards beside every refusal the allow
//! list makes, smuggling, the connection cap, and a clean stop.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use egress::{Limits, Proxy};
use vocab::egress::{AllowList, Cidr, Decision, HostPattern, Rule, Target};

/// An upstream on 127.0.0.1 that counts connections (accepted, and still open); for each it
/// reads one request head and answers `HTTP/1.1 200` with the request line as the body, or
/// echoes when `echo`.
struct Upstream {
    port: u16,
    accepted: Arc<AtomicUsize>,
    open: Arc<AtomicUsize>,
    requests: Arc<std::sync::Mutex<Vec<String>>>,
}

/// Counts a connection of the upstream as open until its thread is done with it.
struct OpenGuard(Arc<AtomicUsize>);

impl Drop for OpenGuard {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

fn upstream(echo: bool) -> Upstream {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = l.local_addr().expect("addr").port();
    let accepted = Arc::new(AtomicUsize::new(0));
    let requests = Arc::new(std::sync::Mutex::new(Vec::new()));
    let open = Arc::new(AtomicUsize::new(0));
    let (a, o, r) = (accepted.clone(), open.clone(), requests.clone());
    std::thread::spawn(move || {
        for s in l.incoming().flatten() {
            a.fetch_add(1, Ordering::SeqCst);
            o.fetch_add(1, Ordering::SeqCst);
            let guard = OpenGuard(o.clone());
            let r = r.clone();
            std::thread::spawn(move || {
                let _guard = guard;
                let mut s = s;
                if echo {
                    let mut buf = [0u8; 1024];
                    while let Ok(n) = s.read(&mut buf) {
                        if n == 0 || s.write_all(&buf[..n]).is_err() {
                            break;
                        }
                    }
                    return;
                }
                // Read everything the proxy sends until it stops, then answer once per
                // request line seen.
                let _ = s.set_read_timeout(Some(Duration::from_millis(300)));
                let mut all = Vec::new();
                let _ = s.read_to_end(&mut all);
                let text = String::from_utf8_lossy(&all).into_owned();
                let lines: Vec<String> = text
                    .lines()
                    .filter(|l| l.contains(" HTTP/1."))
                    .map(str::to_owned)
                    .collect();
                r.lock().expect("lock").extend(lines.iter().cloned());
                let body = lines.join("\n");
                let _ = write!(
                    s,
                    "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
            });
        }
    });
    Upstream {
        port,
        accepted,
        open,
        requests,
    }
}

fn host(h: &str, ports: &[u16], internal: bool) -> Rule {
    Rule {
        target: Target::Host(HostPattern::parse(h).expect("host")),
        ports: ports.to_vec(),
        internal,
    }
}

fn start(rules: Vec<Rule>, limits: Limits) -> (egress::ProxyHandle, u16) {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = l.local_addr().expect("addr").port();
    let h = Proxy::new(
        AllowList {
            rules,
            audit: false,
            hosts: vec![(
                "charts.example.test".into(),
                vec!["127.0.0.1".parse().expect("ip")],
            )],
            search_domains: false,
        },
        limits,
    )
    .start(l)
    .expect("start");
    (h, port)
}

/// Send `req` to the proxy and return its status line, with the stream positioned after the
/// response head (read byte by byte, so nothing of what follows is consumed).
fn ask(proxy: u16, req: &str) -> (String, TcpStream) {
    let mut s = TcpStream::connect(("127.0.0.1", proxy)).expect("connect proxy");
    s.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    s.write_all(req.as_bytes()).expect("write");
    let mut head = Vec::new();
    let mut b = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        match s.read(&mut b) {
            Ok(1) => head.push(b[0]),
            _ => break,
        }
    }
    let text = String::from_utf8_lossy(&head).into_owned();
    (text.lines().next().unwrap_or_default().to_owned(), s)
}

#[test]
fn allowed_destinations_work_and_every_other_one_is_refused_and_named() {
    let echo = upstream(true);
    let other = upstream(false);
    let (proxy, port) = start(
        vec![
            host("localhost", &[echo.port], true),
            host("127.0.0.2.nip.invalid", &[echo.port], false),
        ],
        Limits::default(),
    );
    // Allowed: a tunnel through which bytes go both ways.
    let (status, mut s) = ask(
        port,
        &format!("CONNECT localhost:{} HTTP/1.1\r\n\r\n", echo.port),
    );
    assert_eq!(status, "HTTP/1.1 200 Connection established");
    s.write_all(b"ping").expect("write");
    let mut b = [0u8; 4];
    s.read_exact(&mut b).expect("echo");
    assert_eq!(&b, b"ping");
    drop(s);

    let refused = [
        // A host with no entry.
        (
            format!("CONNECT other.invalid:{} HTTP/1.1\r\n\r\n", other.port),
            "no entry of spec.network.allow names this host and port",
        ),
        // A listed host on another port.
        (
            format!("CONNECT localhost:{} HTTP/1.1\r\n\r\n", other.port),
            "no entry of spec.network.allow names this host and port",
        ),
        // The IP literal of the listed host's address.
        (
            format!("CONNECT 127.0.0.1:{} HTTP/1.1\r\n\r\n", echo.port),
            "needs a cidr entry",
        ),
        (
            format!("CONNECT [::ffff:127.0.0.1]:{} HTTP/1.1\r\n\r\n", echo.port),
            "needs a cidr entry",
        ),
        // Numeric spellings resolvers would take for 127.0.0.1.
        (
            format!("CONNECT 2130706433:{} HTTP/1.1\r\n\r\n", echo.port),
            "not a DNS name or IP address",
        ),
        // The cloud metadata address, by literal and through a plain-HTTP request.
        (
            "CONNECT 169.254.169.254:80 HTTP/1.1\r\n\r\n".into(),
            "needs a cidr entry",
        ),
        (
            "GET http://169.254.169.254/latest/meta-data/ HTTP/1.1\r\n\r\n".into(),
            "needs a cidr entry",
        ),
        // Not a proxy request.
        (
            "GET /index.html HTTP/1.1\r\nHost: localhost\r\n\r\n".into(),
            "only CONNECT and absolute http://",
        ),
    ];
    for (req, why) in &refused {
        let (status, mut s) = ask(port, req);
        assert!(status.starts_with("HTTP/1.1 4"), "{req}: {status}");
        assert!(status.contains("cmp-warden: egress"), "{status}");
        let mut body = String::new();
        let _ = s.read_to_string(&mut body);
        assert!(body.contains(why), "{req}: {body}");
    }
    assert_eq!(
        other.accepted.load(Ordering::SeqCst),
        0,
        "a refused destination was reached"
    );
    let (records, unrecorded) = proxy.finish();
    assert_eq!(unrecorded, 0);
    assert_eq!(records.len(), 1 + refused.len());
    let ok: Vec<_> = records
        .iter()
        .filter(|c| c.decision == Decision::Allowed)
        .collect();
    assert_eq!(ok.len(), 1);
    assert_eq!(ok[0].destination, format!("localhost:{}", echo.port));
    assert_eq!((ok[0].bytes_up, ok[0].bytes_down), (4, 4));
    assert!(ok[0].address.expect("address").ip().is_loopback());
}

/// A client that reads its 403 and keeps the connection open (a command that exits on the
/// answer, before the proxy's drain of what it still sends is over): a proxy finished then
/// still records the refusal with its reason, which the failed request's message and audit
/// event give (mutant: the reason noted after the answer -> a denied record without one).
#[test]
fn a_refusal_finished_while_its_answer_drains_keeps_its_reason() {
    let (proxy, port) = start(vec![], Limits::default());
    let (status, held) = ask(port, "CONNECT other.example.test:443 HTTP/1.1\r\n\r\n");
    assert!(status.starts_with("HTTP/1.1 403"), "{status}");
    let (records, unrecorded) = proxy.finish();
    drop(held);
    assert_eq!(unrecorded, 0);
    assert_eq!(records.len(), 1, "{records:?}");
    assert_eq!(records[0].decision, Decision::Denied);
    let reason = records[0].reason.as_deref().unwrap_or("no reason recorded");
    assert!(
        reason.contains("other.example.test:443") && reason.contains("spec.network.allow"),
        "{reason}"
    );
}

#[test]
fn a_name_that_resolves_to_an_internal_address_needs_an_entry_that_says_so() {
    let up = upstream(false);
    let (proxy, port) = start(
        vec![host("localhost", &[up.port], false)],
        Limits::default(),
    );
    let (status, mut s) = ask(
        port,
        &format!("GET http://localhost:{}/ HTTP/1.1\r\n\r\n", up.port),
    );
    assert!(status.starts_with("HTTP/1.1 403"), "{status}");
    let mut body = String::new();
    let _ = s.read_to_string(&mut body);
    assert!(
        body.contains("resolves only to internal addresses") && body.contains("internal: true"),
        "{body}"
    );
    assert_eq!(up.accepted.load(Ordering::SeqCst), 0);
    drop(proxy);

    // A CIDR entry that covers loopback admits it only when it says `internal: true` (a
    // block like 0.0.0.0/0 would otherwise reach loopback and the metadata address) — by
    // name and by IP literal alike.
    for internal in [false, true] {
        let (proxy, port) = start(
            vec![
                host("localhost", &[up.port], false),
                Rule {
                    target: Target::Cidr(Cidr::parse("0.0.0.0/0").expect("cidr")),
                    ports: vec![up.port, 80],
                    internal,
                },
            ],
            Limits::default(),
        );
        let mut reqs = vec![
            format!("GET http://localhost:{}/x HTTP/1.1\r\n\r\n", up.port),
            format!("CONNECT 127.0.0.1:{} HTTP/1.1\r\n\r\n", up.port),
        ];
        if !internal {
            // (Never sent where it would be admitted: a cloud VM answers it.)
            reqs.push("GET http://169.254.169.254/latest/meta-data/ HTTP/1.1\r\n\r\n".into());
        }
        for req in reqs {
            let (status, mut s) = ask(port, &req);
            if internal {
                assert!(!status.contains("cmp-warden"), "{req}: {status}");
            } else {
                assert!(status.starts_with("HTTP/1.1 403"), "{req}: {status}");
                let mut body = String::new();
                let _ = s.read_to_string(&mut body);
                assert!(body.contains("internal: true"), "{req}: {body}");
            }
        }
        drop(proxy);
        if !internal {
            assert_eq!(up.accepted.load(Ordering::SeqCst), 0);
        }
    }
    // Both reached the upstream with `internal: true`. The upstream counts a connection
    // when its accept() returns, which may come after the proxy's connect() (and the
    // CONNECT's 200) did.
    let deadline = Instant::now() + Duration::from_secs(10);
    while up.accepted.load(Ordering::SeqCst) < 2 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(up.accepted.load(Ordering::SeqCst), 2);
}

#[test]
fn a_request_smuggled_behind_a_forwarded_one_never_leaves() {
    let allowed = upstream(false);
    let forbidden = upstream(false);
    let (proxy, port) = start(
        vec![host("localhost", &[allowed.port], true)],
        Limits::default(),
    );
    let req = format!(
        "POST http://localhost:{a}/first HTTP/1.1\r\nContent-Length: 5\r\nConnection: keep-alive\r\nProxy-Authorization: Basic eA==\r\n\r\nhelloGET http://localhost:{f}/second HTTP/1.1\r\n\r\nCONNECT localhost:{f} HTTP/1.1\r\n\r\n",
        a = allowed.port,
        f = forbidden.port
    );
    let (status, mut s) = ask(port, &req);
    assert_eq!(status, "HTTP/1.1 200 OK");
    let mut body = String::new();
    let _ = s.read_to_string(&mut body);
    assert_eq!(body, "POST /first HTTP/1.1");
    let (records, _) = proxy.finish();
    assert_eq!(records.len(), 1, "{records:?}");
    assert_eq!(records[0].bytes_up as usize, {
        // The rewritten head (the destination as Host, no Connection/Proxy-Authorization,
        // Connection: close) + 5.
        format!(
            "POST /first HTTP/1.1\r\nHost: localhost:{}\r\nContent-Length: 5\r\nConnection: close\r\n\r\n",
            allowed.port
        )
        .len()
            + 5
    });
    assert_eq!(forbidden.accepted.load(Ordering::SeqCst), 0);
    assert_eq!(allowed.requests.lock().expect("lock").len(), 1);
}

/// A plain-HTTP request goes to the host its URL names, which the list decided on: a `Host`
/// naming another (a virtual host behind the same address, as on a shared ingress) is
/// refused before anything is connected; a matching one (any case, a trailing dot, the
/// default port spelled out) is forwarded, and a request without one gets the URL's.
#[test]
fn a_plain_http_host_header_must_name_the_destination_decided_on() {
    let up = upstream(false);
    let (proxy, port) = start(vec![host("localhost", &[up.port], true)], Limits::default());
    for other in [
        "admin.internal".to_owned(),
        format!("localhost:{}", up.port + 1),
        format!("localhost:{}\r\nHost: admin.internal", up.port),
    ] {
        let (status, mut s) = ask(
            port,
            &format!(
                "GET http://localhost:{}/ HTTP/1.1\r\nHost: {other}\r\n\r\n",
                up.port
            ),
        );
        assert!(status.starts_with("HTTP/1.1 403"), "{other}: {status}");
        let mut body = String::new();
        let _ = s.read_to_string(&mut body);
        assert!(body.contains("Host header"), "{body}");
    }
    assert_eq!(
        up.accepted.load(Ordering::SeqCst),
        0,
        "a mismatched Host was forwarded"
    );
    for same in [format!("LOCALHOST.:{}", up.port), String::new()] {
        let host_line = if same.is_empty() {
            String::new()
        } else {
            format!("Host: {same}\r\n")
        };
        let (status, _s) = ask(
            port,
            &format!(
                "GET http://localhost:{}/ok HTTP/1.1\r\n{host_line}\r\n",
                up.port
            ),
        );
        assert_eq!(status, "HTTP/1.1 200 OK", "{same}");
    }
    let (records, _) = proxy.finish();
    assert_eq!(
        records
            .iter()
            .filter(|c| c.decision == Decision::Denied)
            .count(),
        3
    );
}

#[test]
fn the_connection_cap_holds_and_finishing_cuts_every_tunnel_and_joins_every_thread() {
    let echo = upstream(true);
    let limits = Limits {
        max_connections: 100,
        ..Limits::default()
    };
    let (proxy, port) = start(vec![host("localhost", &[echo.port], true)], limits);
    let mut open = Vec::new();
    for _ in 0..100 {
        let (status, s) = ask(
            port,
            &format!("CONNECT localhost:{} HTTP/1.1\r\n\r\n", echo.port),
        );
        assert_eq!(status, "HTTP/1.1 200 Connection established");
        open.push(s);
    }
    assert_eq!(proxy.open_connections(), 100);
    // The 101st is refused at once and named.
    let (status, _s) = ask(
        port,
        &format!("CONNECT localhost:{} HTTP/1.1\r\n\r\n", echo.port),
    );
    assert!(
        status.starts_with("HTTP/1.1 503") && status.contains("maxConnections"),
        "{status}"
    );
    // No thread per tunnel: the proxies' runtime has a fixed few. (The echo upstream in this
    // process holds one per connection.)
    let proxy_threads = std::fs::read_dir("/proc/self/task")
        .expect("tasks")
        .flatten()
        .filter(|t| {
            std::fs::read_to_string(t.path().join("comm")).is_ok_and(|c| c.starts_with("egress"))
        })
        .count();
    assert!(
        proxy_threads <= egress::MAX_THREADS,
        "{proxy_threads} proxy threads"
    );
    // Finishing while all 100 tunnels are open cuts them and joins everything.
    let t = Instant::now();
    let (records, _) = proxy.finish();
    // A liveness bound, not a measurement: open tunnels are cut, not waited for (they would
    // stay open as long as their peers do).
    assert!(t.elapsed() < Duration::from_secs(60), "{:?}", t.elapsed());
    assert_eq!(
        records
            .iter()
            .filter(|c| c.decision == Decision::Allowed)
            .count(),
        100
    );
    assert_eq!(
        records
            .iter()
            .filter(|c| c.decision == Decision::Denied)
            .count(),
        1
    );
    for mut s in open {
        let mut b = [0u8; 1];
        assert_eq!(
            s.read(&mut b).unwrap_or(0),
            0,
            "a tunnel outlived the request"
        );
    }
    // The upstream sees every tunnel's connection end too (counted by the upstream itself:
    // the process's thread count moves with the tests beside this one).
    let deadline = Instant::now() + Duration::from_secs(5);
    while echo.open.load(Ordering::SeqCst) > 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(
        echo.open.load(Ordering::SeqCst),
        0,
        "upstream connections outlived the request"
    );
}

#[test]
fn audit_mode_admits_and_records_what_the_list_would_refuse() {
    let up = upstream(false);
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = l.local_addr().expect("addr").port();
    let proxy = Proxy::new(
        AllowList {
            rules: vec![],
            audit: true,
            hosts: Vec::new(),
            search_domains: false,
        },
        Limits::default(),
    )
    .start(l)
    .expect("start");
    let (status, _s) = ask(
        port,
        &format!("GET http://localhost:{}/ HTTP/1.1\r\n\r\n", up.port),
    );
    assert_eq!(status, "HTTP/1.1 200 OK");
    let (records, _) = proxy.finish();
    assert_eq!(records[0].decision, Decision::Audited);
    assert!(
        records[0]
            .reason
            .as_deref()
            .unwrap_or("")
            .contains("no entry of spec.network.allow"),
        "{records:?}"
    );
}

#[test]
fn a_name_pinned_by_the_policy_goes_to_its_address_and_is_still_checked() {
    let up = upstream(false);
    let (proxy, port) = start(
        vec![host("charts.example.test", &[up.port], true)],
        Limits::default(),
    );
    let (status, _s) = ask(
        port,
        &format!(
            "GET http://charts.example.test:{}/index.yaml HTTP/1.1\r\n\r\n",
            up.port
        ),
    );
    assert_eq!(status, "HTTP/1.1 200 OK");
    assert_eq!(up.accepted.load(Ordering::SeqCst), 1);
    drop(proxy);
}
