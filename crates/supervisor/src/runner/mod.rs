//! The confined runner (supervisor side): jails are prepared ahead of requests — a UID leased,
//! a cgroup created, a jail forked by the factory and told to confine itself by its policy's
//! plan — and a request takes its policy's ready one, streams the archive to it, reads its
//! typed reply, and has it reclaimed after.
//!
//! The supervisor never opens a path inside a jail's directory: the jail creates it as the
//! leased UID, and a helper running as that UID kills its processes and removes it.

use std::collections::HashMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use super::cache::Borrow;
use super::plan::Plan;
use super::reclaim::RECLAIM_ARG;
use super::uid::{Lease, UidPool};
use crate::RequestSpec;
use crate::factory::{Factory, JailProcess};
use crate::{Executed, Runner};
use cgroups::{Layout, RequestCgroup};
use jail_sys::cancel::CancelToken;
use jail_wire::protocol::{Creds, Degraded, Header, Reply, Report, SelfTestOutcome};
use jail_wire::record::Recorder;
use vocab::request::RequestError;

/// How long reclaim waits for a UID's last processes to disappear before quarantining it.
const UID_DRAIN: Duration = Duration::from_secs(3);
/// How long a jail may take to clean up after replying (or to stop after a cancel: the
/// commands' TERM→KILL grace included) before its UID is killed from outside.
const JAIL_CLEANUP: Duration = Duration::from_secs(60);

/// How long a failed request waits for Landlock's first denial record (delivered by the
/// kernel's audit thread); only failed requests wait, and only when the log is read.
const LANDLOCK_LOG_WAIT: Duration = Duration::from_millis(50);
/// How long a failed request whose error calls an access refused waits for a record of
/// something its error names; past it, what has arrived is said.
const LANDLOCK_LOG_WAIT_NAMED: Duration = Duration::from_secs(1);

/// Configuration of the confined runner.
#[derive(Debug)]
pub(crate) struct ConfinedConfig {
    /// Our own binary (normally `/proc/self/exe`).
    pub exe: PathBuf,
    /// The work root: jail directories are created here by the jails.
    pub work_root: PathBuf,
    /// The UID pool; `None` in the shared-UID model.
    pub pool: Option<UidPool>,
    /// What each policy means for a jail (each policy's spares are confined by its plan).
    pub plans: Arc<super::plan::Plans>,
    /// Arguments for the jail's logging (e.g. `--loglevel`, `info`).
    pub log_args: Vec<String>,
    /// The prepared cgroup layout; `None` when unavailable.
    pub cgroups: Option<Layout>,
    /// Directories the probe's confined extractor must fail to write into.
    pub probe_writes: Vec<PathBuf>,
    /// Without request cgroups: the server's own cgroup's OOM-kill counter (the container's
    /// memory limit), read around each request to name an OOM kill that limit caused.
    pub container_oom: Option<cgroups::OomCounter>,
}

/// A started jail and everything it holds until it is reclaimed.
#[derive(Debug)]
struct Jail {
    /// What confines it.
    plan: Arc<Plan>,
    /// Its directory's (and cgroup's) name.
    name: String,
    process: Option<JailProcess>,
    /// The write end of its stdin while it waits for a request.
    stdin: Option<std::fs::File>,
    /// The read end of its stdout (its reply).
    stdout: Option<std::fs::File>,
    lease: Option<Lease>,
    creds: Option<Creds>,
    cgroup: Option<RequestCgroup>,
    /// The cached tree its request runs on, held until the jail is gone.
    tree: Option<Borrow>,
}

/// One policy's spare: the plan its jails are confined by, the slot and the condition its
/// waiters sleep on.
#[derive(Debug)]
struct Spare {
    plan: Arc<Plan>,
    slot: Mutex<SpareSlot>,
    changed: Condvar,
}

impl Spare {
    fn of(plan: &Arc<Plan>) -> Arc<Spare> {
        Arc::new(Spare {
            plan: plan.clone(),
            slot: Mutex::default(),
            changed: Condvar::new(),
        })
    }

    /// One spare per plan of `plans` (none when a benchmark build's layer pass leaves them out:
    /// then every request prepares its own jail).
    fn all_of(plans: &crate::plan::Plans) -> Arc<[Arc<Spare>]> {
        if crate::bench::off().spare {
            return Arc::new([]);
        }
        plans.all().iter().map(Spare::of).collect()
    }
}

