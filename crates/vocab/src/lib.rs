//! The vocabulary every room shares: plain data with its pure rules, serde only, no I/O. What
//! a policy says, what the proxy enforces and what the audit event records are these types, so
//! a room that only reads them (the policy, the audit event) depends on nothing that runs.
//!
//! - `egress`: the allow list (host patterns, CIDRs, ports), how a destination is decided
//!   against it, and each connection's record.
//! - `record`: what a request did (`RunRecord`): its commands, archive, identity, the limit
//!   that ended it and what the sandbox refused; the audit event carries it.
//! - `request`: what a request asks (`Operation`), what comes back (`Outcome`, announced
//!   parameters) and how it fails (`RequestError`, `ErrorKind`).
//!
//! Architecture invariant: depends on std and serde only (the architecture test checks it).
#![forbid(unsafe_code)]

pub mod egress;
pub mod record;
pub mod request;
