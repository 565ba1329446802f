//! One whole request: extract the archive into the request tree, resolve `appRelPath` beneath
//! it, then run discovery, init + generate, or the parameters command, and return a typed
//! result. Failures are classified here ([`Failure::kind`]); the server maps classes to statuses.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::Instant;

use rustix::fs::Mode;

use archive::{DirWriter, ExtractError, Resolver};
use plugin::{glob, params, split_output_within};

use super::run::{CmdError, CmdSpec, run_recorded};
use jail_sys::cancel::CancelToken;
use jail_wire::protocol::{STDERR_LINE, StderrLine};
use jail_wire::spec::Task;
use vocab::record::{Limit, Phase};
use vocab::request::{ErrorKind, GENERATOR_REQUEST, Operation, Outcome, TimeLimit};

/// One request as the jail runs it: its task, where its tree is, its clock and its record.
#[derive(Debug)]
pub(crate) struct Request {
    /// What to run.
    pub task: Task,
    /// The directory the archive is extracted into.
    pub tree: PathBuf,
    /// When the request must be finished.
    pub deadline: Option<Instant>,
    /// What the request did (returned with the reply).
    pub record: jail_wire::record::Recorder,
}

/// Why a request failed in the jail. Messages follow Argo CD's wording where it has one; the
/// class ([`Failure::kind`]) and the message cross the pipe as a [`crate::Failure`].
#[derive(Debug, thiserror::Error)]
pub(crate) enum Failure {
    /// The archive was refused (with the policy field that allows more, where one does).
    #[error("error receiving tgz file: {0}{field}", field = archive_field(.0))]
    Archive(#[from] ExtractError),
    /// `appRelPath` leaves the tree.
    #[error("illegal appPath: out of workDir bound")]
    AppPathOutOfBounds,
    /// A command failed (prefix is Argo's per-RPC wording).
    #[error("{prefix}: {source}")]
    Command {
        /// e.g. `error generating manifests`.
        prefix: &'static str,
        /// The command failure.
        source: CmdError,
    },
    /// Generate output is not YAML/JSON.
    #[error("error generating manifests: {0}")]
    Split(#[from] plugin::SplitError),
    /// Discovery failed (bad pattern, missing path).
    #[error("match repository error: {0}")]
    Discovery(String),
    /// Dynamic parameters output invalid.
    #[error("get parameters announcement error: {0}")]
    Params(#[from] params::ParamsError),
    /// An output Argo CD's cmp-server accepts and then panics on (a `null` parameter
    /// announcement): its panic handler's answer, `Internal` with the panic's text.
    #[error("{0}")]
    Panics(params::ParamsError),
    /// Setting up the request tree failed.
    #[error("error creating workdir for manifest generation: {0}")]
    Workdir(std::io::Error),
    /// The generator command printed something other than a JSON array of objects.
    #[error("{0}")]
    GeneratorOutput(String),
}

/// A limit an extraction's I/O error is (a file over the per-process file size limit, a full
/// disk), if it is one: the policy field that allows more, where one does. Which field a full
/// disk is depends on where the tree is (the request's tmpfs or the work directory's disk):
/// the jail, which knows, says it in front of the message (`lib.rs`, the failure's reply).
fn io_limit(e: &ExtractError) -> Option<Option<&'static str>> {
    let archive::Reason::Io { source, .. } = e.reason() else {
        return None;
    };
    match source.raw_os_error() {
        Some(libc::EFBIG) => Some(Some("spec.limits.fileSizeBytes: one file's size")),
        Some(libc::ENOSPC | libc::EDQUOT) => Some(None),
        _ => None,
    }
}

/// ` (policy spec.archive.FIELD)`: the field that allows more of what an archive was refused
/// for; empty for the extractor's fixed limits and for refusals no field changes.
fn archive_field(e: &ExtractError) -> String {
    use archive::LimitKind as K;
    let field = match e.reason() {
        archive::Reason::Limit { kind, .. } => match kind {
            K::CompressedBytes => {
                Some("spec.archive.compressedBytes, or the server's --max-compressed")
            }
            K::ExtractedBytes => Some("spec.archive.extractedBytes"),
            K::FileBytes => Some("spec.archive.fileBytes"),
            K::CompressionRatio => Some("spec.archive.maxRatio"),
            K::Entries => Some("spec.archive.entries"),
            K::Symlinks => Some("spec.archive.symlinks"),
            K::PathDepth => Some("spec.archive.pathDepth"),
            K::WallClock => Some("spec.archive.wallSeconds"),
            _ => None,
        },
        _ => io_limit(e).flatten(),
    };
    field.map_or_else(String::new, |f| format!(" (policy {f})"))
}

impl Failure {
    /// An extraction that found its disk full (which disk: the caller knows).
    pub fn no_space(&self) -> bool {
        matches!(self, Failure::Archive(a) if io_limit(a) == Some(None))
    }

    /// The error class the client sees (the server maps classes to gRPC codes in one place).
    pub fn kind(&self) -> ErrorKind {
        use archive::ErrorClass;
        match self {
            Failure::Archive(a) if io_limit(a).is_some() => ErrorKind::ResourceExhausted,
            Failure::Archive(a) => match a.class() {
                ErrorClass::PolicyViolation => ErrorKind::InvalidArgument,
                ErrorClass::LimitExceeded => ErrorKind::ResourceExhausted,
                ErrorClass::Integrity => ErrorKind::DataLoss,
                _ => ErrorKind::Internal,
            },
            Failure::AppPathOutOfBounds => ErrorKind::InvalidArgument,
            Failure::Command { source, .. } => match source {
                CmdError::Deadline { .. } => ErrorKind::DeadlineExceeded,
                CmdError::Cancelled { .. } => ErrorKind::Cancelled,
                CmdError::OutputLimit { .. } => ErrorKind::ResourceExhausted,
                _ => ErrorKind::Unknown,
            },
            Failure::Split(plugin::SplitError::TooLarge(_)) => ErrorKind::ResourceExhausted,
            Failure::Discovery(_)
            | Failure::Split(_)
            | Failure::Params(_)
            | Failure::GeneratorOutput(_) => ErrorKind::Unknown,
            Failure::Workdir(_) | Failure::Panics(_) => ErrorKind::Internal,
        }
    }
}

/// Extract the archive into `req.tree`.
pub(crate) fn extract(req: &Request, input: impl Read) -> Result<(), Failure> {
    let root = DirWriter::open_root(&req.tree).map_err(Failure::Workdir)?;
    let mut writer = DirWriter::new(root, Resolver::Auto)
        .map_err(Failure::Workdir)?
        .map_err(|r| Failure::Archive(ExtractError::new(r)))?
        .umask_cleared();
    let mut opts = req.task.archive.clone();
    opts.preserve_file_mode = req.task.config.spec.preserve_file_mode;
    let started_unix_nanos = jail_wire::record::unix_nanos();
    let started = Instant::now();
    // A clear umask while the archive is written (modes exact at creation, no fchmod per
    // entry); the commands get the jail's 077 back.
    let jail_umask = rustix::process::umask(Mode::empty());
    let extracted = archive::extract(input, &mut writer, &opts);
    rustix::process::umask(jail_umask);
    let summary = extracted?;
    jail_wire::record::update(&req.record, |r| {
        r.archive = Some(vocab::record::ArchiveRecord {
            entries: summary.entries,
            file_bytes: summary.file_bytes,
            started_unix_nanos,
            duration_us: u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX),
        })
    });
    tracing::debug!(
        entries = summary.entries,
        bytes = summary.file_bytes,
        "archive extracted"
    );
    Ok(())
}

/// Resolve `appRelPath` and run the operation's commands on the extracted tree.
pub(crate) fn run_operation(req: &Request, cancel: &CancelToken) -> Result<Outcome, Failure> {
    let app = resolve_app_path(&req.tree, &req.task.app_rel_path)?;
    // Go's start error would name the request's directory (a path of this server's); say what
    // the user can act on instead, in the same words.
    let prefix = match req.task.op {
        Operation::Generate => Some("error generating manifests"),
        Operation::Parameters => Some("get parameters announcement error"),
        Operation::Generator => Some("generator command failed"),
        Operation::Match => None,
    };
    if let Some(prefix) = prefix
        && !app.is_dir()
    {
        let rel = vocab::request::bounded(&req.task.app_rel_path, 256);
        return Err(Failure::Command {
            prefix,
            source: CmdError::Start(format!(
                "chdir {rel}: no such file or directory (appRelPath {rel:?} does not exist in the repository)"
            )),
        });
    }
    match req.task.op {
        Operation::Generate => generate(req, &app, cancel),
        Operation::Match => discover(req, &app, cancel),
        Operation::Parameters => parameters(req, &app, cancel),
        Operation::Generator => generator(req, &app, cancel),
    }
}

/// Lexically clean `rel` beneath `tree` (Argo's check), then make sure the real directory, with
/// any in-tree symlinks resolved, is still beneath the tree.
pub(crate) fn resolve_app_path(tree: &Path, rel: &str) -> Result<PathBuf, Failure> {
    let tree_s = tree.display().to_string();
    let joined = glob::clean(&format!("{tree_s}/{rel}"));
    let tree_c = glob::clean(&tree_s);
    if joined != tree_c && !joined.starts_with(&format!("{tree_c}/")) {
        return Err(Failure::AppPathOutOfBounds);
    }
    let joined = PathBuf::from(joined);
    if let (Ok(real), Ok(real_tree)) = (joined.canonicalize(), tree.canonicalize())
        && !real.starts_with(&real_tree)
    {
        return Err(Failure::AppPathOutOfBounds);
    }
    Ok(joined)
}

fn command(
    req: &Request,
    app: &Path,
    phase_argv: (Phase, &[String]),
    cancel: &CancelToken,
) -> Result<Vec<u8>, CmdError> {
    command_with_stdin(req, app, phase_argv, None, cancel)
}

/// How many stderr lines of one command are sent to the server's log as they arrive; the
/// error and the audit event carry the rest.
const LIVE_LINES: usize = 200;

/// Sends each stderr line of a command to the supervisor as a [`StderrLine`] frame on the
/// reply pipe, redacted like everything else we log, at most [`LIVE_LINES`] of them.
fn live_stderr(phase: Phase, env: &[(String, String)]) -> super::run::LineSink {
    let env = env.to_vec();
    let sent = std::sync::atomic::AtomicUsize::new(0);
    std::sync::Arc::new(move |line: &[u8]| {
        let n = sent.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let frame = match n.cmp(&LIVE_LINES) {
            std::cmp::Ordering::Less => StderrLine {
                phase,
                line: jail_wire::redact::redact(&String::from_utf8_lossy(line), &env),
                more_not_logged: false,
            },
            std::cmp::Ordering::Equal => StderrLine {
                phase,
                line: String::new(),
                more_not_logged: true,
            },
            std::cmp::Ordering::Greater => return,
        };
        super::send_frame(STDERR_LINE, &frame);
    })
}

fn command_with_stdin(
    req: &Request,
    app: &Path,
    (phase, argv): (Phase, &[String]),
    stdin: Option<&Path>,
    cancel: &CancelToken,
) -> Result<Vec<u8>, CmdError> {
    let cs = CmdSpec {
        argv,
        env: &req.task.env,
        cwd: app,
        stdout_cap: req.task.output_bytes,
        stderr_cap: req.task.output_bytes,
        stdin,
        stderr_lines: Some(live_stderr(phase, &req.task.env)),
    };
    // The earlier of the request's deadline and this command's own timeout wins, and the
    // error names the one that fired.
    let own = req
        .task
        .command_timeout
        .as_ref()
        .map(|(d, text)| (Instant::now() + *d, text.clone()));
    let (deadline, limit) = match (req.deadline, own) {
        (Some(r), Some((c, text))) if c < r => (Some(c), TimeLimit::Command { text }),
        (None, Some((c, text))) => (Some(c), TimeLimit::Command { text }),
        (r, _) => (r, req.task.deadline_limit.clone()),
    };
    let mut rec = vocab::record::CommandRecord {
        phase,
        argv: argv.to_vec(),
        started_unix_nanos: jail_wire::record::unix_nanos(),
        ..Default::default()
    };
    let out = run_recorded(&cs, deadline, cancel, &mut rec);
    // Killed at the client's deadline, not one of ours.
    if rec.ended_by == Some(Limit::Timeout) && limit == TimeLimit::Client {
        rec.ended_by = Some(Limit::ClientDeadline);
    }
    jail_wire::record::update(&req.record, |r| r.commands.push(rec));
    let out = out.map_err(|e| match e {
        CmdError::Deadline { argv, stderr, .. } => CmdError::Deadline {
            argv,
            stderr,
            limit: limit.clone(),
        },
        other => other,
    })?;
    if !out.stderr.is_empty() {
        let stderr =
            jail_wire::redact::redact(&String::from_utf8_lossy(&out.stderr), &req.task.env);
        tracing::info!(%stderr, argv = %argv.join(" "), "plugin command stderr");
    }
    // The cmp-server's `strings.TrimSuffix(output, "\n")`, on the bytes as they came: what
    // is read from them is read as Argo CD reads them, invalid UTF-8 included.
    let mut s = out.stdout;
    if s.ends_with(b"\n") {
        s.pop();
    }
    Ok(s)
}

fn generate(req: &Request, app: &Path, cancel: &CancelToken) -> Result<Outcome, Failure> {
    let wrap = |source| Failure::Command {
        prefix: "error generating manifests",
        source,
    };
    let init = req.task.config.spec.init.argv();
    if !req.task.config.spec.init.command.is_empty() {
        command(req, app, (Phase::Init, &init), cancel).map_err(wrap)?;
    }
    let argv = req.task.config.spec.generate.argv();
    let out = command(req, app, (Phase::Generate, &argv), cancel).map_err(wrap)?;
    if out.is_empty() {
        tracing::warn!("Plugin command returned zero output");
    }
    // Refused before building what could not be sent: aliases are charged as they expand.
    Ok(Outcome::Manifests(split_output_within(
        &out,
        req.task.reply_bytes,
    )?))
}

fn discover(req: &Request, app: &Path, cancel: &CancelToken) -> Result<Outcome, Failure> {
    let d = &req.task.config.spec.discover;
    let supported = if !d.file_name.is_empty() {
        let m = glob::go_glob(&req.tree, app, &d.file_name).map_err(|e| {
            Failure::Discovery(format!(
                "error finding filename match for pattern \"{}\": {e}",
                d.file_name
            ))
        })?;
        !m.is_empty()
    } else if !d.find.glob.is_empty() {
        let m = glob::zglob(&req.tree, app, &d.find.glob).map_err(|e| {
            Failure::Discovery(format!(
                "error finding glob match for pattern \"{}\": {e}",
                d.find.glob
            ))
        })?;
        !m.is_empty()
    } else if !d.find.command.command.is_empty() {
        let argv = d.find.command.argv();
        let out = command(req, app, (Phase::Discover, &argv), cancel)
            .map_err(|e| Failure::Discovery(format!("error running find command: {e}")))?;
        !out.is_empty()
    } else {
        return Ok(Outcome::Match {
            supported: false,
            discovery_enabled: false,
        });
    };
    Ok(Outcome::Match {
        supported,
        discovery_enabled: true,
    })
}

fn parameters(req: &Request, app: &Path, cancel: &CancelToken) -> Result<Outcome, Failure> {
    let p = &req.task.config.spec.parameters;
    let mut dynamic = Vec::new();
    if !p.dynamic.command.is_empty() {
        let argv = p.dynamic.argv();
        let out = command(req, app, (Phase::Parameters, &argv), cancel).map_err(|source| Failure::Command {
            prefix: "get parameters announcement error: error executing dynamic parameter output command",
            source,
        })?;
        dynamic = params::parse_dynamic_bytes(&out).map_err(|e| match e {
            params::ParamsError::NilAnnouncement => Failure::Panics(e),
            e => Failure::Params(e),
        })?;
    }
    Ok(Outcome::Parameters(params::announce(dynamic, &p.static_)))
}

fn generator(req: &Request, app: &Path, cancel: &CancelToken) -> Result<Outcome, Failure> {
    let argv = req.task.config.spec.generate.argv();
    let request = req.tree.join(GENERATOR_REQUEST);
    let out = command_with_stdin(req, app, (Phase::Generator, &argv), Some(&request), cancel)
        .map_err(|source| Failure::Command {
            prefix: "generator command failed",
            source,
        })?;
    Ok(Outcome::Generated(
        jail_wire::spec::parse_generated(&String::from_utf8_lossy(&out))
            .map_err(Failure::GeneratorOutput)?,
    ))
}
