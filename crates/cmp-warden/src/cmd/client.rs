//! `cmp-warden client`: pack a directory as the repo-server does and call one RPC over the unix
//! socket; prints the response as JSON. The debugging tool operators lack, and the benchmark
//! load generator.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use clap::{Args, ValueEnum};
use hyper_util::rt::TokioIo;
use proto::plugin::config_management_plugin_service_client::ConfigManagementPluginServiceClient;
use proto::plugin::{
    AppStreamRequest, EnvEntry, File, ManifestRequestMetadata, app_stream_request,
};
use serde_json::json;
use sha2::Digest;
use tonic::transport::{Channel, Endpoint};

/// Which RPC.
#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum Rpc {
    /// CheckPluginConfiguration
    Check,
    /// MatchRepository
    Match,
    /// GenerateManifest
    Generate,
    /// GetParametersAnnouncement
    Params,
    /// grpc.health.v1 Health/Check
    Health,
}

/// `client` flags.
#[derive(Debug, Args)]
pub struct ClientArgs {
    /// The plugin socket [default: the one of the plugin.yaml in --config-dir-path when there
    /// is one (a probe in a sidecar of a pod with several plugins), else the only `*.sock` in
    /// --socket-dir].
    #[arg(long)]
    socket: Option<PathBuf>,
    /// The server's config directory: its plugin.yaml names the socket.
    #[arg(long, default_value = "/home/argocd/cmp-server/config")]
    config_dir_path: PathBuf,
    /// Directory holding the plugin socket, used when --socket is not given (probes use this:
    /// the socket's name depends on the plugin).
    #[arg(
        long,
        env = "ARGOCD_PLUGINSOCKFILEPATH",
        default_value = "/home/argocd/cmp-server/plugins"
    )]
    socket_dir: PathBuf,
    /// RPC to call.
    rpc: Rpc,
    /// Repository root to pack (not needed for `check`).
    dir: Option<PathBuf>,
    /// Send this ready-made .tar.gz instead of packing DIR (benchmarks: keeps the client's
    /// packing cost, which is the repo-server's, out of the measurement). DIR still names the app.
    #[arg(long)]
    archive: Option<PathBuf>,
    /// App directory relative to DIR.
    #[arg(long, default_value = ".")]
    app_rel_path: String,
    /// Request environment entry (repeatable).
    #[arg(long = "env", value_parser = super::parse_env)]
    env: Vec<(String, String)>,
    /// Bytes per file chunk (the repo-server's ARGOCD_CMP_CHUNK_SIZE).
    #[arg(long, default_value_t = 1024)]
    chunk_size: usize,
    /// Go filepath.Match globs of relative paths to leave out (repeatable), as --plugin-tar-exclude.
    #[arg(long)]
    exclude: Vec<String>,
    /// Request deadline in seconds (sent as grpc-timeout).
    #[arg(long)]
    timeout: Option<u64>,
    /// Call a plugin service over TCP (HOST:PORT) instead of the unix socket; TLS unless
    /// --insecure.
    #[arg(long, conflicts_with = "socket")]
    address: Option<String>,
    /// CA bundle that signed the server's certificate.
    #[arg(long)]
    tls_ca: Option<PathBuf>,
    /// Client certificate for mutual TLS.
    #[arg(long, requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// Key of --tls-cert.
    #[arg(long, requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// Name to verify in the server's certificate [default: the host of --address].
    #[arg(long)]
    tls_server_name: Option<String>,
    /// File holding a bearer token to send.
    #[arg(long)]
    token_file: Option<PathBuf>,
    /// Plaintext TCP.
    #[arg(long)]
    insecure: bool,
}

/// Anything a channel can run over.
trait Io: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send {}
impl<T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send> Io for T {}

