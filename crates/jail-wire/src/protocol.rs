//! The supervisor ⇄ jail pipe protocol. Trusted in both directions only as far as framing: the
//! supervisor writes the preparation, the request header and the archive; the jail answers one
//! [`Reply`], which the supervisor parses with a size cap (the jail runs hostile commands, so its
//! answer is input).
//!
//! stdin:  `P` len json(prepare) · `H` len json(header) · (`D` len bytes)* · `E`
//!         (with the tree cache: the jail first sends `T` + its mounter's socket, over which
//!         the supervisor has a lent tree mounted before `H`, which then says so)
//!         `P` is written when the jail is started (a spare confines itself while it waits for
//!         a request); `E` only after the checksum matched; after `E`, EOF on stdin means
//!         "cancel". Closing without `E` aborts the extraction; closing before `H` retires an
//!         unused jail.
//! stdout: one JSON [`Reply`], then EOF (none for a retired jail).

use std::io::{self, Read, Write};
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use policy::Namespace;
use seccomp::CompiledFilter;

/// Time between SIGTERM and SIGKILL (Argo CD's value): the jail's grace for a command, and
/// what the supervisor adds to a deadline before it kills the jail's UID.
pub const KILL_GRACE: std::time::Duration = std::time::Duration::from_secs(5);

/// The Landlock ABI whose access rights this build requests and was tested against (Linux
/// 6.15+): the jail asks for it, the supervisor's doctor compares the kernel's with it. Newer
/// kernels' extra rights are never requested implicitly.
pub const TESTED_LANDLOCK_ABI: landlock::ABI = landlock::ABI::V7;
use crate::spec::Task;
use vocab::request::{ErrorKind, Outcome};

/// Largest frame accepted (the header carries the plugin config; data frames are ≤ 64 KiB).
pub const MAX_FRAME: usize = 16 << 20;

/// The first frame, written when the jail is started: everything it needs to confine itself,
/// none of it from a request.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Prepare {
    /// The work root (sticky, world-writable, not listable) the jail's directory is made in.
    pub work_root: PathBuf,
    /// The jail's directory name (chosen by the supervisor, unique per jail).
    pub name: String,
    /// The confinement to apply.
    pub sandbox: Sandbox,
    /// The `cgroup.procs` files of the jail's cgroup (one per v1 hierarchy), joined before
    /// anything else.
    #[serde(default)]
    pub cgroup_procs: Vec<PathBuf>,
}

/// The second frame: the request, read only once the jail is confined.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum Header {
    /// Run a request.
    Request {
        /// The request's name in the supervisor's logs.
        request: String,
        /// What to run.
        task: Box<Task>,
        /// Milliseconds left until the request's deadline.
        deadline_ms: Option<u64>,
        /// The tree is already under the request directory (from the cache): no `D` frame
        /// follows, only `E` once the request's bytes matched their checksum.
        #[serde(default)]
        tree_attached: bool,
    },
    /// Confine, run the extractor self-test, report, exit (start-up probe and `doctor`).
    Probe {
        /// Directories outside the request directory the extractor must fail to write into
        /// once confined (the work root is always tried).
        writes: Vec<PathBuf>,
    },
}

/// The leased identity.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Creds {
    /// UID.
    pub uid: u32,
    /// GID (equal to the UID by construction).
    pub gid: u32,
}

/// Resource limits applied with setrlimit (soft = hard).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rlimits {
    /// RLIMIT_NOFILE.
    pub open_files: u64,
    /// RLIMIT_FSIZE.
    pub file_size_bytes: u64,
    /// RLIMIT_NPROC (only meaningful, and only applied, with a unique UID).
    pub processes: u64,
    /// RLIMIT_DATA (private writable memory per process; a heap backstop without cgroups).
    pub data_bytes: u64,
    /// RLIMIT_AS (virtual address space per process; generous: Go and V8 reserve a lot).
    pub address_space_bytes: u64,
}

