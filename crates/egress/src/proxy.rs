//! The proxy: every connection is a task on one small runtime that all requests' proxies
//! share (one worker thread; name lookups and socket-owner checks on at most
//! [`BLOCKING_THREADS`] more), so connections cost the supervisor memory — bounded by
//! [`MAX_CONNECTIONS_TOTAL`] across requests — and never a thread each.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream, UnixStream};
use tokio::sync::watch;

use vocab::egress::{AllowList, Connection, Decision, Denial};

use crate::head::{Head, MAX_HEAD, parse_head};

mod decide;
use decide::{connect, destination, same_host};

/// Bounds of one request's proxy.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Connections open at once (more are refused with 503).
    pub max_connections: usize,
    /// How long a client may take to send its whole request head (one deadline from accept,
    /// however the bytes trickle in).
    pub head_timeout: Duration,
    /// How long resolving and connecting to a destination may take together.
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

/// Proxy connections open at once across every request of the process: beside each
/// request's `maxConnections`, what bounds the supervisor's descriptors and memory however
/// many requests use their proxies at once (more are refused with 503, naming it).
pub const MAX_CONNECTIONS_TOTAL: usize = 1024;

/// Threads for name lookups and socket-owner checks (blocking calls), shared by all proxies:
/// more lookups than this wait their turn within their connection's deadline.
pub const BLOCKING_THREADS: usize = 4;

/// The most of a destination kept in a record or a log line.
const MAX_DESTINATION: usize = 270;

/// A connection's record before anything is known of it: refused until decided otherwise.
fn denied_connection() -> Connection {
    Connection {
        method: String::new(),
        destination: String::new(),
        address: None,
        decision: Decision::Denied,
        reason: None,
        bytes_up: 0,
        bytes_down: 0,
        duration_ms: 0,
    }
}

/// The destination a command's askpass helper asks for: the repo-server's git credential
/// socket (a reserved name that never resolves).
pub const ASKPASS_HOST: &str = "askpass.cmp-warden.invalid";

/// How the proxy reaches the repo-server's askpass socket (the supervisor's: it connects as
/// the socket's owner, which its capabilities allow and this crate knows nothing of).
pub type AskpassConnect =
    Arc<dyn Fn(&std::path::Path) -> std::io::Result<std::os::unix::net::UnixStream> + Send + Sync>;

/// A request's proxy, before it serves.
#[derive(Clone)]
pub struct Proxy {
    list: Arc<AllowList>,
    limits: Limits,
    askpass: Option<(PathBuf, AskpassConnect)>,
    admit_uid: Option<u32>,
    deadline: Option<Instant>,
}

struct Shared {
    list: Arc<AllowList>,
    limits: Limits,
    askpass: Option<(PathBuf, AskpassConnect)>,
    admit_uid: Option<u32>,
    deadline: Option<Instant>,
    /// Turns true when the request ends: every task of this proxy returns at once.
    stop: watch::Receiver<bool>,
    /// Connections of this request open now.
    live: AtomicUsize,
    /// Tasks of this proxy still running (the acceptor and each connection), for `finish`.
    tasks: Mutex<usize>,
    tasks_done: Condvar,
    records: Mutex<Vec<Connection>>,
    unrecorded: AtomicU64,
    accept_failures: AtomicU64,
}

/// A serving proxy. [`ProxyHandle::finish`] stops it and returns its records.
#[derive(Debug)]
pub struct ProxyHandle {
    shared: Arc<Shared>,
    stop: Option<watch::Sender<bool>>,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared").finish_non_exhaustive()
    }
}

/// Relay buffer per direction.
const BUF: usize = 8 * 1024;

/// Connections open across every proxy of the process.
static TOTAL: AtomicUsize = AtomicUsize::new(0);

