//! Building the confined runner from a policy: privilege model, fail-closed checks, seccomp
//! compilation, the work root, the UID pool, the start-up sweep and the probe. Shared by
//! `serve` and `render`.

use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use jail::confine::{Report, Sandbox};
use jail::confined::{Confined, ConfinedConfig};
use jail::privilege::{PrivilegeModel, Privileges};
use jail::uid::UidPool;
use policy::{Policy, Protection};

/// Load `--policy FILE` or the embedded default.
pub fn load_policy(file: Option<&Path>) -> anyhow::Result<Policy> {
    Ok(match file {
        Some(f) => Policy::load(f)?,
        None => Policy::default_policy()?,
    })
}

/// A runner ready to confine requests, and what start-up found.
#[derive(Debug)]
pub struct Built {
    /// The runner.
    pub runner: Confined,
    /// The privilege model.
    pub privileges: Privileges,
    /// Seccomp filter size (instructions).
    pub seccomp_instructions: usize,
    /// The cgroup layout in use, if any.
    pub cgroups: Option<jail::cgroup::Layout>,
    /// The cgroup controllers limiting each request.
    pub cgroup_controllers: Vec<String>,
    /// Why a protection is unavailable here (protection name, reason); the ones the policy
    /// requires stopped `build` already.
    pub unavailable: Vec<(&'static str, String)>,
}

/// Who the runner is for: the long-lived server owns its UID range and cgroup directory (and
/// sweeps a previous run's leftovers); a one-shot `render` shares them with whatever else runs
/// and must not sweep anything.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Owner {
    /// `serve`: sweeps leftovers at start-up.
    Server,
    /// `render`: a random start in the UID range, its own cgroup directory, no sweep.
    OneShot,
}

/// Create the runner (fails closed on what the policy requires); as [`Owner::Server`], sweep
/// leftovers of a previous run in `work_root`.
pub fn build(
    policy: &Policy,
    work_root: &Path,
    log_args: Vec<String>,
    owner: Owner,
) -> anyhow::Result<Built> {
    let required = |p| policy.require.contains(&p);
    let mut unavailable = Vec::new();
    let privileges = jail::privilege::detect();
    let mapped = privileges.range_mapped(policy.uid_first, policy.uid_count);
    let unique_uid = privileges.can_switch_uids() && mapped;
    if !unique_uid {
        let why = if privileges.can_switch_uids() {
            format!(
                "uidRange {}+{} is not mapped in this user namespace ({:?})",
                policy.uid_first, policy.uid_count, privileges.uid_map
            )
        } else {
            format!(
                "the server cannot switch UIDs (euid {}, no CAP_SETUID/CAP_SETGID)",
                privileges.euid
            )
        };
        unavailable.push(("uniqueUid", why.clone()));
        if required(Protection::UniqueUid) {
            bail!(
                "policy {:?} requires uniqueUid, but {why}. Run as root with only SETUID, SETGID and SETPCAP (docs: privilege models), or remove uniqueUid from spec.require to accept a shared UID",
                policy.name
            );
        }
        tracing::warn!(
            reason = %why,
            "UNIQUE UIDs DISABLED by policy {:?}: every request runs as the server's UID; isolation between requests rests on Landlock and seccomp only",
            policy.name
        );
    }
    let seccomp = match jail::seccomp::compile(&policy.seccomp, policy.seccomp_mode, policy.network)
    {
        Ok(f) => Some(f),
        Err(e) if required(Protection::Seccomp) => return Err(e.into()),
        Err(e) => {
            tracing::warn!(error = %e, "SECCOMP DISABLED: the profile does not compile here and the policy does not require it");
            unavailable.push(("seccomp", e.to_string()));
            None
        }
    };
    let seccomp_instructions = seccomp.as_ref().map_or(0, |f| f.instructions());

    std::fs::create_dir_all(work_root)
        .with_context(|| format!("creating work dir {}", work_root.display()))?;
    if unique_uid {
        check_searchable(work_root)?;
    }
    let pool = if unique_uid {
        let mut pool = UidPool::from_image(policy.uid_first, policy.uid_count, Path::new("/"))?;
        if owner == Owner::OneShot {
            pool.start_at(uuid::Uuid::new_v4().as_u128() as usize);
            // A running server's requests hold some of these: never share one (its reclaim
            // would kill the other's processes).
            for uid in
                jail::uid::uids_in_use(Path::new("/proc"), policy.uid_first, policy.uid_count)
            {
                pool.mark_busy(uid);
            }
        }
        Some(pool)
    } else {
        None
    };
    let sandbox = Sandbox::from_policy(policy, seccomp);
    let instance = match owner {
        Owner::Server => format!("cmp-warden-{}", policy.uid_first),
        Owner::OneShot => format!("cmp-warden-render-{}", std::process::id()),
    };
    let (cgroups, cgroup_controllers) = match cgroups(policy, &instance)? {
        Ok((cg, ctls)) => (Some(cg), ctls),
        Err(why) => {
            unavailable.push(("cgroups", why));
            (None, Vec::new())
        }
    };
    let runner = Confined::new(ConfinedConfig {
        exe: PathBuf::from("/proc/self/exe"),
        work_root: work_root.to_path_buf(),
        pool,
        sandbox,
        log_args,
        cgroups: cgroups.clone(),
    });
    if owner == Owner::Server {
        sweep(&runner, cgroups.as_ref().map(|c| &c.0))?;
    }
    // Sticky and world-writable but not listable: jails (as their leased UID) create their own
    // directory here and cannot see or remove anyone else's.
    let mode = if unique_uid { 0o1733 } else { 0o700 };
    std::fs::set_permissions(
        work_root,
        std::os::unix::fs::PermissionsExt::from_mode(mode),
    )?;
    Ok(Built {
        runner,
        privileges,
        seccomp_instructions,
        cgroups: cgroups.map(|c| c.0),
        cgroup_controllers,
        unavailable,
    })
}

