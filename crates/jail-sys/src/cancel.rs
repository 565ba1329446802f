//! A cancellation flag a blocking request can wait on (client cancel, deadline, shutdown).

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

use rustix::event::{EventfdFlags, PollFd, PollFlags};

/// Why a request was told to stop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CancelReason {
    /// The client went away or cancelled.
    Cancelled,
    /// The server is shutting down.
    Shutdown,
}

#[derive(Debug, Default)]
struct State {
    reason: Option<CancelReason>,
    generation: u64,
}

#[derive(Debug, Default)]
struct Inner {
    state: Mutex<State>,
    changed: Condvar,
    /// An eventfd written on every cancel and poke, for a waiter that polls descriptors (the
    /// command runner); made on first use.
    wake: OnceLock<OwnedFd>,
    /// A descriptor whose end (or any byte) means "cancelled": the jail's stdin once the
    /// request is read, which the supervisor closes to cancel.
    watch: Option<BorrowedFd<'static>>,
}

/// Shared between the server (which cancels) and the request (which waits).
#[derive(Debug, Clone, Default)]
pub struct CancelToken {
    inner: Arc<Inner>,
}

impl CancelToken {
    /// A fresh token.
    pub fn new() -> Self {
        Self::default()
    }

    /// A token cancelled (`Cancelled`) once `fd` is readable or its writers are gone; seen by
    /// [`reason`](Self::reason) and by a command's poll loop, without a thread of its own.
    pub fn watching(fd: BorrowedFd<'static>) -> Self {
        Self {
            inner: Arc::new(Inner {
                watch: Some(fd),
                ..Inner::default()
            }),
        }
    }

    /// Cancel (first reason wins).
    pub fn cancel(&self, reason: CancelReason) {
        let mut s = self.inner.state.lock().unwrap_or_else(|e| e.into_inner());
        s.reason.get_or_insert(reason);
        self.inner.changed.notify_all();
        drop(s);
        self.wake();
    }

    /// The reason, if cancelled (looking at the watched descriptor, without waiting).
    pub fn reason(&self) -> Option<CancelReason> {
        let reason = self
            .inner
            .state
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .reason;
        if reason.is_none() && self.watched_ended() {
            self.cancel(CancelReason::Cancelled);
            return self.reason();
        }
        reason
    }

    /// Wake waiters without cancelling (a watched event happened).
    pub fn poke(&self) {
        self.inner
            .state
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .generation += 1;
        self.inner.changed.notify_all();
        self.wake();
    }

    fn wake(&self) {
        if let Some(fd) = self.inner.wake.get() {
            let _ = rustix::io::write(fd, &1u64.to_ne_bytes());
        }
    }

    /// The descriptors a polling waiter watches: the wake eventfd (readable after a cancel or
    /// poke; [`clear_wake`](Self::clear_wake) reads it back) and the watched descriptor.
    pub fn poll_fds(&self) -> std::io::Result<(BorrowedFd<'_>, Option<BorrowedFd<'_>>)> {
        let wake = match self.inner.wake.get() {
            Some(fd) => fd,
            None => {
                let fd = rustix::event::eventfd(0, EventfdFlags::CLOEXEC | EventfdFlags::NONBLOCK)?;
                let _ = self.inner.wake.set(fd);
                // A cancel that came before the eventfd existed must still be seen.
                if self
                    .inner
                    .state
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .reason
                    .is_some()
                {
                    self.wake();
                }
                self.inner.wake.get().expect("set above")
            }
        };
        Ok((wake.as_fd(), self.inner.watch))
    }

    /// Read the wake eventfd back to zero.
    pub fn clear_wake(&self) {
        if let Some(fd) = self.inner.wake.get() {
            let mut b = [0u8; 8];
            let _ = rustix::io::read(fd, &mut b);
        }
    }

    /// Whether the watched descriptor is readable or hung up now.
    fn watched_ended(&self) -> bool {
        self.inner
            .watch
            .is_some_and(|fd| wait_readable(&[Some(fd)], Some(Duration::ZERO))[0])
    }

    /// Wait until poked, cancelled or `until`; returns whether the deadline passed.
    pub fn wait_until(&self, until: Option<Instant>, mut done: impl FnMut() -> bool) -> bool {
        let (m, cv) = (&self.inner.state, &self.inner.changed);
        let mut s = m.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if s.reason.is_some() || done() {
                return false;
            }
            let wait = match until {
                Some(t) => {
                    let now = Instant::now();
                    if now >= t {
                        return true;
                    }
                    t - now
                }
                None => Duration::from_secs(3600),
            };
            s = cv
                .wait_timeout(s, wait)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }
}

/// Wait at most `timeout` (None: without end) for `fds`; which of them are ready, in order.
pub fn wait_readable(fds: &[Option<BorrowedFd<'_>>], timeout: Option<Duration>) -> Vec<bool> {
    use rustix::event::Timespec;
    let present: Vec<BorrowedFd<'_>> = fds.iter().flatten().copied().collect();
    let mut polled: Vec<PollFd<'_>> = present
        .iter()
        .map(|fd| PollFd::new(fd, PollFlags::IN))
        .collect();
    let t = timeout.map(|d| Timespec {
        tv_sec: i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
        tv_nsec: i64::from(d.subsec_nanos()),
    });
    // EINTR and the like: report nothing ready; the caller looks at its state again.
    let _ = rustix::event::poll(&mut polled, t.as_ref());
    let mut ready = polled.iter().map(|p| !p.revents().is_empty());
    fds.iter()
        .map(|fd| fd.is_some() && ready.next().unwrap_or(false))
        .collect()
}