/// The runtime all proxies share, built on first use.
fn runtime() -> std::io::Result<&'static tokio::runtime::Runtime> {
    static RT: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    static BUILDING: Mutex<()> = Mutex::new(());
    if let Some(rt) = RT.get() {
        return Ok(rt);
    }
    let _one = lock(&BUILDING);
    if let Some(rt) = RT.get() {
        return Ok(rt);
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .max_blocking_threads(BLOCKING_THREADS)
        .thread_name("egress")
        .thread_stack_size(256 * 1024)
        .enable_io()
        .enable_time()
        .build()?;
    Ok(RT.get_or_init(|| rt))
}

impl std::fmt::Debug for Proxy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Proxy")
            .field("list", &self.list)
            .field("limits", &self.limits)
            .field("askpass", &self.askpass())
            .field("admit_uid", &self.admit_uid)
            .field("deadline", &self.deadline)
            .finish()
    }
}

/// The threads the proxies' runtime may use at most (its worker and blocking threads).
pub const MAX_THREADS: usize = 1 + BLOCKING_THREADS;

impl Proxy {
    /// A proxy for `list` within `limits`.
    pub fn new(list: AllowList, limits: Limits) -> Self {
        Self {
            list: Arc::new(list),
            limits,
            askpass: None,
            admit_uid: None,
            deadline: None,
        }
    }

    /// Serve only connections whose client socket `uid` owns (a listener on a loopback other
    /// processes share); any other is answered 403 and recorded as denied.
    pub fn admit_only_uid(mut self, uid: u32) -> Self {
        self.admit_uid = Some(uid);
        self
    }

    /// Relay `CONNECT askpass.cmp-warden.invalid:1` to the repo-server's askpass socket at
    /// `path` (a request of a plugin with `provideGitCreds`), reached by `connect`.
    pub fn with_askpass(mut self, path: PathBuf, connect: AskpassConnect) -> Self {
        self.askpass = Some((path, connect));
        self
    }

    /// Resolving and connecting never run past `deadline` (the request's).
    pub fn with_deadline(mut self, deadline: Option<Instant>) -> Self {
        self.deadline = deadline;
        self
    }

    /// The askpass socket credential requests are relayed to, if any.
    pub fn askpass(&self) -> Option<&std::path::Path> {
        self.askpass.as_ref().map(|(p, _)| p.as_path())
    }

    /// Serve `listener` (a socket in the jail's network namespace) until finished.
    pub fn start(self, listener: std::net::TcpListener) -> std::io::Result<ProxyHandle> {
        let rt = runtime()?;
        listener.set_nonblocking(true)?;
        let listener = {
            let _in = rt.enter();
            TcpListener::from_std(listener)?
        };
        let (tx, rx) = watch::channel(false);
        let shared = Arc::new(Shared {
            list: self.list,
            limits: self.limits,
            askpass: self.askpass,
            admit_uid: self.admit_uid,
            deadline: self.deadline,
            stop: rx,
            live: AtomicUsize::new(0),
            tasks: Mutex::new(0),
            tasks_done: Condvar::new(),
            records: Mutex::new(Vec::new()),
            unrecorded: AtomicU64::new(0),
            accept_failures: AtomicU64::new(0),
        });
        let task = Task::new(&shared);
        rt.spawn(accept_loop(shared.clone(), listener, task));
        Ok(ProxyHandle {
            shared,
            stop: Some(tx),
        })
    }
}

impl ProxyHandle {
    /// Stop accepting, cut every open connection, wait for every task, and return the
    /// records (and how many connections went unrecorded past the record limit).
    pub fn finish(mut self) -> (Vec<Connection>, u64) {
        self.stop();
        let records = std::mem::take(&mut *lock(&self.shared.records));
        (records, self.shared.unrecorded.load(Ordering::Relaxed))
    }

