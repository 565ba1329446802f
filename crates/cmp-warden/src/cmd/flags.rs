//! Flag and environment parsing the commands share. Everything a flag changes about requests
//! goes to `supervisor::Overrides`, applied in the policy's one translation.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use policy::{Policy, PolicySet};

/// Load `--policy FILE` or the embedded default, logging what a reviewer should look at.
pub fn load_policy(file: Option<&Path>) -> anyhow::Result<Policy> {
    let set = load_policies(file)?;
    if set.policies().len() > 1 {
        anyhow::bail!(
            "{}: a policy directory with selected policies (spec.select) is for `serve`; give this command one policy file (the default, or the one a tenant runs under)",
            file.map(|f| f.display().to_string()).unwrap_or_default()
        );
    }
    Ok(set.default_policy().clone())
}

/// `--policy FILE|DIR`: one policy, or a directory of them (one default, the others chosen
/// per request by `spec.select`); the embedded default without it. Warns what a reviewer
/// should look at, per policy.
pub fn load_policies(file: Option<&Path>) -> anyhow::Result<PolicySet> {
    let set = match file {
        Some(f) => PolicySet::load(f)?,
        None => PolicySet::single(Policy::default_policy()?),
    };
    for s in set.skipped() {
        tracing::warn!(skipped = %s, "policy directory: an entry that is not a policy (policies are *.yaml or *.yml files)");
    }
    for p in set.policies() {
        for w in p.warnings() {
            tracing::warn!(policy = %p.name, warning = %w, "policy");
        }
        if p.select
            .as_ref()
            .is_some_and(policy::Select::without_project)
        {
            tracing::warn!(policy = %p.name, "policy: spec.select names no project: an application's author chooses its name and destination namespace, so an application of another project can match it too (add spec.select.projects)");
        }
    }
    Ok(set)
}

/// `ARGOCD_EXEC_TIMEOUT` (Go duration syntax, e.g. `90s`): Argo CD documents it, but its
/// cmp-server never applied it; here it is the per-command limit. Unset, empty or zero: none.
/// A value Go cannot parse is ignored by Argo CD; here it is warned about and not applied.
pub fn exec_timeout() -> Option<(Duration, String)> {
    let v = std::env::var("ARGOCD_EXEC_TIMEOUT")
        .ok()
        .filter(|v| !v.is_empty())?;
    match plugin::duration::parse_go_duration(&v) {
        Ok(d) => (!d.is_zero()).then_some((d, v)),
        Err(e) => {
            tracing::warn!(
                value = %v,
                error = %e,
                "ARGOCD_EXEC_TIMEOUT is not a Go duration (e.g. 90s, 2m30s): no per-command timeout is applied (Argo CD ignores it too)"
            );
            None
        }
    }
}

/// Environment `argocd-cmp-server` reads that changes nothing here, validated as Argo CD
/// validates it and logged, so an operator's setting is never silently dropped:
/// `ARGOCD_GRPC_KEEP_ALIVE_MIN` (the least interval Argo's gRPC server lets a client ping at;
/// hyper answers every ping and never closes a pinging client, so any value holds) and
/// `ARGOCD_ENABLE_GRPC_TIME_HISTOGRAM` (which has no visible effect in Argo CD either: its
/// registry is never served; ours, `--metrics-address`, always has the duration histogram).
pub fn argo_only_variables() {
    if let Some(v) = std::env::var("ARGOCD_GRPC_KEEP_ALIVE_MIN")
        .ok()
        .filter(|v| !v.is_empty())
    {
        match plugin::duration::parse_go_duration(&v) {
            Ok(_) => tracing::info!(
                value = %v,
                "ARGOCD_GRPC_KEEP_ALIVE_MIN: accepted; clients may ping at any interval here (never refused)"
            ),
            Err(e) => tracing::warn!(
                value = %v,
                error = %e,
                "ARGOCD_GRPC_KEEP_ALIVE_MIN is not a Go duration: Argo CD would use 10s; clients may ping at any interval here"
            ),
        }
    }
    if std::env::var("ARGOCD_ENABLE_GRPC_TIME_HISTOGRAM").is_ok_and(|v| v == "true") {
        tracing::info!(
            "ARGOCD_ENABLE_GRPC_TIME_HISTOGRAM: request durations are always a histogram here (cmp_warden_request_duration_seconds, --metrics-address)"
        );
    }
}

/// A quantity flag (`--max-compressed 10Mi`).
pub fn quantity(flag: &str, v: Option<&str>) -> anyhow::Result<Option<u64>> {
    v.map(|q| policy::parse_quantity(q).with_context(|| format!("{flag} {q}")))
        .transpose()
}

/// Where UID leases are locked node-wide (`CMP_WARDEN_LEASE_DIR`, else `.cmp-warden-leases` in
/// the plugin socket directory, which Argo CD's plugin sidecars share). `socket_dir` is the
/// server's own; a one-shot command passes `None` and uses the default socket directory only
/// when it exists (it must not create one).
pub fn lease_dir(socket_dir: Option<&Path>) -> Option<PathBuf> {
    if let Some(d) = std::env::var_os("CMP_WARDEN_LEASE_DIR").filter(|d| !d.is_empty()) {
        return Some(PathBuf::from(d));
    }
    let dir = match socket_dir {
        Some(d) => d.to_owned(),
        None => {
            let d = std::env::var_os("ARGOCD_PLUGINSOCKFILEPATH")
                .map(PathBuf::from)
                .unwrap_or_else(|| PathBuf::from("/home/argocd/cmp-server/plugins"));
            if !d.is_dir() {
                return None;
            }
            d
        }
    };
    Some(dir.join(".cmp-warden-leases"))
}

/// `--audit-log`: `-` (or empty) is stderr, anything else a file appended to.
pub fn audit_sink(path: &str) -> anyhow::Result<server::audit::AuditSink> {
    Ok(match path {
        "-" | "" => server::audit::AuditSink::stderr(),
        path => server::audit::AuditSink::file(Path::new(path))
            .with_context(|| format!("--audit-log {path}"))?,
    })
}

/// `--metrics-address`: bound now (before capabilities go), served once the runtime runs.
pub fn metrics_listener(
    addr: Option<std::net::SocketAddr>,
    metrics: &std::sync::Arc<server::metrics::Metrics>,
) -> anyhow::Result<
    Option<(
        std::net::TcpListener,
        std::sync::Arc<server::metrics::Metrics>,
    )>,
> {
    let Some(addr) = addr else {
        return Ok(None);
    };
    let l =
        std::net::TcpListener::bind(addr).with_context(|| format!("--metrics-address {addr}"))?;
    l.set_nonblocking(true)?;
    tracing::info!(address = %l.local_addr()?, "metrics on http://{}/metrics", l.local_addr()?);
    Ok(Some((l, metrics.clone())))
}