/// Connect to a plugin service over TCP, with TLS unless `insecure`.
async fn connect_tcp(a: &ClientArgs, address: &str) -> anyhow::Result<Channel> {
    let tls = if a.insecure {
        None
    } else {
        let ca = a
            .tls_ca
            .as_deref()
            .context("--address needs --tls-ca (or --insecure for plaintext)")?;
        let identity = a.tls_cert.as_deref().zip(a.tls_key.as_deref());
        let cfg = server::tls::client_config(ca, identity, &[b"h2"])?;
        let host = address.rsplit_once(':').map_or(address, |(h, _)| h);
        let name = a
            .tls_server_name
            .clone()
            .unwrap_or_else(|| host.trim_matches(['[', ']']).to_owned());
        let name = rustls_pki_types::ServerName::try_from(name)
            .context("--tls-server-name / --address host is not a valid server name")?;
        Some((tokio_rustls::TlsConnector::from(cfg), name))
    };
    let address = address.to_owned();
    let scheme = if tls.is_some() { "https" } else { "http" };
    // The connector does TLS itself: the endpoint's URI stays http, or tonic (built with its
    // own TLS for the OTLP exporter) refuses an https URI it was given no TLS config for.
    let ch = Endpoint::try_from(format!("http://{address}"))?
        .connect_with_connector(tower::service_fn(move |_| {
            let address = address.clone();
            let tls = tls.clone();
            async move {
                let tcp = tokio::net::TcpStream::connect(&address).await?;
                let _ = tcp.set_nodelay(true);
                let io: Box<dyn Io> = match tls {
                    Some((connector, name)) => Box::new(connector.connect(name, tcp).await?),
                    None => Box::new(tcp),
                };
                Ok::<_, std::io::Error>(TokioIo::new(io))
            }
        }))
        .await
        .with_context(|| {
            format!(
                "connecting to {scheme}://{}",
                a.address.as_deref().unwrap_or("")
            )
        })?;
    Ok(ch)
}

/// Run one client call; exit 1 with the status on stderr on failure.
pub fn run(a: ClientArgs) -> ExitCode {
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(1);
        }
    };
    match rt.block_on(call(a)) {
        Ok(v) => {
            super::print_out(&format!("{v}\n"));
            ExitCode::SUCCESS
        }
        Err(e) => {
            match e.downcast_ref::<tonic::Status>() {
                Some(s) => eprintln!("error: code={:?} message={}", s.code(), s.message()),
                None => eprintln!("error: {e:#}"),
            }
            ExitCode::from(1)
        }
    }
}

/// Connect to a unix socket as grpc-go does (the socket path as authority is irrelevant here).
pub async fn connect(socket: PathBuf) -> anyhow::Result<Channel> {
    let ch = Endpoint::try_from("http://localhost")?
        .connect_with_connector(tower::service_fn(move |_| {
            let p = socket.clone();
            async move {
                Ok::<_, std::io::Error>(TokioIo::new(tokio::net::UnixStream::connect(p).await?))
            }
        }))
        .await
        .context("connecting to the plugin socket")?;
    Ok(ch)
}

/// Pack `dir` (Argo's layout and exclusions) into memory.
pub fn pack(
    dir: &std::path::Path,
    exclude: &[String],
) -> anyhow::Result<(Vec<u8>, archive::PackSummary)> {
    let excl = |rel: &str| {
        exclude
            .iter()
            .any(|g| plugin::glob::go_match(g, rel).unwrap_or(false))
    };
    let mut buf = Vec::new();
    let s = archive::pack_dir(dir, &excl, &mut buf)?;
    Ok((buf, s))
}

/// The request stream: metadata, then chunks.
pub fn requests(
    buf: Vec<u8>,
    sha: &str,
    app_name: String,
    app_rel_path: String,
    env: &[(String, String)],
    chunk: usize,
) -> Vec<AppStreamRequest> {
    let size = buf.len() as i64;
    let mut msgs = vec![AppStreamRequest {
        request: Some(app_stream_request::Request::Metadata(
            ManifestRequestMetadata {
                app_name,
                app_rel_path,
                checksum: sha.to_owned(),
                size,
                env: env
                    .iter()
                    .map(|(k, v)| EnvEntry {
                        name: k.clone(),
                        value: v.clone(),
                    })
                    .collect(),
            },
        )),
    }];
    for c in buf.chunks(chunk.max(1)) {
        msgs.push(AppStreamRequest {
            request: Some(app_stream_request::Request::File(File {
                chunk: c.to_vec(),
            })),
        });
    }
    msgs
}

