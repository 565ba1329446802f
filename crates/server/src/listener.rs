//! The listeners: the unix socket (stale socket removed, mode/owner set, peers authorised by
//! UID, every connection wrapped in the `:authority` layer) and, for plugins as services, a TCP
//! port with TLS (optionally mutual) and an optional bearer token. One gRPC server serves both;
//! graceful shutdown drains both.

use std::future::Future;
use std::net::SocketAddr;
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use proto::plugin::config_management_plugin_service_server::ConfigManagementPluginServiceServer;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream, UnixListener, UnixStream};
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::server::Connected;

use crate::auth::BearerToken;
use crate::authority::AuthorityFix;
use crate::conns::PeerInfo;
use crate::service::CmpService;

/// Listener settings.
#[derive(Debug, Clone)]
pub struct ListenOptions {
    /// Socket path (`<dir>/<name>[-<version>].sock`).
    pub socket_path: PathBuf,
    /// chmod the socket to this mode (default: as created, i.e. the umask decides, like Argo CD).
    pub socket_mode: Option<u32>,
    /// chown the socket to (uid, gid).
    pub socket_owner: Option<(Option<u32>, Option<u32>)>,
    /// Peers allowed to connect, by UID (`None`: any).
    pub allowed_uids: Option<Vec<u32>>,
    /// gRPC message size limit, both ways.
    pub max_message_bytes: usize,
    /// How long in-flight requests may run after SIGTERM before they are cancelled.
    pub shutdown_grace: Duration,
}

