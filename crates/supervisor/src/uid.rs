//! UID/GID leases: one unique identity per request from the policy's range.
//!
//! Round-robin, so an identity is reused as late as possible; a [`Lease`] is not `Clone` and is
//! consumed by [`UidPool::release`], which the caller does only once the identity's processes are
//! gone and its tree is removed. The range is checked against the image's passwd and group files
//! at start-up: sharing an id with a real account would hand that account's files to a request.
//!
//! Several instances on one node (plugin sidecars sharing a pod's process namespace, services on
//! a host, `render` beside a server) may share a range. With a lease directory every instance
//! can reach (the pod's shared socket directory by default), each lease also holds an exclusive
//! `flock` on `<dir>/<uid>`: an identity another live instance holds is skipped, and the kernel
//! drops the lock when its holder dies, so a crashed instance's identities become sweepable.

use std::os::fd::AsFd;
use std::path::{Path, PathBuf};

/// A leased identity (uid == gid). Give it back with [`UidPool::release`].
#[derive(Debug)]
pub struct Lease {
    id: u32,
    /// The node-wide lock on the identity, when the pool has a lease directory.
    _lock: Option<std::fs::File>,
}

/// An identity locked for the start-up sweep: no other live instance holds it.
#[derive(Debug)]
pub struct SweepLock {
    _lock: Option<std::fs::File>,
}

/// The lock file of `uid` in `dir`, locked exclusively without waiting: `Ok(None)` when another
/// process holds it.
fn try_lock(dir: &Path, uid: u32) -> std::io::Result<Option<std::fs::File>> {
    use std::os::unix::fs::OpenOptionsExt;
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .mode(0o600)
        .custom_flags(libc::O_CLOEXEC | libc::O_NOFOLLOW)
        .open(dir.join(uid.to_string()))?;
    match rustix::fs::flock(
        f.as_fd(),
        rustix::fs::FlockOperation::NonBlockingLockExclusive,
    ) {
        Ok(()) => Ok(Some(f)),
        Err(rustix::io::Errno::WOULDBLOCK) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

impl Lease {
    /// The UID.
    pub fn uid(&self) -> u32 {
        self.id
    }

    /// The GID (same number).
    pub fn gid(&self) -> u32 {
        self.id
    }
}

/// Why the pool cannot be built or cannot lease.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum UidError {
    /// Range overlaps an account or group of the image.
    #[error(
        "uid range {first}..{end} overlaps {kind} '{name}' ({id}) in the image; choose another spec.uidRange"
    )]
    Overlap {
        /// First id.
        first: u32,
        /// One past the last id.
        end: u32,
        /// `user` or `group`.
        kind: &'static str,
        /// Account name.
        name: String,
        /// The id.
        id: u32,
    },
    /// Every identity is in use.
    #[error("all {0} request identities are in use")]
    Exhausted(u32),
}

/// The pool.
#[derive(Debug)]
pub struct UidPool {
    first: u32,
    leased: Vec<bool>,
    cursor: usize,
    in_use: usize,
    /// Node-wide lease locks (`None`: this process alone leases from the range).
    lock_dir: Option<PathBuf>,
    /// Where the node's processes are seen (`/proc`; a test's own directory in unit tests,
    /// which must not depend on what else runs on the host).
    proc_root: PathBuf,
}

/// `(name, id)` pairs from a passwd- or group-format file (malformed lines are skipped, as NSS does).
fn ids(text: &str, field: usize) -> impl Iterator<Item = (&str, u32)> {
    text.lines()
        .filter(|l| !l.trim_start().starts_with('#'))
        .filter_map(move |l| {
            let f: Vec<&str> = l.split(':').collect();
            Some((*f.first()?, f.get(field)?.trim().parse().ok()?))
        })
}

impl UidPool {
    /// Where its lease locks are, for messages ("no lease directory" without one).
    pub fn lease_dir_display(&self) -> String {
        self.lock_dir.as_ref().map_or_else(
            || "no lease directory".to_owned(),
            |d| format!("lease directory {}", d.display()),
        )
    }

    /// A pool over `first..first+count`, refusing any overlap with `passwd`/`group` contents.
    pub fn new(first: u32, count: u32, passwd: &str, group: &str) -> Result<Self, UidError> {
        let end = first.saturating_add(count);
        let range = first..end;
        for (kind, text, field) in [
            ("user", passwd, 2),
            ("user", passwd, 3),
            ("group", group, 2),
        ] {
            if let Some((name, id)) = ids(text, field).find(|(_, id)| range.contains(id)) {
                return Err(UidError::Overlap {
                    first,
                    end,
                    kind,
                    name: name.to_owned(),
                    id,
                });
            }
        }
        Ok(Self {
            first,
            leased: vec![false; count as usize],
            cursor: 0,
            in_use: 0,
            lock_dir: None,
            proc_root: PathBuf::from("/proc"),
        })
    }

