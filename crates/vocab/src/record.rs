//! What a request did, for the audit log: each command (argv, exit, duration, peak memory,
//! output sizes), the archive, the identity and cgroup it ran under, the limit or denial that
//! ended it, and what the sandbox refused (seccomp, Landlock, egress). Filled by the jail and
//! completed by the supervisor; never holds an environment value or command output.

use serde::{Deserialize, Serialize};

use crate::egress::Connection;

/// The limit or denial that ended a request or a command: one vocabulary for the audit event's
/// `limit` and `commands[].endedBy`, the metrics' reasons and the error texts. Serialised as the
/// audit format's names (`memory`, `pids`, …).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Limit {
    /// The request's memory cgroup killed a process (`spec.limits.memoryBytes`).
    Memory,
    /// The request's pids cgroup (or RLIMIT_NPROC) refused a fork (`spec.limits.pids`).
    Pids,
    /// A command said it ran out of memory with no OOM kill of the request: an allocation
    /// refused under the per-process heap limit (`spec.limits.dataBytes`).
    Heap,
    /// The request's tmpfs filled up (`spec.limits.diskBytes`).
    Disk,
    /// The node's disk under the work directory filled up: without a mount namespace the
    /// request's tree is written there and `spec.limits.diskBytes` does not apply.
    WorkDisk,
    /// A deadline of the server's: the policy's wall clock or `ARGOCD_EXEC_TIMEOUT`.
    Timeout,
    /// The client's deadline (`grpc-timeout`: Argo CD's repo-server passes its caller's,
    /// `controller.repo.server.timeout.seconds`), reached before the policy's wall clock.
    ClientDeadline,
    /// A command's stdout or stderr budget (`spec.limits.outputBytes`).
    Output,
    /// A seccomp rule denied a call (or killed a command with SIGSYS).
    Seccomp,
    /// The archive was refused (policy, limit or integrity).
    Archive,
    /// The client cancelled, or the server shut down.
    Cancelled,
    /// A TCP peer without the bearer token.
    Authentication,
    /// The generator's request body was too large or unreadable.
    Body,
    /// The generator's concurrency slots were all taken.
    Concurrency,
}

impl Limit {
    /// The name used in audit events and metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            Limit::Memory => "memory",
            Limit::Pids => "pids",
            Limit::Heap => "heap",
            Limit::Disk => "disk",
            Limit::WorkDisk => "workDisk",
            Limit::Timeout => "timeout",
            Limit::ClientDeadline => "clientDeadline",
            Limit::Output => "output",
            Limit::Seccomp => "seccomp",
            Limit::Archive => "archive",
            Limit::Cancelled => "cancelled",
            Limit::Authentication => "authentication",
            Limit::Body => "body",
            Limit::Concurrency => "concurrency",
        }
    }

    /// Whether this limit ends a request by killing its commands (the metrics'
    /// `cmp_warden_sandbox_kills_total` reasons).
    pub fn kills(self) -> bool {
        matches!(
            self,
            Limit::Timeout
                | Limit::ClientDeadline
                | Limit::Memory
                | Limit::Pids
                | Limit::Output
                | Limit::Seccomp
                | Limit::Disk
        )
    }
}

impl std::fmt::Display for Limit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Which of the plugin's commands ran.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Phase {
    /// `spec.discover.find.command`.
    Discover,
    /// `spec.init`.
    Init,
    /// `spec.generate` (the default of an empty record).
    #[default]
    Generate,
    /// `spec.parameters.dynamic`.
    Parameters,
    /// The ApplicationSet generator's command.
    Generator,
}

impl Phase {
    /// Its name in the audit event, logs and traces.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Discover => "discover",
            Self::Init => "init",
            Self::Generate => "generate",
            Self::Parameters => "parameters",
            Self::Generator => "generator",
        }
    }
}

impl std::fmt::Display for Phase {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.pad(self.as_str())
    }
}

/// One command run.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CommandRecord {
    /// Which command.
    pub phase: Phase,
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
    pub ended_by: Option<Limit>,
    /// When it started (Unix epoch, nanoseconds; 0: unknown), for its trace span.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub started_unix_nanos: u64,
}