/// The jail kept ready for the next request of one policy.
#[derive(Debug, Default)]
struct SpareSlot {
    ready: Option<Jail>,
    /// A background preparation is under way.
    preparing: bool,
    /// A request is waiting for that preparation (others prepare their own).
    claimed: bool,
    /// Shut down: no new spare.
    closed: bool,
    /// A preparer thread exists (preparing, or idle and waiting for `wake`).
    preparer: bool,
    /// The idle preparer is asked for another spare (`preparing` is already set).
    wake: bool,
}

/// How long an idle preparer thread waits for the next request before it ends: under load one
/// thread prepares every spare (a thread's start and exit cost the supervisor ~0.1 ms of CPU
/// per request); an idle server keeps none.
const PREPARER_IDLE: Duration = Duration::from_secs(5);

/// Where a request's jail comes from.
enum Source {
    /// The spare that was ready.
    Ready(Jail),
    /// The spare being prepared, which this request waits for.
    Claimed,
    /// One prepared for this request.
    Own,
}

/// Runs every request in a jail process.
#[derive(Debug)]
pub(crate) struct Confined {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    cfg: ConfinedConfig,
    pool: Option<Mutex<UidPool>>,
    /// Jails taken by requests, by request name, until reclaimed.
    pending: Mutex<HashMap<String, Jail>>,
    quarantined: Mutex<Vec<Lease>>,
    /// Each policy's spare of the set in force, by plan index, confined by that policy's plan
    /// (from its start-up probe on); replaced whole by a reload ([`Confined::set_plans`]).
    spares: std::sync::RwLock<Arc<[Arc<Spare>]>>,
    cgroup_remover: cgroups::Remover,
    /// Forks the jails.
    factory: Factory,
    /// Numbers jail names (with our PID: unique on this host).
    seq: AtomicU64,
    /// Landlock's denial records by leased UID, when the kernel reports them to us.
    landlock_log: std::sync::OnceLock<super::landlock_log::LandlockLog>,
    /// Memory for large replies, shared by every request.
    reply_memory: ReplyMemory,
    /// The tree cache, once its keeper runs.
    cache: std::sync::OnceLock<super::cache::SharedCache>,
    /// Watches every request's jail from the end of its stream to its reply.
    watcher: super::watch::Watcher,
}

fn internal(message: impl Into<String>) -> RequestError {
    RequestError::internal(message)
}

mod feed;
mod file_denials;
mod finish;
mod reply;
mod request;
mod spare;
mod verdict;

