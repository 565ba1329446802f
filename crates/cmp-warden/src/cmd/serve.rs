//! `cmp-warden serve`: argocd-cmp-server's flags, environment and start-up sequence.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
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
    /// gRPC message size limit in MiB [default: 100; as Argo CD, a value that is not a whole
    /// number is warned about and the default used].
    #[arg(long, env = "ARGOCD_GRPC_MAX_SIZE_MB")]
    grpc_max_size_mb: Option<String>,
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
    /// Per-command stdout/stderr budget [default: the policy's spec.limits.outputBytes].
    #[arg(long)]
    output_bytes: Option<String>,
    /// Maximum compressed archive size [default: the policy's spec.archive.compressedBytes].
    #[arg(long)]
    max_compressed: Option<String>,
    /// Sandbox policy file, or a directory of policies chosen per request by `spec.select`
    /// [default: the embedded policies/default.yaml].
    #[arg(long, env = "CMP_WARDEN_POLICY")]
    policy: Option<PathBuf>,
    /// Audit log: a file to append one JSON line per request to, or `-` for stderr (beside
    /// the other logs, marked "log":"audit").
    #[arg(long, env = "CMP_WARDEN_AUDIT_LOG", default_value = "-")]
    audit_log: String,
    /// Serve Prometheus metrics at http://ADDRESS/metrics (e.g. 127.0.0.1:9102) [default: off].
    #[arg(long, env = "CMP_WARDEN_METRICS_ADDRESS", value_parser = super::parse_listen_address)]
    metrics_address: Option<std::net::SocketAddr>,
    /// Plugins as services: also (or, with --no-unix-socket, only) serve on a TCP port.
    #[command(flatten)]
    net: super::net::NetArgs,
    /// Do not create the unix socket (a TCP-only plugin service; needs --listen).
    #[arg(long)]
    no_unix_socket: bool,
    /// Requests running at once; more wait in a queue [default: 32, and at most the policy's
    /// UID range minus the spare jail's].
    #[arg(long, env = "CMP_WARDEN_MAX_IN_FLIGHT")]
    max_in_flight: Option<usize>,
    /// Requests waiting for a slot (within their deadline); beyond this a request is refused
    /// at once with ResourceExhausted.
    #[arg(long, env = "CMP_WARDEN_MAX_QUEUED", default_value_t = 256)]
    max_queued: usize,
    /// OpenTelemetry collector address, host:port (as argocd-cmp-server): each request's
    /// spans are exported over OTLP/gRPC, joined to the caller's trace [default: off].
    #[arg(long, env = "ARGOCD_CMP_SERVER_OTLP_ADDRESS")]
    otlp_address: Option<String>,
    /// Plaintext to the collector; false: TLS with the system's roots (Go's boolean spellings:
    /// 1, t, T, TRUE, true, True, 0, f, F, FALSE, false, False).
    #[arg(long, env = "ARGOCD_CMP_SERVER_OTLP_INSECURE", num_args = 0..=1, default_missing_value = "true", default_value = "true", value_parser = parse_go_bool, action = clap::ArgAction::Set)]
    otlp_insecure: bool,
    /// gRPC metadata sent to the collector, key1=value1,key2=value2 (repeatable; a malformed
    /// pair is warned about and skipped, as Argo CD does).
    #[arg(long, env = "ARGOCD_CMP_SERVER_OTLP_HEADERS", action = clap::ArgAction::Append)]
    otlp_headers: Vec<String>,
    /// Extra resource attributes on every span, key:value,... (repeatable; malformed ones are
    /// warned about and skipped).
    #[arg(long, env = "ARGOCD_CMP_SERVER_OTLP_ATTRS", action = clap::ArgAction::Append)]
    otlp_attrs: Vec<String>,
    /// Share of new traces exported (0 to 1); a caller's sampling decision is always followed
    /// [default: OTEL_TRACES_SAMPLER's, else 1].
    #[arg(long, env = "ARGOCD_CMP_SERVER_OTLP_SAMPLE_RATIO", value_parser = parse_ratio)]
    otlp_sample_ratio: Option<f64>,
    /// Seconds a request's stream may pause between two messages before it is ended.
    #[arg(long, env = "CMP_WARDEN_STREAM_IDLE_TIMEOUT", default_value_t = 30)]
    stream_idle_timeout: u64,
}

