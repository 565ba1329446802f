//! Per-request cgroups on a small cgroupfs layer of our own, for both versions.
//!
//! Why not `cgroups-rs` (the design card's choice): 0.5.1 pulls `nix` 0.25 beside our `rustix`
//! and an unconditional D-Bus client (`zbus`), picks v1 on any hybrid host without asking, and
//! offers no `cgroup.kill`, `memory.peak` or delegation handling; what we need is a dozen file
//! writes, which this module does and tests (v2 against a fake cgroupfs, v1 for real).
//!
//! Layout:
//! - v2: the server's own cgroup (from `/proc/self/cgroup`, or a configured delegated
//!   directory) becomes the base; the server moves itself into `base/supervisor` (the "no
//!   internal processes" rule), enables `memory pids cpu` in `base/cgroup.subtree_control`, and
//!   each request gets `base/<request>`.
//! - v1: for each of `memory`, `pids`, `cpu` the server's cgroup in that hierarchy plus
//!   `cmp-warden/<request>`.

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

/// Detect the hierarchy: `root` is the cgroupfs mount point (normally `/sys/fs/cgroup`),
/// `self_cgroup` the content of `/proc/self/cgroup`, `configured` an operator-given delegated
/// v2 directory, `instance` the v1 directory name (one per server, e.g. per UID range, so two
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
                "{} is not a cgroup v2 directory",
                dir.display()
            )));
        }
        return Ok(Layout::V2 {
            base: dir.to_path_buf(),
        });
    }
    if root.join("cgroup.controllers").exists() {
        let own = self_cgroup
            .lines()
            .find_map(|l| l.strip_prefix("0::"))
            .ok_or_else(|| CgroupError::Unavailable("no v2 entry in /proc/self/cgroup".into()))?;
        return Ok(Layout::V2 {
            base: root.join(own.trim_start_matches('/')),
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
            controllers.push((
                ctl.to_owned(),
                mount.join(own.trim_start_matches('/')).join(instance),
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

/// Prepare the layout once at start-up (the server is the only process in its cgroup then).
/// v2: move `own_pid` into `base/supervisor` and delegate the controllers to children; v1:
/// create the `cmp-warden` directories. Returns the controllers available.
pub fn prepare(layout: &Layout, own_pid: u32) -> Result<Vec<String>, CgroupError> {
    match layout {
        Layout::V2 { base } => {
            let available = std::fs::read_to_string(base.join("cgroup.controllers"))
                .map_err(io_err("reading", &base.join("cgroup.controllers")))?;
            let wanted: Vec<&str> = ["memory", "pids", "cpu"]
                .into_iter()
                .filter(|c| available.split_whitespace().any(|a| a == *c))
                .collect();
            if wanted.is_empty() {
                return Err(CgroupError::Unavailable(format!(
                    "{} delegates none of memory, pids, cpu (has {:?})",
                    base.display(),
                    available.trim()
                )));
            }
            let leaf = base.join("supervisor");
            match std::fs::create_dir(&leaf) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
                Err(e) => return Err(io_err("creating", &leaf)(e)),
            }
            write(&leaf.join("cgroup.procs"), &own_pid.to_string())?;
            let enable: Vec<String> = wanted.iter().map(|c| format!("+{c}")).collect();
            write(&base.join("cgroup.subtree_control"), &enable.join(" "))?;
            Ok(wanted.iter().map(|c| (*c).to_owned()).collect())
        }
        Layout::V1 { controllers } => {
            for (_, dir) in controllers {
                std::fs::create_dir_all(dir).map_err(io_err("creating", dir))?;
            }
            Ok(controllers.iter().map(|(c, _)| c.clone()).collect())
        }
    }
}

/// Start-up: remove request cgroups a previous run left (their processes were killed by the
/// UID sweep; v2 kills again through `cgroup.kill`), leaving those `another_instance` says a
/// live instance sharing the base holds. Returns how many were removed.
pub fn sweep(layout: &Layout, another_instance: impl Fn(&str) -> bool) -> usize {
    let bases: Vec<&Path> = match layout {
        Layout::V2 { base } => vec![base.as_path()],
        Layout::V1 { controllers } => controllers.iter().map(|(_, d)| d.as_path()).collect(),
    };
    let mut removed = 0;
    for base in bases {
        let Ok(rd) = std::fs::read_dir(base) else {
            continue;
        };
        for e in rd.flatten() {
            let p = e.path();
            if !p.is_dir()
                || e.file_name() == "supervisor"
                || another_instance(&e.file_name().to_string_lossy())
            {
                continue;
            }
            let kill = p.join("cgroup.kill");
            if kill.exists() {
                let _ = std::fs::write(&kill, "1");
            }
            if std::fs::remove_dir(&p).is_ok() {
                removed += 1;
            }
        }
    }
    removed
}

/// Remove this instance's own v1 directories (a one-shot `render` on the way out; they must be
/// empty of request cgroups). v2 bases belong to the server's own cgroup and are kept.
pub fn remove_instance(layout: &Layout) {
    if let Layout::V1 { controllers } = layout {
        for (_, dir) in controllers {
            let _ = std::fs::remove_dir(dir);
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

    /// A fake v2 cgroupfs: the files the kernel would create are plain files.
    fn fake_v2(controllers: &str) -> tempfile::TempDir {
        let t = tempfile::tempdir().expect("tmp");
        let base = t.path().join("kubepods/pod1/ctr");
        std::fs::create_dir_all(&base).expect("mkdir");
        std::fs::write(t.path().join("cgroup.controllers"), "cpu memory pids io").expect("w");
        std::fs::write(base.join("cgroup.controllers"), controllers).expect("w");
        std::fs::write(base.join("cgroup.subtree_control"), "").expect("w");
        std::fs::write(base.join("cgroup.procs"), "1\n").expect("w");
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
        let layout =
            detect(t.path(), "0::/kubepods/pod1/ctr\n", None, "cmp-warden").expect("detect");
        let base = t.path().join("kubepods/pod1/ctr");
        assert_eq!(layout, Layout::V2 { base: base.clone() });
        let ctls = prepare(&layout, 4242).expect("prepare");
        assert_eq!(ctls, ["memory", "pids", "cpu"]);
        assert_eq!(
            std::fs::read_to_string(base.join("supervisor/cgroup.procs")).expect("r"),
            "4242"
        );
        assert_eq!(
            std::fs::read_to_string(base.join("cgroup.subtree_control")).expect("r"),
            "+memory +pids +cpu"
        );
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
        for d in ["supervisor", "j20001-10-0", "j20002-11-0"] {
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
        assert!(base.join("supervisor").exists());
    }

    #[test]
    fn v2_without_delegated_controllers_is_unavailable() {
        let t = fake_v2("io");
        let layout =
            detect(t.path(), "0::/kubepods/pod1/ctr\n", None, "cmp-warden").expect("detect");
        let e = prepare(&layout, 1).expect_err("nothing delegated");
        assert!(e.to_string().contains("delegates none"), "{e}");
        let e =
            detect(t.path(), "1:name=systemd:/\n", None, "cmp-warden").expect_err("no 0:: line");
        assert!(e.to_string().contains("no v2 entry"), "{e}");
        let e = detect(&t.path().join("nowhere"), "", None, "cmp-warden").expect_err("nothing");
        assert!(e.to_string().contains("no cgroup v2"), "{e}");
    }

    #[test]
    fn a_configured_delegated_directory_wins() {
        let t = fake_v2("memory pids");
        let dir = t.path().join("kubepods/pod1/ctr");
        let layout =
            detect(Path::new("/nonexistent"), "", Some(&dir), "cmp-warden").expect("detect");
        assert_eq!(layout, Layout::V2 { base: dir });
        assert_eq!(prepare(&layout, 7).expect("prepare"), ["memory", "pids"]);
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
        prepare(&layout, std::process::id()).expect("prepare");
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
    }
}
