//! What the kernel offers the jail and its supervisor, with no notion of a request or a policy:
//! the raw system calls (`sys`, the only module of the project with `unsafe`), the orphan
//! reaper and the cancellation flag a blocking request waits on.
//!
//! Architecture invariant: depends on no crate of this project. `seccomp` (the filter),
//! `jail-wire` (the pipe and the request's vocabulary), `jail` (the confined side) and
//! `supervisor` (the privileged side) build on it.
// `unsafe` is denied everywhere but `sys`, which holds every raw call (each with a SAFETY note).
#![deny(unsafe_code)]

pub mod cancel;
pub mod reaper;
pub mod sys;

pub use cancel::{CancelReason, CancelToken};
