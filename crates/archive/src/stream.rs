//! Counting readers on both sides of the decompressor.
//!
//! Limit violations are recorded in a shared [`Tripwire`] before an opaque `io::Error` is returned,
//! because the tar parser in between re-wraps errors; the pipeline asks the tripwire first.

use std::cell::{Cell, RefCell};
use std::io::{self, Read};
use std::rc::Rc;
use std::time::Instant;

use sha2::{Digest, Sha256};

use crate::error::{LimitKind, Reason};
use crate::limits::Limits;

/// State shared by the readers of one extraction.
#[derive(Debug, Default)]
pub(crate) struct Shared {
    reason: RefCell<Option<Reason>>,
    compressed: Cell<u64>,
}

/// Handle to [`Shared`].
pub(crate) type Tripwire = Rc<Shared>;

impl Shared {
    /// Record the first reason and return an error to unwind with.
    pub(crate) fn trip(&self, reason: Reason) -> io::Error {
        let msg = reason.to_string();
        let mut slot = self.reason.borrow_mut();
        if slot.is_none() {
            *slot = Some(reason);
        }
        io::Error::other(msg)
    }

    /// Take the recorded reason, if any.
    pub(crate) fn take(&self) -> Option<Reason> {
        self.reason.borrow_mut().take()
    }

    /// Compressed bytes consumed so far.
    pub(crate) fn compressed(&self) -> u64 {
        self.compressed.get()
    }
}

/// Reads the untrusted input: hashes and counts every byte, enforces the compressed cap.
#[derive(Debug)]
pub(crate) struct Compressed<R> {
    inner: R,
    hasher: Option<Sha256>,
    cap: u64,
    deadline: Instant,
    wall_secs: u64,
    wire: Tripwire,
}

impl<R: Read> Compressed<R> {
    pub(crate) fn new(
        inner: R,
        limits: &Limits,
        deadline: Instant,
        wire: Tripwire,
        digest: bool,
    ) -> Self {
        Self {
            inner,
            hasher: digest.then(Sha256::new),
            cap: limits.compressed_bytes,
            deadline,
            wall_secs: limits.wall_clock.as_secs(),
            wire,
        }
    }

    /// The SHA-256 of everything read, if it was asked for.
    pub(crate) fn finish(self) -> Option<[u8; 32]> {
        self.hasher.map(|h| h.finalize().into())
    }
}

impl<R: Read> Read for Compressed<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if Instant::now() > self.deadline {
            return Err(self
                .wire
                .trip(Reason::limit(LimitKind::WallClock, self.wall_secs)));
        }
        let n = loop {
            match self.inner.read(buf) {
                Ok(n) => break n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(self.wire.trip(Reason::io("read input", e))),
            }
        };
        let total = self.wire.compressed.get() + n as u64;
        self.wire.compressed.set(total);
        if total > self.cap {
            return Err(self
                .wire
                .trip(Reason::limit(LimitKind::CompressedBytes, self.cap)));
        }
        if let Some(h) = &mut self.hasher {
            h.update(&buf[..n]);
        }
        Ok(n)
    }
}

/// Reads the decompressed tar stream: counts bytes, enforces the extracted cap, the ratio rule
/// and the wall clock.
#[derive(Debug)]
pub(crate) struct Decompressed<R> {
    inner: R,
    count: u64,
    cap: u64,
    max_ratio: u64,
    grace: u64,
    deadline: Instant,
    wall_secs: u64,
    wire: Tripwire,
}

impl<R: Read> Decompressed<R> {
    pub(crate) fn new(inner: R, limits: &Limits, deadline: Instant, wire: Tripwire) -> Self {
        Self {
            inner,
            count: 0,
            cap: limits.extracted_bytes,
            max_ratio: limits.max_ratio,
            grace: limits.ratio_grace_bytes,
            deadline,
            wall_secs: limits.wall_clock.as_secs(),
            wire,
        }
    }

    /// Bytes of tar stream read so far.
    pub(crate) fn count(&self) -> u64 {
        self.count
    }

    pub(crate) fn into_inner(self) -> R {
        self.inner
    }
}

impl<R: Read> Read for Decompressed<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if Instant::now() > self.deadline {
            return Err(self
                .wire
                .trip(Reason::limit(LimitKind::WallClock, self.wall_secs)));
        }
        let n = self.inner.read(buf)?;
        self.count += n as u64;
        if self.count > self.cap {
            return Err(self
                .wire
                .trip(Reason::limit(LimitKind::ExtractedBytes, self.cap)));
        }
        if self.count >= self.grace
            && self.count > self.wire.compressed().saturating_mul(self.max_ratio)
        {
            return Err(self
                .wire
                .trip(Reason::limit(LimitKind::CompressionRatio, self.max_ratio)));
        }
        Ok(n)
    }
}