fn parse_octal(s: &str) -> Result<u32, String> {
    u32::from_str_radix(s.trim_start_matches("0o"), 8).map_err(|e| e.to_string())
}

/// Go's `strconv.ParseBool`, which pflag uses for boolean flags.
pub fn parse_go_bool(s: &str) -> Result<bool, String> {
    match s {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Ok(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Ok(false),
        _ => Err(format!("invalid boolean {s:?} (true or false)")),
    }
}

/// A sampling ratio in [0, 1] (Argo CD's bounded float flag).
fn parse_ratio(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(r) if (0.0..=1.0).contains(&r) => Ok(r),
        _ => Err(format!("{s:?} is not a number between 0 and 1")),
    }
}

/// `ARGOCD_GRPC_MAX_SIZE_MB` as Argo CD reads it: a whole number of MiB; anything else is
/// warned about and the default (100) used.
pub fn grpc_max_size_mb(v: Option<&str>) -> usize {
    const DEFAULT: usize = 100;
    match v.map(str::trim).filter(|v| !v.is_empty()) {
        None => DEFAULT,
        Some(v) => match v.parse::<u32>() {
            Ok(n) if i32::try_from(n).is_ok() => n as usize,
            _ => {
                tracing::warn!(
                    value = v,
                    "ARGOCD_GRPC_MAX_SIZE_MB is not a whole number of MiB: using the default, 100"
                );
                DEFAULT
            }
        },
    }
}

/// Run the server; exit 0 after a clean shutdown, 20 on start-up failure.
pub fn run(a: ServeArgs, log_args: Vec<String>) -> ExitCode {
    run_service(|| prepare(a, log_args), serve)
}

/// The start-up skeleton `serve` and `appset serve` share: stop-signal flag first (a SIGTERM
/// before the runtime exists must still mean "shut down cleanly"), then `prepare` — everything
/// privileged, while the process is single-threaded (capabilities are per thread) — then the
/// runtime and `serve`. Exit 0 after a clean shutdown, 20 on any start-up failure.
pub fn run_service<P, F>(
    prepare: impl FnOnce() -> anyhow::Result<P>,
    serve: impl FnOnce(P, Arc<AtomicBool>) -> F,
) -> ExitCode
where
    F: Future<Output = anyhow::Result<()>>,
{
    let early_stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT] {
        if let Err(e) = signal_hook::flag::register(sig, early_stop.clone()) {
            tracing::error!(error = %e, "cannot install signal handlers");
            return ExitCode::from(EXIT_STARTUP);
        }
    }
    let prepared = match prepare() {
        Ok(p) => p,
        Err(e) => {
            tracing::error!(error = %format!("{e:#}"), "fatal");
            return ExitCode::from(EXIT_STARTUP);
        }
    };
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
    match rt.block_on(serve(prepared, early_stop)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = %format!("{e:#}"), "fatal");
            ExitCode::from(EXIT_STARTUP)
        }
    }
}

struct Prepared {
    svc: CmpService,
    /// Shut down after the last request: retires the spare jail.
    supervisor: Arc<supervisor::Supervisor>,
    opts: ListenOptions,
    listener: Option<std::os::unix::net::UnixListener>,
    tcp: Option<(std::net::TcpListener, server::TcpOptions)>,
    work_dir: PathBuf,
    describe: &'static str,
    metrics: Option<(std::net::TcpListener, Arc<server::metrics::Metrics>)>,
    tracer: Option<(Arc<otlp::Exporter>, otlp::ExportTask)>,
    /// Reloads the policies and plugin.yaml while serving.
    reloader: Arc<server::reload::Reloader>,
}