use feed::Feed;
pub(crate) use reply::ReplyMemory;
pub use reply::ReplyShare;

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Confined {
    /// A runner; call [`Confined::sweep`] and [`Confined::probe`] before serving.
    pub fn new(mut cfg: ConfinedConfig) -> Self {
        let pool = cfg.pool.take().map(Mutex::new);
        let factory = Factory::new(cfg.exe.clone(), cfg.log_args.clone());
        // Two of the largest replies at once, from the jail's pipe until the response is
        // written; a third waits its turn.
        let reply_budget = cfg.plans.default_plan().reply_bytes.saturating_mul(2);
        let spares = Spare::all_of(&cfg.plans);
        Confined {
            inner: Arc::new(Inner {
                cfg,
                pool,
                pending: Mutex::default(),
                quarantined: Mutex::default(),
                spares: std::sync::RwLock::new(spares),
                cgroup_remover: cgroups::Remover::new(),
                factory,
                seq: AtomicU64::new(0),
                landlock_log: std::sync::OnceLock::new(),
                reply_memory: ReplyMemory::new(reply_budget),
                cache: std::sync::OnceLock::new(),
                watcher: super::watch::Watcher::default(),
            }),
        }
    }

    /// UIDs leased by requests (not counting idle spare jails') and capacity (None in the
    /// shared model).
    pub fn pool_usage(&self) -> Option<(usize, usize)> {
        let spare_leases = self
            .inner
            .current_spares()
            .iter()
            .filter(|s| {
                lock(&s.slot)
                    .ready
                    .as_ref()
                    .is_some_and(|j| j.lease.is_some())
            })
            .count();
        self.inner.pool.as_ref().map(|p| {
            let p = lock(p);
            (p.in_use().saturating_sub(spare_leases), p.capacity())
        })
    }

    /// Read Landlock's denial records from now on (start-up step 12).
    /// Start the tree cache's keeper (its tmpfs mounted over `mount_at` in its own mount
    /// namespace) and serve requests from the cache from now on.
    pub fn start_cache(&self, mount_at: &Path) -> Result<(), String> {
        let mut cfg = self
            .inner
            .cfg
            .plans
            .default_plan()
            .cache
            .clone()
            .ok_or("off in the policy (spec.cache.enabled), or no mount and PID namespaces in spec.namespaces")?;
        // The cache identity is locked in the lease directory like a lease: another instance
        // on the node never leases or sweeps it; a second instance with the same policy takes
        // the next free one above.
        let (uid, lock) = match &self.inner.pool {
            Some(pool) => lock(pool).lock_outside(cfg.uid, 16).ok_or_else(|| {
                format!(
                    "spec.cache.uid {} and the 15 above it are held by other instances on this node",
                    cfg.uid
                )
            })?,
            None => return Err("the shared-UID model (the cache needs a leased UID per request)".into()),
        };
        cfg.uid = uid;
        let mut cache = super::cache::TreeCache::start(
            &self.inner.cfg.exe,
            &self.inner.cfg.log_args,
            mount_at,
            cfg,
        )?;
        cache.hold_identity(lock);
        let _ = self.inner.cache.set(Arc::new(cache));
        Ok(())
    }

    /// A reload: `plans` in force from now on; the old set's spare jails retired.
    pub fn set_plans(&self, plans: &super::plan::Plans) {
        self.inner.set_plans(plans);
    }

    /// The tree cache's counters, when it runs.
    pub fn cache_stats(&self) -> Option<super::cache::CacheStats> {
        self.inner.cache.get().map(|c| c.stats())
    }

    pub fn set_landlock_log(&self, log: super::landlock_log::LandlockLog) {
        let _ = self.inner.landlock_log.set(log);
    }

    /// Start-up: kill leftover processes in the UID range and remove leftover jail
    /// directories, each as its owner. Returns how many directories were removed.
    pub fn sweep(&self) -> Result<usize, String> {
        self.inner.kill_leftover_processes()?;
        self.inner.remove_leftover_dirs()
    }

    /// Whether the request cgroup or directory `name` (`j<uid>-<pid>-<n>`, or `j-<pid>-<n>` in
    /// the shared-UID model) belongs to another live instance: its identity's lease is held
    /// elsewhere, or (no identity) the instance that named it is alive and not us.
    pub fn held_by_another_instance(&self, name: &str) -> bool {
        let Some(rest) = name.strip_prefix('j') else {
            return false;
        };
        let mut parts = rest.splitn(3, '-');
        let (uid, pid) = (parts.next(), parts.next());
        match (uid.and_then(|u| u.parse::<u32>().ok()), &self.inner.pool) {
            (Some(uid), Some(pool)) => lock(pool).lock_for_sweep(uid).is_none(),
            _ => pid.and_then(|p| p.parse::<u32>().ok()).is_some_and(|p| {
                p != std::process::id() && Path::new(&format!("/proc/{p}")).exists()
            }),
        }
    }

    /// Remove what is left in the work root (each entry as its owner, through the reclaim
    /// helper): a one-shot run's last step, which holds no capability to do it itself.
    pub fn remove_leftover_dirs(&self) -> Result<usize, String> {
        self.inner.remove_leftover_dirs()
    }

    /// Confine a jail, run the extractor self-test in it, and return what it could enforce
    /// (start-up check and `doctor`). Fails when the self-test shows a write outside the
    /// jail's directory.
    pub fn probe(
        &self,
        plan: &Arc<Plan>,
    ) -> Result<(Report, Option<cgroups::Readback>), RequestError> {
        let name = format!("probe-{}-{}", std::process::id(), plan.index.0);
        let header = Header::Probe {
            writes: self.inner.cfg.probe_writes.clone(),
        };
        let record = Recorder::default();
        let deadline = Some(Instant::now() + Duration::from_secs(30));
        let r = self.inner.run_jail(
            (&name, plan),
            &header,
            Feed::Archive(Box::new(std::io::empty())),
            &CancelToken::new(),
            deadline,
            &record,
        );
        // The probe's cgroup as the kernel holds it, before reclaim removes it.
        let readback = lock(&self.inner.pending)
            .get(&name)
            .and_then(|j| j.cgroup.as_ref())
            .map(RequestCgroup::read_back);
        self.inner.reclaim(&name);
        match r?.0 {
            Reply::Ok { report, .. } => {
                let inside = report.self_test.first().map(|(_, o)| o);
                let escaped: Vec<_> = report
                    .self_test
                    .iter()
                    .skip(1)
                    .filter(|(_, o)| {
                        !matches!(o, SelfTestOutcome::Denied(_) | SelfTestOutcome::Private)
                    })
                    .collect();
                if inside != Some(&SelfTestOutcome::Extracted) || !escaped.is_empty() {
                    return Err(internal(format!(
                        "confinement self-test failed: the jailed extractor must write only inside its own directory: {:?}",
                        report.self_test
                    )));
                }
                Ok((report, readback))
            }
            Reply::Err { kind, message, .. } => Err(RequestError::new(kind, message)),
        }
    }
}

