//! A cancellation flag a blocking request can wait on (client cancel, deadline, shutdown).

use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

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

/// Shared between the server (which cancels) and the request (which waits).
#[derive(Debug, Clone, Default)]
pub struct CancelToken {
    inner: Arc<(Mutex<State>, Condvar)>,
}

impl CancelToken {
    /// A fresh token.
    pub fn new() -> Self {
        Self::default()
    }

    /// Cancel (first reason wins).
    pub fn cancel(&self, reason: CancelReason) {
        let (m, cv) = &*self.inner;
        let mut s = m.lock().unwrap_or_else(|e| e.into_inner());
        s.reason.get_or_insert(reason);
        cv.notify_all();
    }

    /// The reason, if cancelled.
    pub fn reason(&self) -> Option<CancelReason> {
        self.inner
            .0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .reason
    }

    /// Wake waiters without cancelling (a watched event happened).
    pub(crate) fn poke(&self) {
        let (m, cv) = &*self.inner;
        m.lock().unwrap_or_else(|e| e.into_inner()).generation += 1;
        cv.notify_all();
    }

    /// Wait until poked, cancelled or `until`; returns whether the deadline passed.
    pub(crate) fn wait_until(
        &self,
        until: Option<Instant>,
        mut done: impl FnMut() -> bool,
    ) -> bool {
        let (m, cv) = &*self.inner;
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
