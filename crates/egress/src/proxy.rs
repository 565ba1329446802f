//! The proxy: one acceptor thread per request, one thread per connection (plus one per
//! relay direction), all stopped and joined when the request ends.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{IpAddr, Shutdown, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::head::{Head, read_head, split_authority};
use crate::rules::{AllowList, Denial, Host, normalise_name};

/// Bounds of one request's proxy.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Connections open at once (more are refused with 503).
    pub max_connections: usize,
    /// How long a client may take to send its request head.
    pub head_timeout: Duration,
    /// How long connecting to a destination may take.
    pub connect_timeout: Duration,
    /// Connections recorded in detail (the rest are counted).
    pub max_records: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_connections: 100,
            head_timeout: Duration::from_secs(10),
            connect_timeout: Duration::from_secs(10),
            max_records: 256,
        }
    }
}

/// What the proxy did with a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Decision {
    /// The allow list admits it.
    Allowed,
    /// Refused (the reason says why and which field would allow it).
    Denied,
    /// Audit mode: admitted although the list would refuse it (the reason says why).
    Audited,
}

impl Decision {
    /// The metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            Decision::Allowed => "allowed",
            Decision::Denied => "denied",
            Decision::Audited => "audited",
        }
    }
}

/// One connection, as the request's audit event records it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Connection {
    /// `CONNECT`, or the method of a plain-HTTP request.
    pub method: String,
    /// The destination as the client named it (`host:port`).
    pub destination: String,
    /// The address connected to, when one was.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub address: Option<SocketAddr>,
    /// The decision.
    pub decision: Decision,
    /// Why it was denied (or would have been, in audit mode), or why connecting failed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Bytes from the command to the destination.
    pub bytes_up: u64,
    /// Bytes from the destination to the command.
    pub bytes_down: u64,
    /// From accept to close.
    pub duration_ms: u64,
}

/// The destination a command's askpass helper asks for: the repo-server's git credential
/// socket (a reserved name that never resolves).
pub const ASKPASS_HOST: &str = "askpass.cmp-warden.invalid";

/// A request's proxy, before it serves.
#[derive(Debug, Clone)]
pub struct Proxy {
    list: Arc<AllowList>,
    limits: Limits,
    askpass: Option<PathBuf>,
    admit_uid: Option<u32>,
}

struct Shared {
    list: Arc<AllowList>,
    limits: Limits,
    askpass: Option<PathBuf>,
    admit_uid: Option<u32>,
    stopping: AtomicBool,
    /// Live connections' sockets (client, destination), to shut down when the request ends.
    live: Mutex<HashMap<u64, (TcpStream, Option<TcpStream>)>>,
    threads: Mutex<Vec<JoinHandle<()>>>,
    records: Mutex<Vec<Connection>>,
    unrecorded: AtomicU64,
    next_id: AtomicU64,
}

/// A serving proxy. [`ProxyHandle::finish`] stops it and returns its records.
#[derive(Debug)]
pub struct ProxyHandle {
    shared: Arc<Shared>,
    listener: Arc<TcpListener>,
    acceptor: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared").finish_non_exhaustive()
    }
}

/// Small stacks: the threads only copy bytes through a heap buffer.
const STACK: usize = 128 * 1024;
const BUF: usize = 16 * 1024;

impl Proxy {
    /// A proxy for `list` within `limits`.
    pub fn new(list: AllowList, limits: Limits) -> Self {
        Self {
            list: Arc::new(list),
            limits,
            askpass: None,
            admit_uid: None,
        }
    }

    /// Serve only connections whose client socket `uid` owns (a listener on a loopback other
    /// processes share); any other is answered 403 and recorded as denied.
    pub fn admit_only_uid(mut self, uid: u32) -> Self {
        self.admit_uid = Some(uid);
        self
    }

    /// Relay `CONNECT askpass.cmp-warden.invalid:1` to the repo-server's askpass socket at
    /// `path` (a request of a plugin with `provideGitCreds`).
    pub fn with_askpass(mut self, path: PathBuf) -> Self {
        self.askpass = Some(path);
        self
    }

