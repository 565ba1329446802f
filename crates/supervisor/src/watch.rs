//! The jail watcher: one thread for every request in flight (it was a thread per request, whose
//! start and exit were ~2% of a short request's CPU; BENCHMARKS.md, issue 23).
//!
//! Once a jail has its whole request, its stdin carries nothing more; closing it is the
//! supervisor's cancel, which the jail's command loop sees. The watcher closes it when the
//! request's token is cancelled (client gone, shutdown) or the jail overruns its deadline by
//! more than the kill grace (the jail enforces the deadline itself and names the limit; this is
//! the backstop), and if the jail still has not finished a grace period later, kills its whole
//! UID with the reclaim helper. A finished request (its `done` flag set, its token poked) is
//! dropped from the watch.
//!
//! The thread waits in `poll` on each watched token's eventfd and its own, with the nearest
//! deadline as the timeout; it ends when its runner is gone and nothing is watched.

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant};

use crate::reclaim::{RECLAIM_ARG, ReclaimArgs};
use jail_sys::cancel::CancelToken;
use jail_wire::protocol::KILL_GRACE;

/// What more than the jail's own kill grace a stopping jail is given.
const BACKSTOP: Duration = Duration::from_secs(2);

/// One request's jail, watched from the end of its stream to its reply.
pub(crate) struct Watch {
    /// The request's token: cancelled by the client or shutdown; poked when `done` is set.
    pub cancel: CancelToken,
    /// The request's deadline, if it has one.
    pub deadline: Option<Instant>,
    /// Set (then the token poked) once the jail replied.
    pub done: Arc<AtomicBool>,
    /// The write end of the jail's stdin: dropping it tells the jail to stop.
    pub stdin: Option<std::fs::File>,
    /// How to kill the jail's UID when it does not stop (None in the shared-UID model).
    pub kill: Option<ReclaimArgs>,
    /// Our binary, for the reclaim helper.
    pub exe: PathBuf,
}

/// A watch in the thread's list.
struct Watched {
    w: Watch,
    /// When the stop began (stdin closed), the end of the grace the jail has.
    grace_end: Option<Instant>,
}

impl Watched {
    fn done(&self) -> bool {
        self.w.done.load(Ordering::SeqCst)
    }

    /// When this watch next needs a look without being woken.
    fn next(&self) -> Option<Instant> {
        match self.grace_end {
            Some(g) => Some(g),
            None => self.w.deadline.map(|d| d + KILL_GRACE + BACKSTOP),
        }
    }

    /// Look at it; false once it is finished with.
    fn step(&mut self, now: Instant) -> bool {
        if self.done() {
            return false;
        }
        match self.grace_end {
            None => {
                let overrun = self
                    .w
                    .deadline
                    .is_some_and(|d| now >= d + KILL_GRACE + BACKSTOP);
                if self.w.cancel.reason().is_some() || overrun {
                    self.w.stdin = None;
                    self.grace_end = Some(now + KILL_GRACE + BACKSTOP);
                }
                true
            }
            Some(g) if now < g => true,
            Some(_) => {
                if let Some(k) = self.w.kill.take() {
                    kill_uid(k, self.w.exe.clone());
                }
                false
            }
        }
    }
}

/// Kill everything the jail's UID runs, with the reclaim helper, on a thread of its own (the
/// watcher goes on watching the others meanwhile).
fn kill_uid(k: ReclaimArgs, exe: PathBuf) {
    tracing::warn!("jail did not stop after cancellation: killing its UID");
    let _ = std::thread::Builder::new()
        .name("jail-kill".into())
        .spawn(move || {
            let mut cmd = Command::new(&exe);
            cmd.arg(RECLAIM_ARG)
                .args(k.to_args())
                .env_clear()
                .stdin(Stdio::null())
                .stdout(Stdio::null());
            // Tracked: the orphan reaper must not take its exit status.
            if let Ok(mut helper) = jail_sys::reaper::spawn_tracked(&mut cmd) {
                let _ = helper.wait();
                jail_sys::reaper::untrack(helper.id() as i32);
            }
        });
}

/// The runner's side: hands watches to the thread, starting it when there is none.
#[derive(Debug, Default)]
pub(crate) struct Watcher {
    inner: Mutex<Option<(mpsc::Sender<Watch>, CancelToken)>>,
}

impl Drop for Watcher {
    /// The runner is gone: the thread sees the channel closed, finishes what it watches, ends.
    fn drop(&mut self) {
        let inner = self
            .inner
            .get_mut()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        if let Some((tx, wake)) = inner {
            drop(tx);
            wake.poke();
        }
    }
}

impl Watcher {
    /// Watch `w` until its `done` is set (then poke its token).
    pub(crate) fn watch(&self, w: Watch) {
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let w = match inner.as_ref() {
            Some((tx, wake)) => match tx.send(w) {
                Ok(()) => {
                    wake.poke();
                    return;
                }
                // The thread ended (nothing was watched and it saw no runner): start another.
                Err(mpsc::SendError(w)) => w,
            },
            None => w,
        };
        let (tx, rx) = mpsc::channel();
        let wake = CancelToken::new();
        let _ = tx.send(w);
        let thread_wake = wake.clone();
        match std::thread::Builder::new()
            .name("jail-watch".into())
            .spawn(move || watch_loop(&rx, &thread_wake))
        {
            Ok(_) => *inner = Some((tx, wake)),
            Err(e) => {
                // Without the thread a cancel still reaches the jail when the request's stdin is
                // dropped with its watch (the request's end); say so.
                tracing::error!(error = %e, "no jail watcher thread: cancels reach jails only when their request ends");
                *inner = None;
            }
        }
    }
}

