//! `cmp-warden appset serve`: the ApplicationSet plugin generator (contract §4) over HTTPS with a
//! bearer token, its command source confined exactly like CMP commands.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use anyhow::{Context, bail};
use clap::{Args, Subcommand};
use policy::generator::{GeneratorConfig, Source};

/// `appset` subcommands.
#[derive(Debug, Subcommand)]
pub enum AppsetCmd {
    /// Serve POST /api/v1/getparams.execute for the ApplicationSet controller.
    Serve(Box<AppsetServeArgs>),
    /// Validate a generator config file and print what it does.
    Check {
        /// Generator config.
        #[arg(long)]
        config: PathBuf,
    },
}

/// `appset serve` flags.
#[derive(Debug, Args)]
pub struct AppsetServeArgs {
    /// Generator config (kind AppSetGenerator; docs/appset.md).
    #[arg(long, env = "CMP_WARDEN_APPSET_CONFIG")]
    config: PathBuf,
    /// Address, TLS and token (the token is required).
    #[command(flatten)]
    net: super::net::NetArgs,
    /// Sandbox policy file [default: the embedded policies/default.yaml].
    #[arg(long, env = "CMP_WARDEN_POLICY")]
    policy: Option<PathBuf>,
    /// Parent of the work directory `_cmp_appset` [default: $TMPDIR or /tmp].
    #[arg(long, env = "CMP_WARDEN_WORK_DIR")]
    work_dir: Option<PathBuf>,
    /// Audit log file, or `-` for stderr.
    #[arg(long, env = "CMP_WARDEN_AUDIT_LOG", default_value = "-")]
    audit_log: String,
    /// Serve Prometheus metrics at http://ADDRESS/metrics.
    #[arg(long, env = "CMP_WARDEN_METRICS_ADDRESS")]
    metrics_address: Option<std::net::SocketAddr>,
    /// Seconds in-flight requests may run after SIGTERM.
    #[arg(long, default_value_t = 30)]
    shutdown_grace: u64,
}

/// Run an `appset` subcommand.
pub fn run(c: AppsetCmd, log_args: Vec<String>) -> ExitCode {
    let a = match c {
        AppsetCmd::Serve(a) => *a,
        AppsetCmd::Check { config } => {
            return match GeneratorConfig::load(&config) {
                Ok(g) => {
                    println!(
                        "ok {}: source {}, dataDir {}, bodyBytes {}, timeoutSeconds {}, concurrency {}",
                        g.name,
                        match &g.source {
                            Source::Command(argv) => format!("command {argv:?}"),
                            Source::Static(l) => format!("static ({} entries)", l.len()),
                            Source::File(f) => format!("file {}", f.display()),
                        },
                        g.data_dir
                            .as_ref()
                            .map_or("none".into(), |d| d.display().to_string()),
                        g.body_bytes,
                        g.timeout_seconds,
                        g.concurrency
                    );
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("error: {}: {e}", config.display());
                    ExitCode::from(1)
                }
            };
        }
    };
    super::serve::run_service(|| prepare(a, log_args), serve)
}

async fn serve(prepared: Prepared, early_stop: Arc<AtomicBool>) -> anyhow::Result<()> {
    if rustix::process::getpid().is_init() {
        jail::reaper::start_orphan_reaper();
    }
    if let Some((l, m)) = prepared.metrics {
        let l = tokio::net::TcpListener::from_std(l)?;
        tokio::spawn(server::metrics::serve_metrics(l, m));
    }
    tracing::info!(
        address = %prepared.addr,
        tls = prepared.tls.is_some(),
        generator = %prepared.svc.config.name,
        "serving the ApplicationSet plugin generator on {}://{}{}",
        if prepared.tls.is_some() { "https" } else { "http" },
        prepared.addr,
        server::appset::PATH
    );
    server::appset::serve(
        prepared.listener,
        prepared.tls,
        prepared.svc,
        prepared.grace,
        super::serve::shutdown_signal(early_stop),
    )
    .await?;
    super::serve::shut_down_runner(prepared.runner).await;
    tracing::info!("shut down cleanly");
    Ok(())
}

struct Prepared {
    listener: std::net::TcpListener,
    addr: std::net::SocketAddr,
    tls: Option<Arc<rustls::ServerConfig>>,
    svc: Arc<server::appset::AppSetService>,
    /// Shut down after the last request: retires the spare jail.
    runner: Arc<dyn jail::Runner>,
    grace: Duration,
    metrics: Option<(std::net::TcpListener, Arc<server::metrics::Metrics>)>,
}