    /// Read `/etc/passwd` and `/etc/group` under `root` (missing files count as empty).
    pub fn from_image(first: u32, count: u32, root: &Path) -> Result<Self, UidError> {
        let read = |p: &str| std::fs::read_to_string(root.join(p)).unwrap_or_default();
        Self::new(first, count, &read("etc/passwd"), &read("etc/group"))
    }

    /// Coordinate leases with other instances through lock files in `dir` (created 0700).
    pub fn set_lock_dir(&mut self, dir: PathBuf) -> std::io::Result<()> {
        std::fs::create_dir_all(&dir)?;
        std::fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o700))?;
        self.lock_dir = Some(dir);
        Ok(())
    }

    /// Lease the next free identity after the last one handed out (skipping those another
    /// instance holds).
    pub fn lease(&mut self) -> Result<Lease, UidError> {
        let n = self.leased.len();
        for step in 0..n {
            let i = (self.cursor + step) % n;
            if self.leased[i] {
                continue;
            }
            let id = self.first + i as u32;
            let lock = match &self.lock_dir {
                None => None,
                Some(dir) => match try_lock(dir, id) {
                    Ok(Some(f)) => Some(f),
                    // Held by another live instance.
                    Ok(None) => continue,
                    Err(e) => {
                        tracing::warn!(uid = id, error = %e, "lease lock not taken; trying the next identity");
                        continue;
                    }
                },
            };
            self.leased[i] = true;
            self.cursor = (i + 1) % n;
            self.in_use += 1;
            return Ok(Lease { id, _lock: lock });
        }
        Err(UidError::Exhausted(n as u32))
    }

    /// Lock an identity outside the range for as long as the returned file lives: the first of
    /// `uid`, `uid + 1`, … (`tries` of them) no other instance holds — by its lease lock, or,
    /// for an instance with another lease directory, by a process running as it. Without a
    /// lease directory, the first no process runs as, unlocked.
    pub fn lock_outside(&self, uid: u32, tries: u32) -> Option<(u32, Option<std::fs::File>)> {
        (uid..uid.saturating_add(tries))
            .filter(|u| !(self.first..self.first + self.capacity() as u32).contains(u))
            // The overflow ID: what every unmapped ID shows as in a user namespace.
            .filter(|&u| u != 65534)
            // Another instance's keeper (its lease directory not ours) runs as it.
            .filter(|&u| {
                let running = process_of_uid(&self.proc_root, u);
                if let Some(pid) = running {
                    tracing::info!(
                        uid = u,
                        pid,
                        "cache identity taken by a process of another instance; trying the next"
                    );
                }
                running.is_none()
            })
            .find_map(|u| match &self.lock_dir {
                None => Some((u, None)),
                Some(dir) => match try_lock(dir, u) {
                    Ok(Some(f)) => Some((u, Some(f))),
                    _ => None,
                },
            })
    }

    /// For the start-up sweep: lock `uid` unless another live instance holds it (`None`).
    pub fn lock_for_sweep(&self, uid: u32) -> Option<SweepLock> {
        match &self.lock_dir {
            None => Some(SweepLock { _lock: None }),
            Some(dir) => match try_lock(dir, uid) {
                Ok(Some(f)) => Some(SweepLock { _lock: Some(f) }),
                Ok(None) => None,
                Err(e) => {
                    tracing::warn!(uid, error = %e, "lease lock unreadable: not sweeping this identity");
                    None
                }
            },
        }
    }

    /// Identities of the range another live instance holds now (from the lease directory's
    /// files: only identities ever leased have one).
    pub fn held_elsewhere(&self) -> Vec<u32> {
        let Some(dir) = &self.lock_dir else {
            return Vec::new();
        };
        let Ok(rd) = std::fs::read_dir(dir) else {
            return Vec::new();
        };
        let mut held: Vec<u32> = rd
            .flatten()
            .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
            .filter(|u| self.contains(*u))
            .filter(|u| !self.leased[(u - self.first) as usize])
            .filter(|u| matches!(try_lock(dir, *u), Ok(None)))
            .collect();
        held.sort_unstable();
        held
    }

    /// Give an identity back: only once its processes are gone and its tree is removed.
    pub fn release(&mut self, lease: Lease) {
        let i = (lease.id - self.first) as usize;
        debug_assert!(self.leased[i], "release of a free identity");
        self.leased[i] = false;
        self.in_use -= 1;
    }

    /// Start leasing at `offset` into the range (a one-shot `render` picks a random one so it
    /// rarely meets a running server's or another render's identities).
    pub fn start_at(&mut self, offset: usize) {
        if !self.leased.is_empty() {
            self.cursor = offset % self.leased.len();
        }
    }

    /// Never lease `uid` (a one-shot run skips identities a running server's requests hold).
    pub fn mark_busy(&mut self, uid: u32) {
        if self.contains(uid) {
            let i = (uid - self.first) as usize;
            if !self.leased[i] {
                self.leased[i] = true;
                self.in_use += 1;
            }
        }
    }

    /// Identities currently leased.
    pub fn in_use(&self) -> usize {
        self.in_use
    }

    /// Size of the pool.
    pub fn capacity(&self) -> usize {
        self.leased.len()
    }

    /// The first UID of the range.
    pub fn first(&self) -> u32 {
        self.first
    }

    /// Whether `uid` belongs to this pool's range.
    pub fn contains(&self, uid: u32) -> bool {
        uid >= self.first && ((uid - self.first) as usize) < self.leased.len()
    }
}

