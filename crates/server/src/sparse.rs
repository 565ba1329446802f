//! Warnings a flood could repeat endlessly: each occurrence logged at debug, and a warning
//! at most once every 10 s with how many occurred since the last; the accept loops' back-off
//! after a failed accept, which says so this way.

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// One kind of warning, said sparsely.
#[derive(Debug)]
pub struct Sparse(Mutex<(Option<Instant>, u64)>);

impl Sparse {
    /// A fresh one (for statics).
    pub const fn new() -> Self {
        Self(Mutex::new((None, 0)))
    }

    /// Note one occurrence of `what` with `detail`.
    pub fn warn(&self, what: &str, detail: &dyn std::fmt::Display) {
        tracing::debug!(detail = %detail, "{what}");
        let mut g = self.0.lock().unwrap_or_else(|e| e.into_inner());
        g.1 += 1;
        if g.0.is_none_or(|t| t.elapsed() >= Duration::from_secs(10)) {
            tracing::warn!(detail = %detail, count = g.1, "{what} (said at most every 10 s; count since the last)");
            *g = (Some(Instant::now()), 0);
        }
    }
}

impl Default for Sparse {
    fn default() -> Self {
        Self::new()
    }
}

/// After a failed accept: wait before the next one (out of descriptors, EMFILE or ENFILE,
/// lasts until a connection closes; retrying at once spins a core and floods the log), and
/// say so at most once every 10 s, with how many failed meanwhile.
#[derive(Debug, Default)]
pub(crate) struct AcceptErrors(Sparse);

impl AcceptErrors {
    pub(crate) async fn after(&mut self, listener: &str, e: &std::io::Error) {
        self.0.warn(
            "accept failed; retrying every 100 ms",
            &format_args!("{listener}: {e}"),
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
