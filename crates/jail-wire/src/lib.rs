//! What crosses the process boundary between the supervisor and the jail: the pipe's frames
//! and messages (`protocol`, with the constants both sides need), the request's vocabulary
//! (`spec`), the audit record both sides fill (`record`) and the redaction every printed line
//! goes through (`redact`).
//!
//! The privileged side (`supervisor`) and the confined side (`jail`) each depend on this crate
//! and never on each other's internals: the supervisor names only the jail's entry points,
//! and the jail cannot name the supervisor at all.
#![forbid(unsafe_code)]

pub mod protocol;
pub mod record;
pub mod redact;
pub mod spec;
