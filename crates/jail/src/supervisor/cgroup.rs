//! Per-request cgroups on a small cgroupfs layer of our own, for both versions.
//!
//! Why not `cgroups-rs` (the design card's choice): 0.5.1 pulls `nix` 0.25 beside our `rustix`
//! and an unconditional D-Bus client (`zbus`), picks v1 on any hybrid host without asking, and
//! offers no `cgroup.kill`, `memory.peak` or delegation handling; what we need is a dozen file
//! writes, which this module does and tests (v2 against a fake cgroupfs, v1 for real).
//!
//! Layout:
//! - v2: the delegated cgroup is the one the server started in (`/proc/self/cgroup`) or a
//!   configured directory; the server's processes move into its leaf `cmp-warden-supervisor`
//!   (the kernel's "no internal processes" rule: a cgroup that enables controllers for its
//!   children holds no process; the hierarchy's root is exempt and keeps them), `memory pids
//!   cpu` are enabled for its children, and every request cgroup is made in the instance
//!   directory `<delegated>/<instance>`, which is ours alone: the sweep never looks beyond it.
//! - v1: for each of `memory`, `pids`, `cpu` the server's cgroup in that hierarchy plus
//!   `cmp-warden/<instance>/<request>`.

use std::io;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// Limits applied to one request's cgroup.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CgroupLimits {
    /// Memory (swap off where the version allows).
    pub memory_bytes: u64,
    /// Tasks.
    pub pids: u64,
    /// CPU quota in millicores.
    pub cpu_millis: u64,
}

/// Which hierarchy is in use.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Layout {
    /// Unified hierarchy: request cgroups are made under `base`.
    V2 {
        /// The delegated directory.
        base: PathBuf,
    },
    /// Legacy hierarchies: controller name → directory request cgroups are made under.
    V1 {
        /// (controller, base directory).
        controllers: Vec<(String, PathBuf)>,
    },
}

/// Why cgroups cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum CgroupError {
    /// No usable hierarchy.
    #[error("cgroups: {0}")]
    Unavailable(String),
    /// A cgroupfs operation failed.
    #[error("cgroups: {what} {path}: {source}")]
    Io {
        /// What.
        what: &'static str,
        /// Where.
        path: String,
        /// Cause.
        source: io::Error,
    },
}

fn io_err(what: &'static str, path: &Path) -> impl FnOnce(io::Error) -> CgroupError + use<> {
    let path = path.display().to_string();
    move |source| CgroupError::Io { what, path, source }
}

fn write(path: &Path, value: &str) -> Result<(), CgroupError> {
    std::fs::write(path, value).map_err(io_err("writing", path))
}

/// The v1 controllers we use.
const V1_CONTROLLERS: [&str; 3] = ["memory", "pids", "cpu"];

/// The OOM-kill counter of the server's own memory cgroup (its container's), for nodes that
/// delegate no cgroup to it: v2 `memory.events` `oom_kill`, v1 `memory.oom_control` `oom_kill`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OomCounter {
    file: PathBuf,
}

impl OomCounter {
    /// The counter of the cgroup `self_cgroup` (the content of `/proc/self/cgroup`) names under
    /// the cgroupfs mount `root`, where the kernel has one; or, where that path is not there, of
    /// the hierarchy's root as mounted (a container's cgroupfs without a cgroup namespace shows
    /// the container's own cgroup at the root, though `/proc/self/cgroup` names its host path).
    pub fn find(root: &Path, self_cgroup: &str) -> Option<Self> {
        let (dir, own, file) = if root.join("cgroup.controllers").exists() {
            let own = self_cgroup.lines().find_map(|l| l.strip_prefix("0::"))?;
            (root.to_path_buf(), own, "memory.events")
        } else {
            let own = self_cgroup.lines().find_map(|l| {
                let mut f = l.splitn(3, ':');
                let (_, list, path) = (f.next()?, f.next()?, f.next()?);
                list.split(',').any(|c| c == "memory").then_some(path)
            })?;
            (root.join("memory"), own, "memory.oom_control")
        };
        [dir.join(own.trim().trim_start_matches('/')), dir]
            .into_iter()
            .map(|d| OomCounter { file: d.join(file) })
            .find(|c| c.read().is_some())
    }

    /// The kills so far (`None` if the file cannot be read or has no count).
    pub fn read(&self) -> Option<u64> {
        std::fs::read_to_string(&self.file).ok().and_then(|s| {
            s.lines().find_map(|l| {
                let (k, v) = l.split_once(' ')?;
                (k == "oom_kill").then(|| v.trim().parse().ok()).flatten()
            })
        })
    }

    /// Where it is read.
    pub fn file(&self) -> &Path {
        &self.file
    }
}

/// The v2 leaf the server's processes move into when its delegated cgroup is not the root.
pub const SUPERVISOR_LEAF: &str = "cmp-warden-supervisor";

/// The v2 directory, in the delegated cgroup, that holds one directory per instance.
pub const OUR_DIR: &str = "cmp-warden";

/// The v2 controllers we use, in the order they are enabled.
const V2_CONTROLLERS: [&str; 3] = ["memory", "pids", "cpu"];

/// Who moves into [`SUPERVISOR_LEAF`] (v2, a delegated cgroup that is not the root).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tenants {
    /// Every process of the delegated cgroup: the server's container or service is its own.
    All,
    /// Only this process: a one-shot command run from a shell never moves the shell.
    OnlySelf,
}

/// Detect the hierarchy: `root` is the cgroupfs mount point (normally `/sys/fs/cgroup`),
/// `self_cgroup` the content of `/proc/self/cgroup`, `configured` an operator-given delegated
/// v2 directory, `instance` our directory's name (one per server, e.g. per UID range, so two
/// servers in one cgroup never sweep each other's request cgroups).
pub fn detect(
    root: &Path,
    self_cgroup: &str,
    configured: Option<&Path>,
    instance: &str,
) -> Result<Layout, CgroupError> {
    if let Some(dir) = configured {
        if !dir.join("cgroup.controllers").exists() {
            return Err(CgroupError::Unavailable(format!(
                "{} (CMP_WARDEN_CGROUP_ROOT) is not a cgroup v2 directory",
                dir.display()
            )));
        }
        return Ok(Layout::V2 {
            base: dir.join(OUR_DIR).join(instance),
        });
    }
    if root.join("cgroup.controllers").exists() {
        let own = self_cgroup
            .lines()
            .find_map(|l| l.strip_prefix("0::"))
            .ok_or_else(|| CgroupError::Unavailable("no v2 entry in /proc/self/cgroup".into()))?;
        let mut delegated = root.join(own.trim().trim_start_matches('/'));
        // Started in our own leaf (a second start in this process; `kubectl exec`, which runc
        // puts in the cgroup of the container's init once the container's own cgroup delegates
        // controllers): the delegated cgroup is the leaf's parent.
        if delegated.file_name() == Some(std::ffi::OsStr::new(SUPERVISOR_LEAF))
            && let Some(parent) = delegated.parent()
        {
            delegated = parent.to_path_buf();
        }
        return Ok(Layout::V2 {
            base: delegated.join(OUR_DIR).join(instance),
        });
    }
    let mut controllers = Vec::new();
    for ctl in V1_CONTROLLERS {
        let own = self_cgroup.lines().find_map(|l| {
            let mut f = l.splitn(3, ':');
            let (_, list, path) = (f.next()?, f.next()?, f.next()?);
            list.split(',').any(|c| c == ctl).then_some(path)
        });
        let Some(own) = own else { continue };
        let mount = root.join(ctl);
        if mount.join("cgroup.procs").exists() {
            // Under our own `cmp-warden` directory, as in v2: a v1 hierarchy's root is 0555 in
            // the kernel, and an instance directory made straight in it could not be removed
            // once the start-up drop has taken CAP_DAC_OVERRIDE (every one-shot run left one).
            controllers.push((
                ctl.to_owned(),
                mount
                    .join(own.trim_start_matches('/'))
                    .join(OUR_DIR)
                    .join(instance),
            ));
        }
    }
    if controllers.is_empty() {
        return Err(CgroupError::Unavailable(format!(
            "no cgroup v2 at {} and no v1 memory/pids/cpu hierarchy",
            root.display()
        )));
    }
    Ok(Layout::V1 { controllers })
}

