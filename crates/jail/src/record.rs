//! What a request did, for the audit log: each command (argv, exit, duration, peak memory,
//! output sizes), the archive, the identity and cgroup it ran under, and the limit or denial
//! that ended it. Filled by the jail and completed by the supervisor; never holds an
//! environment value or command output.

use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};

/// One command run.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CommandRecord {
    /// `discover`, `init`, `generate` or `parameters`.
    pub phase: String,
    /// argv as configured (arguments come from plugin.yaml, not from the request).
    pub argv: Vec<String>,
    /// Exit code, when it exited.
    pub exit_code: Option<i32>,
    /// Signal name (e.g. `SIGKILL`), when a signal ended it.
    pub signal: Option<String>,
    /// Wall-clock duration.
    pub duration_ms: u64,
    /// Peak resident memory of the largest process of the command's tree (wait4 rusage).
    pub peak_rss_bytes: Option<u64>,
    /// Bytes it wrote to stdout (up to the budget).
    pub stdout_bytes: u64,
    /// Bytes it wrote to stderr (up to the budget).
    pub stderr_bytes: u64,
    /// The limit that ended it: `timeout`, `output`, `cancelled`, `seccomp` (SIGSYS).
    pub ended_by: Option<String>,
}

/// The archive as extracted.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ArchiveRecord {
    /// Entries written.
    pub entries: u64,
    /// File bytes written.
    pub file_bytes: u64,
}

/// A system call the seccomp profile denied (enforce mode) or would have denied (audit mode).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SeccompEvent {
    /// System call name (or `nr:<n>` if unknown to this build).
    pub syscall: String,
    /// `denied` or `audited` (allowed in audit mode).
    pub action: String,
    /// How many times.
    pub count: u64,
    /// The first command (argv[0]) seen making it.
    pub comm: String,
}

/// Everything recorded for one request.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RunRecord {
    /// Leased UID (None: the server's own UID).
    pub uid: Option<u32>,
    /// Leased GID.
    pub gid: Option<u32>,
    /// The request's cgroup (name under the server's cgroup directory).
    pub cgroup: Option<String>,
    /// The extracted archive.
    pub archive: Option<ArchiveRecord>,
    /// Commands in order.
    pub commands: Vec<CommandRecord>,
    /// Peak memory of the whole request (cgroup).
    pub peak_memory_bytes: Option<u64>,
    /// OOM kills in the request's cgroup.
    pub oom_kills: Option<u64>,
    /// The limit or denial that ended the request: `memory`, `pids`, `disk`, `timeout`,
    /// `output`, `seccomp`, `archive`, `cancelled`.
    pub limit: Option<String>,
    /// Seccomp denials (enforce) or would-be denials (audit), by system call.
    pub seccomp_audit: Vec<SeccompEvent>,
}

/// Shared between the runner (which fills it) and the service (which logs it).
pub type Recorder = Arc<Mutex<RunRecord>>;

/// Update the record behind `r` (a poisoned lock still records).
pub fn update(r: &Recorder, f: impl FnOnce(&mut RunRecord)) {
    f(&mut r.lock().unwrap_or_else(|e| e.into_inner()));
}

/// A copy of the record.
pub fn snapshot(r: &Recorder) -> RunRecord {
    r.lock().unwrap_or_else(|e| e.into_inner()).clone()
}
