//! The unix-socket listener: stale socket removed, mode/owner set, peers authorised by UID,
//! every connection wrapped in the `:authority` layer, graceful shutdown.

use std::future::Future;
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use proto::plugin::config_management_plugin_service_server::ConfigManagementPluginServiceServer;
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::server::Connected;

use crate::authority::AuthorityFix;
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

/// Who is on the other end of a connection.
#[derive(Debug, Clone, Copy)]
pub struct PeerInfo {
    /// Peer UID.
    pub uid: u32,
    /// Peer PID, when known.
    pub pid: Option<i32>,
}

impl Connected for AuthorityFix<UnixStream> {
    type ConnectInfo = Option<PeerInfo>;
    fn connect_info(&self) -> Self::ConnectInfo {
        self.get_ref().peer_cred().ok().map(|c| PeerInfo {
            uid: c.uid(),
            pid: c.pid(),
        })
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
    let l = std::os::unix::net::UnixListener::bind(p).map_err(io_err("listening on", p))?;
    l.set_nonblocking(true).map_err(io_err("listening on", p))?;
    if let Some(mode) = opts.socket_mode {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode))
            .map_err(io_err("chmod", p))?;
    }
    if let Some((uid, gid)) = opts.socket_owner {
        std::os::unix::fs::chown(p, uid, gid).map_err(io_err("chown", p))?;
    }
    Ok(l)
}

/// Serve `service` (plus gRPC health) on `listener` until `shutdown` resolves, then drain.
pub async fn serve(
    listener: std::os::unix::net::UnixListener,
    service: CmpService,
    opts: ListenOptions,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), ListenError> {
    let listener = UnixListener::from_std(listener).map_err(|e| ListenError::Io {
        what: "listening on",
        path: opts.socket_path.display().to_string(),
        source: e,
    })?;
    let (health_reporter, health) = tonic_health::server::health_reporter();
    health_reporter
        .set_service_status("", tonic_health::ServingStatus::Serving)
        .await;
    let grpc = ConfigManagementPluginServiceServer::new(service.clone())
        .max_decoding_message_size(opts.max_message_bytes)
        .max_encoding_message_size(opts.max_message_bytes);

    let (stop_tx, mut stop_rx) = watch::channel(false);
    let (conn_tx, conn_rx) = mpsc::channel::<std::io::Result<AuthorityFix<UnixStream>>>(64);
    let allowed = opts.allowed_uids.clone().map(Arc::new);
    let mut accept_stop = stop_rx.clone();
    let acceptor = tokio::spawn(async move {
        loop {
            tokio::select! {
                _ = accept_stop.changed() => break,
                r = listener.accept() => match r {
                    Ok((stream, _)) => {
                        let cred = stream.peer_cred().ok();
                        if let Some(list) = &allowed {
                            let ok = cred.as_ref().is_some_and(|c| list.contains(&c.uid()));
                            if !ok {
                                tracing::warn!(peer_uid = ?cred.map(|c| c.uid()), peer_pid = ?cred.and_then(|c| c.pid()), "connection refused: peer uid not allowed");
                                continue;
                            }
                        }
                        if conn_tx.send(Ok(AuthorityFix::new(stream))).await.is_err() {
                            break;
                        }
                    }
                    Err(e) => tracing::warn!(error = %e, "accept failed"),
                }
            }
        }
    });

    let socket_path = opts.socket_path.clone();
    let signal = async move {
        let _ = stop_rx.wait_for(|v| *v).await;
    };
    let server = tonic::transport::Server::builder()
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
    let _ = std::fs::remove_file(&socket_path);
    let _ = stop_tx.send(true);
    acceptor.abort();
    match tokio::time::timeout(opts.shutdown_grace, &mut server).await {
        Ok(r) => r?,
        Err(_) => {
            tracing::warn!(
                active = service.active(),
                "grace period over: cancelling in-flight requests"
            );
            service.cancel_all();
            let _ =
                tokio::time::timeout(jail::run::KILL_GRACE + Duration::from_secs(1), &mut server)
                    .await;
        }
    }
    Ok(())
}