/// Prepare the layout once at start-up, before the capability drop (the server is single
/// threaded then). Returns the controllers every request cgroup gets.
pub fn prepare(layout: &Layout, tenants: Tenants) -> Result<Vec<String>, CgroupError> {
    match layout {
        Layout::V2 { base } => prepare_v2(base, tenants),
        Layout::V1 { controllers } => {
            for (_, dir) in controllers {
                std::fs::create_dir_all(dir).map_err(io_err("creating", dir))?;
            }
            Ok(controllers.iter().map(|(c, _)| c.clone()).collect())
        }
    }
}

/// v2 preparation, in order (`base` is `<delegated>/cmp-warden/<instance>`):
/// 1. What the delegated cgroup has to give: memory, pids, cpu among its `cgroup.controllers`.
/// 2. Leave it, unless it is the hierarchy's root (which has no `cgroup.type` and is exempt
///    from the no-internal-process rule): `tenants` move into [`SUPERVISOR_LEAF`].
/// 3. Enable the controllers for its children, one at a time, skipping those already on (a
///    restart, another instance); what cannot be enabled is named.
/// 4. Our directory `cmp-warden`, now: at the root only CAP_DAC_OVERRIDE (dropped at
///    start-up's step 10) makes or removes entries, its directory being 0555 in the kernel;
///    ours is 0755 and the supervisor's own, so instance directories come and go in it later.
/// 5. The instance directory, each with the controllers enabled for the request cgroups.
fn prepare_v2(base: &Path, tenants: Tenants) -> Result<Vec<String>, CgroupError> {
    let ours = base
        .parent()
        .ok_or_else(|| CgroupError::Unavailable(format!("{} has no parent", base.display())))?;
    let delegated = ours
        .parent()
        .ok_or_else(|| CgroupError::Unavailable(format!("{} has no parent", ours.display())))?;

    // 1. What is delegated to us.
    let available = std::fs::read_to_string(delegated.join("cgroup.controllers"))
        .map_err(io_err("reading", &delegated.join("cgroup.controllers")))?;
    let wanted: Vec<&str> = V2_CONTROLLERS
        .into_iter()
        .filter(|c| available.split_whitespace().any(|a| a == *c))
        .collect();
    if wanted.is_empty() {
        return Err(CgroupError::Unavailable(format!(
            "{} delegates none of memory, pids, cpu (has {:?})",
            delegated.display(),
            available.trim()
        )));
    }

    // 2. Out of the delegated cgroup, into our leaf (not at the root).
    if delegated.join("cgroup.type").exists() {
        let leaf = delegated.join(SUPERVISOR_LEAF);
        create_dir_existing(&leaf)?;
        move_into(delegated, &leaf, tenants)?;
    }

    // 3. The controllers for the delegated cgroup's children.
    let enabled = enable(delegated, &wanted)?;

    // 4. Our directory.
    create_dir_existing(ours)?;
    let enabled = enable(ours, &enabled)?;

    // 5. The instance directory.
    create_dir_existing(base)?;
    enable(base, &enabled)
}

fn create_dir_existing(dir: &Path) -> Result<(), CgroupError> {
    match std::fs::create_dir(dir) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(io_err("creating", dir)(e)),
    }
}

fn procs(dir: &Path) -> Vec<String> {
    std::fs::read_to_string(dir.join("cgroup.procs"))
        .unwrap_or_default()
        .split_whitespace()
        .map(str::to_owned)
        .collect()
}

/// Move `tenants` of `from` into `leaf`. A process that exits meanwhile is no error; one that
/// forks meanwhile is caught by the next round.
fn move_into(from: &Path, leaf: &Path, tenants: Tenants) -> Result<(), CgroupError> {
    let target = leaf.join("cgroup.procs");
    if tenants == Tenants::OnlySelf {
        return write(&target, &std::process::id().to_string());
    }
    for _ in 0..10 {
        let left = procs(from);
        if left.is_empty() {
            return Ok(());
        }
        for pid in left {
            match std::fs::write(&target, &pid) {
                Ok(()) => {}
                Err(e) if e.raw_os_error() == Some(3) => {} // ESRCH: it exited
                Err(e) => return Err(io_err("writing", &target)(e)),
            }
        }
    }
    Ok(())
}

/// Enable `wanted` in `dir/cgroup.subtree_control` (those not on yet), one at a time. Returns
/// those on afterwards; none on is an error that says why.
fn enable(dir: &Path, wanted: &[impl AsRef<str>]) -> Result<Vec<String>, CgroupError> {
    let control = dir.join("cgroup.subtree_control");
    let on = std::fs::read_to_string(&control).map_err(io_err("reading", &control))?;
    let mut enabled = Vec::new();
    let mut refused = Vec::new();
    for c in wanted.iter().map(AsRef::as_ref) {
        if on.split_whitespace().any(|x| x == c) {
            enabled.push(c.to_owned());
            continue;
        }
        match std::fs::write(&control, format!("+{c}")) {
            Ok(()) => enabled.push(c.to_owned()),
            Err(e) => refused.push(explain_enable(dir, c, &e)),
        }
    }
    for why in &refused {
        tracing::warn!(why = %why, "cgroup controller not enabled for the requests");
    }
    if enabled.is_empty() {
        return Err(CgroupError::Unavailable(refused.join("; ")));
    }
    Ok(enabled)
}