    fn stop(&mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(true);
        }
        // Each task returns at its next await; a lookup still running on a blocking thread
        // is abandoned, not waited for.
        let until = Instant::now() + Duration::from_secs(10);
        let mut n = lock(&self.shared.tasks);
        while *n > 0 {
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                tracing::warn!(
                    tasks = *n,
                    "egress proxy: tasks still running 10 s after the request ended"
                );
                break;
            }
            n = self
                .shared
                .tasks_done
                .wait_timeout(n, left)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    /// Connections open now (for tests and the bench).
    pub fn open_connections(&self) -> usize {
        self.shared.live.load(Ordering::SeqCst)
    }
}

impl Drop for ProxyHandle {
    fn drop(&mut self) {
        self.stop();
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// A running task of one proxy, counted until dropped.
struct Task(Arc<Shared>);

impl Task {
    fn new(shared: &Arc<Shared>) -> Self {
        *lock(&shared.tasks) += 1;
        Task(shared.clone())
    }
}

impl Drop for Task {
    fn drop(&mut self) {
        *lock(&self.0.tasks) -= 1;
        self.0.tasks_done.notify_all();
    }
}

/// One open connection, counted in its request's and the process's totals until dropped.
struct Open(Arc<Shared>);

impl Drop for Open {
    fn drop(&mut self) {
        self.0.live.fetch_sub(1, Ordering::SeqCst);
        TOTAL.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Resolves when the request ends.
async fn stopped(stop: &mut watch::Receiver<bool>) {
    let _ = stop.wait_for(|s| *s).await;
}

/// Take a place for one more connection, or say which cap is full.
fn admit(shared: &Arc<Shared>) -> Result<Open, Denial> {
    let max = shared.limits.max_connections;
    if shared
        .live
        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| {
            (n < max).then_some(n + 1)
        })
        .is_err()
    {
        return Err(Denial::TooManyConnections(max));
    }
    if TOTAL
        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| {
            (n < MAX_CONNECTIONS_TOTAL).then_some(n + 1)
        })
        .is_err()
    {
        shared.live.fetch_sub(1, Ordering::SeqCst);
        return Err(Denial::ServerFull(MAX_CONNECTIONS_TOTAL));
    }
    Ok(Open(shared.clone()))
}

async fn accept_loop(shared: Arc<Shared>, listener: TcpListener, _task: Task) {
    let mut stop = shared.stop.clone();
    loop {
        let accepted = tokio::select! {
            _ = stopped(&mut stop) => return,
            r = listener.accept() => r,
        };
        let (stream, peer) = match accepted {
            Ok(a) => a,
            Err(e) => {
                // Out of descriptors (EMFILE, ENFILE) or a connection gone before accept:
                // back off rather than spin, and say so once per request.
                if shared.accept_failures.fetch_add(1, Ordering::Relaxed) == 0 {
                    tracing::warn!(error = %e, "egress proxy: accept failed; retrying every 100 ms (said once per request)");
                }
                tokio::select! {
                    _ = stopped(&mut stop) => return,
                    _ = tokio::time::sleep(Duration::from_millis(100)) => continue,
                }
            }
        };
        match admit(&shared) {
            Ok(open) => {
                let task = Task::new(&shared);
                tokio::spawn(connection(shared.clone(), stream, peer, open, task));
            }
            Err(denial) => {
                let mut c = denied_connection();
                c.reason = Some(denial.to_string());
                record(&shared, c);
                // Answered and closed on a task of its own (no place, no head read).
                let task = Task::new(&shared);
                let mut stop = shared.stop.clone();
                tokio::spawn(async move {
                    let _task = task;
                    let mut stream = stream;
                    tokio::select! {
                        _ = stopped(&mut stop) => {}
                        _ = answer(&mut stream, 503, &denial) => {}
                    }
                });
            }
        }
    }
}

/// Serve one connection until it ends or the request does, then record it.
async fn connection(
    shared: Arc<Shared>,
    stream: TcpStream,
    peer: SocketAddr,
    open: Open,
    _task: Task,
) {
    let t0 = Instant::now();
    let mut stop = shared.stop.clone();
    let mut c = denied_connection();
    let bytes = Bytes::default();
    tokio::select! {
        _ = stopped(&mut stop) => {}
        _ = serve(&shared, stream, peer, &mut c, &bytes) => {}
    }
    drop(open);
    c.bytes_up = bytes.up.load(Ordering::Relaxed);
    c.bytes_down = bytes.down.load(Ordering::Relaxed);
    c.duration_ms = t0.elapsed().as_millis() as u64;
    record(&shared, c);
}

#[derive(Default)]
struct Bytes {
    up: AtomicU64,
    down: AtomicU64,
}

fn record(shared: &Shared, c: Connection) {
    // The audit event keeps the record; the log line is for debugging.
    tracing::debug!(
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

/// A refusal: the status, a reason phrase naming the destination and the policy field (tools
/// print the phrase of a failed CONNECT), and the same text as the body.
fn refusal(status: u16, denial: &Denial) -> String {
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
    format!(
        "HTTP/1.1 {status} {phrase}\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{text}\n",
        text.len() + 1
    )
}

/// Note `denial` as the connection's reason, then answer `status` for it. The reason comes
/// first: a proxy finished while the answer drains (the command exited on the 403) drops this
/// future, and its record must still say why.
async fn refuse(client: &mut TcpStream, c: &mut Connection, status: u16, denial: Denial) {
    c.reason = Some(denial.to_string());
    answer(client, status, &denial).await;
}

/// Write the refusal and close our side, then discard what the client still sends for a
/// moment, so closing does not reset the connection before the client read the answer (all
/// within 2 s: a client that neither reads nor stops gets nothing more).
async fn answer(client: &mut TcpStream, status: u16, denial: &Denial) {
    let text = refusal(status, denial);
    let _ = tokio::time::timeout(Duration::from_secs(1), async {
        client.write_all(text.as_bytes()).await?;
        client.shutdown().await
    })
    .await;
    let _ = tokio::time::timeout(Duration::from_secs(1), async {
        let mut sink = [0u8; 1024];
        let mut left = 64 * 1024;
        while left > 0 {
            match client.read(&mut sink).await {
                Ok(0) | Err(_) => break,
                Ok(n) => left -= n.min(left),
            }
        }
    })
    .await;
}

/// The first `MAX_DESTINATION` characters of `s`.
fn bounded(s: &str) -> String {
    if s.len() <= MAX_DESTINATION {
        return s.to_owned();
    }
    let mut end = MAX_DESTINATION;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &s[..end])
}

/// Read one head within `MAX_HEAD` bytes: `Ok(None)` if the client closed first.
async fn read_head(client: &mut TcpStream) -> Result<Option<Head>, String> {
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 1024];
    loop {
        let n = client
            .read(&mut chunk)
            .await
            .map_err(|e| format!("reading the request: {e}"))?;
        if n == 0 {
            return if buf.is_empty() {
                Ok(None)
            } else {
                Err("the client closed mid-request".into())
            };
        }
        buf.extend_from_slice(&chunk[..n]);
        if let Some(h) = parse_head(&buf)? {
            return Ok(Some(h));
        }
        if buf.len() >= MAX_HEAD {
            return Err(format!("request head larger than {MAX_HEAD} bytes"));
        }
    }
}

/// Steps 1–4 of the crate's doc for one connection (5, the record, is the caller's).
async fn serve(
    shared: &Shared,
    mut client: TcpStream,
    peer: SocketAddr,
    c: &mut Connection,
    bytes: &Bytes,
) {
    // 0. On a loopback the pod shares: only the request's own processes.
    // The address the client connected to, not the listener's: a listener bound to every
    // address has no single one.
    if let Some(uid) = shared.admit_uid {
        let owner = match client.local_addr() {
            Ok(local) => tokio::task::spawn_blocking(move || crate::peer::owner(peer, local))
                .await
                .ok()
                .flatten(),
            Err(_) => None,
        };
        if owner != Some(uid) {
            return refuse(&mut client, c, 403, Denial::Stranger { owner, uid }).await;
        }
    }
    // 1. One bounded head, within one deadline for all of it.
    let head = match tokio::time::timeout(shared.limits.head_timeout, read_head(&mut client)).await
    {
        Ok(Ok(Some(h))) => h,
        Ok(Ok(None)) => {
            c.reason = Some("the client sent nothing".into());
            return;
        }
        Ok(Err(why)) => return refuse(&mut client, c, 400, Denial::BadRequest(why)).await,
        Err(_) => {
            let why = format!(
                "no complete request head within {} s",
                shared.limits.head_timeout.as_secs()
            );
            return refuse(&mut client, c, 408, Denial::BadRequest(why)).await;
        }
    };
    c.method = bounded(&head.method);
    let (host, port, forward) = match destination(&head) {
        Ok(d) => d,
        Err(d) => return refuse(&mut client, c, 400, d).await,
    };
    c.destination = bounded(&if host.contains(':') && !host.starts_with('[') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    });
    // The git credential relay: only by CONNECT, only when the request has it.
    if host.eq_ignore_ascii_case(ASKPASS_HOST) && forward.is_none() {
        return askpass(shared, client, c, bytes, &head).await;
    }
    // A plain-HTTP request goes where its Host header says (virtual hosts behind one
    // address): that must be the destination decided on.
    if let Some(Err(d)) = forward.as_ref().map(|_| same_host(&head, &host, port)) {
        return refuse(&mut client, c, 403, d).await;
    }
    // 2–3. Decide, resolve, connect to a checked address.
    let upstream = match connect(shared, &host, port).await {
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
            c.decision = decision;
            return refuse(&mut client, c, status, d).await;
        }
    };
    // 4. Relay.
    match forward {
        None => {
            if client
                .write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
                .await
                .is_ok()
            {
                tunnel(client, upstream, &head.rest, bytes).await;
            }
        }
        Some(path) => forward_one(client, upstream, &head, &path, bytes).await,
    }
}