/// The per-request filesystem (`diskBytes`) the mount namespace provides.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct DiskLimit {
    /// tmpfs `size=`.
    pub bytes: u64,
    /// tmpfs `nr_inodes=` (inodes cost kernel memory too).
    pub inodes: u64,
}

/// Everything the jail applies to itself, translated from the policy by
/// `supervisor::plan` (the only place that reads the policy for it).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Sandbox {
    /// Switch to these IDs; `None` in the shared-UID (unprivileged) model.
    pub creds: Option<Creds>,
    /// Read-only paths beyond the request directory.
    pub read_only: Vec<PathBuf>,
    /// Read-write paths beyond the request directory.
    pub read_write: Vec<PathBuf>,
    /// Network mode.
    pub network: policy::NetworkMode,
    /// `spec.network.loopback`: inet sockets on the jail's own loopback (needs its network
    /// namespace with `lo` up, else the jail refuses to confine).
    #[serde(default)]
    pub loopback: bool,
    /// The compiled seccomp filter; `None` only when the policy does not require seccomp and
    /// the supervisor could not compile it.
    pub seccomp: Option<CompiledFilter>,
    /// rlimits.
    pub rlimits: Rlimits,
    /// Protections whose failure aborts the request.
    pub require: Vec<policy::Protection>,
    /// What a required Landlock must provide (`spec.landlock`).
    #[serde(default)]
    pub landlock: policy::LandlockRequirement,
    /// Namespaces to create per request (best effort unless `namespaces` is required).
    pub namespaces: policy::Namespaces,
    /// The request's tmpfs (with a mount namespace).
    pub disk: DiskLimit,
    /// The tree cache is on: with its mount and PID namespaces the jail keeps a mounter (the
    /// namespace's unconfined parent, holding capabilities over the jail's own namespaces
    /// only) that can put a lent tree under the request directory before the request is
    /// read; the supervisor gets its socket (`T`) as the jail confines itself.
    #[serde(default)]
    pub tree_attach: bool,
    /// A benchmark build's layer pass (`supervisor::bench`): no Landlock ruleset. The field
    /// exists in no other build.
    #[cfg(feature = "bench-layers")]
    #[serde(default)]
    pub bench_no_landlock: bool,
}

impl Sandbox {
    /// Whether Landlock is switched off (only ever in a benchmark build).
    #[inline]
    pub fn landlock_switched_off(&self) -> bool {
        #[cfg(feature = "bench-layers")]
        {
            self.bench_no_landlock
        }
        #[cfg(not(feature = "bench-layers"))]
        {
            false
        }
    }
}

/// How much of the Landlock ruleset the kernel enforces.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum LandlockStatus {
    /// Every right this build asks for.
    Full,
    /// Some (an older kernel ABI).
    Partial,
    /// None (no Landlock here).
    None,
}

impl LandlockStatus {
    /// `full`, `partial` or `none`.
    pub fn as_str(self) -> &'static str {
        match self {
            LandlockStatus::Full => "full",
            LandlockStatus::Partial => "partial",
            LandlockStatus::None => "none",
        }
    }
}

/// Which protection a jail applied less of than asked (not required by the policy, so the jail
/// went on).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Reduced {
    /// `oom_score_adj` not raised to 1000.
    OomScoreAdj,
    /// No leased UID: commands share the server's.
    UniqueUid,
    /// A namespace could not be created.
    Namespaces,
    /// No private tmpfs: `diskBytes` not enforced.
    Disk,
    /// The capability bounding set could not be emptied.
    BoundingSet,
    /// Landlock missing or below the tested ABI.
    Landlock,
    /// No seccomp filter installed.
    Seccomp,
}

impl Reduced {
    /// Its name in the log.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::OomScoreAdj => "oom_score_adj",
            Self::UniqueUid => "uniqueUid",
            Self::Namespaces => "namespaces",
            Self::Disk => "disk",
            Self::BoundingSet => "bounding set",
            Self::Landlock => "landlock",
            Self::Seccomp => "seccomp",
        }
    }
}