/// Everything before serving:
///
/// 1. the flags, the tracer, the policy and the overrides flags make of it;
/// 2. `plugin.yaml` ([`plugin_config`]);
/// 3. the unix socket's options ([`listen_options`]);
/// 4. the supervisor's start-up (`supervisor::Supervisor::start`), which binds our listeners at
///    its step for it;
/// 5. the doctor report logged ([`report`]);
/// 6. the audit sink, the metrics listener, admission within the UID range, the service.
fn prepare(a: ServeArgs, log_args: Vec<String>) -> anyhow::Result<Prepared> {
    tracing::info!(
        version = env!("CARGO_PKG_VERSION"),
        commit = env!("CMP_WARDEN_COMMIT"),
        commit_date = env!("CMP_WARDEN_COMMIT_DATE"),
        "cmp-warden starting"
    );
    super::flags::argo_only_variables();
    let tracer = otlp_exporter(&a)?;
    // What a reload compares with: the files as they are before they are loaded.
    let reload_sources = server::reload::Sources {
        policy: a.policy.clone(),
        plugin_dir: a.config_dir_path.clone(),
    };
    let baseline = server::reload::Baseline::take(&reload_sources);
    let policies = super::flags::load_policies(a.policy.as_deref())?;
    let grpc_max_size_mb = grpc_max_size_mb(a.grpc_max_size_mb.as_deref());
    let overrides = supervisor::Overrides {
        compressed_bytes: super::flags::quantity("--max-compressed", a.max_compressed.as_deref())?,
        output_bytes: super::flags::quantity("--output-bytes", a.output_bytes.as_deref())?,
        command_timeout: super::flags::exec_timeout(),
        reply_bytes: Some(grpc_max_size_mb as u64 * 1024 * 1024),
    };

    // 2.
    let config = plugin_config(&a.config_dir_path)?;
    let socket_path = config.socket_path(&a.socket_dir);
    let work_parent = a.work_dir.clone().unwrap_or_else(std::env::temp_dir);
    let work_dir = work_parent.join("_cmp_server");

    // 3.
    let opts = listen_options(&a, socket_path.clone(), grpc_max_size_mb)?;

    // 4.
    let mut listener = None;
    let mut tcp = None;
    let (supervisor, enforcement) = {
        let bind = || -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
            if !a.no_unix_socket {
                listener = Some(server::bind(&opts)?);
            }
            tcp = a.net.bind(&[b"h2"])?.map(|b| {
                (
                    b.listener,
                    server::TcpOptions {
                        addr: b.addr,
                        tls: b.tls,
                        token: b.token,
                        connections: b.connections,
                    },
                )
            });
            Ok(())
        };
        let mut start = supervisor::StartOptions::new(work_dir.clone(), supervisor::Owner::Server);
        start.overrides = overrides;
        start.log_args = log_args;
        // The start-up self-test: the confined extractor must fail to write here. These are
        // also the server's own directories, which no policy grants a command.
        start.probe_writes = vec![
            std::path::absolute(&a.config_dir_path)?,
            std::path::absolute(&a.socket_dir)?,
        ];
        if let Some(dir) = a.policy.as_deref().filter(|p| p.is_dir()) {
            start.probe_writes.push(std::path::absolute(dir)?);
        }
        start.bind = Some(Box::new(bind));
        start.lease_dir = super::flags::lease_dir(Some(&std::path::absolute(&a.socket_dir)?));
        supervisor::Supervisor::start_set(&policies, start)?
    };
    // 5.
    report(
        supervisor.plans().current().default_plan(),
        &enforcement,
        (&a.socket_dir, &work_parent),
    );

    // 6.
    let audit = super::flags::audit_sink(&a.audit_log)?;
    let metrics = Arc::new(server::metrics::Metrics::default());
    metrics.set_commit(env!("CMP_WARDEN_COMMIT"));
    let metrics_listener = super::flags::metrics_listener(a.metrics_address, &metrics)?;
    metrics.set_pool_source(supervisor.pool_gauge());
    if supervisor.tree_cache_stats().is_some() {
        metrics.set_cache_source(supervisor.cache_gauge());
    }
    // With a UID per request, never admit more than the range can lease beside the spares
    // (one per policy): a request then waits for a UID instead of failing for lack of one.
    let spares = policies.policies().len();
    let uid_room = supervisor
        .pool_usage()
        .map_or(usize::MAX, |(_, cap)| cap.saturating_sub(spares).max(1));
    let admission = server::admission::AdmissionConfig {
        max_in_flight: a.max_in_flight.unwrap_or(32).min(uid_room).max(1),
        max_queued: a.max_queued,
        stream_idle: Duration::from_secs(a.stream_idle_timeout.max(1)),
    };
    tracing::info!(
        max_in_flight = admission.max_in_flight,
        max_queued = admission.max_queued,
        stream_idle_seconds = admission.stream_idle.as_secs(),
        "admission"
    );
    let runner = supervisor.runner();
    let describe = runner.describe();
    let supervisor = Arc::new(supervisor);
    let config = Arc::new(supervisor::Current::new(server::reload::ConfigSet {
        plans: supervisor.plans().current(),
        plugin: Arc::new(config),
    }));
    let reloader = Arc::new(
        server::reload::Reloader::new(
            reload_sources,
            baseline,
            supervisor.clone(),
            config.clone(),
            audit.clone(),
            metrics.clone(),
        )?
        .with_status_dir(work_parent.clone()),
    );
    let svc = CmpService::new(
        ServiceConfig {
            config,
            work_dir: work_dir.clone(),
            audit,
            metrics,
            tcp_token: tcp.as_ref().and_then(|(_, t)| t.token.clone()),
            admission,
            tracer: tracer.as_ref().map(|(e, _)| e.clone()),
        },
        runner,
    );
    Ok(Prepared {
        svc,
        supervisor,
        reloader,
        opts,
        listener,
        tcp,
        work_dir,
        describe,
        metrics: metrics_listener,
        tracer,
    })
}

