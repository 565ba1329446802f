//! Admission: at most `max_in_flight` requests hold a jail at once; up to `max_queued` more wait
//! their turn within their own deadline; beyond that a request is refused at once, saying so.
//! Stalled streams are bounded separately (`stream_idle`, the archive's wall clock) so a slot is
//! never held by a client that stopped sending.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::status::StreamError;

/// The limits, from `serve`'s flags.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AdmissionConfig {
    /// Requests holding a jail at once (`--max-in-flight`).
    pub max_in_flight: usize,
    /// Requests waiting for a slot (`--max-queued`).
    pub max_queued: usize,
    /// Longest pause between two messages of a request's stream (`--stream-idle-timeout`).
    pub stream_idle: Duration,
}

impl Default for AdmissionConfig {
    fn default() -> Self {
        AdmissionConfig {
            max_in_flight: 32,
            max_queued: 256,
            stream_idle: Duration::from_secs(30),
        }
    }
}

/// The shared gate.
#[derive(Debug)]
pub struct Admission {
    cfg: AdmissionConfig,
    slots: Arc<Semaphore>,
    waiting: AtomicUsize,
}

/// A slot, given back when dropped (after the request's jail is reclaimed).
pub type Slot = OwnedSemaphorePermit;

impl Admission {
    /// A gate with `cfg`'s limits.
    pub fn new(cfg: AdmissionConfig) -> Self {
        Admission {
            slots: Arc::new(Semaphore::new(cfg.max_in_flight.max(1))),
            waiting: AtomicUsize::new(0),
            cfg,
        }
    }

    /// Requests waiting now.
    pub fn waiting(&self) -> usize {
        self.waiting.load(Ordering::SeqCst)
    }

    /// A slot now, or after waiting in the queue until `deadline`; refused at once when the
    /// queue is full, or when the deadline passes first.
    pub async fn admit(&self, deadline: Option<Instant>) -> Result<Slot, StreamError> {
        if let Ok(s) = self.slots.clone().try_acquire_owned() {
            return Ok(s);
        }
        let before = self.waiting.fetch_add(1, Ordering::SeqCst);
        let _left = Waiting(&self.waiting);
        if before >= self.cfg.max_queued {
            return Err(StreamError::Busy(format!(
                "{} requests are running and {} waiting, the most this server queues (--max-in-flight {}, --max-queued {}); retry",
                self.cfg.max_in_flight, before, self.cfg.max_in_flight, self.cfg.max_queued
            )));
        }
        tracing::debug!(
            waiting = before + 1,
            "request queued for a slot (--max-in-flight, --max-queued)"
        );
        let started = Instant::now();
        let acquire = self.slots.clone().acquire_owned();
        let got = match deadline {
            Some(d) => tokio::time::timeout_at(d.into(), acquire).await.ok(),
            None => Some(acquire.await),
        };
        match got {
            Some(Ok(s)) => Ok(s),
            _ => Err(StreamError::Busy(format!(
                "waited {} ms for one of the {} request slots until the request's deadline (--max-in-flight)",
                started.elapsed().as_millis(),
                self.cfg.max_in_flight
            ))),
        }
    }
}

struct Waiting<'a>(&'a AtomicUsize);

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn requests_wait_their_turn_then_a_full_queue_is_refused_at_once() {
        let a = Admission::new(AdmissionConfig {
            max_in_flight: 1,
            max_queued: 1,
            stream_idle: Duration::from_secs(1),
        });
        let first = a.admit(None).await.expect("a free slot");
        // The second waits for the first; a third finds the queue full.
        let a = Arc::new(a);
        let waiter = {
            let a = a.clone();
            tokio::spawn(async move { a.admit(None).await.map(|_| ()) })
        };
        while a.waiting() == 0 {
            tokio::task::yield_now().await;
        }
        let third = a.admit(None).await.expect_err("queue full");
        assert!(third.to_string().contains("--max-queued 1"), "{third}");
        drop(first);
        waiter
            .await
            .expect("join")
            .expect("admitted once the first left");
        // A deadline that passes in the queue is refused with what it waited for.
        let held = a.admit(None).await.expect("slot");
        let late = a
            .admit(Some(Instant::now() + Duration::from_millis(50)))
            .await
            .expect_err("deadline");
        assert!(late.to_string().contains("--max-in-flight"), "{late}");
        drop(held);
        assert_eq!(a.waiting(), 0);
    }
}