/// A protection applied less than asked, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Degraded {
    /// Which protection.
    pub what: Reduced,
    /// What was missing and what still holds.
    pub why: String,
}

impl Degraded {
    /// `what`, because `why`.
    pub fn new(what: Reduced, why: impl Into<String>) -> Self {
        Self {
            what,
            why: why.into(),
        }
    }

    /// A report's list as one log field (`what: why; …`).
    pub fn joined(list: &[Degraded]) -> String {
        list.iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join("; ")
    }
}

impl std::fmt::Display for Degraded {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.what.as_str(), self.why)
    }
}

/// Something the namespaces step could not do, and for which namespace (none: a part of
/// one, such as the private `/proc`, or a file of the named identity).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NsNote {
    /// The namespace it is about.
    pub ns: Option<Namespace>,
    /// What happened.
    pub what: String,
}

impl NsNote {
    /// About `ns`.
    pub fn of(ns: Namespace, what: impl Into<String>) -> Self {
        Self {
            ns: Some(ns),
            what: what.into(),
        }
    }

    /// About no one namespace.
    pub fn other(what: impl Into<String>) -> Self {
        Self {
            ns: None,
            what: what.into(),
        }
    }
}

impl std::fmt::Display for NsNote {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.ns {
            Some(ns) => write!(f, "{ns}: {}", self.what),
            None => f.write_str(&self.what),
        }
    }
}

/// What the namespaces step created (reported with every reply and by `doctor`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NamespaceReport {
    /// Namespaces entered.
    pub created: Vec<Namespace>,
    /// Asked for but not created, with the reason.
    pub failed: Vec<NsNote>,
    /// A `/proc` of the request's own PID namespace is mounted.
    pub private_proc: bool,
    /// `/tmp` is the request's own (inside its tmpfs).
    pub private_tmp: bool,
    /// The request's tmpfs size, when one is mounted.
    pub disk_bytes: Option<u64>,
    /// Parts of a created namespace the environment refused (e.g. a container runtime's
    /// seccomp profile denying `sethostname` or `mount`): the namespace still isolates, the
    /// extra is missing. Reported, never fatal.
    #[serde(default)]
    pub notes: Vec<NsNote>,
}

impl NamespaceReport {
    /// Whether `ns` was created.
    pub fn has(&self, ns: Namespace) -> bool {
        self.created.contains(&ns)
    }

    /// The namespaces created, as the logs list them (`user, mount, …`).
    pub fn created_list(&self) -> String {
        let names: Vec<&str> = self.created.iter().map(|n| n.as_str()).collect();
        names.join(", ")
    }

    /// What failed, each as `ns: why`.
    pub fn failed_lines(&self) -> Vec<String> {
        self.failed.iter().map(ToString::to_string).collect()
    }

    /// Why `ns` was not created, if it was asked for and failed.
    pub fn failure_of(&self, ns: Namespace) -> Option<&NsNote> {
        self.failed.iter().find(|n| n.ns == Some(ns))
    }

    /// What a created `ns` is missing.
    pub fn notes_of(&self, ns: Namespace) -> impl Iterator<Item = &NsNote> {
        self.notes.iter().filter(move |n| n.ns == Some(ns))
    }
}

/// Where one write of the probe's extractor self-test went.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum SelfTestOutcome {
    /// The extractor wrote there (only the request's own directory may say so).
    Extracted,
    /// The request's own tmpfs is mounted there; the real directory is not reachable.
    Private,
    /// The write failed, with the error.
    Denied(String),
}

impl std::fmt::Display for SelfTestOutcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SelfTestOutcome::Extracted => f.write_str("extracted"),
            SelfTestOutcome::Private => f.write_str(
                "private: the request's own tmpfs here; the real directory is not reachable",
            ),
            SelfTestOutcome::Denied(e) => write!(f, "denied: {e}"),
        }
    }
}

