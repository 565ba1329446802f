//! Running a request's untrusted work — archive extraction, discovery, init, generate and
//! parameter commands — in a jail: a fresh process of our own binary per request, with a leased
//! UID/GID, no capabilities, no_new_privs, Landlock and seccomp ([`confined::Confined`], set-up
//! order in [`confine`]). The server calls only [`Runner`].
//!
//! Knows nothing of gRPC.
// `unsafe` is denied everywhere but `sys`, which holds the one raw call (with a SAFETY note).
#![deny(unsafe_code)]

pub mod cancel;
pub mod cgroup;
pub mod child;
pub mod confine;
pub mod confined;
pub mod factory;
pub mod namespaces;
pub mod privilege;
pub mod protocol;
pub mod reaper;
pub mod record;
pub mod redact;
pub mod request;
pub mod run;
pub mod seccomp;
pub mod sys;
pub mod uid;

use std::io::Read;

pub use cancel::{CancelReason, CancelToken};
pub use request::{Operation, Outcome, RequestError, RequestSpec};
pub use run::{CmdError, CmdOutput, CmdSpec, TimeLimit};

/// Executes requests. Blocking: the server calls it from a blocking thread.
pub trait Runner: Send + Sync + std::fmt::Debug {
    /// Run `spec`, reading the archive from `input`, until done or `cancel` fires.
    fn execute(
        &self,
        spec: &RequestSpec,
        input: Box<dyn Read + Send>,
        cancel: &CancelToken,
    ) -> Result<Outcome, RequestError>;
    /// Remove everything `execute` left for `spec` (processes, tree, lease). Called once per
    /// request after its result has been sent.
    fn reclaim(&self, spec: &RequestSpec);
    /// Retire what the runner keeps ready for the next request (a spare jail) and reclaim it;
    /// called once when the server stops.
    fn shutdown(&self) {}
    /// One line describing what this runner enforces (logged at start-up).
    fn describe(&self) -> &'static str;
}