fn explain_enable(dir: &Path, c: &str, e: &io::Error) -> String {
    let held = procs(dir).len();
    if e.raw_os_error() == Some(16) && held > 0 {
        // EBUSY: the no-internal-process rule.
        format!(
            "enabling {c} in {}: {e}: it still holds {held} process(es), and a cgroup that \
             delegates controllers may hold none (run the server in a cgroup of its own — a \
             container, a systemd service with Delegate=yes — or set CMP_WARDEN_CGROUP_ROOT)",
            dir.join("cgroup.subtree_control").display()
        )
    } else {
        format!(
            "enabling {c} in {}: {e}",
            dir.join("cgroup.subtree_control").display()
        )
    }
}

/// Start-up: remove request cgroups a previous run left in our instance directory (their
/// processes were killed by the UID sweep; v2 kills again through `cgroup.kill` and waits
/// for them to go), leaving those `another_instance` says a live instance sharing it holds.
/// Returns how many were removed.
pub fn sweep(layout: &Layout, another_instance: impl Fn(&str) -> bool) -> usize {
    let mut removed = 0;
    for base in instance_dirs(layout) {
        let Ok(rd) = std::fs::read_dir(base) else {
            continue;
        };
        for e in rd.flatten() {
            let p = e.path();
            if !p.is_dir() || another_instance(&e.file_name().to_string_lossy()) {
                continue;
            }
            let kill = p.join("cgroup.kill");
            if kill.exists() {
                let _ = std::fs::write(&kill, "1");
            }
            // The killed die asynchronously; their cgroup can go once they are gone.
            for _ in 0..100 {
                match std::fs::remove_dir(&p) {
                    Ok(()) => {
                        removed += 1;
                        break;
                    }
                    Err(e) if e.raw_os_error() == Some(16) && kill.exists() => {
                        std::thread::sleep(std::time::Duration::from_millis(10));
                    }
                    Err(_) => break,
                }
            }
        }
    }
    removed
}

/// `serve` on the way out: this instance's directories, once no request cgroup in them holds
/// a process. Requests still being reclaimed as the server stops (an OOM-killed request's
/// processes, a cancelled one's) are waited for, up to `wait`; a request cgroup that still
/// holds a process then (another live instance sharing the UID range, and so the directory)
/// keeps them, said in the log: the next start-up's sweep finds them.
pub fn remove_instance_if_unused(layout: &Layout, wait: std::time::Duration) {
    let in_use = || {
        instance_dirs(layout).into_iter().any(|d| {
            std::fs::read_dir(d)
                .map(|rd| {
                    rd.flatten().any(|e| {
                        std::fs::read_to_string(e.path().join("cgroup.procs"))
                            .is_ok_and(|p| !p.trim().is_empty())
                    })
                })
                .unwrap_or(false)
        })
    };
    let deadline = std::time::Instant::now() + wait;
    while in_use() && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    if in_use() {
        tracing::warn!(
            dirs = %instance_dirs(layout).iter().map(|d| d.display().to_string()).collect::<Vec<_>>().join(", "),
            waited_ms = wait.as_millis() as u64,
            "cgroup directories kept: a request cgroup in them still holds processes (another live instance with the same spec.uidRange, or a reclaim that did not finish); the next start-up's sweep removes them"
        );
        return;
    }
    remove_instance(layout);
}

fn instance_dirs(layout: &Layout) -> Vec<&Path> {
    match layout {
        Layout::V2 { base } => vec![base.as_path()],
        Layout::V1 { controllers } => controllers.iter().map(|(_, d)| d.as_path()).collect(),
    }
}

/// Remove this instance's own directories (a one-shot `render` or `doctor` on the way out;
/// they must be empty of request cgroups). A v2 leaf is kept: this process is still in it.
/// A request cgroup just removed may still be going in the kernel (EBUSY for its parent a
/// moment longer): retried briefly, then named.
pub fn remove_instance(layout: &Layout) {
    for dir in instance_dirs(layout) {
        let mut last = None;
        for _ in 0..200 {
            match std::fs::remove_dir(dir) {
                Ok(()) => {
                    last = None;
                    break;
                }
                Err(e) if e.kind() == io::ErrorKind::NotFound => {
                    last = None;
                    break;
                }
                Err(e) => last = Some(e),
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        if let Some(e) = last {
            tracing::warn!(dir = %dir.display(), error = %e, "cgroup directory not removed");
        }
    }
}

/// One request's cgroup (one directory per hierarchy in v1).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RequestCgroup {
    /// v2 or v1.
    pub v2: bool,
    /// (controller, directory); v2 has one entry named "unified".
    pub dirs: Vec<(String, PathBuf)>,
    /// The controllers limiting it.
    pub controllers: Vec<String>,
}

/// Resource use read back after a request.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CgroupStats {
    /// Peak memory in bytes (0 if unknown).
    pub peak_memory_bytes: u64,
    /// OOM kills in the request's cgroup.
    pub oom_kills: u64,
    /// Times the pids limit refused a fork.
    pub pids_refused: u64,
    /// Most tasks at once (`pids.peak`, 0 if the kernel lacks it).
    pub pids_peak: u64,
}

/// A request cgroup's limits read back from the kernel's files (`None`: the controller or
/// file is not there), and whether a process ran in it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Readback {
    /// 1 or 2.
    pub version: u8,
    /// `memory.max` (v1 `memory.limit_in_bytes`); `u64::MAX` for "max".
    pub memory_max: Option<u64>,
    /// `memory.swap.max` (v1: memsw minus memory); `None` without swap accounting.
    pub swap_max: Option<u64>,
    /// `memory.oom.group` (v2).
    pub oom_group: Option<bool>,
    /// `pids.max`.
    pub pids_max: Option<u64>,
    /// `cpu.max` (quota, period) in µs (v1 `cpu.cfs_quota_us`, `cpu.cfs_period_us`).
    pub cpu_max: Option<(u64, u64)>,
    /// The CPU or memory accounting shows a process ran in it.
    pub ran: bool,
}

impl Readback {
    /// What differs from `asked`, one phrase each (empty: the kernel holds every limit asked
    /// of a controller that is there; a missing controller is the caller's to report).
    pub fn mismatches(&self, asked: &CgroupLimits) -> Vec<String> {
        let mut out = Vec::new();
        let quota = asked.cpu_millis.saturating_mul(CPU_PERIOD_US) / 1000;
        if let Some(m) = self.memory_max
            && m != asked.memory_bytes
        {
            out.push(format!("memory.max is {m}, not {}", asked.memory_bytes));
        }
        if let Some(s) = self.swap_max
            && s != 0
        {
            out.push(format!("swap allowed ({s} bytes)"));
        }
        if self.oom_group == Some(false) {
            out.push("memory.oom.group is 0".into());
        }
        if let Some(p) = self.pids_max
            && p != asked.pids
        {
            out.push(format!("pids.max is {p}, not {}", asked.pids));
        }
        if let Some((q, period)) = self.cpu_max
            && (q, period) != (quota, CPU_PERIOD_US)
        {
            out.push(format!(
                "cpu.max is {q} {period}, not {quota} {CPU_PERIOD_US}"
            ));
        }
        if !self.ran {
            out.push("no process ran in it".into());
        }
        out
    }