/// `plugin.yaml` from the config directory, its unknown keys and a missing discovery said.
fn plugin_config(dir: &std::path::Path) -> anyhow::Result<PluginConfig> {
    let loaded = PluginConfig::read_dir(dir)?;
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
    Ok(config)
}

/// The unix socket: its path, mode and owner (defaults that keep leased UIDs out at the file
/// system), the UIDs its peer check admits, the message limit and the drain grace.
fn listen_options(
    a: &ServeArgs,
    socket_path: PathBuf,
    grpc_max_size_mb: usize,
) -> anyhow::Result<ListenOptions> {
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
    // Run as root with no socket flags (Argo's documented sidecar pattern), a socket created
    // 0755 root:root would refuse the repo-server (999). Two layers then: the file system lets
    // only root and the repo-server's group (999, Argo CD's image) connect — never a leased
    // UID — and the peer-credential check admits only the allowed UIDs.
    let (socket_mode, socket_owner) = match default_socket(
        own_uid,
        a,
        allowed_uids.is_some(),
        &a.socket_dir,
    ) {
        Some(DefaultSocket { mode, owner, why }) => {
            if mode == 0o666 {
                tracing::warn!(
                    allowed_uids = %uid_list(allowed_uids.as_deref()),
                    "socket mode 0666: {why}; only the peer-credential check refuses other UIDs, leased ones included (give the socket directory group 999 with the setgid bit — the pod's fsGroup: 999 — or pass --socket-owner 0:999 with CAP_CHOWN)"
                );
            } else {
                tracing::info!(
                    allowed_uids = %uid_list(allowed_uids.as_deref()),
                    "socket mode 0660: {why}; the peer-credential check then admits only the allowed UIDs (--socket-mode, --socket-owner change it)"
                );
            }
            (Some(mode), owner)
        }
        None => (a.socket_mode, socket_owner),
    };
    if grpc_max_size_mb == 0 {
        bail!(
            "ARGOCD_GRPC_MAX_SIZE_MB is 0: no message could be received (Argo CD would start and fail every request); set a positive number of MiB"
        );
    }
    if a.no_unix_socket && a.net.listen.is_none() {
        bail!("--no-unix-socket needs --listen");
    }
    Ok(ListenOptions {
        socket_path,
        socket_mode,
        socket_owner,
        allowed_uids: allowed_uids.clone(),
        max_message_bytes: grpc_max_size_mb * 1024 * 1024,
        shutdown_grace: Duration::from_secs(a.shutdown_grace),
    })
}

/// The doctor report as one log line, and each gap in confinement as a warning.
fn report(
    plan: &supervisor::Plan,
    enforcement: &supervisor::Enforcement,
    dirs: (&std::path::Path, &std::path::Path),
) {
    let doctor = super::doctor::assemble(plan, enforcement, dirs, None, std::env::vars().collect());
    tracing::info!(
        report = %serde_json::to_string(&doctor).unwrap_or_default(),
        schema = super::doctor::SCHEMA,
        "doctor report"
    );
    for gap in &doctor.gaps {
        tracing::warn!(
            missing = %gap.missing,
            fix = %gap.fix,
            "REDUCED CONFINEMENT on this node: requests do not get {} (fix: {})",
            gap.missing,
            gap.fix
        );
    }
}