    /// The askpass socket credential requests are relayed to, if any.
    pub fn askpass(&self) -> Option<&std::path::Path> {
        self.askpass.as_deref()
    }

    /// Serve `listener` (a socket in the jail's network namespace) until finished.
    pub fn start(self, listener: TcpListener) -> std::io::Result<ProxyHandle> {
        listener.set_nonblocking(false)?;
        let listener = Arc::new(listener);
        let shared = Arc::new(Shared {
            list: self.list,
            limits: self.limits,
            askpass: self.askpass,
            admit_uid: self.admit_uid,
            stopping: AtomicBool::new(false),
            live: Mutex::new(HashMap::new()),
            threads: Mutex::new(Vec::new()),
            records: Mutex::new(Vec::new()),
            unrecorded: AtomicU64::new(0),
            next_id: AtomicU64::new(0),
        });
        let (s, l) = (shared.clone(), listener.clone());
        let acceptor = std::thread::Builder::new()
            .name("egress-accept".into())
            .stack_size(STACK)
            .spawn(move || accept_loop(&s, &l))?;
        Ok(ProxyHandle {
            shared,
            listener,
            acceptor: Some(acceptor),
        })
    }
}

impl ProxyHandle {
    /// Stop accepting, cut every open connection, join every thread, and return the records
    /// (and how many connections went unrecorded past the record limit).
    pub fn finish(mut self) -> (Vec<Connection>, u64) {
        self.stop();
        let records = std::mem::take(&mut *lock(&self.shared.records));
        (records, self.shared.unrecorded.load(Ordering::Relaxed))
    }

    fn stop(&mut self) {
        self.shared.stopping.store(true, Ordering::SeqCst);
        // Wakes the blocked accept (Linux returns EINVAL from accept on a shut-down listener).
        let _ = rustix::net::shutdown(&*self.listener, rustix::net::Shutdown::Both);
        if let Some(a) = self.acceptor.take() {
            let _ = a.join();
        }
        for (_, (client, dest)) in lock(&self.shared.live).drain() {
            let _ = client.shutdown(Shutdown::Both);
            if let Some(d) = dest {
                let _ = d.shutdown(Shutdown::Both);
            }
        }
        let threads = std::mem::take(&mut *lock(&self.shared.threads));
        for t in threads {
            let _ = t.join();
        }
    }

    /// Connections open now (for tests and the bench).
    pub fn open_connections(&self) -> usize {
        lock(&self.shared.live).len()
    }
}

