//! TLS for the TCP listeners (rustls, ring provider): a server certificate re-read when its
//! files change (cert-manager rotates them in place), optional client-certificate verification
//! against a CA (mTLS), TLS 1.2+ only.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use rustls::server::{ClientHello, ResolvesServerCert, WebPkiClientVerifier};
use rustls::sign::CertifiedKey;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

/// Where the certificate material lives.
#[derive(Debug, Clone)]
pub struct TlsFiles {
    /// PEM certificate chain (leaf first).
    pub cert: PathBuf,
    /// PEM private key (PKCS#8, PKCS#1 or SEC1).
    pub key: PathBuf,
    /// PEM CA bundle; when set, clients must present a certificate it signed.
    pub client_ca: Option<PathBuf>,
}

/// TLS set-up failures (start-up errors; a failed reload keeps the previous certificate).
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A file could not be read or parsed.
    #[error("{what} {path}: {reason}")]
    File {
        /// Which file.
        what: &'static str,
        /// Path.
        path: String,
        /// Why.
        reason: String,
    },
    /// rustls refused the configuration.
    #[error("TLS configuration: {0}")]
    Config(#[from] rustls::Error),
    /// The client CA bundle is unusable.
    #[error("client CA: {0}")]
    ClientCa(String),
}

fn file_err(what: &'static str, path: &Path, reason: impl std::fmt::Display) -> TlsError {
    TlsError::File {
        what,
        path: path.display().to_string(),
        reason: reason.to_string(),
    }
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Read a PEM certificate chain.
pub fn read_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs: Vec<_> = CertificateDer::pem_file_iter(path)
        .map_err(|e| file_err("certificate", path, e))?
        .collect::<Result<_, _>>()
        .map_err(|e| file_err("certificate", path, e))?;
    if certs.is_empty() {
        return Err(file_err("certificate", path, "no CERTIFICATE block"));
    }
    Ok(certs)
}

fn load_key(files: &TlsFiles) -> Result<Arc<CertifiedKey>, TlsError> {
    let chain = read_certs(&files.cert)?;
    let key = PrivateKeyDer::from_pem_file(&files.key)
        .map_err(|e| file_err("private key", &files.key, e))?;
    let ck = CertifiedKey::from_der(chain, key, &provider())
        .map_err(|e| file_err("certificate/key pair", &files.cert, e))?;
    Ok(Arc::new(ck))
}

fn mtimes(files: &TlsFiles) -> (Option<SystemTime>, Option<SystemTime>) {
    let m = |p: &Path| std::fs::metadata(p).and_then(|m| m.modified()).ok();
    (m(&files.cert), m(&files.key))
}

/// Serves the current certificate; re-reads the files (at most once a second) when either
/// file's mtime changed. A reload that fails is logged and the old certificate stays.
#[derive(Debug)]
pub struct ReloadingCert {
    files: TlsFiles,
    state: Mutex<Loaded>,
}

#[derive(Debug)]
struct Loaded {
    key: Arc<CertifiedKey>,
    mtimes: (Option<SystemTime>, Option<SystemTime>),
    checked: Instant,
}

impl ReloadingCert {
    /// Load once; errors here are start-up errors.
    pub fn new(files: TlsFiles) -> Result<Self, TlsError> {
        let key = load_key(&files)?;
        let state = Mutex::new(Loaded {
            key,
            mtimes: mtimes(&files),
            checked: Instant::now(),
        });
        Ok(Self { files, state })
    }

    fn current(&self) -> Arc<CertifiedKey> {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if s.checked.elapsed() >= Duration::from_secs(1) {
            s.checked = Instant::now();
            let now = mtimes(&self.files);
            if now != s.mtimes {
                match load_key(&self.files) {
                    Ok(k) => {
                        tracing::info!(cert = %self.files.cert.display(), "TLS certificate reloaded");
                        s.key = k;
                        s.mtimes = now;
                    }
                    // Mid-rotation the two files can disagree for a moment: keep serving the
                    // old pair and try again on a later handshake.
                    Err(e) => {
                        tracing::warn!(error = %e, "TLS certificate reload failed; keeping the previous one")
                    }
                }
            }
        }
        s.key.clone()
    }
}

impl ResolvesServerCert for ReloadingCert {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current())
    }
}

/// Build the rustls server config: TLS 1.2/1.3, ring, the reloading certificate, mTLS when a
/// client CA is given, and these ALPN protocols (`h2` for gRPC, `http/1.1` for the generator).
pub fn server_config(
    files: &TlsFiles,
    alpn: &[&[u8]],
) -> Result<Arc<rustls::ServerConfig>, TlsError> {
    let builder = rustls::ServerConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])?;
    let builder = match &files.client_ca {
        Some(ca) => {
            let mut roots = rustls::RootCertStore::empty();
            for c in read_certs(ca)? {
                roots
                    .add(c)
                    .map_err(|e| TlsError::ClientCa(format!("{}: {e}", ca.display())))?;
            }
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider())
                .build()
                .map_err(|e| TlsError::ClientCa(e.to_string()))?;
            builder.with_client_cert_verifier(verifier)
        }
        None => builder.with_no_client_auth(),
    };
    let mut cfg = builder.with_cert_resolver(Arc::new(ReloadingCert::new(files.clone())?));
    cfg.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    Ok(Arc::new(cfg))
}

/// A client config trusting `ca` (and presenting `identity` when given): for `cmp-warden
/// client` and the tests.
pub fn client_config(
    ca: &Path,
    identity: Option<(&Path, &Path)>,
    alpn: &[&[u8]],
) -> Result<Arc<rustls::ClientConfig>, TlsError> {
    let mut roots = rustls::RootCertStore::empty();
    for c in read_certs(ca)? {
        roots
            .add(c)
            .map_err(|e| file_err("CA certificate", ca, e))?;
    }
    let builder = rustls::ClientConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])?
        .with_root_certificates(roots);
    let mut cfg = match identity {
        Some((cert, key)) => {
            let chain = read_certs(cert)?;
            let key =
                PrivateKeyDer::from_pem_file(key).map_err(|e| file_err("private key", key, e))?;
            builder.with_client_auth_cert(chain, key)?
        }
        None => builder.with_no_client_auth(),
    };
    cfg.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    Ok(Arc::new(cfg))
}