/// UIDs of `first..first+count` that some process under `proc_root` runs as (any of its
/// real, effective, saved or filesystem UIDs).
pub fn uids_in_use(proc_root: &Path, first: u32, count: u32) -> std::collections::BTreeSet<u32> {
    let range = u64::from(first)..u64::from(first) + u64::from(count);
    let Ok(rd) = std::fs::read_dir(proc_root) else {
        return Default::default();
    };
    rd.flatten()
        .filter(|e| {
            e.file_name()
                .to_str()
                .is_some_and(|n| n.parse::<u32>().is_ok())
        })
        .filter_map(|e| std::fs::read_to_string(e.path().join("status")).ok())
        .flat_map(|status| {
            let uids = status
                .lines()
                .find_map(|l| l.strip_prefix("Uid:"))
                .unwrap_or("")
                .to_owned();
            uids.split_whitespace()
                .filter_map(|u| u.parse::<u64>().ok())
                .filter(|u| range.contains(u))
                .map(|u| u as u32)
                .collect::<Vec<_>>()
        })
        .collect()
}

/// PIDs under `proc_root` (normally `/proc`) whose real, effective, saved or filesystem UID lies in
/// `first..first+count`: leftovers of a previous run that the start-up sweep must kill.
pub fn processes_in_range(proc_root: &Path, first: u32, count: u32) -> Vec<i32> {
    let range = u64::from(first)..u64::from(first) + u64::from(count);
    let Ok(rd) = std::fs::read_dir(proc_root) else {
        return Vec::new();
    };
    let mut pids: Vec<i32> = rd
        .flatten()
        .filter_map(|e| {
            let pid: i32 = e.file_name().to_str()?.parse().ok()?;
            let status = std::fs::read_to_string(e.path().join("status")).ok()?;
            let uids = status.lines().find_map(|l| l.strip_prefix("Uid:"))?;
            uids.split_whitespace()
                .filter_map(|u| u.parse::<u64>().ok())
                .any(|u| range.contains(&u))
                .then_some(pid)
        })
        .collect();
    pids.sort_unstable();
    pids
}

/// The real UID of process `pid` (None once it is gone).
pub fn proc_uid(pid: i32) -> Option<u32> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    s.lines()
        .find_map(|l| l.strip_prefix("Uid:"))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// The live cmp-warden (another server, not this process nor one of its ancestors) that