    /// The values, as the kernel's file names and contents, each with the policy field that
    /// sets it.
    pub fn describe(&self) -> String {
        let n = |v: u64| {
            if v == u64::MAX {
                "max".to_owned()
            } else {
                v.to_string()
            }
        };
        let mut parts = Vec::new();
        let v2 = self.version == 2;
        if let Some(m) = self.memory_max {
            parts.push(format!(
                "{}={} (spec.limits.memoryBytes)",
                if v2 {
                    "memory.max"
                } else {
                    "memory.limit_in_bytes"
                },
                n(m)
            ));
        }
        if let Some(s) = self.swap_max {
            parts.push(format!(
                "{}={}",
                if v2 { "memory.swap.max" } else { "swap" },
                n(s)
            ));
        }
        if let Some(g) = self.oom_group {
            parts.push(format!("memory.oom.group={}", u8::from(g)));
        }
        if let Some(p) = self.pids_max {
            parts.push(format!("pids.max={} (spec.limits.pids)", n(p)));
        }
        if let Some((q, p)) = self.cpu_max {
            parts.push(if v2 {
                format!("cpu.max={} {p} (spec.limits.cpuMillis)", n(q))
            } else {
                format!(
                    "cpu.cfs_quota_us={}, cpu.cfs_period_us={p} (spec.limits.cpuMillis)",
                    n(q)
                )
            });
        }
        parts.join(", ")
    }
}

/// The CPU quota period (100 ms, the kernel default).
const CPU_PERIOD_US: u64 = 100_000;

/// Create the request's cgroup with its limits.
pub fn create(
    layout: &Layout,
    name: &str,
    limits: &CgroupLimits,
) -> Result<RequestCgroup, CgroupError> {
    let quota = limits.cpu_millis.saturating_mul(CPU_PERIOD_US) / 1000;
    match layout {
        Layout::V2 { base } => {
            let dir = base.join(name);
            std::fs::create_dir(&dir).map_err(io_err("creating", &dir))?;
            configure_v2(dir, limits)
        }
        Layout::V1 { controllers } => {
            let mut cg = RequestCgroup {
                v2: false,
                dirs: Vec::new(),
                controllers: Vec::new(),
            };
            for (ctl, base) in controllers {
                let dir = base.join(name);
                if let Err(e) = std::fs::create_dir(&dir) {
                    let _ = cg.remove();
                    return Err(io_err("creating", &dir)(e));
                }
                cg.dirs.push((ctl.clone(), dir.clone()));
                cg.controllers.push(ctl.clone());
                let set = || -> Result<(), CgroupError> {
                    match ctl.as_str() {
                        "memory" => {
                            write(
                                &dir.join("memory.limit_in_bytes"),
                                &limits.memory_bytes.to_string(),
                            )?;
                            // memory+swap equal to memory: no swap for the request.
                            let memsw = dir.join("memory.memsw.limit_in_bytes");
                            if memsw.exists() {
                                write(&memsw, &limits.memory_bytes.to_string())?;
                            }
                            Ok(())
                        }
                        "pids" => write(&dir.join("pids.max"), &limits.pids.to_string()),
                        "cpu" => {
                            // Each write walks every CPU cgroup of the host in the kernel
                            // (`tg_set_cfs_bandwidth`): the period only when it is not already
                            // the kernel's default, which a new cgroup has.
                            let period = dir.join("cpu.cfs_period_us");
                            if read_u64(&period) != CPU_PERIOD_US {
                                write(&period, &CPU_PERIOD_US.to_string())?;
                            }
                            write(&dir.join("cpu.cfs_quota_us"), &quota.to_string())
                        }
                        _ => Ok(()),
                    }
                };
                if let Err(e) = set() {
                    let _ = cg.remove();
                    return Err(e);
                }
            }
            Ok(cg)
        }
    }
}

/// Set a new v2 request cgroup's limits, for the controllers delegated to it.
fn configure_v2(dir: PathBuf, limits: &CgroupLimits) -> Result<RequestCgroup, CgroupError> {
    let quota = limits.cpu_millis.saturating_mul(CPU_PERIOD_US) / 1000;
    // The controllers delegated to the new cgroup show as their interface files.
    let controllers: Vec<String> = [
        ("memory", "memory.max"),
        ("pids", "pids.max"),
        ("cpu", "cpu.max"),
    ]
    .into_iter()
    .filter(|(_, f)| dir.join(f).exists())
    .map(|(c, _)| c.to_owned())
    .collect();
    let cg = RequestCgroup {
        v2: true,
        dirs: vec![("unified".into(), dir.clone())],
        controllers,
    };
    let set = || -> Result<(), CgroupError> {
        if cg.has("memory") {
            write(&dir.join("memory.max"), &limits.memory_bytes.to_string())?;
            // Swap off for the request where the kernel has swap accounting.
            if dir.join("memory.swap.max").exists() {
                write(&dir.join("memory.swap.max"), "0")?;
            }
            // An OOM kill takes the whole request, not one random process of it.
            if dir.join("memory.oom.group").exists() {
                write(&dir.join("memory.oom.group"), "1")?;
            }
        }
        if cg.has("pids") {
            write(&dir.join("pids.max"), &limits.pids.to_string())?;
        }
        if cg.has("cpu") {
            write(&dir.join("cpu.max"), &format!("{quota} {CPU_PERIOD_US}"))?;
        }
        Ok(())
    };
    if let Err(e) = set() {
        let _ = cg.remove();
        return Err(e);
    }
    Ok(cg)
}

fn read_u64(path: &Path) -> u64 {
    std::fs::read_to_string(path)
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(0)
}

fn keyed(path: &Path, key: &str) -> u64 {
    std::fs::read_to_string(path)
        .ok()
        .and_then(|s| {
            s.lines().find_map(|l| {
                let (k, v) = l.split_once(' ')?;
                (k == key).then(|| v.trim().parse().ok()).flatten()
            })
        })
        .unwrap_or(0)
}

impl RequestCgroup {
    /// The files a process writes "0" into to join (the jail, before it confines itself: they
    /// cross the pipe in the preparation frame).
    pub fn procs_files(&self) -> Vec<PathBuf> {
        self.dirs
            .iter()
            .map(|(_, d)| d.join("cgroup.procs"))
            .collect()
    }

    /// Whether the request's cgroup has controller `ctl` (always true for v2's delegated set).
    pub fn has(&self, ctl: &str) -> bool {
        self.dir(ctl).is_some()
    }

    fn dir(&self, ctl: &str) -> Option<&Path> {
        if !self.controllers.iter().any(|c| c == ctl) {
            return None;
        }
        self.dirs
            .iter()
            .find(|(c, _)| c == ctl || (self.v2 && c == "unified"))
            .map(|(_, d)| d.as_path())
    }

