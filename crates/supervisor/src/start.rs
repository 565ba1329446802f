//! Start-up: [`Supervisor::start`] is the whole sequence, in order (docs/supervisor.md mirrors
//! it step by step, with the test that checks each step), fail closed.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use policy::{Policy, PolicySet, Protection};

use crate::cache::CacheStats;
use crate::current::PlanSource;
use crate::plan::{Overrides, Plan, Plans};
use crate::privilege::Privileges;
use cgroups::{CgroupLimits, Layout, Readback};
use jail_wire::protocol::{Degraded, LandlockStatus, Report};
use policy::Namespace;

use crate::runner::{Confined, ConfinedConfig};
use crate::uid::{UidError, UidPool};
use crate::{landlock_log, privilege, uid};

/// Who the supervisor is for: the long-lived server owns its UID range and cgroup directory
/// (and sweeps a previous run's leftovers); a one-shot run (`render`, `doctor`) shares them with
/// whatever else runs and must not sweep anything.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Owner {
    /// `serve`, `appset serve`: sweeps leftovers at start-up.
    Server,
    /// `render`, `doctor`: a random start in the UID range that skips UIDs a running server's
    /// requests hold, its own cgroup directory, no sweep; removed again by
    /// [`Supervisor::shutdown`].
    OneShot,
}

/// The caller's listeners, bound at step 9 (before the capability drop: a socket's owner and a
/// port below 1024 need privileges the supervisor then gives up).
pub type Bind<'a> = Box<dyn FnOnce() -> Result<(), Box<dyn std::error::Error + Send + Sync>> + 'a>;

/// How to start.
pub struct StartOptions<'a> {
    /// The work root: request directories are created here by the jails.
    pub work_root: PathBuf,
    /// Server or one-shot.
    pub owner: Owner,
    /// The policy values the command line overrides.
    pub overrides: Overrides,
    /// Directories the probe's confined extractor must fail to write into (the plugin config,
    /// the socket directory; the work root is always tried).
    pub probe_writes: Vec<PathBuf>,
    /// Arguments for the jail factory's and reclaim helper's logging (e.g. `--loglevel info`).
    pub log_args: Vec<String>,
    /// Binds the caller's listeners at step 9.
    pub bind: Option<Bind<'a>>,
    /// Our own binary, re-executed as the jail factory and reclaim helper
    /// (`/proc/self/exe` unless a harness runs from another binary).
    pub exe: PathBuf,
    /// Per-request cgroups where the node has them (a benchmark turns them off to measure
    /// their cost).
    pub cgroups: bool,
    /// Drop every capability but those starting jails needs (step 10). Only an in-process
    /// benchmark, whose baselines need the capabilities, turns this off.
    pub drop_capabilities: bool,
    /// Where leases are locked node-wide, shared with every other instance that may use the
    /// same UID range (`serve`: a directory in the socket directory, which Argo CD's sidecars
    /// share). `None`: no other instance is coordinated with.
    pub lease_dir: Option<PathBuf>,
    /// Start the tree cache's keeper when the policy has the cache on: `serve`, and `doctor`,
    /// which reports whether it starts here. Other one-shot commands never use it.
    pub tree_cache: bool,
}

impl StartOptions<'_> {
    /// Options for `owner` with `work_root`, everything else as `serve` uses it.
    pub fn new(work_root: PathBuf, owner: Owner) -> Self {
        StartOptions {
            work_root,
            owner,
            overrides: Overrides::default(),
            probe_writes: Vec::new(),
            log_args: Vec::new(),
            bind: None,
            exe: PathBuf::from("/proc/self/exe"),
            cgroups: true,
            drop_capabilities: true,
            lease_dir: None,
            tree_cache: owner == Owner::Server,
        }
    }
}

impl std::fmt::Debug for StartOptions<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StartOptions")
            .field("work_root", &self.work_root)
            .field("owner", &self.owner)
            .field("overrides", &self.overrides)
            .field("probe_writes", &self.probe_writes)
            .field("bind", &self.bind.is_some())
            .finish_non_exhaustive()
    }
}

