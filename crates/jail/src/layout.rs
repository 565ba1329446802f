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
            .map_err(|e| fail("request directory", e))?;
    }
    Ok(())
}

/// A step that failed (the request is aborted with this message).
#[derive(Debug, thiserror::Error)]
#[error("sandbox: {step}: {why}")]
pub struct ConfineError {
    /// Which step.
    pub step: &'static str,
    /// What went wrong.
    pub why: String,
    /// The supervisor closed its end while we confined (a spare jail of a command that is
    /// exiting): there is nobody to tell.
    pub supervisor_gone: bool,
}

pub(crate) fn fail(step: &'static str, why: impl ToString) -> ConfineError {
    ConfineError {
        step,
        why: why.to_string(),
        supervisor_gone: false,
    }
}