    /// Peak memory and OOM kills.
    pub fn stats(&self) -> CgroupStats {
        let mut s = CgroupStats::default();
        if let Some(d) = self.dir("memory") {
            if self.v2 {
                s.peak_memory_bytes = read_u64(&d.join("memory.peak"));
                s.oom_kills = keyed(&d.join("memory.events"), "oom_kill");
            } else {
                s.peak_memory_bytes = read_u64(&d.join("memory.max_usage_in_bytes"));
                s.oom_kills = keyed(&d.join("memory.oom_control"), "oom_kill");
            }
        }
        if let Some(d) = self.dir("pids") {
            // Same files and keys in both versions.
            s.pids_refused = keyed(&d.join("pids.events"), "max");
            s.pids_peak = read_u64(&d.join("pids.peak"));
        }
        s
    }

    /// The limits as the kernel holds them, and whether a process ran in the cgroup (read
    /// after the start-up probe's jail has run in it, before its removal: what doctor reports).
    pub fn read_back(&self) -> Readback {
        let mut r = Readback {
            version: if self.v2 { 2 } else { 1 },
            ..Readback::default()
        };
        let max = |p: PathBuf| {
            std::fs::read_to_string(p)
                .ok()
                .and_then(|s| match s.trim() {
                    "max" => Some(u64::MAX),
                    n => n.parse().ok(),
                })
        };
        if let Some(d) = self.dir("memory") {
            if self.v2 {
                r.memory_max = max(d.join("memory.max"));
                r.swap_max = max(d.join("memory.swap.max"));
                r.oom_group = max(d.join("memory.oom.group")).map(|v| v == 1);
                r.ran = keyed(&d.join("cpu.stat"), "usage_usec") > 0;
            } else {
                r.memory_max = max(d.join("memory.limit_in_bytes"));
                r.swap_max = max(d.join("memory.memsw.limit_in_bytes"))
                    .zip(r.memory_max)
                    .map(|(memsw, mem)| memsw.saturating_sub(mem));
                r.ran = read_u64(&d.join("memory.max_usage_in_bytes")) > 0;
            }
        }
        if let Some(d) = self.dir("pids") {
            r.pids_max = max(d.join("pids.max"));
        }
        if let Some(d) = self.dir("cpu") {
            r.cpu_max = if self.v2 {
                std::fs::read_to_string(d.join("cpu.max"))
                    .ok()
                    .and_then(|s| {
                        let mut f = s.split_whitespace();
                        let quota = match f.next()? {
                            "max" => u64::MAX,
                            q => q.parse().ok()?,
                        };
                        Some((quota, f.next()?.parse().ok()?))
                    })
            } else {
                max(d.join("cpu.cfs_quota_us")).zip(max(d.join("cpu.cfs_period_us")))
            };
        }
        if self.v2 && !r.ran {
            // Without a memory controller: the core `cpu.stat` of any v2 cgroup.
            if let Some((_, d)) = self.dirs.first() {
                r.ran = keyed(&d.join("cpu.stat"), "usage_usec") > 0;
            }
        }
        r
    }

    /// v2: `cgroup.kill` (every process, atomically). v1 has no kill file: the UID-wide kill
    /// does it (the caller runs it); this reports whether the cgroup is empty.
    pub fn kill(&self) -> Result<(), CgroupError> {
        if self.v2
            && let Some((_, d)) = self.dirs.first()
        {
            let f = d.join("cgroup.kill");
            if f.exists() {
                write(&f, "1")?;
            }
        }
        Ok(())
    }

    /// Whether no process is left in any of the directories.
    pub fn is_empty(&self) -> bool {
        self.procs_files().iter().all(|f| {
            std::fs::read_to_string(f)
                .map(|s| s.trim().is_empty())
                .unwrap_or(true)
        })
    }

    /// Remove the directories (they must be empty of processes). v1's memory directory goes
    /// last: its removal waits in the kernel for the cgroup's offlining, and the others, which
    /// go at once, must not be left behind when the server is killed during that wait.
    pub fn remove(&self) -> Result<(), CgroupError> {
        let mut first_err = None;
        let (memory, rest): (Vec<_>, Vec<_>) = self.dirs.iter().partition(|(c, _)| c == "memory");
        for (_, d) in rest.into_iter().chain(memory) {
            match std::fs::remove_dir(d) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => {
                    first_err.get_or_insert(io_err("removing", d)(e));
                }
            }
        }
        first_err.map_or(Ok(()), Err)
    }
}

/// Removes emptied request cgroups in the background. Removing a memory cgroup waits in the
/// kernel for its offlining (measured on v1: 4–24 ms on an idle machine, ~0.1 ms on a busy
/// one, no CPU either way); nothing waits for the directory to go once no process is left in
/// it, so reclaim hands it here instead.
#[derive(Debug)]
pub struct Remover {
    tx: std::sync::Mutex<Option<std::sync::mpsc::Sender<RemoverMsg>>>,
}

#[derive(Debug)]
enum RemoverMsg {
    Remove(RequestCgroup),
    /// Answer once everything sent before has been handled.
    Flush(std::sync::mpsc::Sender<()>),
}

impl Default for Remover {
    fn default() -> Self {
        Self::new()
    }
}

impl Remover {
    /// Start the remover thread (lazily: none until the first cgroup arrives).
    pub fn new() -> Self {
        Remover {
            tx: std::sync::Mutex::new(None),
        }
    }

    fn send(&self, msg: RemoverMsg) -> Result<(), RemoverMsg> {
        let mut tx = self.tx.lock().unwrap_or_else(|e| e.into_inner());
        if tx.is_none() {
            let (s, r) = std::sync::mpsc::channel();
            let started = std::thread::Builder::new()
                .name("cgroup-remover".into())
                .spawn(move || remover_loop(&r));
            if started.is_err() {
                return Err(msg);
            }
            *tx = Some(s);
        }
        match tx.as_ref().map(|s| s.send(msg)) {
            Some(Ok(())) => Ok(()),
            Some(Err(e)) => Err(e.0),
            None => unreachable!("sender set above"),
        }
    }

    /// Remove `cg` (empty of processes) soon; done inline if the thread cannot be started.
    pub fn remove_later(&self, cg: RequestCgroup) {
        if let Err(RemoverMsg::Remove(cg)) = self.send(RemoverMsg::Remove(cg)) {
            remove_patiently(&cg);
        }
    }

    /// Wait until every cgroup handed over so far is removed (or given up on).
    pub fn flush(&self) {
        let (done, wait) = std::sync::mpsc::channel();
        if self.send(RemoverMsg::Flush(done)).is_ok() {
            let _ = wait.recv();
        }
    }
}

fn remover_loop(rx: &std::sync::mpsc::Receiver<RemoverMsg>) {
    for msg in rx {
        match msg {
            RemoverMsg::Remove(cg) => remove_patiently(&cg),
            RemoverMsg::Flush(done) => {
                let _ = done.send(());
            }
        }
    }
}