/// Why start-up stopped: one variant per step and cause, numbered as [`Supervisor::start`]'s
/// steps are. Each message says what was refused and the policy field or flag that changes it.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// 0. `CMP_WARDEN_BENCH_OFF` set where it is refused, or naming no layer.
    #[error("{0}")]
    Bench(String),
    /// 1. `prctl(PR_SET_DUMPABLE, 0)`.
    #[error("prctl(PR_SET_DUMPABLE, 0): {0}")]
    NotDumpable(rustix::io::Errno),
    /// 1. `prctl(PR_SET_CHILD_SUBREAPER)`.
    #[error("prctl(PR_SET_CHILD_SUBREAPER): {0}")]
    Subreaper(rustix::io::Errno),
    /// 2. A policy requiring seccomp whose profile does not compile here (`policy`: a policy
    ///    of the directory other than the default one).
    #[error("{}{source}", policy.as_ref().map(|p| format!("policy {p:?}: ")).unwrap_or_default())]
    Seccomp {
        /// The policy, when not the default one.
        policy: Option<String>,
        /// Why the profile does not compile.
        source: seccomp::SeccompError,
    },
    /// 3. `uniqueUid` required, and the server cannot give each request a UID of its own.
    #[error(
        "policy {policy:?} requires uniqueUid, but {why}. Run as root with only SETUID, SETGID and SETPCAP (docs: privilege models), or remove uniqueUid from spec.require to accept a shared UID"
    )]
    UniqueUid {
        /// The default policy.
        policy: String,
        /// What the privilege model lacks.
        why: String,
    },
    /// 4. The work root cannot be created.
    #[error("creating work dir {}: {source}", path.display())]
    WorkRootCreate {
        /// The work root.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// 4. The work root's absolute path, or an ancestor's metadata, cannot be read.
    #[error("{}{source}", path.as_ref().map(|p| format!("{}: ", p.display())).unwrap_or_default())]
    WorkRootRead {
        /// The directory read, when known.
        path: Option<PathBuf>,
        /// The error.
        source: std::io::Error,
    },
    /// 4. An ancestor of the work root is not searchable by others: the leased UIDs could not
    ///    reach their directories.
    #[error(
        "the work dir {} is not reachable by the sandbox UIDs: {} has mode {mode:o} (others need search permission, o+x); set --work-dir (ARGOCD_CMP_WORKDIR, default $TMPDIR or /tmp) to a directory whose every ancestor others may search, such as an emptyDir, or give {} o+x",
        work_root.display(),
        dir.display(),
        dir.display()
    )]
    WorkRootUnreachable {
        /// The work root.
        work_root: PathBuf,
        /// The ancestor without `o+x`.
        dir: PathBuf,
        /// Its permission bits.
        mode: u32,
    },
    /// 5. The UID pool (its range overlaps the image's accounts, or is empty).
    #[error("{0}")]
    UidPool(#[from] UidError),
    /// 6. Cgroups required and unusable here.
    #[error("policy {policy:?} requires cgroups: {source}")]
    Cgroups {
        /// The default policy.
        policy: String,
        /// Why not.
        source: cgroups::CgroupError,
    },
    /// 8. The start-up sweep of a previous run's processes and directories.
    #[error("start-up sweep: {0}")]
    Sweep(String),
    /// 8. The work root's mode (1733, or 700 in the shared-UID model).
    #[error("{}: {source}", path.display())]
    WorkRootMode {
        /// The work root.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// 9. The caller's listeners (the alternate form: the error's whole chain).
    #[error("{0:#}")]
    Bind(Box<dyn std::error::Error + Send + Sync>),
    /// 10. The capability drop.
    #[error("dropping the supervisor's capabilities: {0}")]
    Capabilities(std::io::Error),
    /// 11. The probe jail failed (`policy`: a policy of the directory other than the default).
    #[error("sandbox probe {}failed: {source}", policy.as_ref().map(|p| format!("of policy {p:?} ")).unwrap_or_default())]
    Probe {
        /// The policy, when not the default one.
        policy: Option<String>,
        /// What failed.
        source: vocab::request::RequestError,
    },
    /// 11. A required protection the probe jail could not enforce.
    #[error(
        "policy {policy:?} requires {missing:?}, which this environment cannot enforce (probe: {probe:?})"
    )]
    Unenforceable {
        /// The policy.
        policy: String,
        /// The required protections missing.
        missing: Vec<&'static str>,
        /// What the probe could enforce.
        probe: Box<Report>,
    },
}

/// What start-up found and enforces: logged once as `sandbox enforced`, and the source of
/// `doctor`'s report (the same value in both).
#[derive(Debug, Clone)]
pub struct Enforcement {
    /// The policy's name.
    pub policy_name: String,
    /// SHA-256 of the policy text.
    pub policy_sha256: String,
    /// The privilege model and the capabilities held at start, before the drop.
    pub privileges: Privileges,
    /// The capabilities the supervisor holds after the drop, read back from the kernel.
    pub capabilities_kept: Vec<String>,
    /// Whether each request gets a UID of its own.
    pub unique_uid: bool,
    /// BPF instructions in the seccomp filter (0: none).
    pub seccomp_instructions: usize,
    /// The cgroup layout in use, if any.
    pub cgroups: Option<Layout>,
    /// The cgroup controllers limiting each request.
    pub cgroup_controllers: Vec<String>,
    /// The start-up probe's own request cgroup, read back from the kernel after its jail ran
    /// in it (`None` without cgroups).
    pub cgroup_probe: Option<Readback>,
    /// What each request cgroup is asked for (the policy's limits).
    pub cgroup_limits: CgroupLimits,
    /// Protections not available here (none of them required), with the reason.
    pub unavailable: Vec<(Protection, String)>,
    /// What the probe jail could enforce on itself.
    pub probe: Report,
    /// Whether Landlock's own denial records reach us (explaining refused file access).
    pub denial_log: DenialLog,
    /// The tree cache: its budget in bytes when it runs, else why not.
    pub tree_cache: Result<u64, String>,
}