/// The archive as extracted.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ArchiveRecord {
    /// Entries written.
    pub entries: u64,
    /// File bytes written.
    pub file_bytes: u64,
    /// When extraction started (Unix epoch, nanoseconds; 0: unknown), for its trace span.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub started_unix_nanos: u64,
    /// How long extraction took (microseconds), for its trace span.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub duration_us: u64,
}

/// Something Landlock refused a command, from the kernel's own audit record (Landlock ABI 7
/// with audit enabled on the host; see `supervisor::landlock_log`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LandlockDenial {
    /// What was blocked, as the kernel names it (`fs.read_file`, `net.connect_tcp`, …).
    pub blockers: String,
    /// The object: a path, `address:port`, or a process.
    pub object: String,
    /// The policy field that allows it (none for what no policy allows, e.g. signals).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allowed_by: Option<String>,
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
    /// The limit or denial that ended the request.
    pub limit: Option<Limit>,
    /// Seccomp denials (enforce) or would-be denials (audit), by system call.
    pub seccomp_audit: Vec<SeccompEvent>,
    /// `network: allowList`: every connection through the egress proxy.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub egress: Vec<Connection>,
    /// Connections past the proxy's record limit (counted, not itemised).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub egress_unrecorded: u64,
    /// What Landlock refused the request's commands, when the kernel reports it (a failed
    /// request waits for the records; a successful one has those that arrived in time).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub landlock_denials: Vec<LandlockDenial>,
    /// A command failed while server variables were withheld from it: their names (never
    /// values), for the error and for `policy suggest`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub withheld_env: Vec<String>,
    /// Where the request's tree came from, when the tree cache runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tree_cache: Option<TreeCacheUse>,
}

/// Where a request's tree came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum TreeCacheUse {
    /// A sealed tree (its archive was extracted for an earlier request).
    Hit,
    /// This request's archive filled the tree it ran on.
    Filled,
    /// Extracted in the request's own jail (no claim to key it, the fills busy, the cache out
    /// of service).
    Uncached,
}

impl TreeCacheUse {
    /// `hit`, `filled` or `uncached`.
    pub fn as_str(self) -> &'static str {
        match self {
            TreeCacheUse::Hit => "hit",
            TreeCacheUse::Filled => "filled",
            TreeCacheUse::Uncached => "uncached",
        }
    }
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// What the seccomp listener did with a call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum SeccompAction {
    /// Denied (enforce mode).
    Denied,
    /// Allowed, but enforce mode would have denied it (audit mode).
    Audited,
}

impl SeccompAction {
    /// The name used in audit events and metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            SeccompAction::Denied => "denied",
            SeccompAction::Audited => "audited",
        }
    }
}

/// A system call the seccomp profile denied (enforce mode) or would have denied (audit mode).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SeccompEvent {
    /// System call name (or `nr:<n>` if unknown to this build).
    pub syscall: String,
    /// `denied` or `audited` (allowed in audit mode).
    pub action: SeccompAction,
    /// How many times.
    pub count: u64,
    /// The first command (argv[0]) seen making it.
    pub comm: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_serialise_as_the_audit_names() {
        for l in [
            Limit::Memory,
            Limit::Pids,
            Limit::Disk,
            Limit::WorkDisk,
            Limit::Timeout,
            Limit::ClientDeadline,
            Limit::Output,
            Limit::Seccomp,
            Limit::Archive,
            Limit::Cancelled,
            Limit::Authentication,
            Limit::Body,
            Limit::Concurrency,
        ] {
            let json = serde_json::to_string(&l).expect("json");
            assert_eq!(json, format!("\"{}\"", l.as_str()));
            assert_eq!(serde_json::from_str::<Limit>(&json).expect("back"), l);
        }
        for a in [SeccompAction::Denied, SeccompAction::Audited] {
            assert_eq!(
                serde_json::to_string(&a).expect("json"),
                format!("\"{}\"", a.as_str())
            );
        }
    }
}
