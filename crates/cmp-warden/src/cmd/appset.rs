//! `cmp-warden appset serve`: the ApplicationSet plugin generator (docs/services.md) over HTTPS with a
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
    /// Generator config (kind AppSetGenerator; docs/services.md).
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
    #[arg(long, env = "CMP_WARDEN_METRICS_ADDRESS", value_parser = super::parse_listen_address)]
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
                    super::print_out(&format!(
                        "ok {}: source {}, dataDir {}, bodyBytes {}, timeoutSeconds {}, concurrency {}\n",
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
                    ));
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
    let served = server::appset::serve(
        prepared.listener,
        prepared.tls,
        prepared.svc,
        prepared.connections,
        prepared.grace,
        super::serve::shutdown_signal(early_stop),
    )
    .await;
    // Whatever ended serving, what the runner keeps is retired (its cgroups included).
    if let Some(s) = prepared.supervisor {
        super::serve::shut_down(s).await;
    }
    served?;
    tracing::info!("shut down cleanly");
    Ok(())
}

struct Prepared {
    listener: std::net::TcpListener,
    addr: std::net::SocketAddr,
    tls: Option<Arc<rustls::ServerConfig>>,
    connections: Arc<server::conns::Registry>,
    svc: Arc<server::appset::AppSetService>,
    /// Shut down after the last request: retires the spare jail (none without a command
    /// source).
    supervisor: Option<Arc<supervisor::Supervisor>>,
    grace: Duration,
    metrics: Option<(std::net::TcpListener, Arc<server::metrics::Metrics>)>,
}

/// Flags, the generator config and the policy, then the supervisor's start-up (which binds the
/// listener at its step for it); a generator without a command source starts no jails.
fn prepare(a: AppsetServeArgs, log_args: Vec<String>) -> anyhow::Result<Prepared> {
    tracing::info!(
        version = env!("CARGO_PKG_VERSION"),
        "cmp-warden appset starting"
    );
    let mut config = GeneratorConfig::load(&a.config)
        .with_context(|| format!("--config {}", a.config.display()))?;
    let policy = super::flags::load_policy(a.policy.as_deref())?;
    if a.net.listen.is_none() {
        bail!("appset serve needs --listen HOST:PORT");
    }
    let Some(token) = a.net.token()? else {
        bail!(
            "appset serve needs --token-file or --token-env: the ApplicationSet controller always sends a bearer token, and an unauthenticated generator would answer anyone"
        );
    };
    let work_parent = a.work_dir.clone().unwrap_or_else(std::env::temp_dir);
    let work_dir = work_parent.join("_cmp_appset");
    let mut bound = None;
    let (supervisor, runner, plan): (_, Arc<dyn supervisor::Runner>, _) =
        if matches!(config.source, Source::Command(_)) {
            let bind = || -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
                bound = a.net.bind(&[b"http/1.1"])?;
                Ok(())
            };
            let mut start =
                supervisor::StartOptions::new(work_dir.clone(), supervisor::Owner::Server);
            start.log_args = log_args;
            start.bind = Some(Box::new(bind));
            start.lease_dir = super::flags::lease_dir(None);
            let (supervisor, _) = supervisor::Supervisor::start(&policy, start)?;
            // Each running command holds a leased UID: more slots than UIDs would turn a burst
            // into errors instead of a queue.
            if let Some((_, capacity)) = supervisor.pool_usage()
                && capacity < config.concurrency
            {
                tracing::warn!(
                    concurrency = config.concurrency,
                    uids = capacity,
                    "spec.limits.concurrency exceeds the policy's UID range; using {capacity}"
                );
                config.concurrency = capacity;
            }
            let (runner, plan) = (supervisor.runner(), supervisor.plan());
            (Some(Arc::new(supervisor)), runner, plan)
        } else {
            // Static and file sources run nothing: bind, then keep no capability.
            bound = a.net.bind(&[b"http/1.1"])?;
            supervisor::start_without_jails()?;
            let plan =
                supervisor::Plan::new(&policy, &supervisor::Overrides::default(), std::env::vars());
            (
                None,
                Arc::new(server::appset::NoCommands) as Arc<dyn supervisor::Runner>,
                Arc::new(plan),
            )
        };
    let bound = bound.context("--listen is required")?;
    let audit = super::flags::audit_sink(&a.audit_log)?;
    let metrics = Arc::new(server::metrics::Metrics::default());
    metrics.set_commit(env!("CMP_WARDEN_COMMIT"));
    let metrics_listener = super::flags::metrics_listener(a.metrics_address, &metrics)?;
    let svc =
        server::appset::AppSetService::new(config, runner, token, work_dir, plan, audit, metrics);
    Ok(Prepared {
        listener: bound.listener,
        addr: bound.addr,
        tls: bound.tls,
        connections: bound.connections,
        svc: Arc::new(svc),
        supervisor,
        grace: Duration::from_secs(a.shutdown_grace),
        metrics: metrics_listener,
    })
}