/// `rmdir` the cgroup, retrying briefly (a process that just left may still be counted).
fn remove_patiently(cg: &RequestCgroup) {
    let mut last = None;
    for attempt in 0..50 {
        match cg.remove() {
            Ok(()) => return,
            Err(e) => last = Some(e),
        }
        std::thread::sleep(std::time::Duration::from_millis(2 << attempt.min(6)));
    }
    if let Some(e) = last {
        tracing::error!(error = %e, "request cgroup not removed");
    }
}

#[cfg(test)]
#[allow(clippy::print_stderr)] // a skip must say why
mod tests {
    use super::*;
    use rustix::thread::CapabilitySet;

    /// What the jail does with `procs_files` before it confines itself.
    fn join(cg: &RequestCgroup) {
        for f in cg.procs_files() {
            std::fs::write(f, "0").expect("join");
        }
    }

    const LIMITS: CgroupLimits = CgroupLimits {
        memory_bytes: 1 << 30,
        pids: 512,
        cpu_millis: 2000,
    };

    /// A fake v2 cgroupfs: the files the kernel would create are plain files. The container's
    /// cgroup `kubepods/pod1/ctr` (not the root: it has `cgroup.type`), and our directory and
    /// the instance `i1` in it are already there with their kernel files (a fake cannot make
    /// them when `prepare` creates them).
    fn fake_v2(controllers: &str) -> tempfile::TempDir {
        let t = tempfile::tempdir().expect("tmp");
        let ctr = t.path().join("kubepods/pod1/ctr");
        std::fs::create_dir_all(ctr.join("cmp-warden/i1")).expect("mkdir");
        std::fs::write(t.path().join("cgroup.controllers"), "cpu memory pids io").expect("w");
        for dir in [
            ctr.clone(),
            ctr.join("cmp-warden"),
            ctr.join("cmp-warden/i1"),
        ] {
            std::fs::write(dir.join("cgroup.controllers"), controllers).expect("w");
            std::fs::write(dir.join("cgroup.subtree_control"), "").expect("w");
            std::fs::write(dir.join("cgroup.type"), "domain\n").expect("w");
        }
        std::fs::write(ctr.join("cgroup.procs"), "").expect("w");
        t
    }

    /// `create` for a fake cgroupfs: make the directory with the interface files the kernel
    /// would put there, then configure it.
    fn create_with_kernel_files(layout: &Layout, name: &str, files: &[&str]) -> RequestCgroup {
        let Layout::V2 { base } = layout else {
            panic!("v2 only")
        };
        let dir = base.join(name);
        std::fs::create_dir(&dir).expect("mkdir");
        for f in files {
            std::fs::write(dir.join(f), "max\n").expect("w");
        }
        configure_v2(dir, &LIMITS).expect("configure")
    }

    #[test]
    fn v2_detect_prepare_create_stats_kill_remove_on_a_fake_cgroupfs() {
        let t = fake_v2("cpu memory pids");
        let ctr = t.path().join("kubepods/pod1/ctr");
        let layout = detect(t.path(), "0::/kubepods/pod1/ctr\n", None, "i1").expect("detect");
        let base = ctr.join("cmp-warden/i1");
        assert_eq!(layout, Layout::V2 { base: base.clone() });
        // Started in our own leaf (a second start, `kubectl exec` beside the server): the same.
        let again = detect(
            t.path(),
            "0::/kubepods/pod1/ctr/cmp-warden-supervisor\n",
            None,
            "i1",
        )
        .expect("detect");
        assert_eq!(again, layout);
        let ctls = prepare(&layout, Tenants::OnlySelf).expect("prepare");
        assert_eq!(ctls, ["memory", "pids", "cpu"]);
        assert_eq!(
            std::fs::read_to_string(ctr.join(SUPERVISOR_LEAF).join("cgroup.procs")).expect("r"),
            std::process::id().to_string()
        );
        // One controller per write (a fake file keeps the last), at each level.
        for dir in [ctr.clone(), ctr.join("cmp-warden"), base.clone()] {
            assert_eq!(
                std::fs::read_to_string(dir.join("cgroup.subtree_control")).expect("r"),
                "+cpu"
            );
        }
        // The kernel fills a new cgroup with the interface files of the delegated controllers
        // (memory.swap.max only with swap accounting); a fake cgroupfs cannot, so the test
        // creates them where the kernel would, just before `create` writes them.
        let cg = create_with_kernel_files(
            &layout,
            "r1",
            &[
                "memory.max",
                "memory.swap.max",
                "memory.oom.group",
                "pids.max",
                "cpu.max",
            ],
        );
        assert_eq!(cg.controllers, ["memory", "pids", "cpu"]);
        let r = |f: &str| std::fs::read_to_string(base.join("r1").join(f)).expect(f);
        assert_eq!(r("memory.max"), "1073741824");
        assert_eq!(r("memory.swap.max"), "0");
        assert_eq!(r("memory.oom.group"), "1");
        assert_eq!(r("pids.max"), "512");
        assert_eq!(r("cpu.max"), "200000 100000");
        assert_eq!(cg.procs_files(), [base.join("r1/cgroup.procs")]);
        join(&cg);
        assert_eq!(r("cgroup.procs"), "0");
        std::fs::write(base.join("r1/memory.peak"), "123456\n").expect("w");
        std::fs::write(
            base.join("r1/memory.events"),
            "low 0\nhigh 0\nmax 7\noom 2\noom_kill 1\n",
        )
        .expect("w");
        std::fs::write(base.join("r1/pids.events"), "max 3\n").expect("w");
        assert_eq!(
            cg.stats(),
            CgroupStats {
                peak_memory_bytes: 123456,
                oom_kills: 1,
                pids_refused: 3,
                pids_peak: 0,
            }
        );
        std::fs::write(base.join("r1/cgroup.kill"), "").expect("w");
        cg.kill().expect("kill");
        assert_eq!(r("cgroup.kill"), "1");
        // The real cgroupfs lets rmdir succeed with its control files present; a fake needs
        // them gone first.
        for e in std::fs::read_dir(base.join("r1")).expect("ls").flatten() {
            std::fs::remove_file(e.path()).expect("rm");
        }
        cg.remove().expect("remove");
        assert!(!base.join("r1").exists());
    }

    #[test]
    fn the_sweep_leaves_another_live_instances_request_cgroups_alone() {
        let t = tempfile::tempdir().expect("tmp");
        let base = t.path().to_path_buf();
        for d in ["j20001-10-0", "j20002-11-0"] {
            std::fs::create_dir(base.join(d)).expect("mkdir");
        }
        let layout = Layout::V2 { base: base.clone() };
        let removed = sweep(&layout, |name| name.starts_with("j20002-"));
        assert_eq!(removed, 1);
        assert!(!base.join("j20001-10-0").exists(), "ours: removed");
        assert!(
            base.join("j20002-11-0").exists(),
            "another instance's: kept"
        );
    }

