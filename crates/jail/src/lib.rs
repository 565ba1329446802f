//! Running a request's untrusted work: archive extraction, discovery, init, generate and
//! parameter commands. The server calls only [`Runner`]; today [`Unconfined`] runs the work in
//! the server's own process and user, and the confined runner (unique UID, Landlock, seccomp,
//! cgroups) replaces it behind the same trait without touching the server.
//!
//! Knows nothing of gRPC.
// `unsafe` is denied everywhere but `sys`, which holds the one raw call (with a SAFETY note).
#![deny(unsafe_code)]

pub mod cancel;
pub mod child;
pub mod confine;
pub mod confined;
pub mod privilege;
pub mod protocol;
pub mod reaper;
pub mod request;
pub mod run;
pub mod seccomp;
pub mod sys;
pub mod uid;

use std::io::Read;

pub use cancel::{CancelReason, CancelToken};
pub use request::{Operation, Outcome, RequestError, RequestSpec, execute};
pub use run::{CmdError, CmdOutput, CmdSpec};

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
    /// One line describing what this runner enforces (logged at start-up).
    fn describe(&self) -> &'static str;
}

/// Runs requests in the server's own process, as its own user (no confinement yet).
#[derive(Debug, Default)]
pub struct Unconfined;

impl Runner for Unconfined {
    fn execute(
        &self,
        spec: &RequestSpec,
        input: Box<dyn Read + Send>,
        cancel: &CancelToken,
    ) -> Result<Outcome, RequestError> {
        std::fs::create_dir(&spec.tree).map_err(RequestError::Workdir)?;
        execute(spec, input, cancel)
    }

    fn reclaim(&self, spec: &RequestSpec) {
        let res = archive::DirWriter::open_root(&spec.tree)
            .and_then(|fd| archive::remove_contents(std::os::fd::AsFd::as_fd(&fd)))
            .and_then(|()| std::fs::remove_dir(&spec.tree));
        match res {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => {
                tracing::error!(tree = %spec.tree.display(), error = %e, "failed to remove request tree")
            }
        }
    }

    fn describe(&self) -> &'static str {
        "unconfined: commands run as the server's user in their own process group (no UID, Landlock or seccomp isolation yet)"
    }
}
