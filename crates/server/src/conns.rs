//! A TCP listener's connections (`serve --listen`, `appset serve`), capped, with idle ones
//! reclaimed. A TLS connection that finished its handshake and then sends nothing costs a
//! descriptor and the HTTP/2 state beside it for as long as the peer answers pings: 20,000
//! of them once reached the descriptor limit and starved every honest request. So each
//! connection is tracked from its handshake (plaintext: its accept) on, with how many
//! streams (HTTP/1.1: requests) it has open:
//!
//! 1. at most `max` connections at once: a new one at the cap closes the connection idle
//!    (no open stream) the longest, or is refused when every one has a stream open;
//! 2. a connection idle for `idle_timeout` is closed (checked every 5 s);
//! 3. closing makes the connection's reads and writes fail at once (its reader is woken), so
//!    the HTTP/2 server drops it.
//!
//! Only authenticated work holds a connection: with a bearer token configured, a stream
//! without a valid token (a health check, a refused call) does not make its connection busy,
//! at most [`MAX_UNAUTHENTICATED_STREAMS`] of them are open on one connection at once, and
//! each must be answered within [`UNAUTHENTICATED_DEADLINE`]. (A client without a token once
//! kept the cap full with health checks whose request never ended: idle honest connections
//! were evicted and new ones refused for as long as it stayed.)
//!
//! gRPC streams are counted by the [`CountStreams`] layer, which finds the connection in the
//! request's connect info ([`PeerInfo::Tcp`]); the generator's requests by
//! its connection task ([`crate::appset::serve`]).

use std::collections::HashMap;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Who is on the other end of a connection (in each request's extensions).
#[derive(Debug, Clone)]
pub enum PeerInfo {
    /// A unix-socket peer, by credentials.
    Unix {
        /// Peer UID.
        uid: u32,
        /// Peer PID, when known.
        pid: Option<i32>,
    },
    /// A TCP peer.
    Tcp {
        /// Remote address.
        remote: Option<SocketAddr>,
        /// Whether the connection is TLS.
        tls: bool,
        /// Its entry in the listener's connection registry, when tracked.
        conn: Option<Arc<Tracked>>,
    },
}

/// One tracked connection.
#[derive(Debug)]
pub struct Tracked {
    id: u64,
    streams: AtomicUsize,
    /// Streams without a valid token open now (never counted in `streams`).
    unauthenticated: AtomicUsize,
    /// When its last stream ended (or it was admitted), while it has none open.
    idle_since: Mutex<Option<Instant>>,
    closing: AtomicBool,
    reader: Mutex<Option<Waker>>,
}

impl Tracked {
    fn close(&self) {
        self.closing.store(true, Ordering::SeqCst);
        if let Some(w) = lock(&self.reader).take() {
            w.wake();
        }
    }

    fn idle_for(&self) -> Option<Duration> {
        if self.streams.load(Ordering::SeqCst) > 0 {
            return None;
        }
        lock(&self.idle_since).map(|t| t.elapsed())
    }
}

/// The connections of one listener.
#[derive(Debug)]
pub struct Registry {
    conns: Mutex<HashMap<u64, Arc<Tracked>>>,
    next: AtomicU64,
    max: usize,
    idle_timeout: Duration,
}

impl Registry {
    /// A registry of at most `max` connections, closing those idle for `idle_timeout`.
    pub fn new(max: usize, idle_timeout: Duration) -> Arc<Self> {
        Arc::new(Self {
            conns: Mutex::new(HashMap::new()),
            next: AtomicU64::new(0),
            max: max.max(1),
            idle_timeout,
        })
    }

    /// Step 1: a place for a new connection, closing the one idle the longest at the cap;
    /// `None` when every connection has a stream open.
    pub fn admit(self: &Arc<Self>) -> Option<Arc<Tracked>> {
        let mut conns = lock(&self.conns);
        if conns.len() >= self.max {
            let oldest = conns
                .values()
                .filter_map(|t| t.idle_for().map(|d| (d, t.id)))
                .max()?;
            if let Some(t) = conns.remove(&oldest.1) {
                t.close();
            }
        }
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let t = Arc::new(Tracked {
            id,
            streams: AtomicUsize::new(0),
            unauthenticated: AtomicUsize::new(0),
            idle_since: Mutex::new(Some(Instant::now())),
            closing: AtomicBool::new(false),
            reader: Mutex::new(None),
        });
        conns.insert(id, t.clone());
        Some(t)
    }

    /// Step 2: close every connection idle for the idle timeout; returns how many.
    pub fn reap_idle(&self) -> usize {
        let mut conns = lock(&self.conns);
        let idle: Vec<u64> = conns
            .values()
            .filter(|t| t.idle_for().is_some_and(|d| d >= self.idle_timeout))
            .map(|t| t.id)
            .collect();
        for id in &idle {
            if let Some(t) = conns.remove(id) {
                t.close();
            }
        }
        idle.len()
    }

    /// Connections tracked now.
    pub fn len(&self) -> usize {
        lock(&self.conns).len()
    }

    /// Whether none are.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn remove(&self, id: u64) {
        lock(&self.conns).remove(&id);
    }
}

