//! Per-request cgroups on a small cgroupfs layer of our own, for both versions: the unified
//! hierarchy (`v2`) and the legacy ones (`v1`), each behind `Hierarchy` (start-up
//! preparation, a request's cgroup with its limits); a request's
//! cgroup, its accounting and its removal are `request`; the container's own OOM counter is
//! `oom`. Tested against a fake cgroupfs (v2) and for real on this machine (v1, and v2's
//! `cgroup.kill` where a v2 mount is there); the kernel matrix is the proof on pure v2 nodes.
//!
//! Why not `cgroups-rs`: 0.5.1 pulls `nix` 0.25 beside our `rustix` and an unconditional
//! D-Bus client (`zbus`), picks v1 on any hybrid host without asking, and offers no
//! `cgroup.kill`, `memory.peak` or delegation handling; what we need is a dozen file writes.
//!
//! Architecture invariant: knows nothing of requests beyond a name and its limits, nothing of
//! policies, jails or UIDs; its only I/O is the cgroupfs.
#![forbid(unsafe_code)]

mod files;
mod oom;
mod request;
mod v1;
mod v2;

use std::io;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

pub use oom::OomCounter;
pub use request::{CgroupStats, Readback, Remover, RequestCgroup};

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

/// The v2 leaf the server's processes move into when its delegated cgroup is not the root.
pub const SUPERVISOR_LEAF: &str = "cmp-warden-supervisor";

/// The v2 directory, in the delegated cgroup, that holds one directory per instance.
pub const OUR_DIR: &str = "cmp-warden";

/// Who moves into [`SUPERVISOR_LEAF`] (v2, a delegated cgroup that is not the root).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tenants {
    /// Every process of the delegated cgroup: the server's container or service is its own.
    All,
    /// Only this process: a one-shot command run from a shell never moves the shell.
    OnlySelf,
}

/// The CPU quota period (100 ms, the kernel default).
const CPU_PERIOD_US: u64 = 100_000;

/// What differs between the hierarchies' versions; everything else is shared.
trait Hierarchy {
    /// Prepare once at start-up, before the capability drop (the server is single threaded
    /// then). Returns the controllers every request cgroup gets.
    fn prepare(&self, tenants: Tenants) -> Result<Vec<String>, CgroupError>;
    /// Create the request's cgroup `name` with its limits.
    fn create(&self, name: &str, limits: &CgroupLimits) -> Result<RequestCgroup, CgroupError>;
}

impl Layout {
    fn hierarchy(&self) -> Box<dyn Hierarchy + '_> {
        match self {
            Layout::V2 { base } => Box::new(v2::Unified { base }),
            Layout::V1 { controllers } => Box::new(v1::Legacy { controllers }),
        }
    }

    /// The directories this instance makes request cgroups in (one per hierarchy in v1).
    pub fn instance_dirs(&self) -> Vec<&Path> {
        match self {
            Layout::V2 { base } => vec![base.as_path()],
            Layout::V1 { controllers } => controllers.iter().map(|(_, d)| d.as_path()).collect(),
        }
    }
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
        v2::detect(root, self_cgroup, instance)
    } else {
        v1::detect(root, self_cgroup, instance)
    }
}

/// Prepare the layout once at start-up, before the capability drop (the server is single
/// threaded then). Returns the controllers every request cgroup gets.
pub fn prepare(layout: &Layout, tenants: Tenants) -> Result<Vec<String>, CgroupError> {
    layout.hierarchy().prepare(tenants)
}

/// Create the request's cgroup with its limits.
pub fn create(
    layout: &Layout,
    name: &str,
    limits: &CgroupLimits,
) -> Result<RequestCgroup, CgroupError> {
    layout.hierarchy().create(name, limits)
}

/// Start-up: remove request cgroups a previous run left in our instance directory (their
/// processes were killed by the UID sweep; v2 kills again through `cgroup.kill` and waits
/// for them to go), leaving those `another_instance` says a live instance sharing it holds.
/// Returns how many were removed.
pub fn sweep(layout: &Layout, another_instance: impl Fn(&str) -> bool) -> usize {
    let mut removed = 0;
    for base in layout.instance_dirs() {
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
    let deadline = std::time::Instant::now() + wait;
    while holds_processes(layout) && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    if holds_processes(layout) {
        tracing::warn!(
            dirs = %layout.instance_dirs().iter().map(|d| d.display().to_string()).collect::<Vec<_>>().join(", "),
            waited_ms = wait.as_millis() as u64,
            "cgroup directories kept: a request cgroup in them still holds processes (another live instance with the same spec.uidRange, or a reclaim that did not finish); the next start-up's sweep removes them"
        );
        return;
    }
    if let Err(e) = remove_instance(layout) {
        tracing::warn!(error = %e, "cgroup directory not removed");
    }
}

/// Whether a request cgroup in this instance's directories holds a process.
fn holds_processes(layout: &Layout) -> bool {
    layout.instance_dirs().into_iter().any(|d| {
        std::fs::read_dir(d)
            .map(|rd| {
                rd.flatten().any(|e| {
                    std::fs::read_to_string(e.path().join("cgroup.procs"))
                        .is_ok_and(|p| !p.trim().is_empty())
                })
            })
            .unwrap_or(false)
    })
}

/// Remove this instance's own directories (a one-shot `render` or `doctor` on the way out;
/// they must be empty of request cgroups). A v2 leaf is kept: this process is still in it.
/// A request cgroup just removed may still be going in the kernel (EBUSY for its parent a
/// moment longer): retried briefly, then the first directory that stayed is the error. One
/// already gone is no error.
pub fn remove_instance(layout: &Layout) -> Result<(), CgroupError> {
    let mut first_err = None;
    for dir in layout.instance_dirs() {
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
            first_err.get_or_insert(files::io_err("removing", dir)(e));
        }
    }
    first_err.map_or(Ok(()), Err)
}

/// What the tests of every version share: the limits, and a fake v2 cgroupfs.
#[cfg(test)]
mod testing {
    use super::{CgroupLimits, Layout, RequestCgroup, v2};

    /// What the jail does with `procs_files` before it confines itself.
    pub(crate) fn join(cg: &RequestCgroup) {
        for f in cg.procs_files() {
            std::fs::write(f, "0").expect("join");
        }
    }

    pub(crate) const LIMITS: CgroupLimits = CgroupLimits {
        memory_bytes: 1 << 30,
        pids: 512,
        cpu_millis: 2000,
    };

    /// A fake v2 cgroupfs: the files the kernel would create are plain files. The container's
    /// cgroup `kubepods/pod1/ctr` (not the root: it has `cgroup.type`), and our directory and
    /// the instance `i1` in it are already there with their kernel files (a fake cannot make
    /// them when `prepare` creates them).
    pub(crate) fn fake_v2(controllers: &str) -> tempfile::TempDir {
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
    pub(crate) fn create_with_kernel_files(
        layout: &Layout,
        name: &str,
        files: &[&str],
    ) -> RequestCgroup {
        let Layout::V2 { base } = layout else {
            panic!("v2 only")
        };
        let dir = base.join(name);
        std::fs::create_dir(&dir).expect("mkdir");
        for f in files {
            std::fs::write(dir.join(f), "max\n").expect("w");
        }
        v2::configure(dir, &LIMITS).expect("configure")
    }
}