/// `--otlp-*` → the exporter (started with the runtime), as argocd-cmp-server configures
/// its tracer: service name `argocd-cmp-server` (dashboards keep working), plus our version
/// and the operator's attributes. The SDKs' standard `OTEL_*` variables are read beneath the
/// flags (`otlp::OtelEnv`): an endpoint alone turns export on, and a flag wins over them.
pub fn otlp_exporter(
    a: &ServeArgs,
) -> anyhow::Result<Option<(Arc<otlp::Exporter>, otlp::ExportTask)>> {
    let env = otlp::OtelEnv::from_vars(|k| std::env::var(k).ok());
    for entry in &env.ignored {
        tracing::warn!(entry = %entry, "OpenTelemetry environment: malformed or unsupported; left out");
    }
    let flag = a.otlp_address.as_deref().filter(|a| !a.is_empty());
    let (address, insecure) = match (flag, &env.endpoint) {
        (Some(address), _) => (address.to_owned(), a.otlp_insecure),
        (None, Some((address, insecure))) => (address.clone(), *insecure),
        (None, None) => return Ok(None),
    };
    // The flags win over the environment, OTEL_SDK_DISABLED included.
    if env.disabled {
        if flag.is_none() {
            tracing::info!("OTEL_SDK_DISABLED=true: no spans are exported");
            return Ok(None);
        }
        tracing::info!("OTEL_SDK_DISABLED=true is overridden by --otlp-address");
    }
    // Later entries win: the defaults, the environment's attributes, the flags', and
    // OTEL_SERVICE_NAME over any `service.name` attribute (the SDKs' rule).
    let mut resource: Vec<(String, otlp::Value)> = vec![
        ("service.name".into(), "argocd-cmp-server".into()),
        ("service.version".into(), env!("CARGO_PKG_VERSION").into()),
        ("telemetry.sdk.name".into(), "cmp-warden".into()),
    ];
    resource.extend(env.resource.iter().cloned());
    // As Argo CD: a malformed attribute or header is warned about and left out.
    let (attrs, bad) = otlp::parse_attrs_lenient(&a.otlp_attrs.join(","));
    for b in bad {
        tracing::warn!(attr = %b, "--otlp-attrs: not key:value; left out");
    }
    resource.extend(attrs);
    if let Some(name) = &env.service_name {
        resource.push(("service.name".into(), name.clone().into()));
    }
    let mut seen = std::collections::HashSet::new();
    let mut resource: Vec<_> = resource
        .into_iter()
        .rev()
        .filter(|(k, _)| seen.insert(k.clone()))
        .collect();
    resource.reverse();
    let (flag_headers, bad) = otlp::parse_headers_lenient(&a.otlp_headers.join(","));
    for b in bad {
        tracing::warn!(header = %b, "--otlp-headers: not a valid key=value; left out");
    }
    let headers: Vec<_> = env.headers.iter().cloned().chain(flag_headers).collect();
    let sample_ratio = a.otlp_sample_ratio.or(env.sample_ratio).unwrap_or(1.0);
    let (exporter, task) = otlp::Exporter::new(otlp::ExporterConfig {
        address,
        insecure,
        headers,
        resource,
        scope: ("cmp-warden".into(), env!("CARGO_PKG_VERSION").into()),
        sample_ratio,
    })?;
    tracing::info!(
        endpoint = exporter.endpoint(),
        tls = !insecure,
        sample_ratio,
        from = if flag.is_some() {
            "--otlp-address"
        } else {
            "OTEL_EXPORTER_OTLP_ENDPOINT"
        },
        "OpenTelemetry: exporting each request's spans (joined to the caller's traceparent)"
    );
    Ok(Some((Arc::new(exporter), task)))
}