/// `CONNECT askpass.cmp-warden.invalid:1`: a tunnel to the repo-server's askpass socket.
async fn askpass(
    shared: &Shared,
    mut client: TcpStream,
    c: &mut Connection,
    bytes: &Bytes,
    head: &Head,
) {
    let Some((path, connect)) = &shared.askpass else {
        let d = Denial::BadRequest(
            "git credentials are not available to this request: the plugin does not set provideGitCreds, or the repo-server sent no ARGOCD_ASK_PASS_SOCK".into(),
        );
        return refuse(&mut client, c, 403, d).await;
    };
    c.decision = Decision::Allowed;
    let (path, connect) = (path.clone(), connect.clone());
    let connected = tokio::task::spawn_blocking(move || {
        connect(&path).and_then(|s| {
            s.set_nonblocking(true)?;
            UnixStream::from_std(s)
        })
    })
    .await
    .unwrap_or_else(|e| Err(std::io::Error::other(e)));
    let socket = match connected {
        Ok(s) => s,
        Err(e) => {
            let d = Denial::BadRequest(format!(
                "the repo-server's askpass socket {} cannot be reached: {e}",
                shared
                    .askpass
                    .as_ref()
                    .map_or_else(String::new, |(p, _)| p.display().to_string())
            ));
            return refuse(&mut client, c, 502, d).await;
        }
    };
    if client
        .write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
        .await
        .is_ok()
    {
        tunnel(client, socket, &head.rest, bytes).await;
    }
}

