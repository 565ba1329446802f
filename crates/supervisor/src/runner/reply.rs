//! The jail's reply: read from its pipe within a bound, large ones sharing the
//! supervisor-wide reply memory until the response is written.

use super::{internal, lock};
use std::io::Read;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};
use vocab::request::{ErrorKind, RequestError};

/// Read the jail's `R` frame: `Ok(None)` if it closed stdout without one.
pub(super) fn read_reply(
    r: &mut impl Read,
    cap: u64,
    budget: &ReplyMemory,
    deadline: Option<Instant>,
) -> Result<Option<RawReply>, RequestError> {
    let max = usize::try_from(cap).unwrap_or(usize::MAX).saturating_add(1);
    // Stderr lines of the running command come first, each logged as it arrives.
    let mut head = jail_wire::protocol::read_frame_head(r, max);
    while let Ok(Some((jail_wire::protocol::STDERR_LINE, n))) = head {
        log_stderr_line(r, n)?;
        head = jail_wire::protocol::read_frame_head(r, max);
    }
    match head {
        Ok(None) => Ok(None),
        Ok(Some((b'R', n))) if n as u64 <= cap => {
            // Small replies (nearly all) never wait; a large one takes its size from the
            // supervisor-wide budget first (waiting for it within the request's time), so
            // concurrent large replies cannot add up. Allocated only once charged, and exactly
            // (a doubling Vec would hold up to twice the frame).
            let permit = budget.take(n as u64, deadline)?;
            let mut body = Vec::with_capacity(n);
            r.take(n as u64)
                .read_to_end(&mut body)
                .map_err(|e| internal(format!("reading the jail's reply: {e}")))?;
            if body.len() != n {
                return Err(internal("the jail's reply was cut short"));
            }
            Ok(Some((body, permit)))
        }
        Ok(Some((b'R', n))) => Err(RequestError::new(
            ErrorKind::ResourceExhausted,
            format!("the jail's reply ({n} bytes) exceeds {cap} bytes"),
        )),
        Ok(Some((t, _))) => Err(internal(format!("unexpected frame {t} from the jail"))),
        Err(e) => Err(internal(format!("reading the jail's reply: {e}"))),
    }
}

/// Log one [`jail_wire::protocol::StderrLine`] frame of `n` bytes (in the request's span).
pub(super) fn log_stderr_line(r: &mut impl Read, n: usize) -> Result<(), RequestError> {
    if n > jail_wire::protocol::STDERR_LINE_MAX {
        return Err(internal(format!(
            "a stderr line frame of {n} bytes from the jail"
        )));
    }
    let mut body = vec![0; n];
    r.read_exact(&mut body)
        .map_err(|e| internal(format!("reading the jail's stderr line: {e}")))?;
    let l: jail_wire::protocol::StderrLine = serde_json::from_slice(&body)
        .map_err(|e| internal(format!("the jail's stderr line: {e}")))?;
    if l.more_not_logged {
        tracing::info!(
            phase = %l.phase,
            "command stderr: further lines are not logged as they arrive (the error and the audit event carry what the command printed)"
        );
    } else {
        tracing::info!(phase = %l.phase, line = %l.line, "command stderr");
    }
    Ok(())
}

/// A reply's bytes and, for a large one, its share of the reply memory.
pub(super) type RawReply = (Vec<u8>, Option<ReplyPermit>);

/// Replies up to this size are read without a permit.
pub(super) const SMALL_REPLY: u64 = 1 << 20;

/// The supervisor-wide budget for large replies, from the jail's pipe until the response is
/// written (the raw frame, the parsed outcome and the encoded message are each at most the
/// frame's size, and never all three at once: the raw bytes are gone once parsed).
#[derive(Debug)]
pub(crate) struct ReplyMemory {
    state: Arc<(Mutex<u64>, Condvar)>,
    limit: u64,
}

/// A large reply's share of [`ReplyMemory`], returned when dropped.
#[derive(Debug)]
pub(crate) struct ReplyPermit {
    state: Arc<(Mutex<u64>, Condvar)>,
    bytes: u64,
}

