//! Running a request's untrusted work — archive extraction, discovery, init, generate and
//! parameter commands — in a jail: a fresh process per request, with a leased UID/GID, no
//! capabilities, no_new_privs, Landlock, seccomp, cgroups and namespaces.
//!
//! The privileged side, and the public face of four crates:
//! - [`supervisor`] runs in the server process and holds its privileges: [`Supervisor::start`]
//!   (the start-up sequence, fail closed), the one translation of a policy into what the
//!   runtime enforces (`supervisor::plan`), and the runner that leases UIDs, creates cgroups,
//!   feeds jails and reclaims them;
//! - the jail itself is the `jail-inside` crate: it confines itself (`confine`, a numbered
//!   sequence) before it reads any byte of a request, then extracts the archive and runs the
//!   commands. This crate names only its entry points (`jail_main`, `fill_main`);
//! - they share only `jail-wire` (the pipe protocol, and the request's vocabulary re-exported
//!   here as [`spec`] and [`record`]) and `jail-sys` (the kernel primitives).
//!
//! `factory` is the boundary itself: the process that forks each jail. Knows nothing of gRPC;
//! the server calls [`Runner`].
// `unsafe` lives in `jail_sys::sys` only.
#![forbid(unsafe_code)]

mod factory;
mod keeper;
pub mod supervisor;

pub use jail_wire::{record, redact, spec};

use std::io::Read;

pub use factory::{FACTORY_ARG, factory_main};
pub use jail_sys::cancel::{CancelReason, CancelToken};
pub use jail_wire::protocol::KILL_GRACE;
pub use jail_wire::record::{Limit, RunRecord};
pub use jail_wire::spec::{
    ErrorKind, GENERATOR_REQUEST, Operation, Outcome, PolicyIndex, RequestError, RequestSpec, Task,
    TimeLimit, bounded, parse_generated,
};
pub use keeper::{KEEPER_ARG, keeper_main};
pub use supervisor::reclaim::{RECLAIM_ARG, reclaim_main};
pub use supervisor::runner::ReplyShare;
pub use supervisor::uid::{proc_uid, processes_in_range};
pub use supervisor::{
    DenialLog, Enforcement, Owner, Plan, Plans, StartError, StartOptions, Supervisor,
};

/// For the benchmark harness only: one command run as the jail runs it, to measure the
/// runner's cost over a bare spawn; and the orphan reaping a harness that is the subreaper of
/// other sandboxes needs to count their CPU in the right window.
#[doc(hidden)]
pub mod bench {
    pub use jail_inside::{CmdSpec, run};
    pub use jail_sys::reaper::reap_orphans;
}

/// What [`Runner::execute`] produced: the outcome, and its share of the server's reply memory,
/// which the caller holds until the response is written.
#[derive(Debug)]
pub struct Executed {
    /// The request's result.
    pub outcome: Outcome,
    /// Held until the response is written (dropping it lets the next large reply in).
    pub memory: ReplyShare,
}

impl From<Outcome> for Executed {
    fn from(outcome: Outcome) -> Self {
        Executed {
            outcome,
            memory: ReplyShare::default(),
        }
    }
}

/// Executes requests. Blocking: the server calls it from a blocking thread.
pub trait Runner: Send + Sync + std::fmt::Debug {
    /// Run `spec`, reading the archive from `input`, until done or `cancel` fires.
    fn execute(
        &self,
        spec: &RequestSpec,
        input: Box<dyn Read + Send>,
        cancel: &CancelToken,
    ) -> Result<Executed, RequestError>;
    /// Remove everything `execute` left for `spec` (processes, tree, lease). Called once per
    /// request after its result has been sent.
    fn reclaim(&self, spec: &RequestSpec);
    /// Retire what the runner keeps ready for the next request (a spare jail) and reclaim it;
    /// called once when the server stops.
    fn shutdown(&self) {}
    /// One line describing what this runner enforces (logged at start-up).
    fn describe(&self) -> &'static str;
}