impl Drop for ProxyHandle {
    fn drop(&mut self) {
        if self.acceptor.is_some() {
            self.stop();
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// A connection refused before its request head is read: answered (briefly: a client that
/// does not read gets nothing more) and recorded as denied.
fn refuse_at_accept(shared: &Arc<Shared>, stream: &TcpStream, status: u16, denial: &Denial) {
    let _ = stream.set_write_timeout(Some(Duration::from_secs(1)));
    refuse(&mut &*stream, status, denial);
    record(
        shared,
        Connection {
            method: String::new(),
            destination: String::new(),
            address: None,
            decision: Decision::Denied,
            reason: Some(denial.to_string()),
            bytes_up: 0,
            bytes_down: 0,
            duration_ms: 0,
        },
    );
}

fn accept_loop(shared: &Arc<Shared>, listener: &TcpListener) {
    loop {
        let (stream, peer) = match listener.accept() {
            Ok(accepted) => accepted,
            Err(_) if shared.stopping.load(Ordering::SeqCst) => return,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => {
                tracing::warn!(error = %e, "egress proxy: accept failed; no more connections for this request");
                return;
            }
        };
        if shared.stopping.load(Ordering::SeqCst) {
            return;
        }
        if let Some(uid) = shared.admit_uid {
            let owner = listener
                .local_addr()
                .ok()
                .and_then(|l| crate::peer::owner(peer, l));
            if owner != Some(uid) {
                refuse_at_accept(shared, &stream, 403, &Denial::Stranger { owner, uid });
                continue;
            }
        }
        let id = shared.next_id.fetch_add(1, Ordering::Relaxed);
        {
            let mut live = lock(&shared.live);
            if live.len() >= shared.limits.max_connections {
                drop(live);
                let denial = Denial::TooManyConnections(shared.limits.max_connections);
                refuse_at_accept(shared, &stream, 503, &denial);
                continue;
            }
            match stream.try_clone() {
                Ok(c) => {
                    live.insert(id, (c, None));
                }
                Err(_) => continue,
            }
        }
        // Reap finished connection threads so the list stays as short as the live set.
        {
            let mut threads = lock(&shared.threads);
            let (done, running): (Vec<_>, Vec<_>) = std::mem::take(&mut *threads)
                .into_iter()
                .partition(|t| t.is_finished());
            *threads = running;
            for t in done {
                let _ = t.join();
            }
        }
        let s = shared.clone();
        let spawned = std::thread::Builder::new()
            .name("egress-conn".into())
            .stack_size(STACK)
            .spawn(move || {
                let c = serve(&s, id, stream);
                lock(&s.live).remove(&id);
                record(&s, c);
            });
        match spawned {
            Ok(t) => lock(&shared.threads).push(t),
            Err(e) => {
                lock(&shared.live).remove(&id);
                tracing::warn!(error = %e, "egress proxy: no thread for a connection");
            }
        }
    }
}

fn record(shared: &Shared, c: Connection) {
    tracing::info!(
        destination = %c.destination,
        address = %c.address.map(|a| a.to_string()).unwrap_or_default(),
        decision = c.decision.as_str(),
        reason = c.reason.as_deref().unwrap_or(""),
        bytes_up = c.bytes_up,
        bytes_down = c.bytes_down,
        "egress"
    );
    let mut records = lock(&shared.records);
    if records.len() < shared.limits.max_records {
        records.push(c);
    } else {
        shared.unrecorded.fetch_add(1, Ordering::Relaxed);
    }
}

/// Answer a refusal: the status, a reason phrase naming the destination and the policy field
/// (tools print the phrase of a failed CONNECT), and the same text as the body.
fn refuse(w: &mut impl Write, status: u16, denial: &Denial) {
    let text = denial.to_string();
    let phrase: String = format!("cmp-warden: {text}")
        .chars()
        .map(|c| {
            if c.is_ascii_graphic() || c == ' ' {
                c
            } else {
                '?'
            }
        })
        .collect();
    let _ = write!(
        w,
        "HTTP/1.1 {status} {phrase}\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{text}\n",
        text.len() + 1
    );
    let _ = w.flush();
}

/// Steps 1–5 for one connection.
fn serve(shared: &Shared, id: u64, mut client: TcpStream) -> Connection {
    let t0 = Instant::now();
    let mut c = Connection {
        method: String::new(),
        destination: String::new(),
        address: None,
        decision: Decision::Denied,
        reason: None,
        bytes_up: 0,
        bytes_down: 0,
        duration_ms: 0,
    };
    let finish = |mut c: Connection| {
        c.duration_ms = t0.elapsed().as_millis() as u64;
        c
    };
    // 1. One bounded head, within the head timeout.
    let _ = client.set_read_timeout(Some(shared.limits.head_timeout));
    let head = match read_head(&mut client) {
        Ok(Some(h)) => h,
        Ok(None) => {
            c.reason = Some("the client sent nothing".into());
            return finish(c);
        }
        Err(why) => {
            let d = Denial::BadRequest(why);
            refuse(&mut client, 400, &d);
            c.reason = Some(d.to_string());
            return finish(c);
        }
    };
    let _ = client.set_read_timeout(None);
    c.method = head.method.clone();
    let (host, port, forward) = match destination(&head) {
        Ok(d) => d,
        Err(d) => {
            refuse(&mut client, 400, &d);
            c.reason = Some(d.to_string());
            return finish(c);
        }
    };
    c.destination = if host.contains(':') && !host.starts_with('[') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    };
    // The git credential relay: only by CONNECT, only when the request has it.
    if host.eq_ignore_ascii_case(ASKPASS_HOST) && forward.is_none() {
        let Some(path) = &shared.askpass else {
            let d = Denial::BadRequest(
                "git credentials are not available to this request: the plugin does not set provideGitCreds, or the repo-server sent no ARGOCD_ASK_PASS_SOCK".into(),
            );
            refuse(&mut client, 403, &d);
            c.reason = Some(d.to_string());
            return finish(c);
        };
        let socket = match UnixStream::connect(path) {
            Ok(s) => s,
            Err(e) => {
                let d = Denial::BadRequest(format!(
                    "the repo-server's askpass socket {} cannot be reached: {e}",
                    path.display()
                ));
                refuse(&mut client, 502, &d);
                c.decision = Decision::Allowed;
                c.reason = Some(d.to_string());
                return finish(c);
            }
        };
        c.decision = Decision::Allowed;
        if client
            .write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
            .is_err()
        {
            return finish(c);
        }
        let (up, down) = tunnel(client, Upstream::Unix(socket), &head.rest);
        c.bytes_up = up;
        c.bytes_down = down;
        return finish(c);
    }
    // 2–3. Decide, resolve, connect to a checked address.
    let upstream = match connect(shared, &host, port) {
        Ok((stream, addr, audited)) => {
            c.address = Some(addr);
            c.decision = if audited.is_some() {
                Decision::Audited
            } else {
                Decision::Allowed
            };
            c.reason = audited;
            stream
        }
        Err((status, d, decision)) => {
            refuse(&mut client, status, &d);
            c.decision = decision;
            c.reason = Some(d.to_string());
            return finish(c);
        }
    };
    if let (Some(entry), Ok(clone)) = (lock(&shared.live).get_mut(&id), upstream.try_clone()) {
        entry.1 = Some(clone);
    }
    if shared.stopping.load(Ordering::SeqCst) {
        let _ = upstream.shutdown(Shutdown::Both);
        return finish(c);
    }
    // 4. Relay.
    let (up, down) = match forward {
        None => {
            if client
                .write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
                .is_err()
            {
                return finish(c);
            }
            tunnel(client, Upstream::Tcp(upstream), &head.rest)
        }
        Some(path) => forward_one(client, upstream, &head, &path),
    };
    c.bytes_up = up;
    c.bytes_down = down;
    // 5. Recorded by the caller.
    finish(c)
}

/// The destination of a head: `CONNECT host:port`, or an absolute `http://` URL (whose
/// origin-form path is returned for forwarding).
fn destination(head: &Head) -> Result<(String, u16, Option<String>), Denial> {
    if head.method.eq_ignore_ascii_case("CONNECT") {
        let (h, p) = split_authority(&head.target, None).map_err(Denial::BadRequest)?;
        return Ok((h, p, None));
    }
    let Some(rest) = head
        .target
        .strip_prefix("http://")
        .or_else(|| head.target.strip_prefix("HTTP://"))
    else {
        return Err(Denial::BadRequest(format!(
            "{} {}: only CONNECT and absolute http:// requests are proxied (https goes through CONNECT)",
            head.method, head.target
        )));
    };
    let (authority, path) = match rest.find(['/', '?']) {
        Some(i) => (&rest[..i], rest[i..].to_owned()),
        None => (rest, "/".to_owned()),
    };
    if authority.contains('@') {
        return Err(Denial::BadRequest(
            "credentials in the proxy URL's authority are not forwarded".into(),
        ));
    }
    let (h, p) = split_authority(authority, Some(80)).map_err(Denial::BadRequest)?;
    let path = if path.starts_with('?') {
        format!("/{path}")
    } else {
        path
    };
    Ok((h, p, Some(path)))
}

type Refusal = (u16, Denial, Decision);

/// Decide `host:port` against the list, resolve it here, and connect to the first address the
/// list admits. Returns the stream, the address, and in audit mode what the list would have
/// refused.
fn connect(
    shared: &Shared,
    host: &str,
    port: u16,
) -> Result<(TcpStream, SocketAddr, Option<String>), Refusal> {
    let list = &shared.list;
    let host = normalise_name(host).map_err(|d| (403, d, Decision::Denied))?;
    let mut would_deny: Option<String> = None;
    let entries = match list.entries_for(&host, port) {
        Ok(e) => e,
        Err(d) if list.audit => {
            would_deny = Some(d.to_string());
            Vec::new()
        }
        Err(d) => return Err((403, d, Decision::Denied)),
    };
    let (name, candidates): (String, Vec<IpAddr>) = match &host {
        Host::Ip(ip) => (ip.to_string(), vec![*ip]),
        Host::Name(n) if list.fixed_addresses(n).is_some() => (
            n.clone(),
            list.fixed_addresses(n).unwrap_or_default().to_vec(),
        ),
        Host::Name(n) => {
            let addrs = (n.as_str(), port).to_socket_addrs().map_err(|e| {
                (
                    403,
                    Denial::Unresolvable {
                        host: n.clone(),
                        error: e.to_string(),
                    },
                    Decision::Denied,
                )
            })?;
            let mut ips: Vec<IpAddr> = addrs.map(|a| a.ip()).collect();
            ips.dedup();
            (n.clone(), ips)
        }
    };
    // IP literals were admitted by a CIDR entry, which names its addresses explicitly.
    let usable: Vec<IpAddr> = match &host {
        Host::Ip(_) => candidates.clone(),
        Host::Name(_) => candidates
            .iter()
            .copied()
            .filter(|ip| list.address_allowed(&entries, *ip, port, own_address(*ip)))
            .collect(),
    };
    let usable = if usable.is_empty() && !candidates.is_empty() {
        let d = Denial::Internal {
            host: name,
            port,
            addresses: candidates.clone(),
        };
        if !list.audit {
            return Err((403, d, Decision::Denied));
        }
        would_deny.get_or_insert(d.to_string());
        candidates
    } else {
        usable
    };
    let mut last = String::from("no address");
    for ip in usable {
        let addr = SocketAddr::new(ip, port);
        match TcpStream::connect_timeout(&addr, shared.limits.connect_timeout) {
            Ok(s) => return Ok((s, addr, would_deny)),
            Err(e) => last = format!("{addr}: {e}"),
        }
    }
    Err((
        502,
        Denial::BadRequest(format!(
            "connecting to {}:{port} failed ({last})",
            host_text(&host)
        )),
        if would_deny.is_some() {
            Decision::Audited
        } else {
            Decision::Allowed
        },
    ))
}

fn host_text(h: &Host) -> String {
    match h {
        Host::Name(n) => n.clone(),
        Host::Ip(ip) => ip.to_string(),
    }
}

/// Whether `ip` is one of this node's (the pod's) own addresses: binding to it succeeds only
/// then.
fn own_address(ip: IpAddr) -> bool {
    std::net::UdpSocket::bind(SocketAddr::new(ip, 0)).is_ok()
}

/// What a tunnel's far side is: a destination, or the repo-server's askpass socket.
enum Upstream {
    Tcp(TcpStream),
    Unix(UnixStream),
}

impl Upstream {
    fn try_clone(&self) -> std::io::Result<Upstream> {
        Ok(match self {
            Upstream::Tcp(s) => Upstream::Tcp(s.try_clone()?),
            Upstream::Unix(s) => Upstream::Unix(s.try_clone()?),
        })
    }
}

/// One side of a relay.
trait Half: Read + Write {
    fn shut(&self, how: Shutdown);
}

impl Half for TcpStream {
    fn shut(&self, how: Shutdown) {
        let _ = self.shutdown(how);
    }
}

impl Half for Upstream {
    fn shut(&self, how: Shutdown) {
        let _ = match self {
            Upstream::Tcp(s) => s.shutdown(how),
            Upstream::Unix(s) => s.shutdown(how),
        };
    }
}

impl Read for Upstream {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        match self {
            Upstream::Tcp(s) => s.read(buf),
            Upstream::Unix(s) => s.read(buf),
        }
    }
}

impl Write for Upstream {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match self {
            Upstream::Tcp(s) => s.write(buf),
            Upstream::Unix(s) => s.write(buf),
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Relay both ways until both sides are done; returns (bytes up, bytes down).
fn tunnel(client: TcpStream, mut upstream: Upstream, pending: &[u8]) -> (u64, u64) {
    let (c2, u2) = match (client.try_clone(), upstream.try_clone()) {
        (Ok(c), Ok(u)) => (c, u),
        _ => return (0, 0),
    };
    let down = std::thread::Builder::new()
        .name("egress-down".into())
        .stack_size(STACK)
        .spawn(move || copy(u2, c2));
    let mut up = 0;
    if !pending.is_empty() && upstream.write_all(pending).is_ok() {
        up += pending.len() as u64;
    }
    up += copy(client, upstream);
    let down = down.map(|t| t.join().unwrap_or(0)).unwrap_or(0);
    (up, down)
}

/// Copy until EOF or an error, then pass the EOF on; returns the bytes copied.
fn copy(mut from: impl Half, mut to: impl Half) -> u64 {
    let mut buf = vec![0u8; BUF];
    let mut n = 0u64;
    loop {
        match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(k) => {
                if to.write_all(&buf[..k]).is_err() {
                    break;
                }
                n += k as u64;
            }
        }
    }
    to.shut(Shutdown::Write);
    from.shut(Shutdown::Read);
    n
}

/// Hop-by-hop and proxy headers that are not forwarded.
const DROPPED: &[&str] = &[
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authorization",
    "proxy-authenticate",
    "te",
    "trailer",
    "upgrade",
];

/// Forward exactly one plain-HTTP request (head and a `Content-Length` body) with
/// `Connection: close`, then relay the response. Nothing else the client sends on this
/// connection is forwarded, so a second request smuggled behind the first never leaves.
fn forward_one(client: TcpStream, upstream: TcpStream, head: &Head, path: &str) -> (u64, u64) {
    let mut c = &client;
    if head.header("transfer-encoding").is_some() {
        refuse(
            &mut c,
            501,
            &Denial::BadRequest(
                "chunked request bodies are not forwarded over plain HTTP; use https (CONNECT)"
                    .into(),
            ),
        );
        return (0, 0);
    }
    let length: u64 = match head.header("content-length").map(str::parse) {
        None => 0,
        Some(Ok(n)) => n,
        Some(Err(_)) => {
            refuse(
                &mut c,
                400,
                &Denial::BadRequest("bad Content-Length".into()),
            );
            return (0, 0);
        }
    };
    let mut out = format!("{} {path} HTTP/1.1\r\n", head.method);
    for (k, v) in &head.headers {
        if !DROPPED.contains(&k.to_ascii_lowercase().as_str()) {
            out.push_str(&format!("{k}: {v}\r\n"));
        }
    }
    out.push_str("Connection: close\r\n\r\n");
    let mut u = &upstream;
    if u.write_all(out.as_bytes()).is_err() {
        return (0, 0);
    }
    let mut up = out.len() as u64;
    let first = head.rest.len().min(length as usize);
    if u.write_all(&head.rest[..first]).is_err() {
        return (up, 0);
    }
    up += first as u64;
    let mut remaining = length - first as u64;
    let mut buf = vec![0u8; BUF];
    let mut cr = &client;
    while remaining > 0 {
        let want = remaining.min(BUF as u64) as usize;
        match cr.read(&mut buf[..want]) {
            Ok(0) | Err(_) => break,
            Ok(k) => {
                if u.write_all(&buf[..k]).is_err() {
                    break;
                }
                up += k as u64;
                remaining -= k as u64;
            }
        }
    }
    let down = match client.try_clone() {
        Ok(c) => copy(Upstream::Tcp(upstream), c),
        Err(_) => 0,
    };
    let _ = client.shutdown(Shutdown::Both);
    (up, down)
}