impl Enforcement {
    /// The tree cache in one phrase (logs and doctor).
    pub fn tree_cache_phrase(&self) -> String {
        match &self.tree_cache {
            Ok(bytes) => format!(
                "on ({} MiB of sealed trees; the keeper and each filler confined by Landlock, required, and seccomp)",
                bytes >> 20
            ),
            Err(why) => format!("off: {why}"),
        }
    }
}

/// Whether the supervisor reads Landlock's denial records from the kernel's audit log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DenialLog {
    /// Subscribed; whether the host has audit enabled (`None`: not ours to ask).
    Reading {
        /// `AUDIT_GET`'s answer, if we may ask.
        audit_enabled: Option<bool>,
    },
    /// Not available, and why.
    Unavailable(String),
}

impl DenialLog {
    /// One line for the log and `doctor`.
    pub fn describe(&self) -> String {
        match self {
            DenialLog::Reading {
                audit_enabled: Some(true),
            } => "reading Landlock's denial records (kernel audit enabled)".to_owned(),
            DenialLog::Reading {
                audit_enabled: Some(false),
            } => "subscribed, but kernel audit is disabled on this host: Landlock denials are not reported (auditctl -e 1 enables them)".to_owned(),
            DenialLog::Reading { audit_enabled: None } => {
                "subscribed to the kernel audit log (whether audit is enabled is not visible to us)".to_owned()
            }
            DenialLog::Unavailable(why) => format!("not available: {why}"),
        }
    }
}

impl Enforcement {
    /// What the shared-UID model cannot give on this node, in words (empty with unique UIDs).
    /// Logged at start-up and shown by `doctor`: a reviewer must not have to infer it.
    pub fn shared_uid_gaps(&self) -> Vec<&'static str> {
        if self.unique_uid {
            return Vec::new();
        }
        let p = &self.probe;
        let pid_ns = p.namespaces.has(Namespace::Pid);
        let has = |c: &str| self.cgroup_controllers.iter().any(|x| x == c);
        let cgroup_kill = matches!(self.cgroups, Some(Layout::V2 { .. }));
        let mut gaps = Vec::new();
        if !pid_ns {
            gaps.push("commands can list this PID namespace's processes and read their command lines (no PID namespace)");
        }
        if !has("pids") {
            gaps.push("no per-request process bound (RLIMIT_NPROC would count the server's own processes; no pids cgroup)");
        }
        if !has("memory") {
            gaps.push("no per-request memory bound beyond RLIMIT_DATA and RLIMIT_AS per process (no memory cgroup)");
        }
        if !pid_ns && !cgroup_kill {
            gaps.push("a daemon that leaves its process group outlives its request (nothing may kill by a shared UID; no PID namespace, no cgroup.kill)");
        }
        if !p
            .landlock_features
            .contains(&policy::LandlockFeature::SignalScope)
        {
            gaps.push("commands can signal the server's processes (Landlock signal scoping, ABI 6, is not in effect)");
        }
        if !p
            .landlock_features
            .contains(&policy::LandlockFeature::AbstractUnixSocketScope)
            && !p.namespaces.has(Namespace::Net)
        {
            gaps.push("commands can reach abstract unix sockets outside the jail (no Landlock scoping, ABI 6; no network namespace)");
        }
        gaps
    }

    /// Why `p` is unavailable here, if it is.
    pub fn unavailable(&self, p: Protection) -> Option<&str> {
        self.unavailable
            .iter()
            .find(|(n, _)| *n == p)
            .map(|(_, why)| why.as_str())
    }
}

/// The started supervisor: its runner and what the policy means at run time.
#[derive(Debug)]
pub struct Supervisor {
    pub(crate) runner: Arc<Confined>,
    pub(crate) plans: Arc<PlanSource>,
    /// The command line's values over every policy's, a reloaded set's too.
    pub(crate) overrides: Overrides,
    owner: Owner,
    work_root: PathBuf,
    cgroups: Option<Layout>,
}

impl Supervisor {
    /// Start up, in the order of [`Supervisor::start_steps`], failing closed on whatever
    /// `policy` requires and this node cannot give.
    pub fn start(
        policy: &Policy,
        opts: StartOptions<'_>,
    ) -> Result<(Supervisor, Enforcement), StartError> {
        Self::start_set(&PolicySet::single(policy.clone()), opts)
    }

    /// [`Supervisor::start`] with several policies, each request under the one that selects
    /// it: the default's node-wide fields (`require`, `uidRange`, `namespaces`, `cache`) hold
    /// for all, and every policy is probed and must compile here.
    pub fn start_set(
        set: &PolicySet,
        opts: StartOptions<'_>,
    ) -> Result<(Supervisor, Enforcement), StartError> {
        let (owner, work_root) = (opts.owner, opts.work_root.clone());
        let started = Self::start_steps(set, opts);
        if started.is_err() && owner == Owner::OneShot {
            // A one-shot run's own work root (empty once its runner is gone).
            let _ = std::fs::remove_dir(&work_root);
        }
        started
    }

