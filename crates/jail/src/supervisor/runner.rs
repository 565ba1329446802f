//! The confined runner (supervisor side): jails are prepared ahead of requests — a UID leased,
//! a cgroup created, a jail forked by the factory and told to confine itself — and a request takes
//! the ready one, streams the archive to it, reads its typed reply, and has it reclaimed after.
//!
//! The supervisor never opens a path inside a jail's directory: the jail creates it as the
//! leased UID, and a helper running as that UID kills its processes and removes it.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use super::cache::{Borrow, FillFailed, FillTicket, Lookup};
use super::cgroup::{CgroupStats, Layout, RequestCgroup};
use super::plan::Plan;
use super::reclaim::{RECLAIM_ARG, ReclaimArgs};
use super::uid::{Lease, UidPool, proc_uid, processes_in_range};
use crate::cancel::CancelToken;
use crate::factory::{Factory, JailProcess};
use crate::inside::run::KILL_GRACE;
use crate::protocol::{Creds, Header, Prepare, Reply, Report, SelfTestOutcome, write_frame};
use crate::record::{Limit, Recorder};
use crate::spec::{ErrorKind, RequestError, RequestSpec};
use crate::{Executed, Runner};

/// How long reclaim waits for a UID's last processes to disappear before quarantining it.
const UID_DRAIN: Duration = Duration::from_secs(3);
/// How long a jail may take to clean up after replying (or to stop after a cancel: the
/// commands' TERM→KILL grace included) before its UID is killed from outside.
const JAIL_CLEANUP: Duration = Duration::from_secs(60);

/// How long a failed request waits for Landlock's first denial record (delivered by the
/// kernel's audit thread); only failed requests wait, and only when the log is read.
const LANDLOCK_LOG_WAIT: Duration = Duration::from_millis(50);

/// Configuration of the confined runner.
#[derive(Debug)]
pub(crate) struct ConfinedConfig {
    /// Our own binary (normally `/proc/self/exe`).
    pub exe: PathBuf,
    /// The work root: jail directories are created here by the jails.
    pub work_root: PathBuf,
    /// The UID pool; `None` in the shared-UID model.
    pub pool: Option<UidPool>,
    /// What the policy means for each jail.
    pub plan: Arc<Plan>,
    /// Arguments for the jail's logging (e.g. `--loglevel`, `info`).
    pub log_args: Vec<String>,
    /// The prepared cgroup layout; `None` when unavailable.
    pub cgroups: Option<Layout>,
    /// Directories the probe's confined extractor must fail to write into.
    pub probe_writes: Vec<PathBuf>,
    /// Without request cgroups: the server's own cgroup's OOM-kill counter (the container's
    /// memory limit), read around each request to name an OOM kill that limit caused.
    pub container_oom: Option<super::cgroup::OomCounter>,
}