impl Drop for ReplyPermit {
    fn drop(&mut self) {
        let (in_use, freed) = &*self.state;
        *lock(in_use) -= self.bytes;
        freed.notify_all();
    }
}

/// A request's share of the server's reply memory: held (with the outcome) until its response
/// is written, then dropped, which lets the next large reply in. Empty for small replies.
#[derive(Debug, Clone, Default)]
pub struct ReplyShare(Option<Arc<ReplyPermit>>);

impl ReplyShare {
    pub(super) fn new(permit: Option<ReplyPermit>) -> Self {
        ReplyShare(permit.map(Arc::new))
    }

    /// Bytes of the budget this share holds.
    pub fn bytes(&self) -> u64 {
        self.0.as_ref().map_or(0, |p| p.bytes)
    }
}

impl ReplyMemory {
    /// A budget of `limit` bytes.
    pub(crate) fn new(limit: u64) -> Self {
        ReplyMemory {
            state: Arc::new((Mutex::new(0), Condvar::new())),
            limit,
        }
    }

    /// `bytes` of the budget (at most all of it), waiting until other replies return enough
    /// or `deadline` passes (then ResourceExhausted).
    pub(super) fn take(
        &self,
        bytes: u64,
        deadline: Option<Instant>,
    ) -> Result<Option<ReplyPermit>, RequestError> {
        if bytes <= SMALL_REPLY {
            return Ok(None);
        }
        let bytes = bytes.min(self.limit);
        let (in_use, freed) = &*self.state;
        let mut used = lock(in_use);
        if *used + bytes > self.limit {
            tracing::info!(
                bytes,
                in_use = *used,
                budget = self.limit,
                "a large reply waits for the server's reply memory (twice ARGOCD_GRPC_MAX_SIZE_MB)"
            );
        }
        while *used + bytes > self.limit {
            let left = deadline.map(|d| d.saturating_duration_since(Instant::now()));
            if left == Some(Duration::ZERO) {
                return Err(RequestError::new(
                    ErrorKind::ResourceExhausted,
                    format!(
                        "this reply ({bytes} bytes) did not fit in the server's reply memory before the request's deadline: other large replies hold {} of {} bytes (twice ARGOCD_GRPC_MAX_SIZE_MB)",
                        *used, self.limit
                    ),
                ));
            }
            used = match left {
                Some(left) => {
                    freed
                        .wait_timeout(used, left)
                        .unwrap_or_else(|e| e.into_inner())
                        .0
                }
                None => freed.wait(used).unwrap_or_else(|e| e.into_inner()),
            };
        }
        *used += bytes;
        Ok(Some(ReplyPermit {
            state: self.state.clone(),
            bytes,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn large_replies_share_one_budget_wait_their_turn_and_small_ones_never_wait() {
        let m = Arc::new(ReplyMemory::new(10 << 20));
        let a = m.take(6 << 20, None).expect("fits").expect("a permit");
        // Past its deadline, a reply that does not fit is refused, naming the budget.
        let refused = m
            .take(6 << 20, Some(Instant::now() + Duration::from_millis(20)))
            .expect_err("over the budget");
        assert_eq!(refused.kind, ErrorKind::ResourceExhausted);
        assert!(refused.message.contains("ARGOCD_GRPC_MAX_SIZE_MB"));
        assert!(m.take(1 << 20, None).expect("small").is_none());
        // Within its deadline it waits until the first is returned.
        let m2 = m.clone();
        let waiter = std::thread::spawn(move || {
            m2.take(6 << 20, Some(Instant::now() + Duration::from_secs(10)))
                .map(|p| p.map(|p| p.bytes))
        });
        std::thread::sleep(Duration::from_millis(50));
        assert!(!waiter.is_finished(), "must wait while the budget is held");
        drop(a);
        assert_eq!(waiter.join().expect("thread").expect("fits"), Some(6 << 20));
        // One larger than the whole budget takes all of it rather than never fitting.
        let all = m.take(64 << 20, None).expect("fits").expect("permit");
        assert_eq!(all.bytes, 10 << 20);
        drop(all);
        assert_eq!(*lock(&m.state.0), 0);
    }
}