/// `pid` descends from, if any: a leftover of a dead run has been reparented to init or a
/// subreaper, while a live instance's jails and commands are still its descendants. An
/// instance is recognised by its executable (the same file as ours, by device and inode) and
/// is not one of a server's helpers (the jail factory and its jails, the cache keeper, the
/// reclaim helper): a dead server's jail, still ending its commands, leads to init.
pub fn live_instance_above(proc_root: &Path, pid: i32) -> Option<i32> {
    let helper = |p: i32| {
        std::fs::read(proc_root.join(format!("{p}/cmdline"))).is_ok_and(|c| {
            c.split(|b| *b == 0).nth(1).is_some_and(|a| {
                [crate::FACTORY_ARG, crate::KEEPER_ARG, crate::RECLAIM_ARG]
                    .iter()
                    .any(|h| a == h.as_bytes())
            })
        })
    };
    use std::os::unix::fs::MetadataExt;
    let ours = std::fs::metadata(proc_root.join("self/exe")).ok()?;
    let me = std::process::id() as i32;
    let mut ancestors_of_me = Vec::new();
    let mut p = me;
    for _ in 0..64 {
        match ppid(proc_root, p) {
            Some(pp) if pp > 0 => {
                ancestors_of_me.push(pp);
                p = pp;
            }
            _ => break,
        }
    }
    let mut p = pid;
    for _ in 0..64 {
        let parent = ppid(proc_root, p)?;
        if parent <= 1 {
            return None;
        }
        if parent != me && !ancestors_of_me.contains(&parent) {
            let exe = std::fs::metadata(proc_root.join(format!("{parent}/exe")));
            if exe.is_ok_and(|m| m.dev() == ours.dev() && m.ino() == ours.ino()) && !helper(parent)
            {
                return Some(parent);
            }
        }
        p = parent;
    }
    None
}

/// A process (not of this server's) whose real UID is `uid`, if one is running.
pub fn process_of_uid(proc_root: &Path, uid: u32) -> Option<i32> {
    let me = std::process::id() as i32;
    std::fs::read_dir(proc_root)
        .ok()?
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|&pid| pid != me)
        .find(|&pid| {
            std::fs::read_to_string(proc_root.join(format!("{pid}/status"))).is_ok_and(|st| {
                st.lines()
                    .find_map(|l| l.strip_prefix("Uid:"))
                    .and_then(|ids| ids.split_whitespace().next()?.parse::<u32>().ok())
                    == Some(uid)
            })
        })
}

