//! What the kernel offers the jail and its supervisor, with no notion of a request: the raw
//! system calls (`sys`, the only module of the project with `unsafe`), the seccomp filter
//! (compiled by the supervisor, installed and served inside the jail), the orphan reaper and
//! the cancellation flag a blocking request waits on.
//!
//! The bottom of the jail's crates: `jail-wire` (the pipe and the request's vocabulary),
//! `jail-inside` (the confined side) and `jail` (the privileged side) build on it.
// `unsafe` is denied everywhere but `sys`, which holds every raw call (each with a SAFETY note).
#![deny(unsafe_code)]

pub mod cancel;
pub mod reaper;
pub mod seccomp;
pub mod sys;

pub use cancel::{CancelReason, CancelToken};