/// Failures to set up the listener.
#[derive(Debug, thiserror::Error)]
pub enum ListenError {
    /// Socket I/O.
    #[error("{what} {path}: {source}")]
    Io {
        /// What failed.
        what: &'static str,
        /// Path.
        path: String,
        /// Cause.
        source: std::io::Error,
    },
    /// gRPC transport.
    #[error("serving: {0}")]
    Transport(#[from] tonic::transport::Error),
}

/// The TCP listener's settings.
#[derive(Debug, Clone)]
pub struct TcpOptions {
    /// The bound address (for logs).
    pub addr: SocketAddr,
    /// TLS; `None` is plaintext, which the binary allows only with `--insecure`.
    pub tls: Option<Arc<rustls::ServerConfig>>,
    /// When set, every CMP call on this listener must carry `authorization: Bearer <token>`
    /// (checked and audited by the service, `ServiceConfig::tcp_token`). gRPC health stays
    /// open: Kubernetes gRPC probes cannot send headers.
    pub token: Option<BearerToken>,
    /// Its connections, plaintext or TLS: capped, idle ones closed ([`crate::conns`]).
    pub connections: Arc<crate::conns::Registry>,
}

/// One accepted connection of either listener. TCP connections, plaintext or TLS, are
/// tracked by their listener's connection registry ([`crate::conns`]).
#[derive(Debug)]
pub enum Conn {
    /// Unix socket, through the `:authority` fix.
    Unix(Box<AuthorityFix<UnixStream>>),
    /// Plaintext TCP (`--insecure`).
    Tcp(Box<crate::conns::Closable<TcpStream>>),
    /// TLS over TCP.
    Tls(Box<crate::conns::Closable<tokio_rustls::server::TlsStream<TcpStream>>>),
}

impl Connected for Conn {
    type ConnectInfo = Option<PeerInfo>;
    fn connect_info(&self) -> Self::ConnectInfo {
        match self {
            Conn::Unix(s) => s.get_ref().peer_cred().ok().map(|c| PeerInfo::Unix {
                uid: c.uid(),
                pid: c.pid(),
            }),
            Conn::Tcp(s) => Some(PeerInfo::Tcp {
                remote: s.get_ref().peer_addr().ok(),
                tls: false,
                conn: Some(s.tracked()),
            }),
            Conn::Tls(s) => Some(PeerInfo::Tcp {
                remote: s.get_ref().get_ref().0.peer_addr().ok(),
                tls: true,
                conn: Some(s.tracked()),
            }),
        }
    }
}

impl AsyncRead for Conn {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Conn::Unix(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
            Conn::Tcp(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
            Conn::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Conn {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        match self.get_mut() {
            Conn::Unix(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
            Conn::Tcp(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
            Conn::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Conn::Unix(s) => Pin::new(s.as_mut()).poll_flush(cx),
            Conn::Tcp(s) => Pin::new(s.as_mut()).poll_flush(cx),
            Conn::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Conn::Unix(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
            Conn::Tcp(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
            Conn::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}

/// Streams one connection may have open at once (HTTP/2 `SETTINGS_MAX_CONCURRENT_STREAMS`).
pub const MAX_STREAMS_PER_CONNECTION: u32 = 128;

/// How long a TCP client may take from accept to a finished TLS handshake (its first bytes
/// included: one deadline, however it trickles).
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Handshakes in progress at once. When all are taken, the oldest is dropped for the new
/// one: accepting never waits, and silent sockets (the oldest, since an honest client
/// finishes in milliseconds) cannot hold every place.
const MAX_PENDING_HANDSHAKES: usize = 256;

/// Handshakes in progress, oldest first.
type Pending = Arc<std::sync::Mutex<std::collections::VecDeque<(u64, tokio::task::AbortHandle)>>>;

/// Accept TCP connections (TLS-wrapped when configured) into `conns` until `stop` flips,
/// each tracked by `registry` ([`crate::conns`]) from its handshake on: capped, idle ones
/// reclaimed.
pub fn spawn_tcp_acceptor(
    listener: TcpListener,
    tls: Option<Arc<rustls::ServerConfig>>,
    conns: mpsc::Sender<std::io::Result<Conn>>,
    mut stop: watch::Receiver<bool>,
    registry: Arc<crate::conns::Registry>,
) -> tokio::task::JoinHandle<()> {
    let acceptor = tls.map(tokio_rustls::TlsAcceptor::from);
    let pending: Pending = Arc::default();
    let refused = Arc::new(crate::sparse::Sparse::new());
    let refuser = crate::refuse::Refuser::new();
    tokio::spawn(async move {
        let mut errors = crate::sparse::AcceptErrors::default();
        let mut next_id = 0u64;
        let mut dropped = 0u64;
        let mut reap = tokio::time::interval(crate::conns::REAP_EVERY);
        loop {
            tokio::select! {
                _ = stop.changed() => break,
                _ = reap.tick() => {
                    let closed = registry.reap_idle();
                    if closed > 0 {
                        tracing::debug!(closed, "idle connections closed (--listen-idle-timeout)");
                    }
                }
                r = listener.accept() => match r {
                    Ok((stream, remote)) => {
                        let deadline = tokio::time::Instant::now() + HANDSHAKE_TIMEOUT;
                        let _ = stream.set_nodelay(true);
                        let Some(acceptor) = acceptor.clone() else {
                            match admit(&registry) {
                                Ok(t) => {
                                    let c = crate::conns::Closable::new(stream, t, registry.clone());
                                    if conns.send(Ok(Conn::Tcp(Box::new(c)))).await.is_err() { break; }
                                }
                                Err(why) => refused.warn("connection refused", &format_args!("{remote}: {why}")),
                            }
                            continue;
                        };
                        let oldest = {
                            let mut p = pending.lock().unwrap_or_else(|e| e.into_inner());
                            (p.len() >= MAX_PENDING_HANDSHAKES).then(|| p.pop_front()).flatten()
                        };
                        if let Some((_, handle)) = oldest {
                            handle.abort();
                            dropped += 1;
                            if dropped == 1 || dropped.is_multiple_of(1000) {
                                tracing::warn!(dropped, "{MAX_PENDING_HANDSHAKES} TLS handshakes in progress: the oldest dropped for a new connection (counted; said at the first and every 1,000th)");
                            }
                        }
                        let id = next_id;
                        next_id += 1;
                        let conns = conns.clone();
                        let refuser = refuser.clone();
                        let done = pending.clone();
                        let refused = refused.clone();
                        let registry = registry.clone();
                        // Listed before the task can end (it takes the same lock to leave).
                        let mut p = pending.lock().unwrap_or_else(|e| e.into_inner());
                        let task = tokio::spawn(async move {
                            let told = handshake(stream, deadline, acceptor, refuser, conns, registry).await;
                            if let Err(why) = told {
                                refused.warn("TLS handshake refused", &format_args!("{remote}: {why}"));
                            }
                            let mut p = done.lock().unwrap_or_else(|e| e.into_inner());
                            if let Some(i) = p.iter().position(|(n, _)| *n == id) {
                                p.remove(i);
                            }
                        });
                        p.push_back((id, task.abort_handle()));
                    }
                    Err(e) => errors.after("tcp", &e).await,
                }
            }
        }
    })
}

/// One TLS handshake, within `deadline` from accept; the connection goes to `conns`, or
/// why it was refused comes back.
async fn handshake(
    stream: TcpStream,
    deadline: tokio::time::Instant,
    acceptor: tokio_rustls::TlsAcceptor,
    refuser: crate::refuse::Refuser,
    conns: mpsc::Sender<std::io::Result<Conn>>,
    registry: Arc<crate::conns::Registry>,
) -> Result<(), String> {
    // A plaintext client is told this port speaks TLS, not reset.
    match first_bytes(&stream, deadline).await {
        crate::refuse::FirstBytes::Tls => {}
        crate::refuse::FirstBytes::PlaintextH2 => {
            refuser.grpc(stream, crate::status::plaintext_on_tls_port());
            return Err("the client spoke plaintext HTTP/2 (told so in a gRPC status)".into());
        }
        crate::refuse::FirstBytes::Plaintext => {
            refuser.http1(stream, PLAINTEXT_HTTP.to_owned());
            return Err("the client spoke plaintext (told so in a 400)".into());
        }
    }
    match tokio::time::timeout_at(deadline, acceptor.accept(stream)).await {
        Ok(Ok(tls)) => {
            let t = admit(&registry)?;
            let conn = Conn::Tls(Box::new(crate::conns::Closable::new(tls, t, registry)));
            let _ = conns.send(Ok(conn)).await;
            Ok(())
        }
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err(format!(
            "not finished within {} s of accept",
            HANDSHAKE_TIMEOUT.as_secs()
        )),
    }
}

/// A place in `registry` for a new connection, or why there is none.
fn admit(registry: &Arc<crate::conns::Registry>) -> Result<Arc<crate::conns::Tracked>, String> {
    registry.admit().ok_or_else(|| {
        format!(
            "all {} connections (--listen-max-connections) have a request open; refused",
            registry.len()
        )
    })
}

/// What a plaintext HTTP client on a TLS port is told (Go's net/http says the first sentence).
const PLAINTEXT_HTTP: &str = "Client sent an HTTP request to an HTTPS server: use https://";

/// Up to four first bytes of a new connection, without consuming them (TLS then reads them
/// again); whatever has arrived by `deadline`.
async fn first_bytes(
    stream: &TcpStream,
    deadline: tokio::time::Instant,
) -> crate::refuse::FirstBytes {
    let mut buf = [0u8; 4];
    loop {
        match tokio::time::timeout_at(deadline, stream.peek(&mut buf)).await {
            Ok(Ok(n)) if n >= 4 || (n > 0 && buf[0] == 0x16) => {
                return crate::refuse::classify(&buf[..n]);
            }
            Ok(Ok(n)) if n > 0 => tokio::time::sleep(Duration::from_millis(10)).await,
            // EOF, an error or the timeout: the TLS accept reports it.
            _ => return crate::refuse::FirstBytes::Tls,
        }
        if tokio::time::Instant::now() >= deadline {
            return crate::refuse::FirstBytes::Tls;
        }
    }
}

fn io_err(
    what: &'static str,
    path: &std::path::Path,
) -> impl FnOnce(std::io::Error) -> ListenError {
    let path = path.display().to_string();
    move |source| ListenError::Io { what, path, source }
}

/// Bind the socket (removing a stale one) and apply mode and owner.
///
/// Synchronous and runtime-free, so the binary can bind (and chown) before it drops its
/// capabilities and before any runtime thread exists.
pub fn bind(opts: &ListenOptions) -> Result<std::os::unix::net::UnixListener, ListenError> {
    let p = &opts.socket_path;
    if std::fs::symlink_metadata(p).is_ok() {
        std::fs::remove_file(p).map_err(io_err("removing stale socket", p))?;
    }
    // Bound, listening and given its mode and owner under a hidden name, then renamed into
    // place: the repo-server (which polls the directory) and probes never find a socket that
    // refuses connections (bound, not yet listening) or still has the umask's mode.
    let hidden = p
        .file_name()
        .map(|n| {
            let mut h = std::ffi::OsString::from(".");
            h.push(n);
            h.push(format!(".{}", std::process::id()));
            p.with_file_name(h)
        })
        .filter(|h| h.as_os_str().len() < 100);
    let at = hidden.as_deref().unwrap_or(p);
    if at != p.as_path() {
        let _ = std::fs::remove_file(at);
    }
    let l = std::os::unix::net::UnixListener::bind(at).map_err(io_err("listening on", p))?;
    l.set_nonblocking(true).map_err(io_err("listening on", p))?;
    if let Some(mode) = opts.socket_mode {
        std::fs::set_permissions(at, std::fs::Permissions::from_mode(mode))
            .map_err(io_err("chmod", p))?;
    }
    if let Some((uid, gid)) = opts.socket_owner {
        std::os::unix::fs::chown(at, uid, gid).map_err(io_err("chown", p))?;
    }
    if at != p.as_path() {
        std::fs::rename(at, p).map_err(io_err("publishing the socket", p))?;
    }
    Ok(l)
}

/// Serve `service` (plus gRPC health) on the unix socket and/or the TCP port until `shutdown`
/// resolves, then drain.
pub async fn serve(
    unix: Option<std::os::unix::net::UnixListener>,
    tcp: Option<(std::net::TcpListener, TcpOptions)>,
    service: CmpService,
    opts: ListenOptions,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), ListenError> {
    let (health_reporter, health) = tonic_health::server::health_reporter();
    health_reporter
        .set_service_status("", tonic_health::ServingStatus::Serving)
        .await;
    let grpc = ConfigManagementPluginServiceServer::new(service.clone())
        .max_decoding_message_size(opts.max_message_bytes)
        .max_encoding_message_size(opts.max_message_bytes);
    let (stop_tx, stop_rx) = watch::channel(false);
    let (conn_tx, conn_rx) = mpsc::channel::<std::io::Result<Conn>>(64);
    let mut acceptors = Vec::new();
    if let Some(listener) = unix {
        let listener = UnixListener::from_std(listener).map_err(|e| ListenError::Io {
            what: "listening on",
            path: opts.socket_path.display().to_string(),
            source: e,
        })?;
        let allowed = opts.allowed_uids.clone().map(Arc::new);
        let refuser = crate::refuse::Refuser::new();
        let mut accept_stop = stop_rx.clone();
        let conn_tx = conn_tx.clone();
        acceptors.push(tokio::spawn(async move {
            let mut errors = crate::sparse::AcceptErrors::default();
            loop {
                tokio::select! {
                    _ = accept_stop.changed() => break,
                    r = listener.accept() => match r {
                        Ok((stream, _)) => {
                            let cred = stream.peer_cred().ok();
                            if let Some(list) = &allowed {
                                let ok = cred.as_ref().is_some_and(|c| list.contains(&c.uid()));
                                if !ok {
                                    let uid = cred.map_or(-1, |c| i64::from(c.uid()));
                                    tracing::warn!(peer_uid = uid, peer_pid = cred.and_then(|c| c.pid()).unwrap_or(-1), "connection refused: peer uid not allowed (--allowed-uids / CMP_WARDEN_ALLOWED_UIDS)");
                                    let list = list.iter().map(u32::to_string).collect::<Vec<_>>().join(",");
                                    refuser.grpc(AuthorityFix::new(stream), crate::status::peer_refused(format!(
                                        "peer uid {uid} may not use this socket (allowed: {list}); the server's --allowed-uids / CMP_WARDEN_ALLOWED_UIDS changes it"
                                    )));
                                    continue;
                                }
                            }
                            // Our own commands may share an allowed UID (the shared-UID model,
                            // or a sidecar running as the repo-server's UID): never serve them.
                            if let Some(pid) = cred.and_then(|c| c.pid()).filter(|p| *p > 0)
                                && own_descendant(pid) != Some(false)
                            {
                                tracing::warn!(peer_uid = cred.map_or(-1, |c| i64::from(c.uid())), peer_pid = pid, "connection refused: the peer is one of this server's own jailed processes (or exited before it could be told apart)");
                                refuser.grpc(AuthorityFix::new(stream), crate::status::peer_refused(
                                    "a sandboxed command may not call the server that runs it",
                                ));
                                continue;
                            }
                            if conn_tx.send(Ok(Conn::Unix(Box::new(AuthorityFix::new(stream))))).await.is_err() {
                                break;
                            }
                        }
                        Err(e) => errors.after("unix", &e).await,
                    }
                }
            }
        }));
    }
    // Only streams with the token make a TCP connection busy (conns.rs).
    let token = tcp.as_ref().and_then(|(_, t)| t.token.clone());
    if let Some((listener, t)) = tcp {
        let listener = TcpListener::from_std(listener).map_err(|e| ListenError::Io {
            what: "listening on",
            path: t.addr.to_string(),
            source: e,
        })?;
        acceptors.push(spawn_tcp_acceptor(
            listener,
            t.tls,
            conn_tx.clone(),
            stop_rx.clone(),
            t.connections,
        ));
    }
    drop(conn_tx);

    let socket_path = opts.socket_path.clone();
    let mut stop_wait = stop_rx.clone();
    let signal = async move {
        let _ = stop_wait.wait_for(|v| *v).await;
    };
    let server = tonic::transport::Server::builder()
        // Bounds before any authentication: streams per connection, and pings that find a
        // peer gone (a connection that answers them stays; its streams are bounded).
        .max_concurrent_streams(Some(MAX_STREAMS_PER_CONNECTION))
        .http2_keepalive_interval(Some(Duration::from_secs(30)))
        .http2_keepalive_timeout(Some(Duration::from_secs(20)))
        .layer(crate::conns::CountStreams::new(token))
        .layer(crate::reply_memory::HoldReplyMemory)
        .layer(crate::watch_cap::CapHealthWatches::default())
        .add_service(health)
        .add_service(grpc)
        .serve_with_incoming_shutdown(ReceiverStream::new(conn_rx), signal);
    tokio::pin!(server);

    tokio::select! {
        r = &mut server => { r?; return Ok(()); }
        () = shutdown => {}
    }
    // Argo CD unlinks the socket on SIGTERM; we also stop accepting and drain.
    tracing::info!(
        grace_s = opts.shutdown_grace.as_secs(),
        active = service.active(),
        "shutting down: socket removed, draining"
    );
    // Health watchers (a load balancer's, a mesh's) hear it before their connection closes.
    health_reporter
        .set_service_status("", tonic_health::ServingStatus::NotServing)
        .await;
    let _ = std::fs::remove_file(&socket_path);
    let _ = stop_tx.send(true);
    for a in &acceptors {
        a.abort();
    }
    match tokio::time::timeout(opts.shutdown_grace, &mut server).await {
        Ok(r) => r?,
        Err(_) => {
            tracing::warn!(
                active = service.active(),
                "grace period over: cancelling in-flight requests"
            );
            service.cancel_all();
            let _ =
                tokio::time::timeout(supervisor::KILL_GRACE + Duration::from_secs(1), &mut server)
                    .await;
        }
    }
    Ok(())
}

/// Whether `pid` (as our PID namespace sees it) is this process or one of its descendants:
/// a jail, or a command of one. The supervisor is the subreaper of everything below it, so even
/// a daemon that left its jail's process tree stays a descendant. `None` when the chain cannot
/// be read (the process is gone): the caller refuses, as it cannot tell.
pub fn own_descendant(pid: i32) -> Option<bool> {
    let me = i32::try_from(std::process::id()).ok()?;
    let mut cur = pid;
    // A chain longer than any real process tree is refused as unknown.
    for _ in 0..4096 {
        if cur == me {
            return Some(true);
        }
        if cur <= 1 {
            return Some(false);
        }
        cur = parent_of(cur)?;
    }
    None
}

/// The parent PID from `/proc/<pid>/stat` (the field after the parenthesised command name,
/// which may itself contain parentheses and spaces).
fn parent_of(pid: i32) -> Option<i32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (_, rest) = stat.rsplit_once(')')?;
    rest.split_whitespace().nth(1)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tells_our_own_descendants_apart() {
        let me = std::process::id() as i32;
        assert_eq!(own_descendant(me), Some(true));
        let mut child = std::process::Command::new("sleep")
            .arg("5")
            .spawn()
            .expect("sleep");
        assert_eq!(own_descendant(child.id() as i32), Some(true));
        let _ = child.kill();
        let _ = child.wait();
        // Our parent (the test harness) and init are not below us.
        assert_eq!(
            own_descendant(rustix::process::getppid().map_or(1, |p| p.as_raw_nonzero().get())),
            Some(false)
        );
        assert_eq!(own_descendant(1), Some(false));
        // A process that is gone cannot be told apart.
        assert_eq!(own_descendant(i32::MAX - 1), None);
    }
}
