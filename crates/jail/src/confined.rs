//! The confined runner (supervisor side): per request, lease a UID, re-execute our own binary
//! as a jail, stream the archive to it, read its typed reply, and reclaim afterwards.
//!
//! The supervisor never opens a path inside a request directory: the jail creates it as the
//! leased UID, and a helper running as that UID kills its processes and removes it.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::Runner;
use crate::cancel::CancelToken;
use crate::child::{JAIL_ARG, RECLAIM_ARG, ReclaimArgs};
use crate::confine::{Creds, Report, Sandbox};
use crate::protocol::{ErrorKind, Header, JailOp, Reply, write_frame};
use crate::request::{Operation, Outcome, RequestError, RequestSpec};
use crate::run::KILL_GRACE;
use crate::uid::{Lease, UidPool, processes_in_range};

/// RLIMIT_NPROC above the cgroup's pids limit (the jail's own threads and the reclaim helper).
const NPROC_HEADROOM: u64 = 16;
/// How long reclaim waits for a UID's last processes to disappear before quarantining it.
const UID_DRAIN: Duration = Duration::from_secs(3);
/// How long a jail may take to clean up after replying (or to stop after a cancel: the
/// commands' TERM→KILL grace included) before its UID is killed from outside.
const JAIL_CLEANUP: Duration = Duration::from_secs(60);

/// Configuration of the confined runner.
#[derive(Debug)]
pub struct ConfinedConfig {
    /// Our own binary (normally `/proc/self/exe`).
    pub exe: PathBuf,
    /// The work root: request directories are created here by the jails.
    pub work_root: PathBuf,
    /// The UID pool; `None` in the shared-UID model.
    pub pool: Option<UidPool>,
    /// The sandbox template (creds are filled per request).
    pub sandbox: Sandbox,
    /// Arguments for the jail's logging (e.g. `--loglevel`, `info`).
    pub log_args: Vec<String>,
    /// Per-request cgroups (prepared layout and limits); `None` when unavailable.
    pub cgroups: Option<(crate::cgroup::Layout, crate::cgroup::CgroupLimits)>,
}

/// What a request left for reclaim: its lease and its (possibly still cleaning) jail.
#[derive(Debug, Default)]
struct Pending {
    lease: Option<Lease>,
    jail: Option<Child>,
    cgroup: Option<crate::cgroup::RequestCgroup>,
}

/// Runs every request in a jail process.
#[derive(Debug)]
pub struct Confined {
    cfg: ConfinedConfig,
    pool: Option<Mutex<UidPool>>,
    pending: Mutex<HashMap<String, Pending>>,
    quarantined: Mutex<Vec<Lease>>,
    probe_writes: Vec<PathBuf>,
    /// A jail already started (exec'd and waiting for its header), so a request does not
    /// wait for exec and start-up; it holds no data and no lease until it gets a header.
    spare: Arc<Mutex<Option<Child>>>,
}

fn internal(message: impl Into<String>) -> RequestError {
    RequestError::Remote {
        kind: ErrorKind::Internal,
        message: message.into(),
    }
}

impl Confined {
    /// A runner; call [`Confined::sweep`] and [`Confined::probe`] before serving.
    pub fn new(mut cfg: ConfinedConfig) -> Self {
        let pool = cfg.pool.take().map(Mutex::new);
        Confined {
            cfg,
            pool,
            pending: Mutex::default(),
            quarantined: Mutex::default(),
            probe_writes: Vec::new(),
            spare: Arc::default(),
        }
    }

    /// UIDs in use and capacity (None in the shared model).
    pub fn pool_usage(&self) -> Option<(usize, usize)> {
        self.pool.as_ref().map(|p| {
            let p = p.lock().unwrap_or_else(|e| e.into_inner());
            (p.in_use(), p.capacity())
        })
    }

    fn name_of(spec: &RequestSpec) -> Result<String, RequestError> {
        spec.tree
            .file_name()
            .and_then(|n| n.to_str())
            .map(str::to_owned)
            .ok_or_else(|| internal("request directory has no name"))
    }