fn prepare(a: AppsetServeArgs, log_args: Vec<String>) -> anyhow::Result<Prepared> {
    tracing::info!(
        version = env!("CARGO_PKG_VERSION"),
        "cmp-warden appset starting"
    );
    rustix::process::set_dumpable_behavior(rustix::process::DumpableBehavior::NotDumpable)
        .context("prctl(PR_SET_DUMPABLE, 0)")?;
    let config = GeneratorConfig::load(&a.config)
        .with_context(|| format!("--config {}", a.config.display()))?;
    let policy = super::sandbox::load_policy(a.policy.as_deref())?;
    if a.net.listen.is_none() {
        bail!("appset serve needs --listen HOST:PORT");
    }
    let Some(token) = a.net.token()? else {
        bail!(
            "appset serve needs --token-file or --token-env: the ApplicationSet controller always sends a bearer token, and an unauthenticated generator would answer anyone"
        );
    };
    let bound = a
        .net
        .bind(&[b"http/1.1"])?
        .context("--listen is required")?;
    let work_parent = a.work_dir.clone().unwrap_or_else(std::env::temp_dir);
    let work_dir = work_parent.join("_cmp_appset");
    // Only a command source runs anything; static and file sources need no jail.
    let mut config = config;
    let runner: Arc<dyn jail::Runner> = if matches!(config.source, Source::Command(_)) {
        let built =
            super::sandbox::build(&policy, &work_dir, log_args, super::sandbox::Owner::Server)?;
        let own_uid = rustix::process::geteuid().as_raw();
        let kept = if own_uid == 0 || built.privileges.can_switch_uids() {
            jail::privilege::drop_supervisor_capabilities()
                .context("dropping the supervisor's capabilities")?
        } else {
            Vec::new()
        };
        let report = super::sandbox::probe(&built, &policy)?;
        super::sandbox::log_enforced(&built, &policy, &report, &kept);
        // Each running command holds a leased UID: more slots than UIDs would turn a burst
        // into errors instead of a queue.
        if let Some((_, capacity)) = built.runner.pool_usage()
            && capacity < config.concurrency
        {
            tracing::warn!(
                concurrency = config.concurrency,
                uids = capacity,
                "spec.limits.concurrency exceeds the policy's UID range; using {capacity}"
            );
            config.concurrency = capacity;
        }
        Arc::new(built.runner)
    } else {
        if rustix::process::geteuid().is_root() {
            jail::privilege::drop_supervisor_capabilities()
                .context("dropping the supervisor's capabilities")?;
        }
        Arc::new(NoCommands)
    };
    let audit = match a.audit_log.as_str() {
        "-" | "" => server::audit::AuditSink::stderr(),
        path => server::audit::AuditSink::file(std::path::Path::new(path))
            .with_context(|| format!("--audit-log {path}"))?,
    };
    let metrics = Arc::new(server::metrics::Metrics::default());
    let metrics_listener = match a.metrics_address {
        Some(addr) => {
            let l = std::net::TcpListener::bind(addr)
                .with_context(|| format!("--metrics-address {addr}"))?;
            l.set_nonblocking(true)?;
            Some((l, metrics.clone()))
        }
        None => None,
    };
    let mut archive_opts = archive::Options::default();
    archive_opts.limits.compressed_bytes = policy.archive.compressed_bytes;
    archive_opts.limits.extracted_bytes = policy.archive.extracted_bytes;
    archive_opts.limits.file_bytes = policy.archive.file_bytes;
    archive_opts.limits.entries = policy.archive.entries;
    let svc = server::appset::AppSetService::new(
        config,
        runner.clone(),
        token,
        work_dir,
        policy.passed_env(std::env::vars()),
        archive_opts,
        policy.limits.output_bytes,
        audit,
        server::audit::PolicyRef {
            name: policy.name.clone(),
            sha256: policy.sha256.clone(),
        },
        metrics,
    );
    Ok(Prepared {
        listener: bound.listener,
        addr: bound.addr,
        tls: bound.tls,
        svc: Arc::new(svc),
        runner,
        grace: Duration::from_secs(a.shutdown_grace),
        metrics: metrics_listener,
    })
}

/// The runner of a generator without a command source: never asked to run anything.
#[derive(Debug)]
struct NoCommands;

impl jail::Runner for NoCommands {
    fn execute(
        &self,
        _spec: &jail::RequestSpec,
        _input: Box<dyn std::io::Read + Send>,
        _cancel: &jail::CancelToken,
    ) -> Result<jail::Outcome, jail::RequestError> {
        Err(jail::RequestError::Remote {
            kind: jail::protocol::ErrorKind::Internal,
            message: "this generator has no command source".into(),
        })
    }
    fn reclaim(&self, _spec: &jail::RequestSpec) {}
    fn describe(&self) -> &'static str {
        "no commands (static or file source)"
    }
}