/// Kill a previous run's processes in the UID range, remove its request directories and
/// request cgroups.
fn sweep(runner: &Confined, cgroups: Option<&jail::cgroup::Layout>) -> anyhow::Result<()> {
    let removed = runner
        .sweep()
        .map_err(|e| anyhow::anyhow!("start-up sweep: {e}"))?;
    if removed > 0 {
        tracing::info!(
            removed,
            "removed request directories left by a previous run"
        );
    }
    if let Some(layout) = cgroups {
        let n = jail::cgroup::sweep(layout);
        if n > 0 {
            tracing::info!(
                removed = n,
                "removed request cgroups left by a previous run"
            );
        }
    }
    Ok(())
}

/// The prepared layout and limits, and the controllers in use.
type Cgroups = (
    (jail::cgroup::Layout, jail::cgroup::CgroupLimits),
    Vec<String>,
);

/// Per-request cgroups: detected (v2, a configured delegated directory in
/// `CMP_WARDEN_CGROUP_ROOT`, or v1) and prepared; required → fail closed (the outer error),
/// else a loud warning and the reason (the inner error).
fn cgroups(policy: &Policy, instance: &str) -> anyhow::Result<Result<Cgroups, String>> {
    let configured = std::env::var_os("CMP_WARDEN_CGROUP_ROOT").map(PathBuf::from);
    let own = std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
    let found = jail::cgroup::detect(
        Path::new("/sys/fs/cgroup"),
        &own,
        configured.as_deref(),
        instance,
    )
    .and_then(|layout| {
        let ctls = jail::cgroup::prepare(&layout, std::process::id())?;
        Ok((layout, ctls))
    });
    match found {
        Ok((layout, ctls)) => {
            tracing::info!(?layout, controllers = ?ctls, "per-request cgroups enabled");
            let limits = jail::cgroup::CgroupLimits {
                memory_bytes: policy.limits.memory_bytes,
                pids: policy.limits.pids,
                cpu_millis: policy.limits.cpu_millis,
            };
            Ok(Ok(((layout, limits), ctls)))
        }
        Err(e) if policy.require.contains(&Protection::Cgroups) => {
            bail!("policy {:?} requires cgroups: {e}", policy.name)
        }
        Err(e) => {
            tracing::warn!(error = %e, "CGROUPS UNAVAILABLE: memory, pids and CPU are bounded by rlimits only");
            Ok(Err(e.to_string()))
        }
    }
}

