//! The supervisor: the privileged side, in the server process. It starts fail closed
//! ([`Supervisor::start`], a numbered sequence in `start`), translates each policy once into
//! what the runtime enforces (`plan`), and runs each request in a jail: the runner leases a
//! UID, creates the request's cgroup, forks a jail through the factory, feeds it the request
//! and reclaims everything it left. Knows nothing of gRPC; the server calls [`Runner`].
//!
//! The rooms around it:
//! - the jail itself is the `jail` crate (the confined side): it confines itself (`confine`,
//!   a numbered sequence) before it reads any byte of a request, then extracts the archive and
//!   runs the commands. This crate names only its entry points (`jail_main`, `fill_main`);
//! - they share only `jail-wire` (the pipe protocol, and the request's vocabulary re-exported
//!   here as [`spec`] and [`record`]), `seccomp` (the filter, compiled here, installed there)
//!   and `jail-sys` (the kernel primitives);
//! - `factory` is the process boundary itself: the process that forks each jail; `keeper`
//!   holds the tree cache's trees; `reclaim` kills and removes what a request left, as its UID.
//!
//! Architecture invariant: nothing here names gRPC, HTTP or Argo CD's types; a request
//! arrives as a [`RequestSpec`] and leaves as an [`Outcome`].
#![forbid(unsafe_code)]

pub mod cache;
mod current;
mod factory;
mod keeper;
pub mod landlock_log;
mod plan;
mod privilege;
pub(crate) mod reclaim;
mod reload;
pub(crate) mod runner;
mod start;
pub(crate) mod uid;
mod watch;

pub use jail_wire::{record, redact, spec};

use std::io::Read;

use vocab::request::{Outcome, RequestError};

pub use cache::CacheStats;
pub use current::{Current, PlanSource};
pub use factory::{FACTORY_ARG, factory_main};
pub use jail_sys::cancel::{CancelReason, CancelToken};
pub use jail_wire::protocol::KILL_GRACE;
pub use jail_wire::spec::{Task, parse_generated};
pub use keeper::{KEEPER_ARG, keeper_main};
pub use plan::{Overrides, Plan, Plans, PolicyIndex, RequestSpec, Selected, wanted_namespaces};
pub use privilege::{PrivilegeModel, Privileges};
pub use reclaim::{RECLAIM_ARG, reclaim_main};
pub use reload::{ReloadRefused, Reloaded};
pub use runner::ReplyShare;
pub use start::{
    Bind, DenialLog, Enforcement, Owner, StartError, StartOptions, Supervisor, missing_required,
    privileges_now, start_without_jails,
};
pub use uid::{proc_uid, processes_in_range};

#[doc(hidden)]
pub mod bench;

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