    /// The start-up sequence. Steps 1–10 run while the process has a single thread:
    /// capabilities are per thread, so the drop must precede every thread.
    fn start_steps(
        set: &PolicySet,
        opts: StartOptions<'_>,
    ) -> Result<(Supervisor, Enforcement), StartError> {
        let StartOptions {
            work_root,
            owner,
            overrides,
            probe_writes,
            log_args,
            bind,
            exe,
            cgroups: want_cgroups,
            drop_capabilities,
            lease_dir,
            tree_cache: want_tree_cache,
        } = opts;
        let mut unavailable = Vec::new();

        // 0. Protections a benchmark build was asked to leave out (none in any other build,
        //    which refuses to start when asked).
        let off = crate::bench::init().map_err(StartError::Bench)?;
        if off != crate::bench::Off::default() {
            tracing::warn!(off = ?off.names(), "BENCHMARK BUILD: these protections are switched off for every request ({})", crate::bench::OFF_ENV);
        }

        // 1. Not dumpable: /proc/<pid>/{environ,mem,fd} of the supervisor stay closed even to
        //    a process of the same UID (the shared-UID model) — they hold the sidecar's secrets.
        //    And the subreaper of everything below us: a command that daemonizes stays our
        //    descendant, so the server can tell it from the repo-server even when they share a
        //    UID (the peer check), and its zombie is ours to reap.
        rustix::process::set_dumpable_behavior(rustix::process::DumpableBehavior::NotDumpable)
            .map_err(StartError::NotDumpable)?;
        rustix::process::set_child_subreaper(Some(rustix::process::getpid()))
            .map_err(StartError::Subreaper)?;

        // 2. Each policy's one translation, and its seccomp filter compiled for this
        //    architecture.
        let plans = Arc::new(Plans::new(set, &overrides, std::env::vars()));
        let plan = plans.default_plan().clone();
        for p in plans.all().iter().skip(1) {
            if let Some(why) = &p.cache_refused {
                tracing::warn!(policy = %p.policy_name, why = %why, "tree cache: not used for this policy's requests; each extracts its archive in its own jail");
            }
        }
        match plan.network() {
            policy::NetworkMode::Egress => tracing::warn!(
                "NETWORK EGRESS: commands share the host's network (the pod's own ports, the cloud metadata address, everything the pod reaches); spec.network.mode allowList admits only listed destinations"
            ),
            policy::NetworkMode::AllowList
                if plan.egress.as_ref().is_some_and(|(l, _)| l.audit) =>
            {
                tracing::warn!(
                    destinations = plan.egress.as_ref().map_or(0, |(l, _)| l.rules.len()),
                    "NETWORK AUDIT MODE: {}",
                    vocab::egress::AUDIT_WARNING
                );
            }
            policy::NetworkMode::AllowList => tracing::info!(
                destinations = plan.egress.as_ref().map_or(0, |(l, _)| l.rules.len()),
                "network allowList: commands reach only spec.network.allow, through the egress proxy; every connection is audited"
            ),
            policy::NetworkMode::None => {}
        }
        if !plan.withheld_env.is_empty() {
            tracing::info!(
                withheld = %plan.withheld_env.join(", "),
                "server environment variables withheld from commands (names only; spec.env.pass lists what commands get, NAME_* patterns allowed)"
            );
        }
        if let Err(e) = plan.seccomp() {
            if plan.requires(Protection::Seccomp) {
                return Err(StartError::Seccomp {
                    policy: None,
                    source: e.clone(),
                });
            }
            tracing::warn!(error = %e, "SECCOMP DISABLED: the profile does not compile here and the policy does not require it");
            unavailable.push((Protection::Seccomp, e.to_string()));
        }
        for p in plans.all().iter().skip(1) {
            if let Err(e) = p.seccomp() {
                if plan.requires(Protection::Seccomp) {
                    return Err(StartError::Seccomp {
                        policy: Some(p.policy_name.clone()),
                        source: e.clone(),
                    });
                }
                tracing::warn!(policy = %p.policy_name, error = %e, "SECCOMP DISABLED for this policy's requests: its profile does not compile here and spec.require (the default policy's) does not require it");
            }
        }

        // 3. The privilege model: unique UIDs need CAP_SETUID/CAP_SETGID and, in a user
        //    namespace, the policy's range mapped.
        let privileges = privilege::detect();
        let unique_uid = unique_uids(&plan, &privileges, &mut unavailable)?;

        // 4. The work root, reachable by the leased UIDs.
        std::fs::create_dir_all(&work_root).map_err(|source| StartError::WorkRootCreate {
            path: work_root.clone(),
            source,
        })?;
        if unique_uid {
            check_searchable(&work_root)?;
        }

        // 5. The UID pool: the range must not overlap /etc/passwd or /etc/group; a one-shot
        //    run starts at random and skips UIDs a running server's requests hold.
        let pool = if unique_uid {
            Some(uid_pool(&plan, owner, lease_dir)?)
        } else {
            None
        };
        let (uid_first, uid_count) = plan.uid_range;
        let pool_range = pool
            .as_ref()
            .map(|_| uid_first..=uid_first.saturating_add(uid_count.saturating_sub(1)));

        // 6. Per-request cgroups: v2 in our own delegated cgroup, or v1 per controller.
        let layout = if want_cgroups {
            per_request_cgroups(&plan, owner, &mut unavailable)?
        } else {
            unavailable.push((Protection::Cgroups, "turned off by the caller".to_owned()));
            None
        };
        let controllers = layout.as_ref().map(|(_, c)| c.clone()).unwrap_or_default();
        let layout = layout.map(|(l, _)| l);
        // Without request cgroups: the container's own OOM kills name what its limit ended.
        let container_oom = layout.is_none().then(container_oom_counter).flatten();

        // 7. The runner, with its jail factory.
        let runner = Arc::new(Confined::new(ConfinedConfig {
            exe,
            work_root: work_root.clone(),
            pool,
            plans: plans.clone(),
            log_args,
            cgroups: layout.clone(),
            probe_writes,
            container_oom,
        }));

        // 8. Sweep a previous run's processes, directories and cgroups (server only); the
        //    work root becomes 1733: jails create their own directory in it and cannot see or
        //    remove anyone else's.
        if owner == Owner::Server {
            sweep(&runner, layout.as_ref())?;
        }
        let mode = if unique_uid { 0o1733 } else { 0o700 };
        std::fs::set_permissions(
            &work_root,
            std::os::unix::fs::PermissionsExt::from_mode(mode),
        )
        .map_err(|source| StartError::WorkRootMode {
            path: work_root.clone(),
            source,
        })?;

        // 9. The caller's listeners (a socket's owner and low ports need privileges).
        if let Some(bind) = bind {
            bind().map_err(StartError::Bind)?;
        }

        // 9b. Landlock's denial records: the audit log's read-only group needs CAP_AUDIT_READ
        //     at bind time, so the socket is opened before the drop (the reader thread starts
        //     after step 10). Optional: without it, Landlock denials are not itemised.
        let denial_sub = match &pool_range {
            Some(range) => landlock_log::subscribe(range.clone()).map_err(|e| {
                format!("the kernel audit log's read group ({e}; needs CAP_AUDIT_READ and the host's network namespace)")
            }),
            None => Err("the shared-UID model (denials are attributed by leased UID)".to_owned()),
        };
        // Asked now: AUDIT_GET needs CAP_AUDIT_CONTROL, which step 10 drops.
        let audit_enabled = landlock_log::audit_enabled().ok();

        // 10. Keep only CAP_SETUID, CAP_SETGID and CAP_SETPCAP, in every set including
        //     bounding; read back from the kernel.
        if drop_capabilities && privileges.holds_any() {
            privilege::drop_supervisor_capabilities().map_err(StartError::Capabilities)?;
        }
        let capabilities_kept = privilege::effective_now();

        // 11. Probe: a jail confines itself and runs the extractor self-test; a required
        //     protection it lacks, or a write outside its directory, stops start-up.
        //     Every selected policy's jail is probed too: its own file rules and filter.
        let (probe, cgroup_probe) = runner.probe(&plan).map_err(|source| StartError::Probe {
            policy: None,
            source,
        })?;
        for (i, p) in plans.all().iter().enumerate() {
            let selected;
            let probe = if i == 0 {
                &probe
            } else {
                selected = runner.probe(p).map_err(|source| StartError::Probe {
                    policy: Some(p.policy_name.clone()),
                    source,
                })?;
                &selected.0
            };
            let missing = missing_required(probe, p);
            if !missing.is_empty() {
                return Err(StartError::Unenforceable {
                    policy: p.policy_name.clone(),
                    missing: missing.iter().map(|p| p.as_str()).collect(),
                    probe: Box::new(probe.clone()),
                });
            }
        }

        // 11b. The tree cache (`spec.cache`; `serve`, and `doctor` to report it): its keeper, once the probe showed
        //      the jails have the mount and PID namespaces a lent tree needs. Best effort:
        //      without it every request extracts in its own jail (said loudly).
        let tree_cache = if !want_tree_cache {
            Err("not in one-shot commands".to_owned())
        } else if !(probe.namespaces.has(Namespace::Mount) && probe.namespaces.has(Namespace::Pid))
        {
            Err("the jails have no mount or PID namespace here (see namespaces)".to_owned())
        } else if let Some(why) = &plan.cache_refused {
            Err(why.clone())
        } else {
            runner.start_cache(&work_root)
        };
        if let (Err(why), Owner::Server, Some(_)) = (&tree_cache, owner, &plan.cache) {
            tracing::warn!(why = %why, "TREE CACHE UNAVAILABLE: every request extracts its archive in its own jail");
        }

        // 12. Say exactly what is enforced, once; reap the orphans we are the subreaper of;
        //     start reading Landlock's denial records.
        let denial_log = match denial_sub.and_then(|s| s.start().map_err(|e| e.to_string())) {
            Ok(log) => {
                runner.set_landlock_log(log);
                DenialLog::Reading { audit_enabled }
            }
            Err(why) => DenialLog::Unavailable(why),
        };
        let enforcement = Enforcement {
            policy_name: plan.policy_name.clone(),
            policy_sha256: plan.policy_sha256.clone(),
            privileges,
            capabilities_kept,
            unique_uid,
            seccomp_instructions: plan.seccomp_instructions(),
            cgroups: layout.clone(),
            cgroup_controllers: controllers,
            cgroup_probe,
            cgroup_limits: plan.cgroup,
            unavailable,
            probe,
            denial_log,
            tree_cache: tree_cache.map(|()| plan.cache.as_ref().map_or(0, |c| c.budget)),
        };
        log_enforced(&plan, &enforcement);
        log_selection(&plans);
        let gaps = enforcement.shared_uid_gaps();
        if !gaps.is_empty() {
            tracing::warn!(
                gaps = %gaps.join("; "),
                "SHARED UID on this node: {} (what still holds: the socket refuses this server's own commands, the supervisor is not dumpable, Landlock keeps each request in its directory)",
                gaps.join("; ")
            );
        }
        jail_sys::reaper::start_orphan_reaper();
        Ok((
            Supervisor {
                runner,
                plans: Arc::new(PlanSource::new(plans)),
                overrides,
                owner,
                work_root,
                cgroups: layout,
            },
            enforcement,
        ))
    }