/// What was actually enforced (returned with every reply, logged, shown by `doctor`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Report {
    /// Real/effective/saved UID after the switch.
    pub uid: u32,
    /// GID after the switch.
    pub gid: u32,
    /// Whether the UID was switched to a leased, unique one.
    pub unique_uid: bool,
    /// Whether the bounding set is empty.
    pub bounding_cleared: bool,
    /// Whether E/P/I/A capability sets read back empty.
    pub capabilities_cleared: bool,
    /// `no_new_privs` read back.
    pub no_new_privs: bool,
    /// How much of the Landlock ruleset is enforced.
    pub landlock: LandlockStatus,
    /// The kernel's Landlock ABI, when available.
    pub landlock_abi: Option<i32>,
    /// Whether TCP bind/connect are denied by Landlock.
    pub landlock_tcp_denied: bool,
    /// Policy paths that did not exist and got no rule.
    pub missing_paths: Vec<PathBuf>,
    /// Installed seccomp filters (0 = none).
    pub seccomp_filters: usize,
    /// Protections that could not be applied but were not required.
    pub degraded: Vec<Degraded>,
    /// The jail's own /proc/self/status lines that prove the above (Uid … Seccomp_filters).
    pub status: Vec<String>,
    /// Namespaces created for the request.
    #[serde(default)]
    pub namespaces: NamespaceReport,
    /// The request directory as the request's commands see it.
    #[serde(default)]
    pub request_dir: PathBuf,
    /// The rlimits in force (name, value) as read back after step 2.
    #[serde(default)]
    pub rlimits: Vec<(String, u64)>,
    /// Landlock access rights the kernel enforces for this jail (filesystem, TCP, scopes).
    #[serde(default)]
    pub landlock_rights: Vec<String>,
    /// The Landlock features in effect for this jail.
    #[serde(default)]
    pub landlock_features: Vec<policy::LandlockFeature>,
    /// Probe only: the extractor run, confined, into each directory (path, outcome).
    #[serde(default)]
    pub self_test: Vec<(String, SelfTestOutcome)>,
    /// `network: allowList`: the port of the egress listener on the jail's loopback, which
    /// the jail handed to the supervisor (commands get it as `HTTPS_PROXY` and friends).
    #[serde(default)]
    pub egress_port: Option<u16>,
    /// `network: allowList`: every inet socket of a command is made by the seccomp listener
    /// bound to the loopback device, which the command cannot undo (read back in each jail).
    #[serde(default)]
    pub loopback_sockets: bool,
}

/// The one byte that comes with the egress listener over the jail's stdin socket: bound in the
/// jail's own network namespace, where only its commands can reach it.
pub const EGRESS_LISTENER: u8 = b'L';
/// The same for a listener bound in the server's network namespace (the jail has none of its
/// own): Landlock's TCP rules keep the commands to its port, and the proxy admits only
/// connections whose socket the request's UID owns (other processes of the pod can reach it).
pub const EGRESS_LISTENER_SHARED: u8 = b'S';
/// The tag of the jail's mounter socket on its stdin socket (`T`, with the descriptor), or of
/// its absence (`N`: no mount or PID namespace here).
pub const MOUNTER_SOCKET: u8 = b'T';
/// See [`MOUNTER_SOCKET`].
pub const NO_MOUNTER: u8 = b'N';

/// The jail's answer.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum Reply {
    /// Success.
    Ok {
        /// The result (`None` for a probe).
        outcome: Option<Outcome>,
        /// What was enforced.
        report: Report,
        /// What ran (audit).
        #[serde(default)]
        record: vocab::record::RunRecord,
    },
    /// Failure, with the message the client sees.
    Err {
        /// Class.
        kind: ErrorKind,
        /// Message (Argo-compatible where Argo has one).
        message: String,
        /// What was enforced, if confinement got that far.
        report: Option<Report>,
        /// What ran before the failure (audit).
        #[serde(default)]
        record: vocab::record::RunRecord,
    },
}

/// Tag of a [`StderrLine`] frame: sent by the jail while a command runs, before its `R` frame.
pub const STDERR_LINE: u8 = b'L';
/// Largest [`StderrLine`] frame body the supervisor accepts.
pub const STDERR_LINE_MAX: usize = 4096;