/// `--socket`; else the socket of the plugin.yaml in `--config-dir-path` (as the server names
/// it); else the one socket in `--socket-dir` (several or none is an error: say which).
fn socket_path(a: &ClientArgs) -> anyhow::Result<PathBuf> {
    if let Some(s) = &a.socket {
        return Ok(s.clone());
    }
    if a.config_dir_path.join("plugin.yaml").is_file() {
        let loaded = plugin::PluginConfig::read_dir(&a.config_dir_path)
            .with_context(|| format!("--config-dir-path {}", a.config_dir_path.display()))?;
        return Ok(loaded.config.socket_path(&a.socket_dir));
    }
    let mut socks: Vec<PathBuf> = std::fs::read_dir(&a.socket_dir)
        .with_context(|| format!("reading --socket-dir {}", a.socket_dir.display()))?
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "sock"))
        .collect();
    socks.sort();
    match socks.len() {
        1 => Ok(socks.remove(0)),
        0 => anyhow::bail!("no *.sock in {}", a.socket_dir.display()),
        _ => anyhow::bail!(
            "several sockets in {} ({}): pass --socket",
            a.socket_dir.display(),
            socks
                .iter()
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

async fn call(a: ClientArgs) -> anyhow::Result<serde_json::Value> {
    let channel = match &a.address {
        Some(addr) => connect_tcp(&a, addr).await?,
        None => connect(socket_path(&a)?).await?,
    };
    let token = match &a.token_file {
        Some(f) => {
            let t = std::fs::read_to_string(f)
                .with_context(|| format!("--token-file {}", f.display()))?;
            Some(
                tonic::metadata::MetadataValue::try_from(format!("Bearer {}", t.trim()))
                    .context("token is not a valid header value")?,
            )
        }
        None => None,
    };
    let add_token = move |mut req: tonic::Request<()>| {
        if let Some(t) = &token {
            req.metadata_mut().insert("authorization", t.clone());
        }
        Ok(req)
    };
    if let Rpc::Health = a.rpc {
        let mut h =
            tonic_health::pb::health_client::HealthClient::with_interceptor(channel, add_token);
        let r = h
            .check(tonic_health::pb::HealthCheckRequest {
                service: String::new(),
            })
            .await?
            .into_inner();
        return Ok(json!({"status": format!("{:?}", r.status()).to_uppercase()}));
    }
    let mut client = ConfigManagementPluginServiceClient::with_interceptor(channel, add_token)
        .max_decoding_message_size(usize::MAX)
        .max_encoding_message_size(usize::MAX);
    if let Rpc::Check = a.rpc {
        let r = client.check_plugin_configuration(()).await?.into_inner();
        return Ok(
            json!({"isDiscoveryConfigured": r.is_discovery_configured, "provideGitCreds": r.provide_git_creds}),
        );
    }
    let dir = a.dir.clone().context("DIR is required for this RPC")?;
    let (buf, sha) = match &a.archive {
        Some(f) => {
            let buf = std::fs::read(f).with_context(|| format!("--archive {}", f.display()))?;
            let sha = hex::encode(sha2::Sha256::digest(&buf));
            (buf, sha)
        }
        None => {
            let (buf, sum) = pack(&dir, &a.exclude)?;
            (buf, hex::encode(sum.sha256))
        }
    };
    let app_dir = dir.join(&a.app_rel_path);
    let app_name = app_dir
        .canonicalize()
        .unwrap_or(app_dir)
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let msgs = requests(
        buf,
        &sha,
        app_name,
        a.app_rel_path.clone(),
        &a.env,
        a.chunk_size,
    );
    let mut req = tonic::Request::new(tokio_stream::iter(msgs));
    if let Some(t) = a.timeout {
        req.set_timeout(Duration::from_secs(t));
    }
    Ok(match a.rpc {
        Rpc::Generate => {
            json!({"manifests": client.generate_manifest(req).await?.into_inner().manifests})
        }
        Rpc::Match => {
            let r = client.match_repository(req).await?.into_inner();
            json!({"isSupported": r.is_supported, "isDiscoveryEnabled": r.is_discovery_enabled})
        }
        Rpc::Params => {
            let r = client.get_parameters_announcement(req).await?.into_inner();
            let list: Vec<_> = r
                .parameter_announcements
                .into_iter()
                .map(|p| {
                    json!({"name": p.name, "title": p.title, "tooltip": p.tooltip, "required": p.required,
                           "itemType": p.item_type, "collectionType": p.collection_type, "string": p.string,
                           "array": p.array, "map": p.map})
                })
                .collect();
            json!({"parameterAnnouncements": list})
        }
        Rpc::Check | Rpc::Health => unreachable!("handled above"),
    })
}