fn ppid(proc_root: &Path, pid: i32) -> Option<i32> {
    std::fs::read_to_string(proc_root.join(format!("{pid}/status")))
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix("PPid:"))?
        .trim()
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A live server's jail leads to the server; a dead server's jail, reparented to init,
    /// leads to no live instance (mutant: the jail itself taken for a server -> the VM's
    /// restart after a crash refused to start, its sweep blocked by the dying jail).
    #[test]
    fn a_dead_servers_jail_is_no_live_instance() {
        let t = tempfile::tempdir().expect("tmp");
        let root = t.path();
        std::fs::write(root.join("cmp-warden"), "").expect("exe");
        std::fs::write(root.join("sleep"), "").expect("exe");
        std::fs::create_dir(root.join("self")).expect("self");
        std::os::unix::fs::symlink(root.join("cmp-warden"), root.join("self/exe")).expect("ln");
        let proc = |pid: i32, ppid: i32, exe: &str, cmdline: &[&str]| {
            let d = root.join(pid.to_string());
            std::fs::create_dir(&d).expect("mkdir");
            std::fs::write(d.join("status"), format!("Name:\tx\nPPid:\t{ppid}\n")).expect("status");
            std::os::unix::fs::symlink(root.join(exe), d.join("exe")).expect("ln");
            std::fs::write(d.join("cmdline"), cmdline.join("\0") + "\0").expect("cmdline");
        };
        // A live server, its factory, a jail, the jail's command.
        proc(
            100,
            1,
            "cmp-warden",
            &["cmp-warden", "--config-dir-path", "/c"],
        );
        proc(
            200,
            100,
            "cmp-warden",
            &["/proc/self/exe", crate::FACTORY_ARG],
        );
        proc(
            300,
            200,
            "cmp-warden",
            &["/proc/self/exe", crate::FACTORY_ARG],
        );
        proc(400, 300, "sleep", &["sleep", "1000"]);
        assert_eq!(live_instance_above(root, 400), Some(100));
        // A dead server's jail, reparented to init, and its command.
        proc(
            500,
            1,
            "cmp-warden",
            &["/proc/self/exe", crate::FACTORY_ARG],
        );
        proc(600, 500, "sleep", &["sleep", "1000"]);
        assert_eq!(live_instance_above(root, 600), None);
    }

    const PASSWD: &str = "root:x:0:0:root:/root:/bin/sh\n# comment\nargocd:x:999:999::/home/argocd:/bin/sh\nbroken line\nnobody:x:65534:65534::/:/bin/false\n";
    const GROUP: &str = "root:x:0:\nargocd:x:999:\nweird:x:20005:\n";

    #[test]
    fn round_robin_unique_and_exhaustion() {
        let mut p = UidPool::new(30000, 3, PASSWD, "").unwrap();
        let a = p.lease().unwrap();
        let b = p.lease().unwrap();
        assert_eq!((a.uid(), b.uid(), a.gid()), (30000, 30001, 30000));
        p.release(a);
        // The freed id is not reused while others are fresh: round-robin.
        let c = p.lease().unwrap();
        assert_eq!(c.uid(), 30002);
        let d = p.lease().unwrap();
        let mut busy = UidPool::new(40000, 3, "", "").unwrap();
        busy.mark_busy(40000);
        busy.mark_busy(40001);
        busy.mark_busy(50000); // outside: ignored
        assert_eq!(busy.lease().unwrap().uid(), 40002);
        assert!(busy.lease().is_err());
        assert_eq!(d.uid(), 30000);
        assert!(matches!(p.lease(), Err(UidError::Exhausted(3))));
        assert_eq!(p.in_use(), 3);
        p.release(b);
        assert_eq!(p.lease().unwrap().uid(), 30001);
        assert!(p.contains(30002) && !p.contains(30003) && !p.contains(29999));
    }

    #[test]
    fn instances_sharing_a_lease_directory_never_lease_or_sweep_the_same_identity() {
        let dir = tempfile::tempdir().expect("tmp");
        let pool = || {
            let mut p = UidPool::new(30000, 3, "", "").unwrap();
            p.set_lock_dir(dir.path().join("leases")).expect("lock dir");
            p
        };
        let (mut a, mut b) = (pool(), pool());
        let held = a.lease().unwrap();
        assert_eq!(held.uid(), 30000);
        // B skips what A holds, and may not sweep it.
        assert_eq!(b.held_elsewhere(), vec![30000]);
        assert!(b.lock_for_sweep(30000).is_none());
        let mine = b.lease().unwrap();
        assert_eq!(mine.uid(), 30001);
        // A lock dies with its holder (here: the lease dropped, as when A's process exits).
        drop(held);
        assert!(b.held_elsewhere().is_empty());
        assert!(b.lock_for_sweep(30000).is_some());
        drop(mine);
    }

    #[test]
    fn the_cache_identity_is_outside_the_range_and_never_the_overflow_id() {
        let dir = tempfile::tempdir().expect("tmp");
        let mut p = UidPool::new(30000, 3, "", "").unwrap();
        p.set_lock_dir(dir.path().join("leases")).expect("lock dir");
        // No process runs as any of these here (the host's own keepers are not this test's).
        p.proc_root = dir.path().join("proc");
        std::fs::create_dir_all(&p.proc_root).expect("proc");
        let (a, _la) = p.lock_outside(65533, 4).expect("free");
        assert_eq!(a, 65533);
        // 65533 is held (by `_la`): the next one is 65535, never 65534.
        let (b, _lb) = p.lock_outside(65533, 4).expect("free");
        assert_eq!(b, 65535);
        let (c, _lc) = p.lock_outside(29999, 3).expect("free");
        assert_eq!(c, 29999);
        // 29999 held, 30000..30002 are the range's: nothing among the three tried.
        assert!(p.lock_outside(29999, 3).is_none());
    }

    #[test]
    fn overlap_with_the_image_is_refused() {
        let e = UidPool::new(900, 200, PASSWD, GROUP).unwrap_err();
        assert!(
            e.to_string().contains("overlaps user 'argocd' (999)"),
            "{e}"
        );
        let e = UidPool::new(20000, 10, PASSWD, GROUP).unwrap_err();
        assert!(
            e.to_string().contains("overlaps group 'weird' (20005)"),
            "{e}"
        );
        assert!(UidPool::new(20006, 100, PASSWD, GROUP).is_ok());
    }

    #[test]
    fn finds_leftover_processes_in_a_fake_proc() {
        let t = tempfile::tempdir().unwrap();
        for (pid, uids) in [
            ("12", "0\t0\t0\t0"),
            ("34", "20001\t20001\t20001\t20001"),
            ("56", "1000\t20002\t1000\t1000"),
            ("self", "20003\t0\t0\t0"),
        ] {
            std::fs::create_dir_all(t.path().join(pid)).unwrap();
            std::fs::write(
                t.path().join(pid).join("status"),
                format!("Name:\tx\nUid:\t{uids}\nGid:\t0\t0\t0\t0\n"),
            )
            .unwrap();
        }
        assert_eq!(processes_in_range(t.path(), 20000, 100), [34, 56]);
    }
}
