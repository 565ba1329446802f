//! The egress proxy's cost, against a direct connection in the same run: latency of a short
//! request/response exchange on a fresh connection, throughput of a bulk transfer, and the
//! process's memory with 100 tunnels open at once. Prints one JSON line (benches/egress.py).
//! `BENCH_ITERATIONS` sets the exchanges per case; `BENCH_MIB` the bulk size.
#![allow(clippy::print_stdout)]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use egress::{Limits, Proxy};
use vocab::egress::{AllowList, HostPattern, Rule, Target};

/// An upstream that answers each 64-byte message with 64 bytes, and sinks or sources bulk data.
fn upstream() -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    let a = l.local_addr().expect("addr");
    std::thread::spawn(move || {
        for s in l.incoming().flatten() {
            std::thread::spawn(move || {
                let mut s = s;
                let mut cmd = [0u8; 1];
                if s.read_exact(&mut cmd).is_err() {
                    return;
                }
                match cmd[0] {
                    b'p' => {
                        let mut b = [0u8; 64];
                        while s.read_exact(&mut b).is_ok() {
                            if s.write_all(&b).is_err() {
                                break;
                            }
                        }
                    }
                    b'b' => {
                        let mut n = [0u8; 8];
                        if s.read_exact(&mut n).is_err() {
                            return;
                        }
                        let mut left = u64::from_le_bytes(n);
                        let buf = vec![7u8; 64 * 1024];
                        while left > 0 {
                            let k = left.min(buf.len() as u64) as usize;
                            if s.write_all(&buf[..k]).is_err() {
                                return;
                            }
                            left -= k as u64;
                        }
                    }
                    _ => {
                        // Hold the connection open until the peer closes.
                        let mut b = [0u8; 1];
                        let _ = s.read(&mut b);
                    }
                }
            });
        }
    });
    a
}

fn connect(via: Option<u16>, up: SocketAddr) -> TcpStream {
    match via {
        None => TcpStream::connect(up).expect("direct"),
        Some(p) => {
            let mut s = TcpStream::connect(("127.0.0.1", p)).expect("proxy");
            write!(s, "CONNECT localhost:{} HTTP/1.1\r\n\r\n", up.port()).expect("connect");
            let mut head = Vec::new();
            let mut b = [0u8; 1];
            while !head.ends_with(b"\r\n\r\n") {
                s.read_exact(&mut b).expect("head");
                head.push(b[0]);
            }
            assert!(
                head.starts_with(b"HTTP/1.1 200"),
                "{}",
                String::from_utf8_lossy(&head)
            );
            s
        }
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Fresh connection + one 64-byte exchange, in microseconds.
fn latency(via: Option<u16>, up: SocketAddr, n: usize) -> f64 {
    let mut times = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        let mut s = connect(via, up);
        s.set_nodelay(true).expect("nodelay");
        s.write_all(b"p").expect("cmd");
        s.write_all(&[1u8; 64]).expect("write");
        let mut b = [0u8; 64];
        s.read_exact(&mut b).expect("read");
        times.push(t.elapsed().as_secs_f64() * 1e6);
    }
    median(times)
}

/// MiB/s of a bulk download.
fn throughput(via: Option<u16>, up: SocketAddr, mib: u64) -> f64 {
    let mut s = connect(via, up);
    let bytes = mib << 20;
    s.write_all(b"b").expect("cmd");
    s.write_all(&bytes.to_le_bytes()).expect("n");
    let t = Instant::now();
    let mut buf = vec![0u8; 256 * 1024];
    let mut got = 0u64;
    while got < bytes {
        let k = s.read(&mut buf).expect("read");
        assert!(k > 0, "short transfer");
        got += k as u64;
    }
    mib as f64 / t.elapsed().as_secs_f64()
}

fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .expect("status")
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

fn threads() -> usize {
    std::fs::read_dir("/proc/self/task").expect("tasks").count()
}

fn main() {
    let n: usize = std::env::var("BENCH_ITERATIONS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2000);
    let mib: u64 = std::env::var("BENCH_MIB")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(512);
    let up = upstream();
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = l.local_addr().expect("addr").port();
    let proxy = Proxy::new(
        AllowList {
            rules: vec![Rule {
                target: Target::Host(HostPattern::parse("localhost").expect("host")),
                ports: vec![up.port()],
                internal: true,
            }],
            audit: false,
            hosts: Vec::new(),
            search_domains: false,
        },
        Limits {
            max_connections: 1000,
            max_records: 100_000,
            ..Limits::default()
        },
    )
    .start(l)
    .expect("start");
    // Warm up both paths.
    latency(None, up, 50.min(n));
    latency(Some(port), up, 50.min(n));
    let direct_us = latency(None, up, n);
    let proxied_us = latency(Some(port), up, n);
    let direct_mibs = throughput(None, up, mib);
    let proxied_mibs = throughput(Some(port), up, mib);
    // 100 tunnels held open at once: the proxy's memory and threads.
    let (rss0, threads0) = (rss_kib(), threads());
    let open: Vec<TcpStream> = (0..100)
        .map(|_| {
            let mut s = connect(Some(port), up);
            s.write_all(b"h").expect("hold");
            s
        })
        .collect();
    std::thread::sleep(Duration::from_millis(200));
    let (rss100, threads100) = (rss_kib(), threads());
    drop(open);
    let (records, _) = proxy.finish();
    println!(
        "{}",
        serde_json::json!({
            "iterations": n,
            "bulk_mib": mib,
            "latency_direct_us": direct_us,
            "latency_proxied_us": proxied_us,
            "latency_ratio": proxied_us / direct_us,
            "throughput_direct_mibs": direct_mibs,
            "throughput_proxied_mibs": proxied_mibs,
            "throughput_ratio": proxied_mibs / direct_mibs,
            "rss_before_kib": rss0,
            "rss_100_tunnels_kib": rss100,
            "rss_per_tunnel_kib": (rss100.saturating_sub(rss0)) as f64 / 100.0,
            "threads_per_tunnel": (threads100.saturating_sub(threads0)) as f64 / 100.0,
            "connections_recorded": records.len(),
        })
    );
}