/// How often idle connections are looked for.
pub const REAP_EVERY: Duration = Duration::from_secs(5);

/// A connection's IO while it is tracked: leaves the registry when dropped; fails once
/// closed (step 3).
#[derive(Debug)]
pub struct Closable<S> {
    inner: S,
    tracked: Arc<Tracked>,
    registry: Arc<Registry>,
}

impl<S> Closable<S> {
    /// Track `inner` as `tracked` of `registry`.
    pub fn new(inner: S, tracked: Arc<Tracked>, registry: Arc<Registry>) -> Self {
        Self {
            inner,
            tracked,
            registry,
        }
    }

    /// The connection's entry (for its requests' connect info).
    pub fn tracked(&self) -> Arc<Tracked> {
        self.tracked.clone()
    }

    /// The stream inside.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }
}

impl<S> Drop for Closable<S> {
    fn drop(&mut self) {
        self.registry.remove(self.tracked.id);
    }
}

fn closed() -> std::io::Error {
    std::io::Error::new(
        std::io::ErrorKind::ConnectionAborted,
        "closed by the server: idle at the connection cap, or for the idle timeout",
    )
}

impl<S: AsyncRead + Unpin> AsyncRead for Closable<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        if this.tracked.closing.load(Ordering::SeqCst) {
            return Poll::Ready(Err(closed()));
        }
        *lock(&this.tracked.reader) = Some(cx.waker().clone());
        Pin::new(&mut this.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Closable<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let this = self.get_mut();
        if this.tracked.closing.load(Ordering::SeqCst) {
            return Poll::Ready(Err(closed()));
        }
        Pin::new(&mut this.inner).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

/// A stream open on a tracked connection, until dropped with its response body.
#[derive(Debug)]
pub struct StreamOpen(Arc<Tracked>);

impl StreamOpen {
    /// Count a stream (an HTTP/1.1 request) open on `t`.
    pub fn new(t: Arc<Tracked>) -> Self {
        t.streams.fetch_add(1, Ordering::SeqCst);
        Self(t)
    }
}

impl Drop for StreamOpen {
    fn drop(&mut self) {
        if self.0.streams.fetch_sub(1, Ordering::SeqCst) == 1 {
            *lock(&self.0.idle_since) = Some(Instant::now());
        }
    }
}

/// Streams without a valid token open at once on one connection.
pub const MAX_UNAUTHENTICATED_STREAMS: usize = 4;

/// How long a stream without a valid token may take to be answered (a health check is
/// answered at once; a call without the token is refused at once).
pub const UNAUTHENTICATED_DEADLINE: Duration = Duration::from_secs(10);

/// A stream without a valid token on a tracked connection, until dropped with its response
/// body.
#[derive(Debug)]
pub struct UnauthenticatedOpen(Arc<Tracked>);

impl UnauthenticatedOpen {
    /// A place for one more on `t`, if it has one.
    fn new(t: Arc<Tracked>) -> Option<Self> {
        let n = t.unauthenticated.fetch_add(1, Ordering::SeqCst);
        let open = Self(t);
        (n < MAX_UNAUTHENTICATED_STREAMS).then_some(open)
    }
}

impl Drop for UnauthenticatedOpen {
    fn drop(&mut self) {
        self.0.unauthenticated.fetch_sub(1, Ordering::SeqCst);
    }
}

/// What a stream holds of its connection while it is open.
#[derive(Debug)]
pub enum Holds {
    /// Authenticated (or no token is configured): the connection is busy.
    Busy(StreamOpen),
    /// Without a valid token: one of the connection's few places, not busy.
    Unauthenticated(UnauthenticatedOpen),
}

/// The layer that counts each tracked connection's open streams; with `token`, only those
/// that carry it make the connection busy.
#[derive(Debug, Clone, Default)]
pub struct CountStreams {
    token: Option<crate::auth::BearerToken>,
}

impl CountStreams {
    /// The layer for a listener whose calls need `token` (if any).
    pub fn new(token: Option<crate::auth::BearerToken>) -> Self {
        Self { token }
    }
}

impl<S> tower_layer::Layer<S> for CountStreams {
    type Service = Counted<S>;
    fn layer(&self, inner: S) -> Counted<S> {
        Counted {
            inner,
            token: self.token.clone(),
        }
    }
}

/// The service the layer wraps.
#[derive(Debug, Clone)]
pub struct Counted<S> {
    inner: S,
    token: Option<crate::auth::BearerToken>,
}

impl<S, ReqB, B> tower_service::Service<http::Request<ReqB>> for Counted<S>
where
    S: tower_service::Service<http::Request<ReqB>, Response = http::Response<B>>,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    B: http_body::Body<Data = bytes::Bytes> + Send + Unpin + 'static,
    B::Error: Into<tonic::codegen::StdError>,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<ReqB>) -> Self::Future {
        let conn = match req.extensions().get::<Option<PeerInfo>>() {
            Some(Some(PeerInfo::Tcp { conn: Some(t), .. })) => Some(t.clone()),
            _ => None,
        };
        let authenticated = self.token.as_ref().is_none_or(|t| {
            t.check(
                req.headers()
                    .get(http::header::AUTHORIZATION)
                    .map(|v| v.as_bytes()),
            )
            .is_ok()
        });
        let holds = match conn {
            None => None,
            Some(t) if authenticated => Some(Holds::Busy(StreamOpen::new(t))),
            Some(t) => match UnauthenticatedOpen::new(t) {
                Some(u) => Some(Holds::Unauthenticated(u)),
                None => {
                    let refused =
                        crate::status::unauthenticated_streams_full(MAX_UNAUTHENTICATED_STREAMS);
                    return Box::pin(std::future::ready(Ok(refused.into_http())));
                }
            },
        };
        let response = self.inner.call(req);
        let unauthenticated = matches!(holds, Some(Holds::Unauthenticated(_)));
        Box::pin(async move {
            let response = if unauthenticated {
                match tokio::time::timeout(UNAUTHENTICATED_DEADLINE, response).await {
                    Ok(r) => r?,
                    Err(_) => {
                        let status = crate::status::unauthenticated_too_slow(
                            UNAUTHENTICATED_DEADLINE.as_secs(),
                        );
                        return Ok(status.into_http());
                    }
                }
            } else {
                response.await?
            };
            Ok(response
                .map(|body| tonic::body::Body::new(crate::reply_memory::Guarded::new(body, holds))))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn at_the_cap_the_connection_idle_longest_goes_and_busy_ones_stay() {
        let r = Registry::new(2, Duration::from_secs(3600));
        let a = r.admit().expect("a");
        std::thread::sleep(Duration::from_millis(5));
        let b = r.admit().expect("b");
        // a is idle the longest: it goes for c.
        let c = r.admit().expect("c");
        assert!(a.closing.load(Ordering::SeqCst) && !b.closing.load(Ordering::SeqCst));
        // With a stream open on each, a new one is refused.
        let (_sb, _sc) = (StreamOpen::new(b.clone()), StreamOpen::new(c.clone()));
        assert!(r.admit().is_none());
        assert_eq!(r.len(), 2);
        drop(_sb);
        // b idle again: it goes.
        assert!(r.admit().is_some());
        assert!(b.closing.load(Ordering::SeqCst) && !c.closing.load(Ordering::SeqCst));
    }

    #[test]
    fn idle_connections_are_reaped_after_the_timeout_and_busy_ones_are_not() {
        let r = Registry::new(8, Duration::from_millis(20));
        let idle = r.admit().expect("idle");
        let busy = r.admit().expect("busy");
        let _open = StreamOpen::new(busy.clone());
        std::thread::sleep(Duration::from_millis(40));
        assert_eq!(r.reap_idle(), 1);
        assert!(idle.closing.load(Ordering::SeqCst));
        assert!(!busy.closing.load(Ordering::SeqCst));
    }
}
