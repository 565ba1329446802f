//! The spare jails, one per policy: prepared ahead of requests (a UID leased, a cgroup made, a
//! jail forked by the factory and confining itself by that policy's plan), taken by the next
//! request the policy runs, replaced in the background.

use super::{Inner, Jail, PREPARER_IDLE, Source, Spare, internal, lock};
use crate::plan::Plan;
use cgroups::RequestCgroup;
use jail_sys::cancel::CancelToken;
use jail_wire::protocol::{Creds, Prepare, write_frame};
use std::io::Write;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};
use vocab::request::{ErrorKind, RequestError};

impl Inner {
    /// Start a jail: lease a UID, create its cgroup, start our binary and send it the
    /// preparation, after which it confines itself and waits for a request.
    pub(super) fn prepare(self: &Arc<Self>, plan: &Arc<Plan>) -> Result<Jail, RequestError> {
        let mut jail = Jail {
            plan: plan.clone(),
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
            self.finish(jail, false);
            return Err(e);
        }
        tracing::debug!(jail = %jail.name, uid = jail.creds.map(|c| c.uid), "jail prepared");
        Ok(jail)
    }

    pub(super) fn start(&self, jail: &mut Jail) -> Result<(), RequestError> {
        let plan = &jail.plan;
        if let Some(layout) = self
            .cfg
            .cgroups
            .as_ref()
            .filter(|_| !crate::bench::off().cgroups)
        {
            jail.cgroup = Some(
                cgroups::create(layout, &jail.name, &plan.cgroup)
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

    /// The ready spare of `plan`'s policy if it is still alive; else the one being prepared,
    /// if no other request is waiting for it (it was started earlier, so it is ready sooner
    /// than a new one); else a jail prepared now. Then prepare that policy's next spare in the
    /// background: every policy keeps one from its first request on.
    pub(super) fn take(
        self: &Arc<Self>,
        request: &str,
        plan: &Arc<Plan>,
        deadline: Option<Instant>,
        cancel: &CancelToken,
    ) -> Result<Jail, RequestError> {
        // A plan of a set a reload replaced has no spare: its request prepares its own jail.
        let spare = self.spare_of(plan);
        let source = match &spare {
            None => Source::Own,
            Some(spare) => {
                let mut slot = lock(&spare.slot);
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
            }
        };
        let ready = match (source, &spare) {
            (Source::Ready(j), _) => self.alive_or_discard(j),
            (Source::Claimed, Some(spare)) => {
                let j = self.wait_for_spare(spare);
                lock(&spare.slot).claimed = false;
                j
            }
            (Source::Claimed | Source::Own, _) => None,
        };
        let jail = match ready {
            Some(j) => j,
            None => loop {
                match self.prepare(plan) {
                    Ok(j) => break j,
                    // Every UID is leased — one perhaps by a spare being prepared, others by
                    // another instance on this node: wait for one until the request's
                    // deadline (a burst queues rather than fails).
                    Err(e) if e.kind == ErrorKind::ResourceExhausted && self.pool.is_some() => {
                        if let Some(j) = spare.as_ref().and_then(|s| self.wait_for_spare(s)) {
                            break j;
                        }
                        // Another policy's idle spare gives its UID back to this request.
                        if let Some(j) = self
                            .current_spares()
                            .iter()
                            .find_map(|s| lock(&s.slot).ready.take())
                        {
                            self.discard(j);
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
        if let Some(spare) = &spare {
            self.refill(spare);
        }
        Ok(jail)
    }

    /// `jail` if it is still running; a spare that died while idle is reclaimed.
    pub(super) fn alive_or_discard(self: &Arc<Self>, mut jail: Jail) -> Option<Jail> {
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

    /// The spare a background preparation under way for policy `i` produces (`None` if there
    /// is none or it fails).
    pub(super) fn wait_for_spare(self: &Arc<Self>, spare: &Spare) -> Option<Jail> {
        let mut slot = lock(&spare.slot);
        loop {
            if let Some(j) = slot.ready.take() {
                drop(slot);
                return self.alive_or_discard(j);
            }
            if !slot.preparing {
                return None;
            }
            slot = spare.changed.wait(slot).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// Prepare policy `i`'s spare in the background unless one is ready, under way, or we are
    /// closing.
    pub(super) fn refill(self: &Arc<Self>, spare: &Arc<Spare>) {
        {
            let mut slot = lock(&spare.slot);
            if slot.closed || slot.ready.is_some() || slot.preparing {
                return;
            }
            slot.preparing = true;
            if slot.preparer {
                // The preparer is idle (it is not preparing): hand it the work.
                slot.wake = true;
                drop(slot);
                spare.changed.notify_all();
                return;
            }
            slot.preparer = true;
        }
        let me = self.clone();
        let mine = spare.clone();
        let spawned = std::thread::Builder::new()
            .name("jail-spare".into())
            .spawn(move || {
                loop {
                    me.prepare_spare(&mine);
                    if !me.next_spare_wanted(&mine) {
                        return;
                    }
                }
            });
        if spawned.is_err() {
            let mut slot = lock(&spare.slot);
            slot.preparing = false;
            slot.preparer = false;
            drop(slot);
            spare.changed.notify_all();
        }
    }

    /// Prepare one jail for `spare` (`preparing` is set) and make it the ready one.
    pub(super) fn prepare_spare(self: &Arc<Self>, spare: &Spare) {
        let plan = &spare.plan;
        let jail = self.prepare(plan);
        let mut slot = lock(&spare.slot);
        let extra = match jail {
            Ok(j) if slot.closed || slot.ready.is_some() => Some(j),
            Ok(j) => {
                slot.ready = Some(j);
                None
            }
            Err(e) => {
                tracing::debug!(error = %e, policy = %plan.policy_name, "no spare jail prepared");
                None
            }
        };
        if let Some(j) = extra {
            // Still "preparing" while it is retired: `shutdown` waits for that, so the server
            // cannot exit (and end this thread) with the jail's process and directory left.
            drop(slot);
            self.discard(j);
            slot = lock(&spare.slot);
        }
        slot.preparing = false;
        drop(slot);
        spare.changed.notify_all();
    }

    /// A spare's idle preparer: wait up to [`PREPARER_IDLE`] to be asked for another jail;
    /// false when it should end (idle that long, shut down, or retired by a reload).
    pub(super) fn next_spare_wanted(self: &Arc<Self>, spare: &Spare) -> bool {
        let until = Instant::now() + PREPARER_IDLE;
        let mut slot = lock(&spare.slot);
        while !slot.wake && !slot.closed {
            let now = Instant::now();
            if now >= until {
                break;
            }
            slot = spare
                .changed
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
            spare.changed.notify_all();
        }
        false
    }

    /// Retire a jail no request used: close its stdin (it cleans up and exits), reclaim it.
    pub(super) fn discard(self: &Arc<Self>, mut jail: Jail) {
        tracing::debug!(jail = %jail.name, "jail discarded");
        jail.stdin = None;
        self.finish(jail, false);
    }

    /// Stop preparing spares, wait for the preparations under way, reclaim the ready ones,
    /// and wait for the cgroups handed to the remover.
    pub(super) fn shutdown(self: &Arc<Self>) {
        for spare in self.current_spares().iter() {
            self.close(spare);
        }
        self.factory.stop();
        self.cgroup_remover.flush();
    }

    /// Close `spare`: no new jail for it, the preparation under way waited for, the ready
    /// jail reclaimed.
    fn close(self: &Arc<Self>, spare: &Spare) {
        let mut slot = lock(&spare.slot);
        slot.closed = true;
        // An idle preparer ends now rather than after PREPARER_IDLE.
        spare.changed.notify_all();
        while slot.preparing {
            slot = spare.changed.wait(slot).unwrap_or_else(|e| e.into_inner());
        }
        let ready = slot.ready.take();
        drop(slot);
        if let Some(j) = ready {
            self.discard(j);
        }
    }

    /// The spares of the set in force.
    pub(super) fn current_spares(&self) -> Arc<[Arc<Spare>]> {
        self.spares
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// `plan`'s spare, if `plan` belongs to the set in force (a request that arrived under
    /// a set a reload replaced has none).
    pub(super) fn spare_of(&self, plan: &Arc<Plan>) -> Option<Arc<Spare>> {
        self.current_spares()
            .get(plan.index.0)
            .filter(|s| Arc::ptr_eq(&s.plan, plan))
            .cloned()
    }

    /// A reload: `plans` in force from now on, each with a spare of its own; the old set's
    /// spares retired (a jail prepared under an old plan is never given to a new request).
    pub(super) fn set_plans(self: &Arc<Self>, plans: &crate::plan::Plans) {
        let new = Spare::all_of(plans);
        let old = std::mem::replace(
            &mut *self.spares.write().unwrap_or_else(|e| e.into_inner()),
            new,
        );
        for spare in old.iter() {
            self.close(spare);
        }
    }
}