    fn lease(&self, name: &str) -> Result<Option<Creds>, RequestError> {
        let Some(pool) = &self.pool else {
            return Ok(None);
        };
        let lease = pool
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .lease()
            .map_err(|e| RequestError::Remote {
                kind: ErrorKind::ResourceExhausted,
                message: format!("no sandbox UID free: {e}"),
            })?;
        let creds = Creds {
            uid: lease.uid(),
            gid: lease.gid(),
        };
        self.pending
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(name.to_owned())
            .or_default()
            .lease = Some(lease);
        Ok(Some(creds))
    }

    fn spawn(
        &self,
        arg: &str,
        extra: &[String],
        stdin: bool,
        stdout: bool,
    ) -> std::io::Result<Child> {
        let mut cmd = Command::new(&self.cfg.exe);
        cmd.arg(arg)
            .args(&self.cfg.log_args)
            .args(extra)
            .env_clear()
            .stdin(if stdin { Stdio::piped() } else { Stdio::null() })
            .stdout(if stdout {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stderr(Stdio::inherit());
        crate::reaper::spawn_tracked(&mut cmd)
    }

    /// Kill what is left in the request's cgroup (v2 `cgroup.kill`; v1 relies on the UID-wide
    /// kill) and remove it, waiting briefly for exiting processes. Returns whether it is gone.
    fn remove_cgroup(cg: &crate::cgroup::RequestCgroup) -> bool {
        let _ = cg.kill();
        let start = Instant::now();
        while !cg.is_empty() && start.elapsed() < Duration::from_secs(2) {
            std::thread::sleep(Duration::from_millis(2));
        }
        match cg.remove() {
            Ok(()) => true,
            Err(e) => {
                tracing::error!(error = %e, "request cgroup not removed");
                false
            }
        }
    }

    /// Wait for a jail that has replied and is cleaning up; `None` if it takes longer than
    /// [`JAIL_CLEANUP`] (the slow path then kills its UID).
    fn wait_bounded(child: &mut Child) -> Option<std::process::ExitStatus> {
        let start = Instant::now();
        loop {
            match child.try_wait() {
                Ok(Some(s)) => {
                    crate::reaper::untrack(child.id() as i32);
                    return Some(s);
                }
                Ok(None) if start.elapsed() < JAIL_CLEANUP => {
                    std::thread::sleep(Duration::from_micros(200));
                }
                _ => return None,
            }
        }
    }

    /// The spare jail if there is a live one, else a fresh one; then start the next spare in
    /// the background.
    fn take_jail(&self) -> std::io::Result<Child> {
        let spare = self.spare.lock().unwrap_or_else(|e| e.into_inner()).take();
        let jail = match spare {
            Some(mut c) => match c.try_wait() {
                Ok(None) => c,
                _ => {
                    let _ = Self::wait(&mut c);
                    self.spawn(JAIL_ARG, &[], true, true)?
                }
            },
            None => self.spawn(JAIL_ARG, &[], true, true)?,
        };
        let slot = self.spare.clone();
        let (exe, log_args) = (self.cfg.exe.clone(), self.cfg.log_args.clone());
        let _ = std::thread::Builder::new()
            .name("jail-spare".into())
            .spawn(move || {
                let child = crate::reaper::spawn_tracked(
                    Command::new(exe)
                        .arg(JAIL_ARG)
                        .args(log_args)
                        .env_clear()
                        .stdin(Stdio::piped())
                        .stdout(Stdio::piped())
                        .stderr(Stdio::inherit()),
                );
                if let Ok(c) = child {
                    let mut slot = slot.lock().unwrap_or_else(|e| e.into_inner());
                    if let Some(mut old) = slot.replace(c) {
                        // Two requests raced to refill: keep one spare.
                        let _ = old.kill();
                        let _ = Self::wait(&mut old);
                    }
                }
            });
        Ok(jail)
    }

    fn wait(child: &mut Child) -> std::io::Result<std::process::ExitStatus> {
        let r = child.wait();
        crate::reaper::untrack(child.id() as i32);
        r
    }

    /// Run the reclaim helper and wait for it.
    fn helper(&self, args: &ReclaimArgs) -> Result<(), String> {
        let mut child = self
            .spawn(RECLAIM_ARG, &args.to_args(), false, false)
            .map_err(|e| format!("cannot start the reclaim helper: {e}"))?;
        match Self::wait(&mut child) {
            Ok(s) if s.success() => Ok(()),
            Ok(s) => Err(format!("reclaim helper failed: {s}")),
            Err(e) => Err(format!("reclaim helper: {e}")),
        }
    }

    /// Start-up: kill leftover processes in the UID range and remove leftover request
    /// directories, each as its owner. Returns how many directories were removed.
    pub fn sweep(&self) -> Result<usize, String> {
        if let Some(pool) = &self.pool {
            let (first, count) = {
                let p = pool.lock().unwrap_or_else(|e| e.into_inner());
                (p.first(), p.capacity() as u32)
            };
            let mut uids: Vec<u32> = processes_in_range(Path::new("/proc"), first, count)
                .into_iter()
                .filter_map(proc_uid)
                .filter(|u| (first..first + count).contains(u))
                .collect();
            uids.sort_unstable();
            uids.dedup();
            for uid in uids {
                tracing::warn!(uid, "killing leftover processes of a previous run");
                self.helper(&ReclaimArgs {
                    creds: Some((uid, uid)),
                    work_root: self.cfg.work_root.clone(),
                    name: None,
                })?;
            }
        }
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
            let in_pool = self
                .pool
                .as_ref()
                .is_some_and(|p| p.lock().unwrap_or_else(|e| e.into_inner()).contains(owner));
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

    /// Extra directories the probe's confined extractor must fail to write into.
    pub fn set_probe_writes(&mut self, dirs: Vec<PathBuf>) {
        self.probe_writes = dirs;
    }

    /// Confine a jail, run the extractor self-test in it, and return what it could enforce
    /// (start-up check and `doctor`). Fails when the self-test shows a write outside the
    /// request directory.
    pub fn probe(&self) -> Result<Report, RequestError> {
        let name = format!("probe-{}", std::process::id());
        let spec = RequestSpec {
            op: Operation::Generate,
            config: plugin::PluginConfig::default(),
            tree: self.cfg.work_root.join(&name),
            app_rel_path: ".".into(),
            env: Vec::new(),
            archive: archive::Options::default(),
            output_bytes: 1024,
            deadline: Some(Instant::now() + Duration::from_secs(30)),
            deadline_limit: crate::run::TimeLimit::Client,
            command_timeout: None,
            record: Default::default(),
        };
        let r = self.run_jail(
            &spec,
            JailOp::Probe,
            Box::new(std::io::empty()),
            &CancelToken::new(),
        );
        self.reclaim(&spec);
        match r? {
            Reply::Ok { report, .. } => {
                let inside = report.self_test.first().map(|(_, o)| o.as_str());
                let escaped: Vec<_> = report
                    .self_test
                    .iter()
                    .skip(1)
                    .filter(|(_, o)| !o.starts_with("denied") && !o.starts_with("private"))
                    .collect();
                if inside != Some("extracted") || !escaped.is_empty() {
                    return Err(internal(format!(
                        "confinement self-test failed: the jailed extractor must write only inside its own directory: {:?}",
                        report.self_test
                    )));
                }
                Ok(report)
            }
            Reply::Err { kind, message, .. } => Err(RequestError::Remote { kind, message }),
        }
    }

    fn run_jail(
        &self,
        spec: &RequestSpec,
        op: JailOp,
        mut input: Box<dyn Read + Send>,
        cancel: &CancelToken,
    ) -> Result<Reply, RequestError> {
        let name = Self::name_of(spec)?;
        let creds = self.lease(&name)?;
        let cgroup = match &self.cfg.cgroups {
            Some((layout, limits)) => {
                let cg = crate::cgroup::create(layout, &name, limits)
                    .map_err(|e| internal(e.to_string()))?;
                self.pending
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .entry(name.clone())
                    .or_default()
                    .cgroup = Some(cg.clone());
                Some(cg)
            }
            None => None,
        };
        let mut sandbox = self.cfg.sandbox.clone();
        sandbox.creds = creds;
        // With a pids cgroup, RLIMIT_NPROC (same count, per UID) stays a backstop just above
        // it, so the cgroup refuses first and the failure can be named from `pids.events`.
        if let (Some(cg), Some((_, limits))) = (&cgroup, &self.cfg.cgroups)
            && cg.has("pids")
        {
            sandbox.rlimits.processes = limits.pids.saturating_add(NPROC_HEADROOM);
        }
        let header = Header {
            op,
            config: spec.config.clone(),
            app_rel_path: spec.app_rel_path.clone(),
            env: spec.env.clone(),
            archive: spec.archive.clone(),
            output_bytes: spec.output_bytes,
            deadline_ms: spec
                .deadline
                .map(|d| d.saturating_duration_since(Instant::now()).as_millis() as u64),
            deadline_limit: spec.deadline_limit.clone(),
            command_timeout: spec
                .command_timeout
                .as_ref()
                .map(|(d, t)| (d.as_millis() as u64, t.clone())),
            work_root: self.cfg.work_root.clone(),
            name: name.clone(),
            sandbox,
            probe_writes: self.probe_writes.clone(),
            cgroup: cgroup.clone(),
        };
        let body = serde_json::to_vec(&header).map_err(|e| internal(e.to_string()))?;
        let mut child = self
            .take_jail()
            .map_err(|e| internal(format!("cannot start the jail: {e}")))?;
        tracing::debug!(pid = child.id(), uid = ?creds.map(|c| c.uid), "jail started");
        let mut stdin = child.stdin.take();
        let stdout = child.stdout.take();

        // Feed: header, then the archive as it arrives. A write error means the jail already
        // stopped (it refused the archive); its reply says why.
        if let Some(w) = stdin.as_mut() {
            let mut ok = write_frame(w, b'H', &body).is_ok();
            let mut buf = vec![0u8; 64 * 1024];
            while ok {
                match input.read(&mut buf) {
                    Ok(0) => {
                        ok = write_frame(w, b'E', &[]).is_ok() && w.flush().is_ok();
                        break;
                    }
                    Ok(n) => ok = write_frame(w, b'D', &buf[..n]).is_ok(),
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
        // period later, its whole UID is killed.
        let done = Arc::new(AtomicBool::new(false));
        let watcher = {
            let cancel = cancel.clone();
            let done = done.clone();
            let kill = creds.map(|c| ReclaimArgs {
                creds: Some((c.uid, c.gid)),
                work_root: self.cfg.work_root.clone(),
                name: None,
            });
            let exe = self.cfg.exe.clone();
            let deadline = spec.deadline;
            std::thread::Builder::new()
                .name("jail-watch".into())
                .spawn(move || {
                    // The jail enforces the deadline itself (and says which limit fired);
                    // this only reacts to a cancel, or to a jail overrunning its deadline.
                    let hard = deadline.map(|d| d + KILL_GRACE + Duration::from_secs(2));
                    let _ = cancel.wait_until(hard, || done.load(Ordering::SeqCst));
                    if done.load(Ordering::SeqCst) {
                        return;
                    }
                    drop(stdin);
                    let grace_end = Instant::now() + KILL_GRACE + Duration::from_secs(2);
                    let tick = CancelToken::new();
                    while !done.load(Ordering::SeqCst) && Instant::now() < grace_end {
                        let next = (Instant::now() + Duration::from_millis(20)).min(grace_end);
                        let _ = tick.wait_until(Some(next), || done.load(Ordering::SeqCst));
                    }
                    if !done.load(Ordering::SeqCst)
                        && let Some(k) = kill
                    {
                        tracing::warn!("jail did not stop after cancellation: killing its UID");
                        let _ = Command::new(&exe)
                            .arg(RECLAIM_ARG)
                            .args(k.to_args())
                            .env_clear()
                            .stdin(Stdio::null())
                            .stdout(Stdio::null())
                            .status();
                    }
                })
                .ok()
        };

        let cap = spec.output_bytes.saturating_mul(8).saturating_add(1 << 20);
        let raw = stdout.map(|mut s| read_reply(&mut s, cap));
        // The jail cleans up after replying; reclaim waits for it, off the response's path.
        self.pending
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(name.clone())
            .or_default()
            .jail = Some(child);
        done.store(true, Ordering::SeqCst);
        cancel.poke();
        if let Some(w) = watcher {
            let _ = w.join();
        }
        let stats = cgroup.as_ref().map(|c| c.stats());
        // The supervisor's part of the audit record: identity, cgroup, request-wide memory.
        crate::record::update(&spec.record, |r| {
            r.uid = creds.map(|c| c.uid);
            r.gid = creds.map(|c| c.gid);
            r.cgroup = cgroup.as_ref().map(|_| name.clone());
            r.peak_memory_bytes = stats.map(|s| s.peak_memory_bytes);
            r.oom_kills = stats.map(|s| s.oom_kills);
            if stats.is_some_and(|s| s.oom_kills > 0) {
                r.limit = Some("memory".into());
            }
        });
        if let Some(s) = stats {
            tracing::debug!(
                peak_memory_bytes = s.peak_memory_bytes,
                oom_kills = s.oom_kills,
                pids_refused = s.pids_refused,
                "request cgroup"
            );
        }
        let oom = stats.is_some_and(|s| s.oom_kills > 0);
        let limits = self.cfg.cgroups.as_ref().map(|(_, l)| *l);
        let oom_error = |detail: &str| RequestError::Remote {
            kind: ErrorKind::ResourceExhausted,
            message: format!(
                "memory limit exceeded (policy spec.limits.memoryBytes: {}): the kernel killed a process of the request{detail}",
                limits.map_or(0, |l| l.memory_bytes)
            ),
        };
        let raw = match raw {
            Some(Ok(Some(raw))) => raw,
            _ if oom => return Err(oom_error("")),
            Some(Ok(None)) | None => {
                return Err(match cancel.reason() {
                    Some(_) => RequestError::Remote {
                        kind: ErrorKind::Cancelled,
                        message: "context canceled".into(),
                    },
                    None => internal("the jail exited without a reply"),
                });
            }
            Some(Err(e)) => return Err(e),
        };
        let mut reply: Reply = serde_json::from_slice(&raw)
            .map_err(|e| internal(format!("bad reply from the jail: {e}")))?;
        // The jail's part (commands, archive, its view of the limit), merged under ours.
        let (Reply::Ok { record, .. } | Reply::Err { record, .. }) = &mut reply;
        let jail_record = std::mem::take(record);
        crate::record::update(&spec.record, |r| {
            r.archive = jail_record.archive;
            r.commands = jail_record.commands;
            r.seccomp_audit = jail_record.seccomp_audit;
            if r.limit.is_none() {
                r.limit = jail_record.limit;
            }
        });
        // Forks refused by the cgroup, or the task count at the limit (RLIMIT_NPROC, set to the
        // same value for the unique UID, usually refuses first).
        let pids_hit = stats
            .is_some_and(|s| s.pids_refused > 0 || limits.is_some_and(|l| s.pids_peak >= l.pids));
        Ok(match reply {
            Reply::Err { message, .. } if oom => {
                let RequestError::Remote { kind, message } = oom_error(&format!(": {message}"))
                else {
                    unreachable!()
                };
                Reply::Err {
                    kind,
                    message,
                    report: None,
                    record: Default::default(),
                }
            }
            // A failure after forks were refused: name the limit (the tool's own message,
            // e.g. "Cannot fork", follows).
            Reply::Err { message, .. } if pids_hit => {
                crate::record::update(&spec.record, |r| r.limit = Some("pids".into()));
                Reply::Err {
                    kind: ErrorKind::ResourceExhausted,
                    message: format!(
                        "process limit reached (policy spec.limits.pids: {}): {message}",
                        limits.map_or(0, |l| l.pids)
                    ),
                    report: None,
                    record: Default::default(),
                }
            }
            other => other,
        })
    }
}

/// Read the jail's `R` frame: `Ok(None)` if it closed stdout without one.
fn read_reply(r: &mut impl Read, cap: u64) -> Result<Option<Vec<u8>>, RequestError> {
    let max = usize::try_from(cap).unwrap_or(usize::MAX).saturating_add(1);
    match crate::protocol::read_frame_head(r, max) {
        Ok(None) => Ok(None),
        Ok(Some((b'R', n))) if n as u64 <= cap => {
            let mut body = vec![0u8; n];
            r.read_exact(&mut body)
                .map_err(|e| internal(format!("reading the jail's reply: {e}")))?;
            Ok(Some(body))
        }
        Ok(Some((b'R', n))) => Err(RequestError::Remote {
            kind: ErrorKind::ResourceExhausted,
            message: format!("the jail's reply ({n} bytes) exceeds {cap} bytes"),
        }),
        Ok(Some((t, _))) => Err(internal(format!("unexpected frame {t} from the jail"))),
        Err(e) => Err(internal(format!("reading the jail's reply: {e}"))),
    }
}

fn proc_uid(pid: i32) -> Option<u32> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    s.lines()
        .find_map(|l| l.strip_prefix("Uid:"))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

impl Runner for Confined {
    fn execute(
        &self,
        spec: &RequestSpec,
        input: Box<dyn Read + Send>,
        cancel: &CancelToken,
    ) -> Result<Outcome, RequestError> {
        let op = match spec.op {
            Operation::Generate => JailOp::Generate,
            Operation::Match => JailOp::Match,
            Operation::Parameters => JailOp::Parameters,
            Operation::Generator => JailOp::Generator,
        };
        match self.run_jail(spec, op, input, cancel)? {
            Reply::Ok {
                outcome: Some(o),
                report,
                ..
            } => {
                if !report.degraded.is_empty() {
                    tracing::warn!(degraded = ?report.degraded, "request ran with reduced confinement");
                }
                Ok(o)
            }
            Reply::Ok { outcome: None, .. } => Err(internal("the jail returned no result")),
            Reply::Err { kind, message, .. } => Err(RequestError::Remote { kind, message }),
        }
    }

    fn reclaim(&self, spec: &RequestSpec) {
        let Ok(name) = Self::name_of(spec) else {
            return;
        };
        let pending = self
            .pending
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&name)
            .unwrap_or_default();
        let Pending {
            lease,
            mut jail,
            cgroup,
        } = pending;
        // Fast path: the jail killed its UID's other processes and emptied its directory
        // after replying; all that is left is the empty directory entry in the work root
        // (which the supervisor owns, so it may remove it from the sticky directory).
        let jail_clean = jail
            .as_mut()
            .and_then(Self::wait_bounded)
            .is_some_and(|s| s.success());
        let cgroup_gone = cgroup.as_ref().is_none_or(Self::remove_cgroup);
        let fast = jail_clean
            && rustix::fs::unlinkat(
                rustix::fs::CWD,
                self.cfg.work_root.join(&name),
                rustix::fs::AtFlags::REMOVEDIR,
            )
            .is_ok();
        if fast && cgroup_gone {
            if let (Some(pool), Some(lease)) = (&self.pool, lease) {
                pool.lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .release(lease);
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
        if let Some(mut c) = jail {
            // Killed by the helper if it was still running: collect it.
            let _ = Self::wait(&mut c);
        }
        let cgroup_gone = cgroup_gone || cgroup.as_ref().is_none_or(Self::remove_cgroup);
        let Some(lease) = lease else {
            if let Err(e) = res {
                tracing::error!(error = %e, "reclaim failed");
            }
            return;
        };
        // The UID goes back only when nothing of the request is left.
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
        match (&res, left.is_empty(), dir_gone && cgroup_gone) {
            (Ok(()), true, true) => {
                if let Some(pool) = &self.pool {
                    pool.lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .release(lease);
                }
            }
            _ => {
                tracing::error!(uid = lease.uid(), helper = ?res, processes = ?left, dir_gone, "reclaim incomplete: UID quarantined");
                self.quarantined
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .push(lease);
            }
        }
    }

    fn describe(&self) -> &'static str {
        if self.pool.is_some() {
            "confined: one jail process per request, unique UID/GID, no capabilities, no_new_privs, Landlock, seccomp"
        } else {
            "confined (shared UID): one jail process per request, no capabilities, no_new_privs, Landlock, seccomp; commands share the server's UID"
        }
    }
}