fn watch_loop(rx: &mpsc::Receiver<Watch>, wake: &CancelToken) {
    let mut list: Vec<Watched> = Vec::new();
    let mut open = true;
    loop {
        // New watches; each token's eventfd exists before its `done` is first read, so a
        // `done` set later wakes the poll below.
        loop {
            match rx.try_recv() {
                Ok(w) => {
                    let _ = w.cancel.poll_fds();
                    list.push(Watched { w, grace_end: None });
                }
                Err(mpsc::TryRecvError::Empty) => break,
                Err(mpsc::TryRecvError::Disconnected) => {
                    open = false;
                    break;
                }
            }
        }
        let now = Instant::now();
        list.retain_mut(|w| w.step(now));
        if !open && list.is_empty() {
            return;
        }
        let timeout = list
            .iter()
            .filter_map(Watched::next)
            .min()
            .map(|t| t.saturating_duration_since(Instant::now()));
        let Ok((own, _)) = wake.poll_fds() else {
            // No eventfd (descriptors exhausted): look again shortly.
            std::thread::sleep(Duration::from_millis(20));
            continue;
        };
        let mut fds = vec![Some(own)];
        fds.extend(
            list.iter()
                .map(|w| w.w.cancel.poll_fds().ok().map(|(fd, _)| fd)),
        );
        // No deadline near: sleep until a watch arrives, a token is poked, or the runner goes.
        let _ = jail_sys::cancel::wait_readable(&fds, timeout);
        drop(fds);
        wake.clear_wake();
        for w in &list {
            w.w.cancel.clear_wake();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustix::event::{PollFd, PollFlags, Timespec};
    use std::io::Read;

    /// A watch whose stdin is a pipe; the returned read end sees EOF once the watcher dropped it.
    fn watch(deadline: Option<Instant>) -> (Watch, std::fs::File, CancelToken, Arc<AtomicBool>) {
        let (r, w) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC).expect("pipe");
        let cancel = CancelToken::new();
        let done = Arc::new(AtomicBool::new(false));
        let watch = Watch {
            cancel: cancel.clone(),
            deadline,
            done: done.clone(),
            stdin: Some(std::fs::File::from(w)),
            kill: None,
            exe: PathBuf::from("/bin/true"),
        };
        (watch, std::fs::File::from(r), cancel, done)
    }

    /// Whether the pipe's writer is gone within `within`.
    fn closed_within(r: &std::fs::File, within: Duration) -> bool {
        let mut p = [PollFd::new(r, PollFlags::IN)];
        let t = Timespec {
            tv_sec: i64::try_from(within.as_secs()).expect("secs"),
            tv_nsec: i64::from(within.subsec_nanos()),
        };
        if !matches!(rustix::event::poll(&mut p, Some(&t)), Ok(1)) {
            return false;
        }
        let mut b = [0u8; 1];
        matches!((&*r).read(&mut b), Ok(0))
    }

    /// One thread watches several requests: a cancel closes that jail's stdin at once, a
    /// finished request's watch is dropped, an overrun deadline closes the stdin, and a request
    /// that is neither keeps its stdin open.
    #[test]
    fn one_thread_closes_the_stdin_of_each_cancelled_finished_or_overrun_jail() {
        let watcher = Watcher::default();
        let (w1, r1, c1, d1) = watch(None);
        let (w2, r2, c2, d2) = watch(None);
        let overrun = Instant::now() - KILL_GRACE - BACKSTOP - Duration::from_secs(1);
        let (w3, r3, c3, d3) = watch(Some(overrun));
        let (w4, r4, c4, d4) = watch(Some(Instant::now() + Duration::from_secs(60)));
        for w in [w1, w2, w3, w4] {
            watcher.watch(w);
        }
        assert!(
            closed_within(&r3, Duration::from_secs(2)),
            "overrun: closed"
        );
        assert!(
            !closed_within(&r1, Duration::from_millis(200)),
            "still running"
        );
        c1.cancel(jail_sys::cancel::CancelReason::Cancelled);
        assert!(
            closed_within(&r1, Duration::from_secs(2)),
            "cancelled: closed"
        );
        d2.store(true, Ordering::SeqCst);
        c2.poke();
        assert!(
            closed_within(&r2, Duration::from_secs(2)),
            "finished: dropped"
        );
        assert!(
            !closed_within(&r4, Duration::from_millis(200)),
            "within its deadline"
        );
        let watchers = || {
            std::fs::read_dir("/proc/self/task")
                .expect("tasks")
                .flatten()
                .filter(|t| {
                    std::fs::read_to_string(t.path().join("comm"))
                        .is_ok_and(|c| c.trim() == "jail-watch")
                })
                .count()
        };
        assert_eq!(watchers(), 1, "one watcher thread for every request");
        d4.store(true, Ordering::SeqCst);
        c4.poke();
        assert!(
            closed_within(&r4, Duration::from_secs(2)),
            "finished: dropped"
        );
        // The stopped jails reply too; with the runner gone and nothing watched, the thread
        // ends.
        for (d, c) in [(&d1, &c1), (&d3, &c3)] {
            d.store(true, Ordering::SeqCst);
            c.poke();
        }
        drop(watcher);
        let end = Instant::now() + Duration::from_secs(2);
        while watchers() > 0 && Instant::now() < end {
            std::thread::sleep(Duration::from_millis(10));
        }
        assert_eq!(watchers(), 0, "the watcher thread ended with its runner");
    }
}