/// One line a command wrote to stderr, sent as it arrives so a long command's progress shows
/// in the server's log; already redacted and cut by the jail ([`crate::redact`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StderrLine {
    /// The command's phase.
    pub phase: vocab::record::Phase,
    /// The line (empty with `more_not_logged`).
    pub line: String,
    /// The command's live-line budget is spent: later lines are not logged (the error and the
    /// audit event still carry what the command printed).
    #[serde(default)]
    pub more_not_logged: bool,
}

/// Write one frame.
pub fn write_frame(w: &mut impl Write, tag: u8, body: &[u8]) -> io::Result<()> {
    let len = u32::try_from(body.len()).map_err(|_| io::Error::other("frame too large"))?;
    let mut head = [0u8; 5];
    head[0] = tag;
    head[1..].copy_from_slice(&len.to_be_bytes());
    w.write_all(&head)?;
    w.write_all(body)
}

/// Read one frame header: `None` at a clean EOF. Frames over `max` bytes are refused.
pub fn read_frame_head(r: &mut impl Read, max: usize) -> io::Result<Option<(u8, usize)>> {
    let mut head = [0u8; 5];
    let mut got = 0;
    while got < head.len() {
        match r.read(&mut head[got..]) {
            Ok(0) if got == 0 => return Ok(None),
            Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    let len = u32::from_be_bytes([head[1], head[2], head[3], head[4]]) as usize;
    if len > max {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "frame too large",
        ));
    }
    Ok(Some((head[0], len)))
}

/// Read one frame tagged `tag` holding JSON: `Ok(None)` at a clean EOF before the frame.
pub fn read_json_frame<T: serde::de::DeserializeOwned>(
    r: &mut impl Read,
    tag: u8,
) -> Result<Option<T>, String> {
    let name = char::from(tag);
    match read_frame_head(r, MAX_FRAME) {
        Ok(None) => Ok(None),
        Ok(Some((t, n))) if t == tag => {
            let mut body = vec![0u8; n];
            r.read_exact(&mut body)
                .map_err(|e| format!("reading frame {name}: {e}"))?;
            serde_json::from_slice(&body)
                .map(Some)
                .map_err(|e| format!("bad frame {name}: {e}"))
        }
        Ok(Some((t, _))) => Err(format!("expected frame {name}, got {:?}", char::from(t))),
        Err(e) => Err(format!("reading frame {name}: {e}")),
    }
}

/// Reads the archive out of `D` frames; EOF at `E`; an error if the stream ends without `E`.
#[derive(Debug)]
pub struct FrameReader<R> {
    inner: R,
    left: usize,
    ended: bool,
    aborted: bool,
}

impl<R: Read> FrameReader<R> {
    /// Wrap the jail's stdin (after the header frame).
    pub fn new(inner: R) -> Self {
        Self {
            inner,
            left: 0,
            ended: false,
            aborted: false,
        }
    }

    /// Whether the end frame was seen.
    #[cfg(test)]
    pub fn ended(&self) -> bool {
        self.ended
    }

    /// Whether the supervisor closed the stream without the end frame (checksum mismatch,
    /// client gone): the extraction's failure is a cancellation, not the archive's fault.
    pub fn aborted(&self) -> bool {
        self.aborted
    }
}

