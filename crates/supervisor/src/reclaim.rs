//! The reclaim helper: our binary re-executed as `__reclaim` by the supervisor when a jail did
//! not clean up after itself (or at start-up, for a previous run's leftovers). It switches to the
//! request's UID, kills every process of it and removes its directory fd-relative without
//! following links. Trusted code of ours, started privileged: it is the supervisor's side.

use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::time::Duration;

use rustix::fs::{self as rfs, AtFlags, Mode, OFlags};

/// The argument that selects the reclaim helper.
pub const RECLAIM_ARG: &str = "__reclaim";

/// What the reclaim helper is asked to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReclaimArgs {
    /// Switch to this UID/GID first (and kill everything it owns); `None` in the shared model.
    pub creds: Option<(u32, u32)>,
    /// The work root.
    pub work_root: PathBuf,
    /// The request directory to remove; `None` = only kill.
    pub name: Option<String>,
}

impl ReclaimArgs {
    /// As command-line arguments (after [`RECLAIM_ARG`]).
    pub fn to_args(&self) -> Vec<String> {
        let (u, g) = self.creds.map_or(("-".into(), "-".into()), |(u, g)| {
            (u.to_string(), g.to_string())
        });
        vec![
            u,
            g,
            self.work_root.display().to_string(),
            self.name.clone().unwrap_or_else(|| "-".into()),
        ]
    }

    /// Parse [`Self::to_args`] output.
    pub fn parse(args: &[String]) -> Option<Self> {
        let [u, g, root, name] = args else {
            return None;
        };
        let creds = match (u.as_str(), g.as_str()) {
            ("-", "-") => None,
            (u, g) => Some((u.parse().ok()?, g.parse().ok()?)),
        };
        Some(ReclaimArgs {
            creds,
            work_root: PathBuf::from(root),
            name: (name != "-").then(|| name.clone()),
        })
    }
}

/// The reclaim helper: become the request's UID, kill every process it owns, remove its
/// directory fd-relative without following links. Exit 0 when both are done.
pub fn reclaim_main(args: &[String]) -> i32 {
    let Some(a) = ReclaimArgs::parse(args) else {
        tracing::error!(args = %args.join(" "), "reclaim: bad arguments");
        return 2;
    };
    if let Some((uid, gid)) = a.creds {
        use rustix::process::{Gid, Uid};
        let g = Gid::from_raw(gid);
        let u = Uid::from_raw(uid);
        let switched = rustix::thread::set_thread_groups(&[])
            .and_then(|()| rustix::thread::set_thread_res_gid(g, g, g))
            .and_then(|()| rustix::thread::set_thread_res_uid(u, u, u));
        if let Err(e) = switched {
            tracing::error!(uid, error = %e, "reclaim: cannot switch to the request's UID");
            return 1;
        }
        // Repeat until /proc shows no live process of the UID: a fork bomb may create
        // processes between two sweeps. (kill(-1) itself reports success whenever any other
        // process exists, so its result says nothing.)
        let mut rounds = 0;
        loop {
            if let Err(e) = jail_sys::sys::kill_all_of_my_uid() {
                tracing::error!(uid, error = %e, "reclaim: kill failed");
                return 1;
            }
            if live_processes_of(uid) == 0 {
                break;
            }
            rounds += 1;
            if rounds > 2000 {
                tracing::error!(uid, "reclaim: processes keep appearing");
                return 1;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    if let Some(name) = &a.name
        && let Err(e) = remove_request_dir(&a.work_root, name)
    {
        tracing::error!(dir = %name, error = %e, "reclaim: cannot remove the request directory");
        return 1;
    }
    0
}

/// Processes (not zombies, not ourselves) whose real UID is `uid`.
fn live_processes_of(uid: u32) -> usize {
    let me = std::process::id().to_string();
    let Ok(rd) = std::fs::read_dir("/proc") else {
        return 0;
    };
    rd.flatten()
        .filter(|e| {
            let n = e.file_name();
            let n = n.to_string_lossy();
            if !n.bytes().all(|b| b.is_ascii_digit()) || n == me {
                return false;
            }
            let Ok(s) = std::fs::read_to_string(e.path().join("status")) else {
                return false;
            };
            let zombie = s
                .lines()
                .find_map(|l| l.strip_prefix("State:"))
                .is_some_and(|st| st.trim_start().starts_with('Z'));
            let owner = s
                .lines()
                .find_map(|l| l.strip_prefix("Uid:"))
                .and_then(|u| u.split_whitespace().next()?.parse::<u32>().ok());
            !zombie && owner == Some(uid)
        })
        .count()
}

fn remove_request_dir(work_root: &Path, name: &str) -> std::io::Result<()> {
    let root = rfs::open(
        work_root,
        OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    let dir = match rfs::openat(
        &root,
        name,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    ) {
        Ok(d) => d,
        Err(rustix::io::Errno::NOENT) => return Ok(()),
        Err(rustix::io::Errno::ACCESS) => {
            archive::regain_dir(root.as_fd(), name.as_bytes())?;
            rfs::openat(
                &root,
                name,
                OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                Mode::empty(),
            )?
        }
        Err(rustix::io::Errno::NOTDIR | rustix::io::Errno::LOOP) => {
            // Not a directory (a previous run's stray file or link): unlink the entry itself.
            rfs::unlinkat(&root, name, AtFlags::empty())?;
            return Ok(());
        }
        Err(e) => return Err(e.into()),
    };
    rfs::fchmod(&dir, Mode::from_raw_mode(0o700))?;
    archive::remove_contents(dir.as_fd())?;
    rfs::unlinkat(&root, name, AtFlags::REMOVEDIR)?;
    Ok(())
}
