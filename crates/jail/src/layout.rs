//! The jail's vocabulary, shared by its confinement steps (`confine`, `namespaces`,
//! `mounter`): the layout of the request directory, and a failed step.

use std::os::fd::OwnedFd;

use rustix::fs::{self as rfs, Mode};

/// The layout under the request directory.
pub const REPO_DIR: &str = "repo";
/// `$HOME` of the commands.
pub const HOME_DIR: &str = "home";
/// `$TMPDIR` of the commands.
pub const TMP_DIR: &str = "tmp";

/// `repo/`, `home/` and `tmp/` in the request directory.
pub(crate) fn make_subdirs(dir: &OwnedFd) -> Result<(), ConfineError> {
    for sub in [REPO_DIR, HOME_DIR, TMP_DIR] {
        rfs::mkdirat(dir, sub, Mode::from_raw_mode(0o700))
            .map_err(|e| fail(Step::RequestDirectory, e))?;
    }
    Ok(())
}

/// The step of the confinement that failed (`confine`'s numbered sequence names each).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    Namespaces,
    RequestDirectory,
    UserNamespace,
    MountNamespace,
    PidNamespace,
    Rlimits,
    Setsid,
    Setgroups,
    Setresgid,
    Setresuid,
    Credentials,
    TreeCache,
    Dumpable,
    NoNewPrivs,
    Seccomp,
    Network,
    Capget,
    BoundingSet,
    AmbientCapabilities,
    Capset,
    Capabilities,
    Landlock,
}

impl Step {
    /// The step's name in messages.
    pub fn as_str(self) -> &'static str {
        match self {
            Step::Namespaces => "namespaces",
            Step::RequestDirectory => "request directory",
            Step::UserNamespace => "user namespace",
            Step::MountNamespace => "mount namespace",
            Step::PidNamespace => "pid namespace",
            Step::Rlimits => "rlimits",
            Step::Setsid => "setsid",
            Step::Setgroups => "setgroups",
            Step::Setresgid => "setresgid",
            Step::Setresuid => "setresuid",
            Step::Credentials => "credentials",
            Step::TreeCache => "tree cache",
            Step::Dumpable => "dumpable",
            Step::NoNewPrivs => "no_new_privs",
            Step::Seccomp => "seccomp",
            Step::Network => "network",
            Step::Capget => "capget",
            Step::BoundingSet => "bounding set",
            Step::AmbientCapabilities => "ambient capabilities",
            Step::Capset => "capset",
            Step::Capabilities => "capabilities",
            Step::Landlock => "landlock",
        }
    }
}

impl std::fmt::Display for Step {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A step that failed (the request is aborted with this message).
#[derive(Debug, thiserror::Error)]
pub enum ConfineError {
    /// The step's call failed, or what it set did not read back.
    #[error("sandbox: {step}: {why}")]
    Failed {
        /// Which step.
        step: Step,
        /// What went wrong (the call's error, or what read back).
        why: String,
    },
    /// Handing a descriptor over to the supervisor failed.
    #[error("sandbox: {step}: handing the {what} over: {source}")]
    HandOver {
        /// Which step.
        step: Step,
        /// What was handed over.
        what: &'static str,
        /// The send's error.
        source: rustix::io::Errno,
    },
}

impl ConfineError {
    /// The supervisor closed its end while we confined (a spare jail of a command that is
    /// exiting): there is nobody to tell.
    pub fn supervisor_gone(&self) -> bool {
        matches!(
            self,
            ConfineError::HandOver {
                source: rustix::io::Errno::PIPE | rustix::io::Errno::CONNRESET,
                ..
            }
        )
    }
}

pub(crate) fn fail(step: Step, why: impl ToString) -> ConfineError {
    ConfineError::Failed {
        step,
        why: why.to_string(),
    }
}