    /// The runner every request goes through.
    pub fn runner(&self) -> Arc<dyn crate::Runner> {
        self.runner.clone()
    }

    /// What the default policy in force means for each request.
    pub fn plan(&self) -> Arc<Plan> {
        self.plans.current().default_plan().clone()
    }

    /// Every policy's plan in force, and which a request runs under (a reload replaces them).
    pub fn plans(&self) -> Arc<PlanSource> {
        self.plans.clone()
    }

    /// The tree cache's counters (`None` when it does not run).
    pub fn tree_cache_stats(&self) -> Option<CacheStats> {
        self.runner.cache_stats()
    }

    /// UIDs leased by requests and the pool's capacity (`None` in the shared-UID model).
    pub fn pool_usage(&self) -> Option<(usize, usize)> {
        self.runner.pool_usage()
    }

    /// A closure reporting [`Self::pool_usage`] (for the metrics).
    pub fn pool_gauge(&self) -> impl Fn() -> Option<(usize, usize)> + Send + Sync + 'static {
        let r = self.runner.clone();
        move || r.pool_usage()
    }

    /// A closure reporting the tree cache's figures (for the metrics).
    pub fn cache_gauge(&self) -> impl Fn() -> Option<CacheStats> + Send + Sync + 'static {
        let r = self.runner.clone();
        move || r.cache_stats()
    }

    /// Retire the spare jail and reclaim it; a one-shot run also removes its work root (what a
    /// jail left in it through the reclaim helper, as its owner: the supervisor no longer holds
    /// the capabilities to do it itself) and its cgroup directories; `serve` removes its cgroup
    /// directories unless a request cgroup in them still holds a process (another instance's).
    pub fn shutdown(&self) {
        crate::Runner::shutdown(self.runner.as_ref());
        if self.owner == Owner::OneShot {
            if let Err(e) = self.runner.remove_leftover_dirs() {
                tracing::warn!(error = %e, "work root not emptied");
            }
            if let Err(e) = std::fs::remove_dir(&self.work_root) {
                tracing::warn!(dir = %self.work_root.display(), error = %e, "work root not removed");
            }
            if let Some(layout) = &self.cgroups
                && let Err(e) = cgroups::remove_instance(layout)
            {
                tracing::warn!(error = %e, "cgroup directory not removed");
            }
        } else if let Some(layout) = &self.cgroups {
            // (Bounded: within the pod's grace period, which the drain before this also
            // spent part of.)
            cgroups::remove_instance_if_unused(layout, std::time::Duration::from_secs(10));
        }
    }
}