impl Drop for Confined {
    fn drop(&mut self) {
        self.inner.shutdown();
    }
}

impl Inner {
    /// Start the reclaim helper (our binary, exec'd: it runs rarely and must not depend on
    /// the factory being healthy).
    fn spawn_helper(&self, extra: &[String]) -> std::io::Result<Child> {
        let mut cmd = Command::new(&self.cfg.exe);
        cmd.arg(RECLAIM_ARG)
            .args(&self.cfg.log_args)
            .args(extra)
            .env_clear()
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit());
        jail_sys::reaper::spawn_tracked(&mut cmd)
    }
}

/// The request's name (its tree's file name), which keys its jail until reclaim.
fn name_of(spec: &RequestSpec) -> Result<String, RequestError> {
    spec.tree
        .file_name()
        .and_then(|n| n.to_str())
        .map(str::to_owned)
        .ok_or_else(|| internal("request directory has no name"))
}

fn wait(child: &mut Child) -> std::io::Result<std::process::ExitStatus> {
    let r = child.wait();
    jail_sys::reaper::untrack(child.id() as i32);
    r
}

/// Wait for a jail that has replied and is cleaning up; `None` if it takes longer than
/// `limit` (the slow path then kills its UID). Sleeps on a pidfd where the kernel has them.
fn wait_bounded(jail: &mut JailProcess, limit: Duration) -> Option<std::process::ExitStatus> {
    let start = Instant::now();
    loop {
        match jail.try_wait() {
            Ok(Some(s)) => return Some(s),
            Ok(None) if start.elapsed() < limit => {
                jail.wait_exit_for(limit.saturating_sub(start.elapsed()));
            }
            _ => return None,
        }
    }
}

impl Runner for Confined {
    fn execute(
        &self,
        spec: &RequestSpec,
        input: Box<dyn Read + Send>,
        cancel: &CancelToken,
    ) -> Result<Executed, RequestError> {
        let request = name_of(spec)?;
        let plan = Arc::clone(&spec.plan);
        // From the tree cache when it can: the bytes are then received and verified (and, on
        // a fill, extracted by the filler) before the jail is taken.
        let feed = self.inner.cached_tree(&plan, spec, input)?;
        let header = Header::Request {
            request: request.clone(),
            task: Box::new(spec.task.clone()),
            deadline_ms: spec
                .deadline
                .map(|d| d.saturating_duration_since(Instant::now()).as_millis() as u64),
            tree_attached: false,
        };
        let (reply, memory) = self.inner.run_jail(
            (&request, &plan),
            &header,
            feed,
            cancel,
            spec.deadline,
            &spec.record,
        )?;
        match reply {
            Reply::Ok {
                outcome: Some(outcome),
                report,
                ..
            } => {
                if !report.degraded.is_empty() {
                    tracing::warn!(degraded = %Degraded::joined(&report.degraded), "request ran with reduced confinement");
                }
                Ok(Executed { outcome, memory })
            }
            Reply::Ok { outcome: None, .. } => Err(internal("the jail returned no result")),
            Reply::Err { kind, message, .. } => Err(RequestError::new(kind, message)),
        }
    }

    fn reclaim(&self, spec: &RequestSpec) {
        if let Ok(request) = name_of(spec) {
            self.inner.reclaim(&request);
        }
    }

    fn shutdown(&self) {
        self.inner.shutdown();
    }

    fn describe(&self) -> &'static str {
        if self.inner.pool.is_some() {
            "confined: one jail process per request, prepared ahead, unique UID/GID, no capabilities, no_new_privs, Landlock, seccomp"
        } else {
            "confined (shared UID): one jail process per request, prepared ahead, no capabilities, no_new_privs, Landlock, seccomp; commands share the server's UID"
        }
    }
}