/// Jails reach their directory (and commands their cwd, `$HOME`, `$TMPDIR`) by path as the
/// leased UID, so every ancestor of the work root must be searchable by others.
fn check_searchable(work_root: &Path) -> anyhow::Result<()> {
    let abs = std::path::absolute(work_root)?;
    for dir in abs.ancestors().skip(1) {
        let md = std::fs::metadata(dir).with_context(|| format!("{}", dir.display()))?;
        let mode = std::os::unix::fs::PermissionsExt::mode(&md.permissions());
        if mode & 0o001 == 0 {
            bail!(
                "the work dir {} is not reachable by the sandbox UIDs: {} has mode {:o} (others need search permission, o+x); use a directory such as /tmp or an emptyDir",
                work_root.display(),
                dir.display(),
                mode & 0o7777
            );
        }
    }
    Ok(())
}

/// Run the probe jail and check the report against the policy's requirements.
pub fn probe(built: &Built, policy: &Policy) -> anyhow::Result<Report> {
    let report = built
        .runner
        .probe()
        .map_err(|e| anyhow::anyhow!("sandbox probe failed: {e}"))?;
    let missing = missing_required(&report, policy);
    if !missing.is_empty() {
        bail!(
            "policy {:?} requires {missing:?}, which this environment cannot enforce (probe: {report:?})",
            policy.name
        );
    }
    Ok(report)
}

/// The protections `policy` requires that the probe `report` shows missing.
pub fn missing_required(report: &Report, policy: &Policy) -> Vec<&'static str> {
    let required = |p| policy.require.contains(&p);
    let mut missing = Vec::new();
    if required(Protection::UniqueUid) && !report.unique_uid {
        missing.push("uniqueUid");
    }
    if required(Protection::NoNewPrivs) && !report.no_new_privs {
        missing.push("noNewPrivs");
    }
    if required(Protection::Landlock) && report.landlock == "none" {
        missing.push("landlock");
    }
    if required(Protection::Seccomp) && report.seccomp_filters == 0 {
        missing.push("seccomp");
    }
    if required(Protection::Namespaces) && !report.namespaces.failed.is_empty() {
        missing.push("namespaces");
    }
    missing
}

/// Log exactly what is enforced (once, at start-up).
pub fn log_enforced(built: &Built, policy: &Policy, report: &Report, kept_caps: &[String]) {
    let model = match built.privileges.model {
        PrivilegeModel::UserNamespaceRoot => "user-namespaced root",
        PrivilegeModel::MinimalCapsRoot => "minimal-caps root",
        PrivilegeModel::FileCapabilities => "file capabilities",
        PrivilegeModel::Unprivileged => "unprivileged (shared UID)",
    };
    tracing::info!(
        policy = %policy.name,
        policy_sha256 = %policy.sha256,
        privilege_model = model,
        supervisor_capabilities = ?kept_caps,
        unique_uid = report.unique_uid,
        uid_range = %format!("{}+{}", policy.uid_first, policy.uid_count),
        capabilities_cleared = report.capabilities_cleared,
        bounding_cleared = report.bounding_cleared,
        no_new_privs = report.no_new_privs,
        landlock = %report.landlock,
        landlock_abi = ?report.landlock_abi,
        landlock_tcp_denied = report.landlock_tcp_denied,
        seccomp_filters = report.seccomp_filters,
        seccomp_instructions = built.seccomp_instructions,
        seccomp_mode = ?policy.seccomp_mode,
        cgroup_controllers = ?built.cgroup_controllers,
        unavailable = ?built.unavailable,
        network = ?policy.network,
        namespaces = ?report.namespaces.created,
        namespaces_unavailable = ?report.namespaces.failed,
        private_proc = report.namespaces.private_proc,
        disk_bytes = ?report.namespaces.disk_bytes,
        missing_paths = ?report.missing_paths,
        degraded = ?report.degraded,
        self_test = ?report.self_test,
        "sandbox enforced"
    );
}
