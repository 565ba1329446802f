//! TCP listener flags shared by `serve` (plugins as services) and `appset serve`: address, TLS
//! files, client CA (mTLS), bearer token, and the explicit `--insecure` for plaintext.

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::{Context, bail};
use clap::Args;
use server::auth::BearerToken;
use server::tls::TlsFiles;

/// Network listener flags.
#[derive(Debug, Clone, Args)]
pub struct NetArgs {
    /// Listen on this TCP address (HOST:PORT).
    #[arg(long, env = "CMP_WARDEN_LISTEN")]
    pub listen: Option<SocketAddr>,
    /// PEM certificate chain for TLS on --listen (re-read when the file changes).
    #[arg(long, env = "CMP_WARDEN_TLS_CERT", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// PEM private key for --tls-cert.
    #[arg(long, env = "CMP_WARDEN_TLS_KEY", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// PEM CA bundle: require client certificates it signed (mutual TLS).
    #[arg(long, env = "CMP_WARDEN_TLS_CLIENT_CA", requires = "tls_cert")]
    pub tls_client_ca: Option<PathBuf>,
    /// File holding the bearer token clients must send (`Authorization: Bearer <token>`).
    #[arg(long, env = "CMP_WARDEN_TOKEN_FILE", conflicts_with = "token_env")]
    pub token_file: Option<PathBuf>,
    /// Name of an environment variable holding the bearer token.
    #[arg(long)]
    pub token_env: Option<String>,
    /// Allow --listen without TLS (plaintext; for a mesh that terminates TLS itself).
    #[arg(long)]
    pub insecure: bool,
    /// Connections open at once on --listen; at the cap a new one closes the connection
    /// idle the longest [default: 1024].
    #[arg(long, env = "CMP_WARDEN_LISTEN_MAX_CONNECTIONS")]
    pub listen_max_connections: Option<usize>,
    /// Seconds a connection on --listen may have no request open before it is closed
    /// [default: 300].
    #[arg(long, env = "CMP_WARDEN_LISTEN_IDLE_TIMEOUT")]
    pub listen_idle_timeout: Option<u64>,
}

/// `--listen-max-connections` unless given.
pub const DEFAULT_MAX_CONNECTIONS: usize = 1024;
/// `--listen-idle-timeout` unless given.
pub const DEFAULT_IDLE_TIMEOUT_SECS: u64 = 300;

/// A bound TCP listener and what protects it.
#[derive(Debug)]
pub struct Bound {
    /// The listener (non-blocking, ready for tokio).
    pub listener: std::net::TcpListener,
    /// Its address.
    pub addr: SocketAddr,
    /// TLS config, `None` with --insecure.
    pub tls: Option<std::sync::Arc<rustls::ServerConfig>>,
    /// Token clients must present.
    pub token: Option<BearerToken>,
    /// Its connections: at most so many, idle ones closed after so long.
    pub connections: std::sync::Arc<server::conns::Registry>,
}

impl NetArgs {
    /// The bearer token, if configured.
    pub fn token(&self) -> anyhow::Result<Option<BearerToken>> {
        Ok(match (&self.token_file, &self.token_env) {
            (Some(f), _) => Some(BearerToken::from_file(f)?),
            (None, Some(v)) => Some(BearerToken::from_env(v)?),
            (None, None) => None,
        })
    }

    /// Validate the flags, load TLS material and the token, and bind (before capabilities are
    /// dropped). `None` when --listen is not given.
    pub fn bind(&self, alpn: &[&[u8]]) -> anyhow::Result<Option<Bound>> {
        let Some(addr) = self.listen else {
            if self.tls_cert.is_some() || self.token_file.is_some() || self.token_env.is_some() {
                bail!("--tls-cert/--token-file/--token-env need --listen");
            }
            return Ok(None);
        };
        let tls = match (&self.tls_cert, &self.tls_key) {
            (Some(cert), Some(key)) => Some(server::tls::server_config(
                &TlsFiles {
                    cert: cert.clone(),
                    key: key.clone(),
                    client_ca: self.tls_client_ca.clone(),
                },
                alpn,
            )?),
            _ if self.insecure => {
                tracing::warn!(%addr, "PLAINTEXT TCP (--insecure): requests and tokens cross the network unencrypted");
                None
            }
            _ => bail!(
                "--listen {addr} without TLS: pass --tls-cert and --tls-key, or --insecure to accept plaintext"
            ),
        };
        let token = self.token()?;
        if token.is_none() && self.tls_client_ca.is_none() {
            tracing::warn!(%addr, "TCP listener without client authentication (no --token-file/--token-env, no --tls-client-ca): restrict who can reach it (NetworkPolicy)");
        }
        let listener =
            std::net::TcpListener::bind(addr).with_context(|| format!("--listen {addr}"))?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let connections = server::conns::Registry::new(
            self.listen_max_connections
                .unwrap_or(DEFAULT_MAX_CONNECTIONS),
            std::time::Duration::from_secs(
                self.listen_idle_timeout
                    .unwrap_or(DEFAULT_IDLE_TIMEOUT_SECS),
            ),
        );
        Ok(Some(Bound {
            listener,
            addr,
            tls,
            token,
            connections,
        }))
    }
}
