//! After a request: its jail waited for, its processes killed, its cgroup emptied and removed,
//! its tree and UID given back; at start-up, what an earlier run left.

use super::feed::TreeHold;
use super::{Inner, JAIL_CLEANUP, Jail, UID_DRAIN, lock, wait, wait_bounded};
use crate::reclaim::ReclaimArgs;
use crate::uid::{proc_uid, processes_in_range};
use cgroups::RequestCgroup;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

impl Inner {
    /// Kill what is left in the jail's cgroup (v2 `cgroup.kill`; v1 relies on the UID-wide
    /// kill), wait briefly for exiting processes, and once it is empty have it removed in the
    /// background. Returns whether it is empty.
    pub(super) fn empty_cgroup(&self, cg: &RequestCgroup) -> bool {
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
    pub(super) fn helper(&self, args: &ReclaimArgs) -> Result<(), String> {
        let mut child = self
            .spawn_helper(&args.to_args())
            .map_err(|e| format!("cannot start the reclaim helper: {e}"))?;
        match wait(&mut child) {
            Ok(s) if s.success() => Ok(()),
            Ok(s) => Err(format!("reclaim helper failed: {s}")),
            Err(e) => Err(format!("reclaim helper: {e}")),
        }
    }

    /// Step 15 of a request (and a discarded spare's end): reclaim a jail: wait for it to
    /// finish its own clean-up, remove its cgroup and its (then empty) directory entry,
    /// release its UID; or, when anything is left, have the
    /// helper kill and remove it as the UID and quarantine the UID if even that fails. A
    /// request's jail (`refill`) then lets the default's spare, and its own policy's, be
    /// prepared with the UID it gave back; a discarded spare's UID is left to whoever needs it.
    pub(super) fn finish(self: &Arc<Self>, jail: Jail, refill: bool) {
        let plan = jail.plan.clone();
        let refill = |me: &Arc<Self>| {
            if refill {
                if let Some(default) = me.current_spares().first() {
                    me.refill(default);
                }
                if let Some(own) = me.spare_of(&plan) {
                    me.refill(&own);
                }
            }
        };
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
                refill(self);
            }
            return;
        }
        // Slow path: a helper running as the UID kills and removes whatever is left.
        tracing::info!(
            jail = %name,
            jail_clean,
            cgroup_empty,
            "reclaim by the helper: the jail did not clean up after itself"
        );
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
                    refill(self);
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
    pub(super) fn reclaim(self: &Arc<Self>, name: &str) {
        let jail = lock(&self.pending).remove(name);
        if let Some(j) = jail {
            self.finish(j, true);
        }
    }

    /// Kill every process in the UID range (a previous run's; the server owns its range).
    pub(super) fn kill_leftover_processes(&self) -> Result<(), String> {
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
                    .find_map(|(pid, _)| crate::uid::live_instance_above(Path::new("/proc"), *pid))
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
    pub(super) fn remove_leftover_dirs(&self) -> Result<usize, String> {
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
}
