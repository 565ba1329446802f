//! What crosses the process boundary between the supervisor and the jail: the pipe's frames
//! and messages (`protocol`, with the constants both sides need), the request's vocabulary
//! (`spec`), the audit record both sides fill (`record`) and the redaction every printed line
//! goes through (`redact`).
//!
//! The privileged side (`jail`) and the confined side (`jail-inside`) each depend on this crate
//! and never on each other's internals: the jail crate names only `jail-inside`'s entry points,
//! and `jail-inside` cannot name the supervisor at all.
#![forbid(unsafe_code)]

pub mod protocol;
pub mod record;
pub mod redact;
pub mod spec;