async fn serve(p: Prepared, early_stop: Arc<AtomicBool>) -> anyhow::Result<()> {
    let tracer = p
        .tracer
        .map(|(exporter, task)| (exporter, tokio::spawn(task.run())));
    if let Some((l, m)) = p.metrics {
        let l = tokio::net::TcpListener::from_std(l)?;
        tokio::spawn(server::metrics::serve_metrics(l, m));
    }
    let socket_path = p.opts.socket_path.clone();
    if let Some((_, t)) = &p.tcp {
        tracing::info!(
            address = %t.addr,
            tls = t.tls.is_some(),
            token = t.token.is_some(),
            "serving gRPC (CMP + health) on tcp://{}",
            t.addr
        );
    }
    if p.listener.is_some() {
        tracing::info!(
            socket = %socket_path.display(),
            work_dir = %p.work_dir.display(),
            allowed_uids = %uid_list(p.opts.allowed_uids.as_deref()),
            runner = p.describe,
            "argocd-cmp-server {} (cmp-warden) serving on {}",
            env!("CARGO_PKG_VERSION"),
            socket_path.display()
        );
    }
    let stop_reloading = Arc::new(AtomicBool::new(false));
    let reloading = p.reloader.clone().spawn(stop_reloading.clone())?;
    let served = server::serve(
        p.listener,
        p.tcp,
        p.svc,
        p.opts,
        shutdown_signal(early_stop),
    )
    .await;
    // No reload once serving ended (a reload's probe would take a UID the shutdown reclaims).
    stop_reloading.store(true, Ordering::Relaxed);
    let _ = tokio::task::spawn_blocking(move || reloading.join()).await;
    p.reloader.withdraw();
    // Whatever ended serving, what the runner keeps is retired (its cgroups included).
    shut_down(p.supervisor).await;
    served?;
    if let Some((exporter, task)) = tracer {
        exporter.shutdown(task, Duration::from_secs(5)).await;
    }
    tracing::info!("shut down cleanly");
    Ok(())
}

/// Retire what the runner keeps ready (the spare jail: its processes, directory, cgroup and UID)
/// once no request is left.
pub async fn shut_down(supervisor: Arc<supervisor::Supervisor>) {
    let _ = tokio::task::spawn_blocking(move || supervisor.shutdown()).await;
}

/// Resolves on SIGTERM/SIGINT (or one that arrived before the runtime existed).
pub async fn shutdown_signal(early_stop: Arc<AtomicBool>) {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        std::future::pending::<()>().await;
        return;
    };
    let early = async {
        // Set by a signal that arrived before these handlers existed (or since: the flag
        // handler stays registered).
        while !early_stop.load(Ordering::SeqCst) {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    tokio::select! {
        _ = term.recv() => tracing::info!("SIGTERM received"),
        _ = int.recv() => tracing::info!("SIGINT received"),
        _ = early => tracing::info!("termination signal received"),
    }
}

/// Allowed UIDs as the log says them: `999,0`, or `any`.
/// A socket's mode and owner chosen without flags, and why (for the log).
struct DefaultSocket {
    mode: u32,
    owner: Option<(Option<u32>, Option<u32>)>,
    why: String,
}

/// The socket's mode and owner when run as root with neither `--socket-mode` nor
/// `--socket-owner` (and an allow list): group 999 (the repo-server's, as Argo CD's image runs
/// it) and 0660, given by chown while we hold CAP_CHOWN (start-up binds before its capability
/// drop) or inherited from a setgid socket directory of another group (the pod's fsGroup);
/// else 0666, said loudly. With the reason, for the log.
fn default_socket(
    own_uid: u32,
    a: &ServeArgs,
    allow_list: bool,
    socket_dir: &std::path::Path,
) -> Option<DefaultSocket> {
    use std::os::unix::fs::MetadataExt;
    if own_uid != 0 || a.socket_mode.is_some() || a.socket_owner.is_some() || !allow_list {
        return None;
    }
    const REPO_SERVER_GID: u32 = 999;
    let can_chown = supervisor::privileges_now()
        .effective
        .iter()
        .any(|c| c == "CAP_CHOWN");
    if can_chown {
        return Some(DefaultSocket {
            mode: 0o660,
            owner: Some((None, Some(REPO_SERVER_GID))),
            why: format!("owned by root:{REPO_SERVER_GID} (the repo-server's group)"),
        });
    }
    match std::fs::metadata(socket_dir) {
        Ok(m) if m.mode() & 0o2000 != 0 && m.gid() != 0 => Some(DefaultSocket {
            mode: 0o660,
            owner: None,
            why: format!("group {} from the socket directory's setgid bit", m.gid()),
        }),
        _ => Some(DefaultSocket {
            mode: 0o666,
            owner: None,
            why: "no CAP_CHOWN to give the socket to the repo-server's group, and the socket directory is not setgid to another group".to_owned(),
        }),
    }
}

fn uid_list(uids: Option<&[u32]>) -> String {
    match uids {
        None => "any".to_owned(),
        Some(u) => u.iter().map(u32::to_string).collect::<Vec<_>>().join(","),
    }
}