/// Relay both ways until both sides are done (each side's end passed on to the other).
async fn tunnel<U>(client: TcpStream, mut upstream: U, pending: &[u8], bytes: &Bytes)
where
    U: AsyncRead + AsyncWrite + Unpin,
{
    if !pending.is_empty() {
        if upstream.write_all(pending).await.is_err() {
            return;
        }
        bytes.up.fetch_add(pending.len() as u64, Ordering::Relaxed);
    }
    let (cr, cw) = tokio::io::split(client);
    let (ur, uw) = tokio::io::split(upstream);
    tokio::join!(pipe(cr, uw, &bytes.up), pipe(ur, cw, &bytes.down));
}

/// Copy until EOF or an error, then pass the EOF on.
async fn pipe(mut from: impl AsyncRead + Unpin, mut to: impl AsyncWrite + Unpin, n: &AtomicU64) {
    let mut buf = vec![0u8; BUF];
    loop {
        match from.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(k) => {
                if to.write_all(&buf[..k]).await.is_err() {
                    break;
                }
                n.fetch_add(k as u64, Ordering::Relaxed);
            }
        }
    }
    let _ = to.shutdown().await;
}

/// Hop-by-hop and proxy headers that are not forwarded (`Host` is written from the
/// destination decided on).
const DROPPED: &[&str] = &[
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authorization",
    "proxy-authenticate",
    "te",
    "trailer",
    "upgrade",
    "host",
];