impl<R: Read> Read for FrameReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        while self.left == 0 {
            if self.ended {
                return Ok(0);
            }
            match read_frame_head(&mut self.inner, MAX_FRAME)? {
                None => {
                    self.aborted = true;
                    return Err(io::Error::new(
                        io::ErrorKind::ConnectionAborted,
                        "archive stream aborted",
                    ));
                }
                Some((b'D', n)) => self.left = n,
                Some((b'E', 0)) => self.ended = true,
                Some((t, _)) => {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        format!("unexpected frame {t}"),
                    ));
                }
            }
        }
        let n = buf.len().min(self.left);
        let got = self.inner.read(&mut buf[..n])?;
        if got == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        self.left -= got;
        Ok(got)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn degraded_protections_read_as_one_log_field_and_cross_the_pipe() {
        let list = vec![
            Degraded::new(Reduced::Landlock, "not enforced by this kernel"),
            Degraded::new(Reduced::Seccomp, "no filter"),
        ];
        assert_eq!(
            Degraded::joined(&list),
            "landlock: not enforced by this kernel; seccomp: no filter"
        );
        let json = serde_json::to_string(&list).expect("json");
        let back: Vec<Degraded> = serde_json::from_str(&json).expect("parse");
        assert_eq!(back, list);
    }

    #[test]
    fn frames_round_trip_and_abort_is_an_error() {
        let mut buf = Vec::new();
        write_frame(&mut buf, b'D', b"hello ").unwrap();
        write_frame(&mut buf, b'D', b"world").unwrap();
        write_frame(&mut buf, b'E', b"").unwrap();
        let mut r = FrameReader::new(&buf[..]);
        let mut s = String::new();
        r.read_to_string(&mut s).unwrap();
        assert_eq!(s, "hello world");
        assert!(r.ended());

        let mut cut = Vec::new();
        write_frame(&mut cut, b'D', b"partial").unwrap();
        let mut r = FrameReader::new(&cut[..]);
        let mut s = String::new();
        let e = r.read_to_string(&mut s).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::ConnectionAborted);
        assert!(r.aborted());

        let mut huge = vec![b'D'];
        huge.extend_from_slice(&u32::MAX.to_be_bytes());
        assert!(FrameReader::new(&huge[..]).read(&mut [0; 4]).is_err());
    }
}

/// A command from the supervisor to the tree cache's keeper (one `SOCK_SEQPACKET` message of
/// JSON, descriptors as `SCM_RIGHTS`). The keeper runs none of it on request data: it makes
/// directories, forks the confined filler, renames, removes and lends mounts.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum KeeperCmd {
    /// Extract an archive into the new staging directory `id`, in a confined filler process.
    /// Descriptors: the archive (frames `D`… `E`, read end) and the filler's reply (write end).
    Fill {
        /// The staging directory's number.
        id: u64,
        /// How to extract (limits, file modes), exactly as a jail would.
        options: archive::Options,
        /// The filler's resource limits.
        limits: FillLimits,
    },
    /// The fill `id` succeeded and its bytes were verified: it becomes the sealed tree `key`.
    Seal {
        /// The staging directory's number.
        id: u64,
        /// The tree's key.
        key: String,
    },
    /// Stop the fill `id` (if it runs) and remove what it wrote.
    Discard {
        /// The staging directory's number.
        id: u64,
    },
    /// Remove the sealed tree `key` (no request holds it).
    Evict {
        /// The tree's key.
        key: String,
    },
    /// A read-only, idmapped clone of the sealed tree `key` in which its files appear owned by
    /// `uid`/`gid` (answered with the mount's descriptor).
    Lend {
        /// The tree's key.
        key: String,
        /// The borrowing jail's UID.
        uid: u32,
        /// The borrowing jail's GID.
        gid: u32,
    },
}

impl KeeperCmd {
    /// The command's name, for messages.
    pub fn name(&self) -> &'static str {
        match self {
            KeeperCmd::Fill { .. } => "Fill",
            KeeperCmd::Seal { .. } => "Seal",
            KeeperCmd::Discard { .. } => "Discard",
            KeeperCmd::Evict { .. } => "Evict",
            KeeperCmd::Lend { .. } => "Lend",
        }
    }
}

/// The keeper's answer to one [`KeeperCmd`].
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum KeeperReply {
    /// Done (`Lend`: the mount's descriptor comes with it).
    Ok,
    /// The filler was started.
    Started {
        /// Its PID (in the keeper's namespaces: for the logs).
        pid: i32,
    },
    /// Refused or failed, and why.
    Failed(String),
}

