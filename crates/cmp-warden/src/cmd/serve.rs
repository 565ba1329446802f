//! `cmp-warden serve`: argocd-cmp-server's flags, environment and start-up sequence.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use clap::Args;
use plugin::PluginConfig;
use server::{CmpService, ListenOptions, ServiceConfig};

/// Argo CD exits with 20 on fatal start-up errors.
const EXIT_STARTUP: u8 = 20;

/// `serve` flags.
#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Directory holding plugin.yaml.
    #[arg(long, default_value = "/home/argocd/cmp-server/config")]
    config_dir_path: PathBuf,
    /// Socket directory.
    #[arg(
        long,
        env = "ARGOCD_PLUGINSOCKFILEPATH",
        default_value = "/home/argocd/cmp-server/plugins"
    )]
    socket_dir: PathBuf,
    /// Parent of the work directory `_cmp_server` [default: $TMPDIR or /tmp].
    #[arg(long, env = "ARGOCD_CMP_WORKDIR")]
    work_dir: Option<PathBuf>,
    /// gRPC message size limit in MiB.
    #[arg(long, env = "ARGOCD_GRPC_MAX_SIZE_MB", default_value_t = 100)]
    grpc_max_size_mb: usize,
    /// Socket mode, octal (e.g. 0660) [default: as created].
    #[arg(long, value_parser = parse_octal)]
    socket_mode: Option<u32>,
    /// Socket owner as UID[:GID] (e.g. 999:999 so a repo-server running as 999 can connect).
    #[arg(long)]
    socket_owner: Option<String>,
    /// UIDs allowed to connect, comma-separated, or `any` [default: 999 and the server's own UID].
    #[arg(long, env = "CMP_WARDEN_ALLOWED_UIDS")]
    allowed_uids: Option<String>,
    /// Seconds in-flight requests may run after SIGTERM.
    #[arg(long, default_value_t = 30)]
    shutdown_grace: u64,
    /// Per-command stdout/stderr budget.
    #[arg(long, default_value = "64Mi")]
    output_bytes: String,
    /// Maximum compressed archive size.
    #[arg(long, default_value = "100Mi")]
    max_compressed: String,
}

fn parse_octal(s: &str) -> Result<u32, String> {
    u32::from_str_radix(s.trim_start_matches("0o"), 8).map_err(|e| e.to_string())
}

/// Run the server; exit 0 after a clean shutdown, 20 on start-up failure.
pub fn run(a: ServeArgs) -> ExitCode {
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            tracing::error!(error = %e, "cannot start runtime");
            return ExitCode::from(EXIT_STARTUP);
        }
    };
    match rt.block_on(serve(a)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = %format!("{e:#}"), "fatal");
            ExitCode::from(EXIT_STARTUP)
        }
    }
}

async fn serve(a: ServeArgs) -> anyhow::Result<()> {
    tracing::info!(version = env!("CARGO_PKG_VERSION"), "cmp-warden starting");
    let loaded = PluginConfig::read_dir(&a.config_dir_path)?;
    for k in &loaded.unknown_keys {
        tracing::warn!(key = %k, "plugin.yaml: unknown key ignored (Argo CD ignores it too)");
    }
    let config = loaded.config;
    if !config.spec.discover.is_defined() {
        tracing::info!(
            "No discovery configuration is defined for plugin {}. To use this plugin, specify {:?} in the Application's spec.source.plugin.name field.",
            config.name,
            config.plugin_name()
        );
    }
    let socket_path = config.socket_path(&a.socket_dir);
    let work_parent = a.work_dir.clone().unwrap_or_else(std::env::temp_dir);
    let work_dir = work_parent.join("_cmp_server");
    // Wipe and recreate, as Argo CD does: nothing of a previous run survives.
    if work_dir.exists() {
        std::fs::remove_dir_all(&work_dir)
            .with_context(|| format!("error removing workdir {}", work_dir.display()))?;
    }
    std::fs::create_dir_all(&work_dir)
        .with_context(|| format!("error creating workdir {}", work_dir.display()))?;
    std::fs::set_permissions(
        &work_dir,
        std::os::unix::fs::PermissionsExt::from_mode(0o700),
    )?;

    let own_uid = rustix::process::geteuid().as_raw();
    let allowed_uids = match a.allowed_uids.as_deref() {
        Some("any") => None,
        Some(list) => Some(
            list.split(',')
                .map(|u| u.trim().parse::<u32>())
                .collect::<Result<Vec<_>, _>>()
                .context("--allowed-uids")?,
        ),
        None => Some(vec![999, own_uid]),
    };
    let socket_owner = match &a.socket_owner {
        None => None,
        Some(s) => {
            let (u, g) = s.split_once(':').unwrap_or((s, ""));
            let p = |v: &str| -> anyhow::Result<Option<u32>> {
                if v.is_empty() {
                    Ok(None)
                } else {
                    Ok(Some(v.parse()?))
                }
            };
            Some((p(u)?, p(g)?))
        }
    };
    if a.grpc_max_size_mb == 0 {
        bail!("ARGOCD_GRPC_MAX_SIZE_MB must be positive");
    }
    let mut archive_opts = archive::Options::default();
    archive_opts.limits.compressed_bytes = policy::parse_quantity(&a.max_compressed)?;
    let svc = CmpService::new(
        ServiceConfig {
            plugin: config.clone(),
            work_dir: work_dir.clone(),
            archive: archive_opts,
            output_bytes: policy::parse_quantity(&a.output_bytes)?,
            base_env: std::env::vars().collect(),
        },
        Arc::new(jail::Unconfined),
    );
    let opts = ListenOptions {
        socket_path: socket_path.clone(),
        socket_mode: a.socket_mode,
        socket_owner,
        allowed_uids: allowed_uids.clone(),
        max_message_bytes: a.grpc_max_size_mb * 1024 * 1024,
        shutdown_grace: Duration::from_secs(a.shutdown_grace),
    };
    let listener = server::bind(&opts)?;
    if rustix::process::getpid().is_init() {
        jail::reaper::start_orphan_reaper();
    }
    tracing::info!(
        socket = %socket_path.display(),
        work_dir = %work_dir.display(),
        allowed_uids = ?allowed_uids,
        runner = jail::Runner::describe(&jail::Unconfined),
        "argocd-cmp-server {} (cmp-warden) serving on {}",
        env!("CARGO_PKG_VERSION"),
        socket_path.display()
    );
    server::serve(listener, svc, opts, shutdown_signal()).await?;
    let _ = std::fs::remove_dir_all(&work_dir);
    tracing::info!("shut down cleanly");
    Ok(())
}

async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        std::future::pending::<()>().await;
        return;
    };
    tokio::select! {
        _ = term.recv() => tracing::info!("SIGTERM received"),
        _ = int.recv() => tracing::info!("SIGINT received"),
    }
}