/// A started jail and everything it holds until it is reclaimed.
#[derive(Debug)]
struct Jail {
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

/// The jail kept ready for the next request.
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
    spare: Mutex<SpareSlot>,
    spare_changed: Condvar,
    cgroup_remover: super::cgroup::Remover,
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

/// What a jail's request works on: the archive, to extract as it arrives, or a tree from the
/// cache with what is left of the archive's stream to receive and verify (nothing after a
/// fill; all of it on a hit, drained while the jail gets the tree, before its `E`).
enum Feed {
    Archive(Box<dyn Read + Send>),
    Tree(Borrow, Box<dyn Read + Send>),
    /// This request fills the tree from its stream, once its jail is taken (so that the
    /// jail's identity and cgroup are in its record whatever the fill's outcome).
    Fill(FillTicket, Box<dyn Read + Send>, Box<FillJob>),
}

/// How a fill extracts: the request's archive options and the filler's limits.
struct FillJob {
    options: archive::Options,
    limits: crate::protocol::FillLimits,
}

/// A borrowed tree, returned to the cache when dropped.
struct TreeHold(Option<Borrow>, Option<super::cache::SharedCache>);

impl Drop for TreeHold {
    fn drop(&mut self) {
        if let (Some(b), Some(c)) = (self.0.take(), &self.1) {
            c.release(b);
        }
    }
}

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
        let reply_budget = cfg.plan.reply_bytes.saturating_mul(2);
        Confined {
            inner: Arc::new(Inner {
                cfg,
                pool,
                pending: Mutex::default(),
                quarantined: Mutex::default(),
                spare: Mutex::default(),
                spare_changed: Condvar::new(),
                cgroup_remover: super::cgroup::Remover::new(),
                factory,
                seq: AtomicU64::new(0),
                landlock_log: std::sync::OnceLock::new(),
                reply_memory: ReplyMemory::new(reply_budget),
                cache: std::sync::OnceLock::new(),
                watcher: super::watch::Watcher::default(),
            }),
        }
    }

    /// UIDs leased by requests (not counting the idle spare jail's) and capacity (None in the
    /// shared model).
    pub fn pool_usage(&self) -> Option<(usize, usize)> {
        let spare_lease = lock(&self.inner.spare)
            .ready
            .as_ref()
            .is_some_and(|j| j.lease.is_some());
        self.inner.pool.as_ref().map(|p| {
            let p = lock(p);
            (
                p.in_use().saturating_sub(usize::from(spare_lease)),
                p.capacity(),
            )
        })
    }

    /// Read Landlock's denial records from now on (start-up step 12).
    /// Start the tree cache's keeper (its tmpfs mounted over `mount_at` in its own mount
    /// namespace) and serve requests from the cache from now on.
    pub fn start_cache(&self, mount_at: &Path) -> Result<(), String> {
        let mut cfg = self
            .inner
            .cfg
            .plan
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
    pub fn probe(&self) -> Result<(Report, Option<super::cgroup::Readback>), RequestError> {
        let name = format!("probe-{}", std::process::id());
        let header = Header::Probe {
            writes: self.inner.cfg.probe_writes.clone(),
        };
        let record = Recorder::default();
        let deadline = Some(Instant::now() + Duration::from_secs(30));
        let r = self.inner.run_jail(
            &name,
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
        crate::reaper::spawn_tracked(&mut cmd)
    }

    /// Start a jail: lease a UID, create its cgroup, start our binary and send it the
    /// preparation, after which it confines itself and waits for a request.
    fn prepare(self: &Arc<Self>) -> Result<Jail, RequestError> {
        let mut jail = Jail {
            name: String::new(),
            process: None,
            stdin: None,
            stdout: None,
            lease: None,
            creds: None,
            cgroup: None,
            tree: None,
        };
        if let Some(pool) = &self.pool {
            let lease = lock(pool).lease().map_err(|e| {
                RequestError::new(
                    ErrorKind::ResourceExhausted,
                    format!("no sandbox UID free: {e}"),
                )
            })?;
            jail.creds = Some(Creds {
                uid: lease.uid(),
                gid: lease.gid(),
            });
            jail.lease = Some(lease);
        }
        let seq = self.seq.fetch_add(1, Ordering::Relaxed);
        jail.name = match jail.creds {
            Some(c) => format!("j{}-{}-{seq}", c.uid, std::process::id()),
            None => format!("j-{}-{seq}", std::process::id()),
        };
        let started = self.start(&mut jail);
        if let Err(e) = started {
            self.finish(jail);
            return Err(e);
        }
        tracing::debug!(jail = %jail.name, uid = jail.creds.map(|c| c.uid), "jail prepared");
        Ok(jail)
    }

    fn start(&self, jail: &mut Jail) -> Result<(), RequestError> {
        let plan = &self.cfg.plan;
        if let Some(layout) = &self.cfg.cgroups {
            jail.cgroup = Some(
                super::cgroup::create(layout, &jail.name, &plan.cgroup)
                    .map_err(|e| internal(e.to_string()))?,
            );
        }
        let pids_cgroup = jail.cgroup.as_ref().is_some_and(|cg| cg.has("pids"));
        let prep = Prepare {
            work_root: self.cfg.work_root.clone(),
            name: jail.name.clone(),
            sandbox: plan.sandbox_for(jail.creds, pids_cgroup),
            cgroup_procs: jail
                .cgroup
                .as_ref()
                .map(RequestCgroup::procs_files)
                .unwrap_or_default(),
        };
        let body = serde_json::to_vec(&prep).map_err(|e| internal(e.to_string()))?;
        let forked = self
            .factory
            .fork()
            .map_err(|e| internal(format!("cannot start the jail: {e}")))?;
        let mut stdin = Some(forked.stdin);
        jail.process = Some(forked.process);
        jail.stdout = Some(forked.stdout);
        // A write error means the jail already stopped; its reply says why.
        if let Some(w) = stdin.as_mut()
            && write_frame(w, b'P', &body)
                .and_then(|()| w.flush())
                .is_err()
        {
            stdin = None;
        }
        jail.stdin = stdin;
        Ok(())
    }

    /// The ready spare if it is still alive; else the one being prepared, if no other request
    /// is waiting for it (it was started earlier, so it is ready sooner than a new one); else a
    /// jail prepared now. Then prepare the next spare in the background.
    fn take(
        self: &Arc<Self>,
        request: &str,
        deadline: Option<Instant>,
        cancel: &CancelToken,
    ) -> Result<Jail, RequestError> {
        let source = {
            let mut slot = lock(&self.spare);
            if slot.claimed {
                // Another request waits for the spare under way (and a ready one is its).
                Source::Own
            } else if let Some(j) = slot.ready.take() {
                Source::Ready(j)
            } else if slot.preparing {
                slot.claimed = true;
                Source::Claimed
            } else {
                Source::Own
            }
        };
        let spare = match source {
            Source::Ready(j) => self.alive_or_discard(j),
            Source::Claimed => {
                let j = self.wait_for_spare();
                lock(&self.spare).claimed = false;
                j
            }
            Source::Own => None,
        };
        let jail = match spare {
            Some(j) => j,
            None => loop {
                match self.prepare() {
                    Ok(j) => break j,
                    // Every UID is leased — one perhaps by a spare being prepared, others by
                    // another instance on this node: wait for one until the request's
                    // deadline (a burst queues rather than fails).
                    Err(e) if e.kind == ErrorKind::ResourceExhausted && self.pool.is_some() => {
                        if let Some(j) = self.wait_for_spare() {
                            break j;
                        }
                        let next = Instant::now() + Duration::from_millis(50);
                        if deadline.is_some_and(|d| d <= next) || cancel.reason().is_some() {
                            return Err(e);
                        }
                        let _ = cancel.wait_until(Some(next), || false);
                    }
                    Err(e) => return Err(e),
                }
            },
        };
        tracing::debug!(jail = %jail.name, request, uid = jail.creds.map(|c| c.uid), "jail taken");
        self.refill();
        Ok(jail)
    }

    /// `jail` if it is still running; a spare that died while idle is reclaimed.
    fn alive_or_discard(self: &Arc<Self>, mut jail: Jail) -> Option<Jail> {
        if jail
            .process
            .as_mut()
            .is_some_and(|c| matches!(c.try_wait(), Ok(None)))
        {
            return Some(jail);
        }
        tracing::warn!(jail = %jail.name, "spare jail exited while idle");
        self.discard(jail);
        None
    }

    /// The spare a background preparation under way produces (`None` if there is none or it
    /// fails).
    fn wait_for_spare(self: &Arc<Self>) -> Option<Jail> {
        let mut slot = lock(&self.spare);
        loop {
            if let Some(j) = slot.ready.take() {
                drop(slot);
                return self.alive_or_discard(j);
            }
            if !slot.preparing {
                return None;
            }
            slot = self
                .spare_changed
                .wait(slot)
                .unwrap_or_else(|e| e.into_inner());
        }
    }

    /// Prepare a spare in the background unless one is ready, under way, or we are closing.
    fn refill(self: &Arc<Self>) {
        {
            let mut slot = lock(&self.spare);
            if slot.closed || slot.ready.is_some() || slot.preparing {
                return;
            }
            slot.preparing = true;
            if slot.preparer {
                // The preparer is idle (it is not preparing): hand it the work.
                slot.wake = true;
                drop(slot);
                self.spare_changed.notify_all();
                return;
            }
            slot.preparer = true;
        }
        let me = self.clone();
        let spawned = std::thread::Builder::new()
            .name("jail-spare".into())
            .spawn(move || {
                loop {
                    me.prepare_spare();
                    if !me.next_spare_wanted() {
                        return;
                    }
                }
            });
        if spawned.is_err() {
            let mut slot = lock(&self.spare);
            slot.preparing = false;
            slot.preparer = false;
            drop(slot);
            self.spare_changed.notify_all();
        }
    }

    /// Prepare one spare (`preparing` is set) and make it the ready one.
    fn prepare_spare(self: &Arc<Self>) {
        let jail = self.prepare();
        let mut slot = lock(&self.spare);
        slot.preparing = false;
        let extra = match jail {
            Ok(j) if slot.closed || slot.ready.is_some() => Some(j),
            Ok(j) => {
                slot.ready = Some(j);
                None
            }
            Err(e) => {
                tracing::debug!(error = %e, "no spare jail prepared");
                None
            }
        };
        drop(slot);
        self.spare_changed.notify_all();
        if let Some(j) = extra {
            self.discard(j);
        }
    }

    /// The idle preparer: wait up to [`PREPARER_IDLE`] to be asked for another spare; false
    /// when it should end (idle that long, or shut down).
    fn next_spare_wanted(self: &Arc<Self>) -> bool {
        let until = Instant::now() + PREPARER_IDLE;
        let mut slot = lock(&self.spare);
        while !slot.wake && !slot.closed {
            let now = Instant::now();
            if now >= until {
                break;
            }
            slot = self
                .spare_changed
                .wait_timeout(slot, until - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        let asked = std::mem::take(&mut slot.wake);
        if asked && !slot.closed {
            return true;
        }
        slot.preparer = false;
        if asked {
            // Asked, then shut down before it began: nothing is under way after all.
            slot.preparing = false;
            drop(slot);
            self.spare_changed.notify_all();
        }
        false
    }

    /// Retire a jail no request used: close its stdin (it cleans up and exits), reclaim it.
    fn discard(self: &Arc<Self>, mut jail: Jail) {
        tracing::debug!(jail = %jail.name, "jail discarded");
        jail.stdin = None;
        self.finish(jail);
    }

    /// Stop preparing spares, wait for a preparation under way, reclaim the ready one, and
    /// wait for the cgroups handed to the remover.
    fn shutdown(self: &Arc<Self>) {
        let mut slot = lock(&self.spare);
        slot.closed = true;
        // An idle preparer ends now rather than after PREPARER_IDLE.
        self.spare_changed.notify_all();
        while slot.preparing {
            slot = self
                .spare_changed
                .wait(slot)
                .unwrap_or_else(|e| e.into_inner());
        }
        let ready = slot.ready.take();
        drop(slot);
        if let Some(j) = ready {
            self.discard(j);
        }
        self.factory.stop();
        self.cgroup_remover.flush();
    }

    /// Kill what is left in the jail's cgroup (v2 `cgroup.kill`; v1 relies on the UID-wide
    /// kill), wait briefly for exiting processes, and once it is empty have it removed in the
    /// background. Returns whether it is empty.
    fn empty_cgroup(&self, cg: &RequestCgroup) -> bool {
        let _ = cg.kill();
        let start = Instant::now();
        while !cg.is_empty() {
            if start.elapsed() > Duration::from_secs(2) {
                tracing::error!(dirs = %cg.dirs.iter().map(|(_, d)| d.display().to_string()).collect::<Vec<_>>().join(", "), "jail cgroup still has processes");
                return false;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        self.cgroup_remover.remove_later(cg.clone());
        true
    }

    /// Run the reclaim helper and wait for it.
    fn helper(&self, args: &ReclaimArgs) -> Result<(), String> {
        let mut child = self
            .spawn_helper(&args.to_args())
            .map_err(|e| format!("cannot start the reclaim helper: {e}"))?;
        match wait(&mut child) {
            Ok(s) if s.success() => Ok(()),
            Ok(s) => Err(format!("reclaim helper failed: {s}")),
            Err(e) => Err(format!("reclaim helper: {e}")),
        }
    }

    /// Reclaim a jail: wait for it to finish its own clean-up, remove its cgroup and its
    /// (then empty) directory entry, release its UID; or, when anything is left, have the
    /// helper kill and remove it as the UID and quarantine the UID if even that fails.
    fn finish(self: &Arc<Self>, jail: Jail) {
        let Jail {
            name,
            process: mut jail_child,
            stdin,
            lease,
            cgroup,
            tree,
            ..
        } = jail;
        drop(stdin);
        // The tree goes back once the jail (and with it its mount namespace) is gone.
        let _tree = TreeHold(tree, self.cache.get().cloned());
        // Fast path: the jail killed its UID's other processes and emptied its directory
        // after replying; all that is left is the empty directory entry in the work root
        // (which the supervisor owns, so it may remove it from the sticky directory).
        let jail_clean = jail_child
            .as_mut()
            .and_then(|c| wait_bounded(c, JAIL_CLEANUP))
            .is_some_and(|s| s.success());
        let cgroup_empty = cgroup.as_ref().is_none_or(|c| self.empty_cgroup(c));
        let fast = jail_clean
            && match rustix::fs::unlinkat(
                rustix::fs::CWD,
                self.cfg.work_root.join(&name),
                rustix::fs::AtFlags::REMOVEDIR,
            ) {
                // A jail that stopped before making its directory left nothing to remove.
                Ok(()) | Err(rustix::io::Errno::NOENT) => true,
                Err(_) => false,
            };
        if fast && cgroup_empty {
            if let (Some(pool), Some(lease)) = (&self.pool, lease) {
                lock(pool).release(lease);
                self.refill();
            }
            return;
        }
        // Slow path: a helper running as the UID kills and removes whatever is left.
        let creds = lease.as_ref().map(|l| (l.uid(), l.gid()));
        let res = self.helper(&ReclaimArgs {
            creds,
            work_root: self.cfg.work_root.clone(),
            name: Some(name.clone()),
        });
        if let Some(mut c) = jail_child {
            // Killed by the helper if it was still running: collect it.
            let _ = c.wait();
        }
        let cgroup_empty = cgroup_empty || cgroup.as_ref().is_none_or(|c| self.empty_cgroup(c));
        let Some(lease) = lease else {
            if let Err(e) = res {
                tracing::error!(jail = %name, error = %e, "reclaim failed");
            }
            return;
        };
        // The UID goes back only when nothing of the jail is left.
        let start = Instant::now();
        let mut left = processes_in_range(Path::new("/proc"), lease.uid(), 1);
        while !left.is_empty() && start.elapsed() < UID_DRAIN {
            std::thread::sleep(Duration::from_millis(5));
            left = processes_in_range(Path::new("/proc"), lease.uid(), 1);
        }
        let dir_gone = matches!(
            rustix::fs::statat(
                rustix::fs::CWD,
                self.cfg.work_root.join(&name),
                rustix::fs::AtFlags::SYMLINK_NOFOLLOW
            ),
            Err(rustix::io::Errno::NOENT)
        );
        match (&res, left.is_empty(), dir_gone && cgroup_empty) {
            (Ok(()), true, true) => {
                if let Some(pool) = &self.pool {
                    lock(pool).release(lease);
                    self.refill();
                }
            }
            _ => {
                tracing::error!(
                    jail = %name,
                    uid = lease.uid(),
                    helper = %res.as_ref().err().map_or_else(|| "ok".to_owned(), ToString::to_string),
                    processes = %left.iter().map(ToString::to_string).collect::<Vec<_>>().join(", "),
                    dir_gone,
                    "reclaim incomplete: UID quarantined"
                );
                lock(&self.quarantined).push(lease);
            }
        }
    }

    /// Reclaim the jail the request `name` took (once, after its result was sent).
    fn reclaim(self: &Arc<Self>, name: &str) {
        let jail = lock(&self.pending).remove(name);
        if let Some(j) = jail {
            self.finish(j);
        }
    }

    /// Kill every process in the UID range (a previous run's; the server owns its range).
    fn kill_leftover_processes(&self) -> Result<(), String> {
        if let Some(pool) = &self.pool {
            let (first, count) = {
                let p = lock(pool);
                (p.first(), p.capacity() as u32)
            };
            let procs: Vec<(i32, u32)> = processes_in_range(Path::new("/proc"), first, count)
                .into_iter()
                .filter_map(|pid| proc_uid(pid).map(|u| (pid, u)))
                .filter(|(_, u)| (first..first + count).contains(u))
                .collect();
            let mut uids: Vec<u32> = procs.iter().map(|(_, u)| *u).collect();
            uids.sort_unstable();
            uids.dedup();
            for uid in uids {
                // Another live instance's request: not ours to kill.
                let Some(_held) = lock(pool).lock_for_sweep(uid) else {
                    tracing::info!(
                        uid,
                        "processes of an identity another live instance holds: left alone"
                    );
                    continue;
                };
                // Not locked in our lease directory, yet a live instance's: it keeps its
                // leases elsewhere. Never kill its work; refuse to share the range blind.
                if let Some(other) = procs
                    .iter()
                    .filter(|(_, u)| *u == uid)
                    .find_map(|(pid, _)| super::uid::live_instance_above(Path::new("/proc"), *pid))
                {
                    return Err(format!(
                        "UID {uid} of spec.uidRange {first}+{count} runs processes of another live cmp-warden (PID {other}) that keeps its UID leases elsewhere than this instance ({}): two instances on one node need disjoint spec.uidRange values, or one lease directory (CMP_WARDEN_LEASE_DIR; a pod's plugin sidecars share the socket directory, where it is by default); nothing of the other instance was touched",
                        lock(pool).lease_dir_display()
                    ));
                }
                tracing::warn!(uid, "killing leftover processes of a previous run");
                self.helper(&ReclaimArgs {
                    creds: Some((uid, uid)),
                    work_root: self.cfg.work_root.clone(),
                    name: None,
                })?;
            }
        }
        Ok(())
    }

    /// Remove every entry of the work root, each as its owner through the reclaim helper
    /// (which first kills that UID's processes). Returns how many were removed.
    fn remove_leftover_dirs(&self) -> Result<usize, String> {
        let mut removed = 0;
        let entries = match std::fs::read_dir(&self.cfg.work_root) {
            Ok(rd) => rd,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(0),
            Err(e) => return Err(format!("{}: {e}", self.cfg.work_root.display())),
        };
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            // lstat of the entry itself (no follow): its owner, not its contents.
            let owner = std::os::unix::fs::MetadataExt::uid(
                &e.metadata().map_err(|err| format!("{name}: {err}"))?,
            );
            let in_pool = self.pool.as_ref().is_some_and(|p| lock(p).contains(owner));
            // A tree another live instance's request owns (a shared work root): left alone.
            let _held = match self.pool.as_ref().filter(|_| in_pool) {
                Some(p) => match lock(p).lock_for_sweep(owner) {
                    Some(l) => Some(l),
                    None => continue,
                },
                None => None,
            };
            let creds = in_pool.then_some((owner, owner));
            self.helper(&ReclaimArgs {
                creds,
                work_root: self.cfg.work_root.clone(),
                name: Some(name),
            })?;
            removed += 1;
        }
        Ok(removed)
    }

    /// Run one request (or the probe) in the next jail: send `header` and the archive from
    /// `input`, read the reply, and judge it with what the cgroup saw ([`verdict`]).
    fn run_jail(
        self: &Arc<Self>,
        request: &str,
        header: &Header,
        feed: Feed,
        cancel: &CancelToken,
        deadline: Option<Instant>,
        record: &Recorder,
    ) -> Result<(Reply, ReplyShare), RequestError> {
        // With a tree, the bytes are received and verified but not sent: only their end is.
        let (mut input, tree, fill) = match feed {
            Feed::Archive(input) => (input, None, None),
            Feed::Tree(b, rest) => (rest, Some(b), None),
            Feed::Fill(ticket, input, job) => (input, None, Some((ticket, job))),
        };
        let mut forward = tree.is_none() && fill.is_none();
        // Returned to the cache if this ends before a jail holds it.
        let mut hold = TreeHold(tree, self.cache.get().cloned());
        let mut jail = self.take(request, deadline, cancel)?;
        let (creds, cgroup, jail_name) = (jail.creds, jail.cgroup.clone(), jail.name.clone());
        // No cgroup of its own: the container's OOM kills before and after say whether its
        // memory limit ended the request.
        let container_ooms = |c: &super::cgroup::OomCounter| c.read();
        let ooms_before = match (&cgroup, &self.cfg.container_oom) {
            (None, Some(c)) => container_ooms(c),
            _ => None,
        };
        let filled = fill.is_some();
        // A fill: the stream goes to the filler; the jail gets the tree once it is sealed.
        if let Some((ticket, job)) = fill {
            match self.fill_tree(ticket, &mut input, &job, deadline, record) {
                Ok(b) => {
                    input = Box::new(std::io::empty());
                    hold.0 = Some(b);
                }
                // The cache is an optimisation: a fill that never started read nothing of the
                // stream, which the jail now extracts as with the cache off.
                Err(FillFailed::NotStarted(e)) => {
                    tracing::warn!(error = %e.message, "tree cache: the fill could not start; this request extracts in its own jail");
                    crate::record::update(record, |r| {
                        r.tree_cache = Some(crate::record::TreeCacheUse::Uncached);
                        r.archive = None;
                    });
                    forward = true;
                }
                Err(FillFailed::Failed(e)) => {
                    crate::record::update(record, |r| {
                        r.uid = creds.map(|c| c.uid);
                        r.gid = creds.map(|c| c.gid);
                        r.cgroup = cgroup.as_ref().map(|_| jail_name.clone());
                    });
                    // Reclaimed with the request, as every jail it took.
                    lock(&self.pending).insert(request.to_owned(), jail);
                    return Err(e);
                }
            }
        }
        let mut stdin = jail.stdin.take();
        let stdout = jail.stdout.take();
        // A cached tree: lent for this jail's UID, held until the jail is gone.
        let lent = match (&hold.0, creds, self.cache.get()) {
            (Some(b), Some(c), Some(cache)) => Some(cache.lend(b, c.uid, c.gid)),
            (Some(_), _, _) => Some(Err(internal("tree cache: a tree needs a leased UID"))),
            _ => None,
        };
        jail.tree = hold.0.take();
        let denial_log = self.landlock_log.get().zip(creds.map(|c| c.uid));
        if let Some((log, uid)) = denial_log {
            log.clear(uid);
        }
        // From here on the request owns the jail: reclaim finds it by the request's name.
        lock(&self.pending).insert(request.to_owned(), jail);

        let body = serde_json::to_vec(&header).map_err(|e| internal(e.to_string()))?;

        // `network: allowList`: serve the listener the jail made on its loopback (it came over
        // its stdin socket while it confined itself).
        let task = match header {
            Header::Request { task, .. } => Some(&**task),
            Header::Probe { .. } => None,
        };
        let proxy = match (self.cfg.plan.egress_proxy(task), stdin.as_ref()) {
            (Some(p), Some(sock)) => match receive_listener(sock) {
                Ok((l, shared)) => {
                    // On the server's loopback: only the request's own processes are served
                    // (its UID; the server's in the shared-UID model).
                    let p = if shared {
                        let own = rustix::process::getuid().as_raw();
                        p.admit_only_uid(creds.map_or(own, |c| c.uid))
                    } else {
                        p
                    }
                    .with_deadline(deadline);
                    match p.start(l) {
                        Ok(h) => Some(h),
                        Err(e) => return Err(internal(format!("egress proxy: {e}"))),
                    }
                }
                // The jail stopped before handing it over; its reply says why.
                Err(e) => {
                    tracing::warn!(error = %e, "no egress listener from the jail");
                    None
                }
            },
            _ => None,
        };

        // The tree cache: the jail's mounter puts the lent tree in place before the header;
        // without one, its socket is closed and the jail extracts.
        let mounter = match (&self.cfg.plan.cache, stdin.as_ref()) {
            (Some(_), Some(sock)) => receive_mounter(sock).unwrap_or_else(|e| {
                tracing::warn!(error = %e, "no word of the jail's mounter");
                None
            }),
            _ => None,
        };
        let body = match (lent, mounter) {
            (Some(Ok(tree)), Some(m)) => {
                attach_tree(&m, tree)
                    .map_err(|e| internal(format!("tree cache: attaching the tree: {e}")))?;
                let mut h = header.clone();
                if let Header::Request { tree_attached, .. } = &mut h {
                    *tree_attached = true;
                }
                serde_json::to_vec(&h).map_err(|e| internal(e.to_string()))?
            }
            // A hit whose tree cannot be lent (the keeper failed or is gone) or attached (no
            // mounter) still has its whole stream to come: the jail extracts it, as without
            // the cache (its mounter socket, if any, is closed unused). A fill's stream went
            // to the filler, so its request fails instead.
            (Some(lent), mounter) if !filled && (lent.is_err() || mounter.is_none()) => {
                let why = match lent {
                    Err(e) => e.message,
                    Ok(_) => "the jail has no mounter".to_owned(),
                };
                tracing::warn!(error = %why, "tree cache: the tree could not be lent; this request extracts in its own jail");
                fall_back_to_extraction(record, self.cache.get());
                forward = true;
                body
            }
            (Some(lent), None) => {
                lent?;
                return Err(internal(
                    "tree cache: the jail has no mounter (no mount or PID namespace here)",
                ));
            }
            (Some(Err(e)), Some(_)) => return Err(e),
            (None, _) => body,
        };

        // Feed: header, then the archive as it arrives (with a tree: drained), then its end,
        // which the service lets through only once the bytes matched their checksum. A write
        // error means the jail already stopped (it refused the archive, or could not confine
        // itself); its reply says why.
        if let Some(w) = stdin.as_mut() {
            let mut ok = write_frame(w, b'H', &body).is_ok();
            let mut buf = vec![0u8; 64 * 1024];
            while ok {
                match input.read(&mut buf) {
                    Ok(0) => {
                        ok = write_frame(w, b'E', &[]).is_ok() && w.flush().is_ok();
                        break;
                    }
                    Ok(n) if forward => ok = write_frame(w, b'D', &buf[..n]).is_ok(),
                    Ok(_) => {}
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    // Aborted (checksum mismatch, client gone): close without `E`.
                    Err(_) => {
                        ok = false;
                    }
                }
            }
            if !ok {
                stdin = None;
            }
        }
        drop(input);

        // After `E`, closing stdin tells the jail to cancel; if it has not exited a grace
        // period later, its whole UID is killed (the runner's one watcher thread).
        let done = Arc::new(AtomicBool::new(false));
        self.watcher.watch(super::watch::Watch {
            cancel: cancel.clone(),
            deadline,
            done: done.clone(),
            stdin,
            kill: creds.map(|c| ReclaimArgs {
                creds: Some((c.uid, c.gid)),
                work_root: self.cfg.work_root.clone(),
                name: None,
            }),
            exe: self.cfg.exe.clone(),
        });

        // The reply carries at most what one gRPC message may (or an error with a command's
        // stderr), with room for the record. Manifests travel as JSON strings inside the JSON
        // frame, where escaping (`"` → `\"`) at most doubles them.
        let cap = match header {
            Header::Request { task, .. } => task.reply_bytes.max(task.output_bytes),
            Header::Probe { .. } => 1024,
        }
        .saturating_mul(2)
        .saturating_add(1 << 20);
        let reply_deadline = deadline.map(|d| d + KILL_GRACE);
        let raw = stdout.map(|mut s| read_reply(&mut s, cap, &self.reply_memory, reply_deadline));
        if let Some(p) = proxy {
            let (connections, unrecorded) = p.finish();
            crate::record::update(record, |r| {
                r.egress = connections;
                r.egress_unrecorded = unrecorded;
            });
        }
        // The watcher sees `done` and drops the watch (and the jail's stdin, which the jail no
        // longer reads); nothing on the reply's path waits for it.
        done.store(true, Ordering::SeqCst);
        cancel.poke();
        let stats = cgroup.as_ref().map(|c| c.stats());
        // The supervisor's part of the audit record: identity, cgroup, request-wide memory.
        crate::record::update(record, |r| {
            r.uid = creds.map(|c| c.uid);
            r.gid = creds.map(|c| c.gid);
            r.cgroup = cgroup.as_ref().map(|_| jail_name.clone());
            r.peak_memory_bytes = stats.map(|s| s.peak_memory_bytes);
            r.oom_kills = stats.map(|s| s.oom_kills);
        });
        if let Some(s) = stats {
            tracing::debug!(
                peak_memory_bytes = s.peak_memory_bytes,
                oom_kills = s.oom_kills,
                pids_refused = s.pids_refused,
                "request cgroup"
            );
        }
        // The permit (supervisor-wide reply memory) goes with the outcome until the response
        // is written.
        let (raw, permit) = match raw {
            Some(Ok(Some((raw, permit)))) => (Some(raw), permit),
            Some(Ok(None)) | None => (None, None),
            Some(Err(e)) => return Err(e),
        };
        // No reply: how the jail itself ended says why (an allocation it could not make
        // aborts it).
        let jail_signal = if raw.is_none() {
            self.jail_signal(request)
        } else {
            None
        };
        let container_oom = ooms_before
            .zip(self.cfg.container_oom.as_ref().and_then(container_ooms))
            .is_some_and(|(before, after)| after > before);
        let reply = verdict(
            raw,
            stats,
            container_oom,
            &self.cfg.plan,
            cancel,
            record,
            jail_signal,
        )?;
        // What Landlock refused the request's commands, if the kernel told us: a failed
        // request waits for the records (they arrive a few milliseconds after the denial) to
        // say why it failed; a successful one takes those already there, for the audit event.
        if let Some((log, uid)) = denial_log {
            let wait = match &reply {
                Reply::Err { .. } => LANDLOCK_LOG_WAIT,
                Reply::Ok { .. } => Duration::ZERO,
            };
            let denied = log.take(uid, wait);
            if !denied.is_empty() {
                crate::record::update(record, |r| r.landlock_denials = denied);
            }
        }
        Ok((
            explain_denials(reply, record, &self.cfg.plan),
            ReplyShare::new(permit),
        ))
    }
}

impl Inner {
    /// What the request's jail works on: a sealed tree from the cache (with `input` still to
    /// drain: it ends only once the bytes matched their checksum, and the jail gets the tree
    /// meanwhile), a tree this request fills (from `input`), or the archive to extract in its
    /// own jail. The audit record says which.
    fn cached_tree(
        &self,
        spec: &RequestSpec,
        input: Box<dyn Read + Send>,
    ) -> Result<Feed, RequestError> {
        use crate::record::TreeCacheUse;
        let Some(cache) = self.cache.get() else {
            return Ok(Feed::Archive(input));
        };
        let mut options = spec.task.archive.clone();
        options.preserve_file_mode = spec.task.config.spec.preserve_file_mode;
        let key = spec
            .task
            .archive_sha256
            .as_deref()
            .and_then(|c| super::cache::tree_key(c, &options));
        // Too small to be worth a tree: a fill costs more than its hits save.
        let small = spec
            .task
            .archive_size
            .is_some_and(|n| n < cache.min_archive_bytes());
        let Some(key) = key.filter(|_| !small) else {
            if small {
                tracing::debug!(
                    "tree cache: the archive is smaller than spec.cache.minArchiveBytes; it extracts in its own jail"
                );
            }
            crate::record::update(&spec.record, |r| {
                r.tree_cache = Some(TreeCacheUse::Uncached)
            });
            return Ok(Feed::Archive(input));
        };
        match cache.lookup(&key, spec.deadline) {
            // Drained by `run_jail` while the jail takes the tree.
            Lookup::Hit(b) => {
                note_tree(&spec.record, &b, None);
                Ok(Feed::Tree(b, input))
            }
            Lookup::Fill(ticket) => {
                let limits = crate::protocol::FillLimits {
                    cpu_seconds: options.limits.wall_clock.as_secs().max(1),
                    data_bytes: self.cfg.plan.data_bytes(),
                    address_space_bytes: self.cfg.plan.address_space_bytes(),
                    file_size_bytes: options.limits.file_bytes,
                };
                Ok(Feed::Fill(
                    ticket,
                    input,
                    Box::new(FillJob { options, limits }),
                ))
            }
            Lookup::Uncached(why) => {
                tracing::debug!(why, "tree cache: this request extracts in its own jail");
                crate::record::update(&spec.record, |r| {
                    r.tree_cache = Some(TreeCacheUse::Uncached)
                });
                Ok(Feed::Archive(input))
            }
        }
    }

    /// Fill the tree of `ticket` from `input` (received, verified and sealed when this
    /// returns), recording it as this request's extraction.
    fn fill_tree(
        &self,
        ticket: FillTicket,
        input: &mut Box<dyn Read + Send>,
        job: &FillJob,
        deadline: Option<Instant>,
        record: &Recorder,
    ) -> Result<Borrow, FillFailed> {
        use crate::record::TreeCacheUse;
        let cache = self
            .cache
            .get()
            .ok_or_else(|| FillFailed::NotStarted(internal("tree cache: not running")))?;
        let started = Instant::now();
        match cache.fill(ticket, input, &job.options, job.limits, deadline) {
            Ok(b) => {
                note_tree(record, &b, Some(started));
                Ok(b)
            }
            Err(FillFailed::NotStarted(e)) => Err(FillFailed::NotStarted(e)),
            Err(FillFailed::Failed(e)) => {
                crate::record::update(record, |r| {
                    r.tree_cache = Some(TreeCacheUse::Filled);
                    if e.kind != ErrorKind::Internal && e.kind != ErrorKind::Cancelled {
                        r.limit = Some(Limit::Archive);
                    }
                });
                Err(FillFailed::Failed(e))
            }
        }
    }

    /// The signal that ended `request`'s jail (or its PID namespace's init), if one did
    /// (waiting briefly: its stdout closes as it exits).
    fn jail_signal(&self, request: &str) -> Option<i32> {
        use std::os::unix::process::ExitStatusExt;
        let deadline = Instant::now() + Duration::from_millis(500);
        loop {
            {
                let mut pending = lock(&self.pending);
                let process = pending.get_mut(request)?.process.as_mut()?;
                match process.try_wait() {
                    // Behind its PID namespace's init, a signal arrives as 128 + its number.
                    Ok(Some(st)) => {
                        return st
                            .signal()
                            .or_else(|| st.code().filter(|c| *c > 128).map(|c| c - 128));
                    }
                    Ok(None) => {}
                    Err(_) => return None,
                }
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

/// Receive the jail's egress listener (one `L` or `S` byte with the descriptor) from its
/// stdin socket, waiting at most as long as a jail may take to confine itself. `true`: it is
/// on the server's loopback (`S`), where other processes of the pod can reach it too.
fn receive_listener(sock: &std::fs::File) -> std::io::Result<(std::net::TcpListener, bool)> {
    match receive_tagged(sock)? {
        (crate::protocol::EGRESS_LISTENER, Some(fd)) => Ok((fd.into(), false)),
        (crate::protocol::EGRESS_LISTENER_SHARED, Some(fd)) => Ok((fd.into(), true)),
        _ => Err(std::io::Error::other("the jail sent no listener")),
    }
}

/// Receive the jail's mounter socket (`T` with the descriptor; `N` when it has none).
fn receive_mounter(sock: &std::fs::File) -> std::io::Result<Option<std::os::fd::OwnedFd>> {
    match receive_tagged(sock)? {
        (crate::protocol::MOUNTER_SOCKET, Some(fd)) => Ok(Some(fd)),
        (crate::protocol::NO_MOUNTER, None) => Ok(None),
        _ => Err(std::io::Error::other(
            "the jail sent no word of its mounter",
        )),
    }
}

/// A hit that extracts after all: the record says uncached, and the jail's extraction
/// replaces the tree's figures.
fn fall_back_to_extraction(record: &Recorder, cache: Option<&super::cache::SharedCache>) {
    if let Some(c) = cache {
        c.not_lent();
    }
    crate::record::update(record, |r| {
        r.tree_cache = Some(crate::record::TreeCacheUse::Uncached);
        r.archive = None;
    });
}

/// The tree in the request's record: from the cache or filled by it, as its extraction (the
/// fill's time, from `filled_since`; a hit extracted nothing).
fn note_tree(record: &Recorder, b: &Borrow, filled_since: Option<Instant>) {
    use crate::record::TreeCacheUse;
    let now = crate::record::unix_nanos();
    let took = filled_since.map_or(0, |t| t.elapsed().as_micros() as u64);
    crate::record::update(record, |r| {
        r.tree_cache = Some(if b.filled {
            TreeCacheUse::Filled
        } else {
            TreeCacheUse::Hit
        });
        r.archive = Some(crate::record::ArchiveRecord {
            entries: b.entries,
            file_bytes: b.file_bytes,
            started_unix_nanos: now.saturating_sub(took.saturating_mul(1000)),
            duration_us: took,
        });
    });
}

/// Have the jail's mounter put the lent tree `tree` under its `repo/`.
fn attach_tree(mounter: &std::os::fd::OwnedFd, tree: std::os::fd::OwnedFd) -> Result<(), String> {
    use std::os::fd::AsFd;
    rustix::net::sockopt::set_socket_timeout(
        mounter,
        rustix::net::sockopt::Timeout::Recv,
        Some(Duration::from_secs(10)),
    )
    .map_err(|e| e.to_string())?;
    crate::protocol::send_msg(
        mounter.as_fd(),
        &crate::protocol::MounterCmd::Attach,
        &[tree.as_fd()],
    )
    .map_err(|e| e.to_string())?;
    match crate::protocol::recv_msg::<crate::protocol::MounterReply>(mounter.as_fd()) {
        Ok(Some((crate::protocol::MounterReply::Ok, _))) => Ok(()),
        Ok(Some((crate::protocol::MounterReply::Failed(e), _))) => Err(e),
        Ok(None) => Err("the mounter is gone".into()),
        Err(e) => Err(e.to_string()),
    }
}

/// One tagged byte from the jail's stdin socket, with the descriptor that came with it.
fn receive_tagged(sock: &std::fs::File) -> std::io::Result<(u8, Option<std::os::fd::OwnedFd>)> {
    use rustix::net::{RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags};
    use std::os::fd::AsFd;
    rustix::net::sockopt::set_socket_timeout(
        sock,
        rustix::net::sockopt::Timeout::Recv,
        Some(Duration::from_secs(30)),
    )?;
    let mut space = [std::mem::MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
    let mut anc = RecvAncillaryBuffer::new(&mut space);
    let mut byte = [0u8; 1];
    let got = rustix::net::recvmsg(
        sock.as_fd(),
        &mut [std::io::IoSliceMut::new(&mut byte)],
        &mut anc,
        RecvFlags::CMSG_CLOEXEC,
    )?;
    let fd = anc.drain().find_map(|m| match m {
        RecvAncillaryMessage::ScmRights(mut fds) => fds.next(),
        _ => None,
    });
    rustix::net::sockopt::set_socket_timeout(sock, rustix::net::sockopt::Timeout::Recv, None)?;
    if got.bytes != 1 {
        return Err(std::io::Error::other("the jail closed its socket"));
    }
    Ok((byte[0], fd))
}

/// A failed request in which the sandbox refused something says what and which policy field
/// allows it, after the tool's own message (which may only say "403" or "no such host"):
/// destinations the egress proxy refused, calls the seccomp profile denied (inet sockets under
/// `network: none` named as such), and the server variables commands did not get.
fn explain_denials(reply: Reply, record: &Recorder, plan: &Plan) -> Reply {
    let network = plan.network();
    let Reply::Err {
        kind,
        message,
        report,
        record: r,
    } = reply
    else {
        return reply;
    };
    let rec = crate::record::snapshot(record);
    let mut refused: Vec<String> = rec
        .egress
        .iter()
        .filter(|c| c.decision == egress::Decision::Denied)
        .filter_map(|c| c.reason.clone())
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .take(3)
        .collect();
    for e in rec
        .seccomp_audit
        .iter()
        .filter(|e| e.action == crate::record::SeccompAction::Denied)
        .take(3)
    {
        refused.push(if e.syscall == "socket" && network == policy::NetworkMode::None {
            format!(
                "network access ({} socket calls by {}): spec.network.mode is none; allowList with spec.network.allow (or egress) allows connections",
                e.count, e.comm
            )
        } else {
            format!(
                "system call {} ({} times, by {}), denied by the spec.seccomp profile",
                e.syscall, e.count, e.comm
            )
        });
    }
    // Tools probe many paths they can do without (locale files, cgroup limits); the ones the
    // command's own message names come first.
    let mut landlock: Vec<_> = rec.landlock_denials.iter().collect();
    landlock.sort_by_key(|d| d.object.is_empty() || !message.contains(d.object.as_str()));
    for d in landlock.into_iter().take(3) {
        refused.push(match &d.allowed_by {
            Some(field) => format!("{} on {} (Landlock; {field})", d.blockers, d.object),
            None => format!(
                "{} on {} (Landlock; no policy field allows this)",
                d.blockers, d.object
            ),
        });
    }
    let mut message = if refused.is_empty() {
        message
    } else {
        format!("{message} (the sandbox refused: {})", refused.join("; "))
    };
    // A command failed: it may have missed a server variable it is configured by. (Not when
    // its output was refused: Argo CD's own words then stand alone.)
    let command_failed = rec
        .commands
        .last()
        .is_some_and(|c| c.exit_code != Some(0) || c.signal.is_some());
    if command_failed && !plan.withheld_env.is_empty() {
        crate::record::update(record, |r| r.withheld_env = plan.withheld_env.clone());
        let shown: Vec<&str> = plan
            .withheld_env
            .iter()
            .take(8)
            .map(String::as_str)
            .collect();
        let more = plan.withheld_env.len() - shown.len();
        message = format!(
            "{message} (server variables not passed to commands: {}{}; spec.env.pass allows them)",
            shown.join(", "),
            if more > 0 {
                format!(" and {more} more")
            } else {
                String::new()
            }
        );
    }
    Reply::Err {
        kind,
        message,
        report,
        record: r,
    }
}

/// The request's result from the jail's raw reply and what its cgroup saw: an OOM kill or a
/// refused fork is named as the limit that ended the request (ResourceExhausted with the
/// policy field), whatever the jail itself made of the failure; the jail's part of the audit
/// record is merged under the supervisor's.
fn verdict(
    raw: Option<Vec<u8>>,
    stats: Option<CgroupStats>,
    container_oom: bool,
    plan: &Plan,
    cancel: &CancelToken,
    record: &Recorder,
    jail_signal: Option<i32>,
) -> Result<Reply, RequestError> {
    // The request's own cgroup saw an OOM kill: memory ended it, whatever else happened. The
    // container's count also moves for another request's kill: it names only a failure.
    let oom = stats.is_some_and(|s| s.oom_kills > 0) || container_oom;
    if stats.is_some_and(|s| s.oom_kills > 0) {
        crate::record::update(record, |r| r.limit = Some(Limit::Memory));
    }
    let oom_error = |detail: &str| {
        crate::record::update(record, |r| r.limit = Some(Limit::Memory));
        RequestError::new(
            ErrorKind::ResourceExhausted,
            if container_oom {
                format!(
                    "memory limit exceeded: the kernel's OOM killer ended a process of the request when the server's own cgroup (the container's memory limit) was full; a per-request bound (policy spec.limits.memoryBytes: {}) needs a delegated cgroup, which this node does not give (doctor's cgroups){detail}",
                    plan.cgroup.memory_bytes
                )
            } else {
                format!(
                    "memory limit exceeded (policy spec.limits.memoryBytes: {}): the kernel killed a process of the request{detail}",
                    plan.cgroup.memory_bytes
                )
            },
        )
    };
    let raw = match raw {
        Some(raw) => raw,
        None if oom => return Err(oom_error("")),
        // The jail aborted: an allocation failed under its heap limit. Rust aborts then; as
        // init of its PID namespace the jail ignores its own SIGABRT, so glibc's fallback
        // ends it with SIGSEGV.
        None if matches!(jail_signal, Some(libc::SIGABRT | libc::SIGSEGV))
            && cancel.reason().is_none() =>
        {
            crate::record::update(record, |r| r.limit = Some(Limit::Memory));
            return Err(RequestError::new(
                ErrorKind::ResourceExhausted,
                format!(
                    "the sandbox ran out of memory handling the command's output (it ended by signal {}, as a failed allocation under policy spec.limits.dataBytes: {} per process ends it)",
                    jail_signal.unwrap_or_default(),
                    plan.data_bytes()
                ),
            ));
        }
        None => {
            return Err(match cancel.reason() {
                Some(_) => RequestError::new(ErrorKind::Cancelled, "context canceled"),
                None => internal("the jail exited without a reply"),
            });
        }
    };
    let mut reply: Reply = serde_json::from_slice(&raw)
        .map_err(|e| internal(format!("bad reply from the jail: {e}")))?;
    // The jail's part (commands, archive, its view of the limit), merged under ours.
    let (Reply::Ok { record: theirs, .. } | Reply::Err { record: theirs, .. }) = &mut reply;
    let theirs = std::mem::take(theirs);
    crate::record::update(record, |r| {
        // (A jail on a cached tree extracted nothing: the record has the tree's.)
        if theirs.archive.is_some() {
            r.archive = theirs.archive;
        }
        r.commands = theirs.commands;
        r.seccomp_audit = theirs.seccomp_audit;
        if r.limit.is_none() {
            r.limit = theirs.limit;
        }
    });
    // Forks refused by the cgroup, or the task count at the limit (RLIMIT_NPROC, set to the
    // same value for the unique UID, usually refuses first).
    let pids_hit = stats.is_some_and(|s| s.pids_refused > 0 || s.pids_peak >= plan.cgroup.pids);
    let rewritten = |e: RequestError| Reply::Err {
        kind: e.kind,
        message: e.message,
        report: None,
        record: Default::default(),
    };
    Ok(match reply {
        Reply::Err { message, .. } if oom => rewritten(oom_error(&format!(": {message}"))),
        // A failure after forks were refused: name the limit (the tool's own message, e.g.
        // "Cannot fork", follows).
        Reply::Err { message, .. } if pids_hit => {
            crate::record::update(record, |r| r.limit = Some(Limit::Pids));
            rewritten(RequestError::new(
                ErrorKind::ResourceExhausted,
                format!(
                    "process limit reached (policy spec.limits.pids: {}): {message}",
                    plan.cgroup.pids
                ),
            ))
        }
        other => other,
    })
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
    crate::reaper::untrack(child.id() as i32);
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

/// Read the jail's `R` frame: `Ok(None)` if it closed stdout without one.
fn read_reply(
    r: &mut impl Read,
    cap: u64,
    budget: &ReplyMemory,
    deadline: Option<Instant>,
) -> Result<Option<RawReply>, RequestError> {
    let max = usize::try_from(cap).unwrap_or(usize::MAX).saturating_add(1);
    // Stderr lines of the running command come first, each logged as it arrives.
    let mut head = crate::protocol::read_frame_head(r, max);
    while let Ok(Some((crate::protocol::STDERR_LINE, n))) = head {
        log_stderr_line(r, n)?;
        head = crate::protocol::read_frame_head(r, max);
    }
    match head {
        Ok(None) => Ok(None),
        Ok(Some((b'R', n))) if n as u64 <= cap => {
            // Small replies (nearly all) never wait; a large one takes its size from the
            // supervisor-wide budget first (waiting for it within the request's time), so
            // concurrent large replies cannot add up. Allocated only once charged, and exactly
            // (a doubling Vec would hold up to twice the frame).
            let permit = budget.take(n as u64, deadline)?;
            let mut body = Vec::with_capacity(n);
            r.take(n as u64)
                .read_to_end(&mut body)
                .map_err(|e| internal(format!("reading the jail's reply: {e}")))?;
            if body.len() != n {
                return Err(internal("the jail's reply was cut short"));
            }
            Ok(Some((body, permit)))
        }
        Ok(Some((b'R', n))) => Err(RequestError::new(
            ErrorKind::ResourceExhausted,
            format!("the jail's reply ({n} bytes) exceeds {cap} bytes"),
        )),
        Ok(Some((t, _))) => Err(internal(format!("unexpected frame {t} from the jail"))),
        Err(e) => Err(internal(format!("reading the jail's reply: {e}"))),
    }
}

/// Log one [`crate::protocol::StderrLine`] frame of `n` bytes (in the request's span).
fn log_stderr_line(r: &mut impl Read, n: usize) -> Result<(), RequestError> {
    if n > crate::protocol::STDERR_LINE_MAX {
        return Err(internal(format!(
            "a stderr line frame of {n} bytes from the jail"
        )));
    }
    let mut body = vec![0; n];
    r.read_exact(&mut body)
        .map_err(|e| internal(format!("reading the jail's stderr line: {e}")))?;
    let l: crate::protocol::StderrLine = serde_json::from_slice(&body)
        .map_err(|e| internal(format!("the jail's stderr line: {e}")))?;
    if l.more_not_logged {
        tracing::info!(
            phase = %l.phase,
            "command stderr: further lines are not logged as they arrive (the error and the audit event carry what the command printed)"
        );
    } else {
        tracing::info!(phase = %l.phase, line = %l.line, "command stderr");
    }
    Ok(())
}

/// A reply's bytes and, for a large one, its share of the reply memory.
type RawReply = (Vec<u8>, Option<ReplyPermit>);

/// Replies up to this size are read without a permit.
const SMALL_REPLY: u64 = 1 << 20;

/// The supervisor-wide budget for large replies, from the jail's pipe until the response is
/// written (the raw frame, the parsed outcome and the encoded message are each at most the
/// frame's size, and never all three at once: the raw bytes are gone once parsed).
#[derive(Debug)]
pub(crate) struct ReplyMemory {
    state: Arc<(Mutex<u64>, Condvar)>,
    limit: u64,
}

/// A large reply's share of [`ReplyMemory`], returned when dropped.
#[derive(Debug)]
pub(crate) struct ReplyPermit {
    state: Arc<(Mutex<u64>, Condvar)>,
    bytes: u64,
}

impl Drop for ReplyPermit {
    fn drop(&mut self) {
        let (in_use, freed) = &*self.state;
        *lock(in_use) -= self.bytes;
        freed.notify_all();
    }
}

/// A request's share of the server's reply memory: held (with the outcome) until its response
/// is written, then dropped, which lets the next large reply in. Empty for small replies.
#[derive(Debug, Clone, Default)]
pub struct ReplyShare(Option<Arc<ReplyPermit>>);

impl ReplyShare {
    fn new(permit: Option<ReplyPermit>) -> Self {
        ReplyShare(permit.map(Arc::new))
    }

    /// Bytes of the budget this share holds.
    pub fn bytes(&self) -> u64 {
        self.0.as_ref().map_or(0, |p| p.bytes)
    }
}

impl ReplyMemory {
    /// A budget of `limit` bytes.
    pub(crate) fn new(limit: u64) -> Self {
        ReplyMemory {
            state: Arc::new((Mutex::new(0), Condvar::new())),
            limit,
        }
    }

    /// `bytes` of the budget (at most all of it), waiting until other replies return enough
    /// or `deadline` passes (then ResourceExhausted).
    fn take(
        &self,
        bytes: u64,
        deadline: Option<Instant>,
    ) -> Result<Option<ReplyPermit>, RequestError> {
        if bytes <= SMALL_REPLY {
            return Ok(None);
        }
        let bytes = bytes.min(self.limit);
        let (in_use, freed) = &*self.state;
        let mut used = lock(in_use);
        if *used + bytes > self.limit {
            tracing::info!(
                bytes,
                in_use = *used,
                budget = self.limit,
                "a large reply waits for the server's reply memory (twice ARGOCD_GRPC_MAX_SIZE_MB)"
            );
        }
        while *used + bytes > self.limit {
            let left = deadline.map(|d| d.saturating_duration_since(Instant::now()));
            if left == Some(Duration::ZERO) {
                return Err(RequestError::new(
                    ErrorKind::ResourceExhausted,
                    format!(
                        "this reply ({bytes} bytes) did not fit in the server's reply memory before the request's deadline: other large replies hold {} of {} bytes (twice ARGOCD_GRPC_MAX_SIZE_MB)",
                        *used, self.limit
                    ),
                ));
            }
            used = match left {
                Some(left) => {
                    freed
                        .wait_timeout(used, left)
                        .unwrap_or_else(|e| e.into_inner())
                        .0
                }
                None => freed.wait(used).unwrap_or_else(|e| e.into_inner()),
            };
        }
        *used += bytes;
        Ok(Some(ReplyPermit {
            state: self.state.clone(),
            bytes,
        }))
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
        // From the tree cache when it can: the bytes are then received and verified (and, on
        // a fill, extracted by the filler) before the jail is taken.
        let feed = self.inner.cached_tree(spec, input)?;
        let header = Header::Request {
            request: request.clone(),
            task: Box::new(spec.task.clone()),
            deadline_ms: spec
                .deadline
                .map(|d| d.saturating_duration_since(Instant::now()).as_millis() as u64),
            tree_attached: false,
        };
        let (reply, memory) =
            self.inner
                .run_jail(&request, &header, feed, cancel, spec.deadline, &spec.record)?;
        match reply {
            Reply::Ok {
                outcome: Some(outcome),
                report,
                ..
            } => {
                if !report.degraded.is_empty() {
                    tracing::warn!(degraded = %report.degraded.join("; "), "request ran with reduced confinement");
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn large_replies_share_one_budget_wait_their_turn_and_small_ones_never_wait() {
        let m = Arc::new(ReplyMemory::new(10 << 20));
        let a = m.take(6 << 20, None).expect("fits").expect("a permit");
        // Past its deadline, a reply that does not fit is refused, naming the budget.
        let refused = m
            .take(6 << 20, Some(Instant::now() + Duration::from_millis(20)))
            .expect_err("over the budget");
        assert_eq!(refused.kind, ErrorKind::ResourceExhausted);
        assert!(refused.message.contains("ARGOCD_GRPC_MAX_SIZE_MB"));
        assert!(m.take(1 << 20, None).expect("small").is_none());
        // Within its deadline it waits until the first is returned.
        let m2 = m.clone();
        let waiter = std::thread::spawn(move || {
            m2.take(6 << 20, Some(Instant::now() + Duration::from_secs(10)))
                .map(|p| p.map(|p| p.bytes))
        });
        std::thread::sleep(Duration::from_millis(50));
        assert!(!waiter.is_finished(), "must wait while the budget is held");
        drop(a);
        assert_eq!(waiter.join().expect("thread").expect("fits"), Some(6 << 20));
        // One larger than the whole budget takes all of it rather than never fitting.
        let all = m.take(64 << 20, None).expect("fits").expect("permit");
        assert_eq!(all.bytes, 10 << 20);
        drop(all);
        assert_eq!(*lock(&m.state.0), 0);
    }
}