/// The privilege model and capabilities of the calling thread now.
pub fn privileges_now() -> Privileges {
    privilege::detect()
}

/// A supervisor that starts no jails (a generator without a command source): steps 1 and 10
/// only. Returns the capabilities kept.
pub fn start_without_jails() -> Result<Vec<String>, StartError> {
    rustix::process::set_dumpable_behavior(rustix::process::DumpableBehavior::NotDumpable)
        .map_err(StartError::NotDumpable)?;
    if privilege::detect().holds_any() {
        privilege::drop_supervisor_capabilities().map_err(StartError::Capabilities)?;
    }
    Ok(privilege::effective_now())
}

/// Step 3: whether requests get unique UIDs; fail closed when the policy requires them.
fn unique_uids(
    plan: &Plan,
    privileges: &Privileges,
    unavailable: &mut Vec<(Protection, String)>,
) -> Result<bool, StartError> {
    let mapped = privileges.range_mapped(plan.uid_range.0, plan.uid_range.1);
    if privileges.can_switch_uids() && mapped {
        return Ok(true);
    }
    let why = if privileges.can_switch_uids() {
        format!(
            "uidRange {}+{} is not mapped in this user namespace ({:?})",
            plan.uid_range.0, plan.uid_range.1, privileges.uid_map
        )
    } else {
        format!(
            "the server cannot switch UIDs (euid {}, no CAP_SETUID/CAP_SETGID)",
            privileges.euid
        )
    };
    if plan.requires(Protection::UniqueUid) {
        return Err(StartError::UniqueUid {
            policy: plan.policy_name.clone(),
            why,
        });
    }
    tracing::warn!(
        reason = %why,
        "UNIQUE UIDs DISABLED by policy {:?}: every request runs as the server's UID; isolation between requests rests on Landlock and seccomp only",
        plan.policy_name
    );
    unavailable.push((Protection::UniqueUid, why));
    Ok(false)
}