/// Forward exactly one plain-HTTP request (head and a `Content-Length` body) with
/// `Connection: close`, then relay the response. Nothing else the client sends on this
/// connection is forwarded, so a second request smuggled behind the first never leaves.
async fn forward_one(
    mut client: TcpStream,
    mut upstream: TcpStream,
    head: &Head,
    path: &str,
    bytes: &Bytes,
) {
    if head.header("transfer-encoding").is_some() {
        let d = Denial::BadRequest(
            "chunked request bodies are not forwarded over plain HTTP; use https (CONNECT)".into(),
        );
        let _ = client.write_all(refusal(501, &d).as_bytes()).await;
        return;
    }
    let length: u64 = match head.header("content-length").map(str::parse) {
        None => 0,
        Some(Ok(n)) => n,
        Some(Err(_)) => {
            let d = Denial::BadRequest("bad Content-Length".into());
            let _ = client.write_all(refusal(400, &d).as_bytes()).await;
            return;
        }
    };
    let mut out = format!("{} {path} HTTP/1.1\r\n", head.method);
    if let Some(h) = head.header("host") {
        out.push_str(&format!("Host: {h}\r\n"));
    } else if let Some(authority) = head.target.get("http://".len()..) {
        let authority = authority.split(['/', '?']).next().unwrap_or_default();
        out.push_str(&format!("Host: {authority}\r\n"));
    }
    for (k, v) in &head.headers {
        if !DROPPED.contains(&k.to_ascii_lowercase().as_str()) {
            out.push_str(&format!("{k}: {v}\r\n"));
        }
    }
    out.push_str("Connection: close\r\n\r\n");
    if upstream.write_all(out.as_bytes()).await.is_err() {
        return;
    }
    bytes.up.fetch_add(out.len() as u64, Ordering::Relaxed);
    let first = head
        .rest
        .len()
        .min(usize::try_from(length).unwrap_or(usize::MAX));
    if upstream.write_all(&head.rest[..first]).await.is_err() {
        return;
    }
    bytes.up.fetch_add(first as u64, Ordering::Relaxed);
    let mut remaining = length - first as u64;
    let mut buf = vec![0u8; BUF];
    while remaining > 0 {
        let want = remaining.min(BUF as u64) as usize;
        match client.read(&mut buf[..want]).await {
            Ok(0) | Err(_) => break,
            Ok(k) => {
                if upstream.write_all(&buf[..k]).await.is_err() {
                    break;
                }
                bytes.up.fetch_add(k as u64, Ordering::Relaxed);
                remaining -= k as u64;
            }
        }
    }
    let (ur, _uw) = tokio::io::split(upstream);
    let (_cr, cw) = tokio::io::split(client);
    pipe(ur, cw, &bytes.down).await;
}