    #[test]
    fn v2_without_delegated_controllers_is_unavailable() {
        let t = fake_v2("io");
        let layout = detect(t.path(), "0::/kubepods/pod1/ctr\n", None, "i1").expect("detect");
        let e = prepare(&layout, Tenants::All).expect_err("nothing delegated");
        assert!(e.to_string().contains("delegates none"), "{e}");
        let e =
            detect(t.path(), "1:name=systemd:/\n", None, "cmp-warden").expect_err("no 0:: line");
        assert!(e.to_string().contains("no v2 entry"), "{e}");
        let e = detect(&t.path().join("nowhere"), "", None, "cmp-warden").expect_err("nothing");
        assert!(e.to_string().contains("no cgroup v2"), "{e}");
    }

    /// At the hierarchy's root (no `cgroup.type`: exempt from the no-internal-process rule)
    /// nothing moves; the requests still go into our instance directory, never beside the
    /// host's own cgroups.
    #[test]
    fn at_the_root_nothing_moves_and_requests_stay_in_our_directory() {
        let t = fake_v2("cpu memory pids");
        let root = t.path();
        std::fs::write(root.join("cgroup.subtree_control"), "memory").expect("w");
        let base = root.join("cmp-warden/cmp-warden-20000");
        std::fs::create_dir_all(&base).expect("mkdir");
        for dir in [root.join("cmp-warden"), base.clone()] {
            std::fs::write(dir.join("cgroup.controllers"), "cpu memory pids").expect("w");
            std::fs::write(dir.join("cgroup.subtree_control"), "").expect("w");
        }
        let layout = detect(root, "0::/\n", None, "cmp-warden-20000").expect("detect");
        assert_eq!(layout, Layout::V2 { base: base.clone() });
        prepare(&layout, Tenants::All).expect("prepare");
        assert!(
            !root.join(SUPERVISOR_LEAF).exists(),
            "nothing moved at the root"
        );
        // memory was on already: only pids and cpu were written.
        assert_eq!(
            std::fs::read_to_string(root.join("cgroup.subtree_control")).expect("r"),
            "+cpu"
        );
        // The host's own cgroups beside ours are never swept.
        std::fs::create_dir(root.join("system.slice")).expect("mkdir");
        std::fs::create_dir(base.join("j20001-5-0")).expect("mkdir");
        assert_eq!(sweep(&layout, |_| false), 1);
        assert!(root.join("system.slice").exists());
    }

    #[test]
    fn a_configured_delegated_directory_wins() {
        let t = fake_v2("memory pids");
        let dir = t.path().join("kubepods/pod1/ctr");
        let layout = detect(Path::new("/nonexistent"), "", Some(&dir), "i1").expect("detect");
        assert_eq!(
            layout,
            Layout::V2 {
                base: dir.join("cmp-warden/i1")
            }
        );
        assert_eq!(
            prepare(&layout, Tenants::All).expect("prepare"),
            ["memory", "pids"]
        );
    }

    /// The container's OOM-kill counter: the server's own cgroup, or the hierarchy's root as a
    /// container without a cgroup namespace mounts it (its own cgroup at the root).
    #[test]
    fn the_containers_oom_counter_is_found_where_the_mount_shows_it() {
        let t = tempfile::tempdir().expect("tmp");
        let v1 = "4:memory:/kubepods/pod1/ctr\n";
        let mem = t.path().join("memory");
        std::fs::create_dir_all(&mem).expect("mkdir");
        std::fs::write(
            mem.join("memory.oom_control"),
            "oom_kill_disable 0\nunder_oom 0\noom_kill 3\n",
        )
        .expect("w");
        let c = OomCounter::find(t.path(), v1).expect("the mount's root");
        assert_eq!(
            (c.file(), c.read()),
            (mem.join("memory.oom_control").as_path(), Some(3))
        );
        let nested = mem.join("kubepods/pod1/ctr");
        std::fs::create_dir_all(&nested).expect("mkdir");
        std::fs::write(nested.join("memory.oom_control"), "oom_kill 1\n").expect("w");
        assert_eq!(
            OomCounter::find(t.path(), v1).and_then(|c| c.read()),
            Some(1)
        );
        // v2 with a cgroup namespace: "0::/" and memory.events at the root.
        let v2 = tempfile::tempdir().expect("tmp");
        std::fs::write(v2.path().join("cgroup.controllers"), "memory pids").expect("w");
        std::fs::write(
            v2.path().join("memory.events"),
            "low 0\nmax 4\noom 2\noom_kill 2\n",
        )
        .expect("w");
        assert_eq!(
            OomCounter::find(v2.path(), "0::/\n").and_then(|c| c.read()),
            Some(2)
        );
        assert!(OomCounter::find(&t.path().join("none"), v1).is_none());
    }

    /// What doctor reports comes from the kernel's files: each limit read back and compared.
    #[test]
    fn read_back_reports_what_the_kernel_holds_and_each_difference() {
        let t = tempfile::tempdir().expect("tmp");
        let dir = t.path().join("j1");
        std::fs::create_dir(&dir).expect("mkdir");
        let put = |f: &str, v: &str| std::fs::write(dir.join(f), v).expect("w");
        put("memory.max", "1073741824\n");
        put("memory.swap.max", "0\n");
        put("memory.oom.group", "1\n");
        put("pids.max", "512\n");
        put("cpu.max", "200000 100000\n");
        put("cpu.stat", "usage_usec 1234\nuser_usec 1000\n");
        let cg = RequestCgroup {
            v2: true,
            dirs: vec![("unified".into(), dir.clone())],
            controllers: vec!["memory".into(), "pids".into(), "cpu".into()],
        };
        let rb = cg.read_back();
        assert!(rb.ran);
        assert_eq!(rb.mismatches(&LIMITS), Vec::<String>::new());
        assert_eq!(
            rb.describe(),
            "memory.max=1073741824 (spec.limits.memoryBytes), memory.swap.max=0, memory.oom.group=1, pids.max=512 (spec.limits.pids), cpu.max=200000 100000 (spec.limits.cpuMillis)"
        );
        put("memory.max", "max\n");
        put("pids.max", "max\n");
        put("memory.oom.group", "0\n");
        put("cpu.stat", "usage_usec 0\n");
        let wrong = cg.read_back().mismatches(&LIMITS);
        assert_eq!(
            wrong,
            [
                format!("memory.max is {}, not 1073741824", u64::MAX),
                "memory.oom.group is 0".to_owned(),
                format!("pids.max is {}, not 512", u64::MAX),
                "no process ran in it".to_owned(),
            ]
        );
    }