/// Step 4: jails reach their directory (and commands their cwd, `$HOME`, `$TMPDIR`) by path as
/// the leased UID, so every ancestor of the work root must be searchable by others.
fn check_searchable(work_root: &Path) -> Result<(), StartError> {
    let abs = std::path::absolute(work_root)
        .map_err(|source| StartError::WorkRootRead { path: None, source })?;
    for dir in abs.ancestors().skip(1) {
        let md = std::fs::metadata(dir).map_err(|source| StartError::WorkRootRead {
            path: Some(dir.to_owned()),
            source,
        })?;
        let mode = std::os::unix::fs::PermissionsExt::mode(&md.permissions());
        if mode & 0o001 == 0 {
            return Err(StartError::WorkRootUnreachable {
                work_root: work_root.to_owned(),
                dir: dir.to_owned(),
                mode: mode & 0o7777,
            });
        }
    }
    Ok(())
}

/// Step 5.
fn uid_pool(plan: &Plan, owner: Owner, lease_dir: Option<PathBuf>) -> Result<UidPool, StartError> {
    let mut pool = UidPool::from_image(plan.uid_range.0, plan.uid_range.1, Path::new("/"))?;
    if let Some(dir) = lease_dir {
        if let Err(e) = pool.set_lock_dir(dir.clone()) {
            tracing::warn!(dir = %dir.display(), error = %e, "UID LEASES NOT COORDINATED: another instance using this UID range on this node could lease the same identities");
        }
        let held = pool.held_elsewhere();
        if !held.is_empty() {
            tracing::warn!(
                held = held.len(),
                first = held[0],
                range = %format!("{}+{}", plan.uid_range.0, plan.uid_range.1),
                "the UID range is shared: another live instance on this node holds identities of it; they are skipped and never swept (give each instance its own spec.uidRange to avoid it)"
            );
        }
    }
    if owner == Owner::OneShot {
        pool.start_at(random_offset());
        // A running server's requests hold some of these: never share one (its reclaim would
        // kill the other's processes).
        for uid in uid::uids_in_use(Path::new("/proc"), plan.uid_range.0, plan.uid_range.1) {
            pool.mark_busy(uid);
        }
    }
    Ok(pool)
}

/// A random offset into the UID range (std's randomly keyed hasher: no dependency needed).
fn random_offset() -> usize {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u32(std::process::id());
    h.finish() as usize
}

/// Step 6: detected (v2, a delegated directory in `CMP_WARDEN_CGROUP_ROOT`, or v1) and
/// prepared; required → fail closed, else a loud warning and the reason.
fn per_request_cgroups(
    plan: &Plan,
    owner: Owner,
    unavailable: &mut Vec<(Protection, String)>,
) -> Result<Option<(Layout, Vec<String>)>, StartError> {
    let instance = match owner {
        Owner::Server => format!("cmp-warden-{}", plan.uid_range.0),
        Owner::OneShot => format!("cmp-warden-render-{}", std::process::id()),
    };
    let configured = std::env::var_os("CMP_WARDEN_CGROUP_ROOT").map(PathBuf::from);
    let own = std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
    let found = cgroups::detect(
        Path::new("/sys/fs/cgroup"),
        &own,
        configured.as_deref(),
        &instance,
    )
    .and_then(|layout| {
        let tenants = match owner {
            Owner::Server => cgroups::Tenants::All,
            Owner::OneShot => cgroups::Tenants::OnlySelf,
        };
        let ctls = cgroups::prepare(&layout, tenants)?;
        Ok((layout, ctls))
    });
    match found {
        Ok((layout, ctls)) => {
            let at = match &layout {
                Layout::V2 { base } => format!("v2 {}", base.display()),
                Layout::V1 { controllers } => controllers
                    .iter()
                    .map(|(c, d)| format!("{c}={}", d.display()))
                    .collect::<Vec<_>>()
                    .join(" "),
            };
            tracing::info!(layout = %at, controllers = %ctls.join(","), "per-request cgroups enabled");
            Ok(Some((layout, ctls)))
        }
        Err(source) if plan.requires(Protection::Cgroups) => Err(StartError::Cgroups {
            policy: plan.policy_name.clone(),
            source,
        }),
        Err(e) => {
            tracing::warn!(error = %e, "CGROUPS UNAVAILABLE: memory, pids and CPU are bounded by rlimits only");
            unavailable.push((Protection::Cgroups, e.to_string()));
            Ok(None)
        }
    }
}