/// The filler's one answer (an `R` frame on its reply pipe), then it exits.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum FillReply {
    /// Extracted completely.
    Ok {
        /// Entries accepted.
        entries: u64,
        /// Bytes of regular-file content written.
        file_bytes: u64,
    },
    /// Refused or failed: the class and the message a request extracting it would have
    /// answered with (the same words either way).
    Err {
        /// The error class.
        kind: ErrorKind,
        /// The message.
        message: String,
    },
}

/// What bounds one filler (the process that extracts a tree into the cache).
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub struct FillLimits {
    /// RLIMIT_CPU (seconds): the archive's wall clock bounds it in time as well.
    pub cpu_seconds: u64,
    /// RLIMIT_DATA.
    pub data_bytes: u64,
    /// RLIMIT_AS.
    pub address_space_bytes: u64,
    /// RLIMIT_FSIZE.
    pub file_size_bytes: u64,
}

/// What a cached tree's entry costs beyond its file bytes (its inode, its directory entry,
/// the last partial page of a file): charged to the budget and to a fill's room by the
/// supervisor, and the keeper's tmpfs has an inode per this many bytes.
pub const ENTRY_OVERHEAD: u64 = 4096;

/// Largest keeper message (commands and answers are small).
const MAX_KEEPER_MESSAGE: usize = 64 << 10;

/// Send `msg` as one `SOCK_SEQPACKET` message with `fds` as `SCM_RIGHTS`.
pub fn send_msg(
    sock: std::os::fd::BorrowedFd<'_>,
    msg: &impl Serialize,
    fds: &[std::os::fd::BorrowedFd<'_>],
) -> io::Result<()> {
    use rustix::net::{SendAncillaryBuffer, SendAncillaryMessage, SendFlags};
    let body = serde_json::to_vec(msg).map_err(io::Error::other)?;
    let mut space = [std::mem::MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(2))];
    let mut anc = SendAncillaryBuffer::new(&mut space);
    if !fds.is_empty() && !anc.push(SendAncillaryMessage::ScmRights(fds)) {
        return Err(io::Error::other("too many descriptors for one message"));
    }
    rustix::net::sendmsg(
        sock,
        &[io::IoSlice::new(&body)],
        &mut anc,
        SendFlags::NOSIGNAL,
    )?;
    Ok(())
}

/// Receive one message sent by [`send_msg`] (`None` when the peer closed its end).
pub fn recv_msg<T: serde::de::DeserializeOwned>(
    sock: std::os::fd::BorrowedFd<'_>,
) -> io::Result<Option<(T, Vec<std::os::fd::OwnedFd>)>> {
    use rustix::net::{RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags};
    let mut buf = vec![0u8; MAX_KEEPER_MESSAGE];
    let mut space = [std::mem::MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(2))];
    let mut anc = RecvAncillaryBuffer::new(&mut space);
    let got = loop {
        match rustix::net::recvmsg(
            sock,
            &mut [io::IoSliceMut::new(&mut buf)],
            &mut anc,
            RecvFlags::CMSG_CLOEXEC,
        ) {
            Err(rustix::io::Errno::INTR) => continue,
            r => break r?,
        }
    };
    let mut fds = Vec::new();
    for m in anc.drain() {
        if let RecvAncillaryMessage::ScmRights(r) = m {
            fds.extend(r);
        }
    }
    if got.bytes == 0 {
        return Ok(None);
    }
    let msg = serde_json::from_slice(&buf[..got.bytes]).map_err(io::Error::other)?;
    Ok(Some((msg, fds)))
}

/// The supervisor's one command to a jail's mounter (`SOCK_SEQPACKET`; the lent tree's mount
/// as `SCM_RIGHTS`). Closing the socket instead means "no tree: the jail extracts".
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum MounterCmd {
    /// Put the lent tree under the request directory (`repo/`) with a private writable layer.
    Attach,
}

/// The mounter's answer.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum MounterReply {
    /// `repo/` is the tree with its private layer.
    Ok,
    /// Nothing was mounted, and why.
    Failed(String),
}
