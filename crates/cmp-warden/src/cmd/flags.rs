//! Flag and environment parsing the commands share. Everything a flag changes about requests
//! goes to `jail::supervisor::Overrides`, applied in the policy's one translation.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use policy::Policy;

/// Load `--policy FILE` or the embedded default.
pub fn load_policy(file: Option<&Path>) -> anyhow::Result<Policy> {
    Ok(match file {
        Some(f) => Policy::load(f)?,
        None => Policy::default_policy()?,
    })
}

/// `ARGOCD_EXEC_TIMEOUT` (Go duration syntax, e.g. `90s`): Argo CD documents it, but its
/// cmp-server never applied it; here it is the per-command limit. Unset, empty or zero: none.
pub fn exec_timeout() -> anyhow::Result<Option<(Duration, String)>> {
    match std::env::var("ARGOCD_EXEC_TIMEOUT") {
        Ok(v) if !v.is_empty() => {
            let d = plugin::duration::parse_go_duration(&v)
                .with_context(|| format!("ARGOCD_EXEC_TIMEOUT={v}"))?;
            Ok((!d.is_zero()).then_some((d, v)))
        }
        _ => Ok(None),
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