/// Step 6, without request cgroups: the server's own memory cgroup's OOM-kill counter.
fn container_oom_counter() -> Option<cgroups::OomCounter> {
    let own = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let found = cgroups::OomCounter::find(Path::new("/sys/fs/cgroup"), &own);
    match &found {
        Some(c) => tracing::info!(
            file = %c.file().display(),
            "no request cgroups: an OOM kill the container's memory limit causes is named from the server's own cgroup, and commands are the OOM killer's first choice (oom_score_adj 1000)"
        ),
        None => tracing::info!(
            "no request cgroups and no OOM counter of the server's own cgroup: commands are the OOM killer's first choice (oom_score_adj 1000)"
        ),
    }
    found
}

/// Step 8: kill a previous run's processes in the UID range, remove its request directories
/// and request cgroups.
fn sweep(runner: &Confined, layout: Option<&Layout>) -> Result<(), StartError> {
    let removed = runner.sweep().map_err(StartError::Sweep)?;
    if removed > 0 {
        tracing::info!(
            removed,
            "removed request directories left by a previous run"
        );
    }
    if let Some(layout) = layout {
        let n = cgroups::sweep(layout, |name| runner.held_by_another_instance(name));
        if n > 0 {
            tracing::info!(
                removed = n,
                "removed request cgroups left by a previous run"
            );
        }
    }
    Ok(())
}

/// Step 11: the protections `policy` requires that the probe `report` shows missing.
pub fn missing_required(report: &Report, plan: &Plan) -> Vec<Protection> {
    let required = |p| plan.requires(p);
    let checks = [
        (Protection::UniqueUid, !report.unique_uid),
        (Protection::NoNewPrivs, !report.no_new_privs),
        (
            Protection::Landlock,
            report.landlock == LandlockStatus::None,
        ),
        (
            Protection::Landlock,
            plan.landlock()
                .features
                .iter()
                .any(|f| !report.landlock_features.contains(f))
                || report.landlock_abi.unwrap_or(0) < i32::from(plan.landlock().min_abi),
        ),
        (Protection::Seccomp, report.seccomp_filters == 0),
        (Protection::Namespaces, !report.namespaces.failed.is_empty()),
    ];
    let mut missing: Vec<Protection> = checks
        .into_iter()
        .filter(|(p, missing)| required(*p) && *missing)
        .map(|(p, _)| p)
        .collect();
    missing.dedup();
    missing
}

/// Step 12, with several policies: which selects what, once (the table operators read).
pub(crate) fn log_selection(plans: &Plans) {
    for p in plans.all().iter().skip(1) {
        tracing::info!(
            policy = %p.policy_name,
            policy_sha256 = %p.policy_sha256,
            select = %p.select.as_ref().map(ToString::to_string).unwrap_or_default(),
            network = p.network().as_str(),
            env_pass_withheld = p.withheld_env.len(),
            "policy selected by Argo CD's own variables (ARGOCD_APP_PROJECT_NAME, ARGOCD_APP_NAMESPACE, ARGOCD_APP_NAME); other requests run under the default"
        );
    }
}

/// Step 12: log exactly what is enforced (once).
fn log_enforced(plan: &Plan, e: &Enforcement) {
    let r = &e.probe;
    tracing::info!(
        policy = %plan.policy_name,
        policy_sha256 = %plan.policy_sha256,
        privilege_model = e.privileges.model.describe(),
        supervisor_capabilities = %e.capabilities_kept.join(", "),
        unique_uid = r.unique_uid,
        uid_range = %format!("{}+{}", plan.uid_range.0, plan.uid_range.1),
        capabilities_cleared = r.capabilities_cleared,
        bounding_cleared = r.bounding_cleared,
        no_new_privs = r.no_new_privs,
        landlock = r.landlock.as_str(),
        landlock_abi = r.landlock_abi.unwrap_or(0),
        landlock_tcp_denied = r.landlock_tcp_denied,
        seccomp_filters = r.seccomp_filters,
        seccomp_instructions = e.seccomp_instructions,
        seccomp_mode = plan.seccomp_mode().as_str(),
        cgroup_controllers = %e.cgroup_controllers.join(", "),
        unavailable = %e
            .unavailable
            .iter()
            .map(|(p, why)| format!("{}: {why}", p.as_str()))
            .collect::<Vec<_>>()
            .join("; "),
        network = plan.network().as_str(),
        namespaces = %r.namespaces.created_list(),
        namespaces_unavailable = %r.namespaces.failed_lines().join("; "),
        private_proc = r.namespaces.private_proc,
        disk_bytes = r.namespaces.disk_bytes.unwrap_or(0),
        missing_paths = %r
            .missing_paths
            .iter()
            .map(|p| p.display().to_string())
            .collect::<Vec<_>>()
            .join(", "),
        degraded = %Degraded::joined(&r.degraded),
        landlock_denials = %e.denial_log.describe(),
        tree_cache = %e.tree_cache_phrase(),
        self_test = %r
            .self_test
            .iter()
            .map(|(dir, outcome)| format!("{dir}: {outcome}"))
            .collect::<Vec<_>>()
            .join("; "),
        "sandbox enforced"
    );
}