    /// `cgroup.kill` and removal on a real cgroup v2 hierarchy (this CI host mounts an empty
    /// one at /sys/fs/cgroup/unified: no memory or pids controller there, so `memory.oom.group`
    /// is only tested on the fake cgroupfs): a process moved into a request cgroup dies with
    /// the kill, the cgroup is then empty and is removed.
    #[test]
    fn v2_kill_on_this_machine_for_real() {
        let root = Path::new("/sys/fs/cgroup/unified");
        if !rustix::process::geteuid().is_root() || !root.join("cgroup.procs").exists() {
            let why = "v2 cgroup test needs root and a cgroup2 mount at /sys/fs/cgroup/unified";
            assert!(
                std::env::var_os("CMP_WARDEN_TESTS_MUST_RUN").is_none(),
                "this test must run here (CMP_WARDEN_TESTS_MUST_RUN): {why}"
            );
            eprintln!("SKIP: {why}");
            return;
        }
        let dir = root.join(format!("cmp-warden-unit-{}", std::process::id()));
        std::fs::create_dir(&dir).expect("mkdir");
        let cg = RequestCgroup {
            v2: true,
            dirs: vec![("unified".into(), dir.clone())],
            controllers: Vec::new(),
        };
        let mut child = std::process::Command::new("sleep")
            .arg("60")
            .spawn()
            .expect("sleep");
        std::fs::write(dir.join("cgroup.procs"), child.id().to_string()).expect("join");
        assert!(!cg.is_empty());
        cg.kill().expect("cgroup.kill");
        let status = child.wait().expect("wait");
        assert_eq!(
            std::os::unix::process::ExitStatusExt::signal(&status),
            Some(9),
            "killed by cgroup.kill"
        );
        assert!(cg.is_empty());
        cg.remove().expect("rmdir");
        assert!(!dir.exists());
    }

    #[test]
    fn v1_on_this_machine_for_real() {
        // Real cgroup v1 (this project's machines are hybrid); needs root.
        if !rustix::process::geteuid().is_root()
            || !Path::new("/sys/fs/cgroup/memory/cgroup.procs").exists()
        {
            let why = "v1 cgroup test needs root and a v1 memory hierarchy";
            assert!(
                std::env::var_os("CMP_WARDEN_TESTS_MUST_RUN").is_none(),
                "this test must run here (CMP_WARDEN_TESTS_MUST_RUN): {why}"
            );
            eprintln!("SKIP: {why}");
            return;
        }
        let own = std::fs::read_to_string("/proc/self/cgroup").expect("cgroup");
        let layout =
            detect(Path::new("/sys/fs/cgroup"), &own, None, "cmp-warden-unit").expect("detect");
        let Layout::V1 { controllers } = &layout else {
            panic!("expected v1 here: {layout:?}");
        };
        assert!(controllers.iter().any(|(c, _)| c == "memory"));
        prepare(&layout, Tenants::OnlySelf).expect("prepare");
        let name = format!("unit-{}", std::process::id());
        let cg = create(&layout, &name, &LIMITS).expect("create");
        let mem = cg.dir("memory").expect("memory dir");
        assert_eq!(
            std::fs::read_to_string(mem.join("memory.limit_in_bytes"))
                .expect("r")
                .trim(),
            "1073741824"
        );
        // The CPU limit: the kernel's default period (not written again), the quota for it.
        if let Some(cpu) = cg.dir("cpu") {
            let r = |f: &str| std::fs::read_to_string(cpu.join(f)).expect("r");
            assert_eq!(r("cpu.cfs_period_us").trim(), CPU_PERIOD_US.to_string());
            let quota = LIMITS.cpu_millis * CPU_PERIOD_US / 1000;
            assert_eq!(r("cpu.cfs_quota_us").trim(), quota.to_string());
        }
        // A child joins, allocates, and exits; its peak is read back.
        let procs = cg.procs_files();
        let script = format!(
            "for f in {}; do echo 0 > $f; done; head -c 8000000 /dev/zero | tail -c 1 >/dev/null",
            procs
                .iter()
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>()
                .join(" ")
        );
        let st = std::process::Command::new("sh")
            .args(["-c", &script])
            .status()
            .expect("sh");
        assert!(st.success());
        assert!(cg.is_empty());
        assert!(cg.stats().peak_memory_bytes > 0);
        cg.remove().expect("remove");
        assert!(!mem.exists());
        remove_instance(&layout);
    }

    #[test]
    fn v1_instance_directories_go_after_the_supervisors_capability_drop() {
        // What `render` and `serve` do on the way out, with only the capabilities the
        // supervisor keeps (capabilities are per thread: dropped in this test's own thread).
        // Made straight in a hierarchy's root (0555 here), an instance directory outlived
        // every one-shot run.
        if !rustix::process::geteuid().is_root()
            || !Path::new("/sys/fs/cgroup/pids/cgroup.procs").exists()
        {
            let why = "v1 cgroup test needs root and a v1 pids hierarchy";
            assert!(
                std::env::var_os("CMP_WARDEN_TESTS_MUST_RUN").is_none(),
                "this test must run here (CMP_WARDEN_TESTS_MUST_RUN): {why}"
            );
            eprintln!("SKIP: {why}");
            return;
        }
        std::thread::spawn(|| {
            let own = std::fs::read_to_string("/proc/self/cgroup").expect("cgroup");
            let instance = format!("cmp-warden-unit-drop-{}", std::process::id());
            let layout =
                detect(Path::new("/sys/fs/cgroup"), &own, None, &instance).expect("detect");
            let dirs: Vec<PathBuf> = instance_dirs(&layout)
                .into_iter()
                .map(Path::to_path_buf)
                .collect();
            assert!(
                dirs.iter()
                    .all(|d| d.parent().is_some_and(|p| p.ends_with(OUR_DIR)))
            );
            prepare(&layout, Tenants::OnlySelf).expect("prepare");
            let cg = create(&layout, "req", &LIMITS).expect("create");
            crate::supervisor::privilege::drop_supervisor_capabilities().expect("drop");
            let caps = rustix::thread::capabilities(None).expect("caps");
            assert!(!caps.effective.contains(CapabilitySet::DAC_OVERRIDE));
            // A request cgroup with a process in it (another instance's): the directory stays.
            let mut holder = std::process::Command::new("sleep")
                .arg("30")
                .spawn()
                .expect("sleep");
            for f in cg.procs_files() {
                std::fs::write(f, holder.id().to_string()).expect("join");
            }
            remove_instance_if_unused(&layout, std::time::Duration::from_millis(200));
            assert!(dirs.iter().all(|d| d.exists()));
            // The request being reclaimed as the server stops (its process killed, then its
            // cgroup removed, after the check began): waited for (mutant: no wait -> the
            // directories stay, as a VM's stop right after an OOM kill once showed).
            let later = cg.clone();
            let reclaim = std::thread::spawn(move || {
                std::thread::sleep(std::time::Duration::from_millis(300));
                holder.kill().expect("kill");
                holder.wait().expect("wait");
                later.remove().expect("remove the request cgroup");
            });
            remove_instance_if_unused(&layout, std::time::Duration::from_secs(10));
            reclaim.join().expect("reclaim");
            for d in &dirs {
                assert!(!d.exists(), "{} left behind", d.display());
            }
        })
        .join()
        .expect("test thread");
    }
}
