//! One whole request: extract the archive into the request tree, resolve `appRelPath` beneath
//! it, then run discovery, init + generate, or the parameters command, and return a typed
//! result. Knows nothing of gRPC; the server maps [`RequestError`] to statuses in one place.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use archive::{DirWriter, ExtractError, Options, Resolver};
use plugin::config::ParameterAnnouncement;
use plugin::{PluginConfig, glob, params, split_manifests};

use crate::cancel::CancelToken;
use crate::protocol::ErrorKind;
use crate::run::{CmdError, CmdSpec, TimeLimit, run_recorded};

/// What the request asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Operation {
    /// GenerateManifest: init, generate, split.
    Generate,
    /// MatchRepository: discovery.
    Match,
    /// GetParametersAnnouncement: dynamic command + static list.
    Parameters,
    /// The ApplicationSet plugin generator: the `generate` command with the request JSON
    /// ([`GENERATOR_REQUEST`] in the tree) on stdin, printing a JSON array of objects.
    Generator,
}

/// The file (at the tree's root) holding the generator's HTTP request body.
pub const GENERATOR_REQUEST: &str = ".cmp-warden-request.json";

/// Everything a request needs besides its archive bytes.
#[derive(Debug, Clone)]
pub struct RequestSpec {
    /// Which RPC.
    pub op: Operation,
    /// The plugin.
    pub config: PluginConfig,
    /// The empty directory the archive is extracted into.
    pub tree: PathBuf,
    /// `metadata.appRelPath`.
    pub app_rel_path: String,
    /// Environment for commands (already composed).
    pub env: Vec<(String, String)>,
    /// Archive limits; `preserve_file_mode` comes from the plugin config.
    pub archive: Options,
    /// Budget for each command's stdout and stderr.
    pub output_bytes: u64,
    /// When the request must be finished.
    pub deadline: Option<Instant>,
    /// Which limit `deadline` comes from (named in the error when it fires).
    pub deadline_limit: TimeLimit,
    /// Per-command limit (`ARGOCD_EXEC_TIMEOUT`) and its configured text.
    pub command_timeout: Option<(Duration, String)>,
    /// What the request did, for the audit log (filled by the runner).
    pub record: crate::record::Recorder,
}

/// A request's result.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Outcome {
    /// Generated manifests, one compact JSON string each.
    Manifests(Vec<String>),
    /// Discovery verdict.
    Match {
        /// `isSupported`.
        supported: bool,
        /// `isDiscoveryEnabled`.
        discovery_enabled: bool,
    },
    /// Parameter announcements (dynamic then static).
    Parameters(Vec<ParameterAnnouncement>),
    /// The generator's parameters: a compact JSON array of objects.
    Generated(String),
}

/// Why a request failed. Messages follow Argo CD's wording where it has one.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RequestError {
    /// The archive was refused.
    #[error("error receiving tgz file: {0}")]
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
    /// Setting up the request tree failed.
    #[error("error creating workdir for manifest generation: {0}")]
    Workdir(std::io::Error),
    /// The generator command printed something other than a JSON array of objects.
    #[error("generator output is not a JSON array of objects: {0}")]
    GeneratorOutput(String),
    /// A failure reported by the confined jail process, already classified.
    #[error("{message}")]
    Remote {
        /// Class.
        kind: ErrorKind,
        /// Message.
        message: String,
    },
}

impl RequestError {
    /// The error class the client sees (the server maps classes to gRPC codes in one place).
    pub fn kind(&self) -> ErrorKind {
        use archive::ErrorClass;
        match self {
            RequestError::Archive(a) => match a.class() {
                ErrorClass::PolicyViolation => ErrorKind::InvalidArgument,
                ErrorClass::LimitExceeded => ErrorKind::ResourceExhausted,
                ErrorClass::Integrity => ErrorKind::DataLoss,
                _ => ErrorKind::Internal,
            },
            RequestError::AppPathOutOfBounds => ErrorKind::InvalidArgument,
            RequestError::Command { source, .. } => match source {
                CmdError::Deadline { .. } => ErrorKind::DeadlineExceeded,
                CmdError::Cancelled { .. } => ErrorKind::Cancelled,
                CmdError::OutputLimit { .. } => ErrorKind::ResourceExhausted,
                _ => ErrorKind::Unknown,
            },
            RequestError::Discovery(_)
            | RequestError::Split(_)
            | RequestError::Params(_)
            | RequestError::GeneratorOutput(_) => ErrorKind::Unknown,
            RequestError::Workdir(_) => ErrorKind::Internal,
            RequestError::Remote { kind, .. } => *kind,
        }
    }
}

/// Extract the archive into `spec.tree`.
pub fn extract(spec: &RequestSpec, input: impl Read) -> Result<(), RequestError> {
    let root = DirWriter::open_root(&spec.tree).map_err(RequestError::Workdir)?;
    let mut writer = DirWriter::new(root, Resolver::Auto)
        .map_err(RequestError::Workdir)?
        .map_err(|r| RequestError::Archive(ExtractError::new(r)))?;
    let mut opts = spec.archive.clone();
    opts.preserve_file_mode = spec.config.spec.preserve_file_mode;
    let summary = archive::extract(input, &mut writer, &opts)?;
    crate::record::update(&spec.record, |r| {
        r.archive = Some(crate::record::ArchiveRecord {
            entries: summary.entries,
            file_bytes: summary.file_bytes,
        })
    });
    tracing::debug!(entries = summary.entries, bytes = summary.file_bytes, sha256 = %summary.sha256_hex(), "archive extracted");
    Ok(())
}

/// Resolve `appRelPath` and run the operation's commands on the extracted tree.
pub fn run_operation(spec: &RequestSpec, cancel: &CancelToken) -> Result<Outcome, RequestError> {
    let app = resolve_app_path(&spec.tree, &spec.app_rel_path)?;
    match spec.op {
        Operation::Generate => generate(spec, &app, cancel),
        Operation::Match => discover(spec, &app, cancel),
        Operation::Parameters => parameters(spec, &app, cancel),
        Operation::Generator => generator(spec, &app, cancel),
    }
}

/// Lexically clean `rel` beneath `tree` (Argo's check), then make sure the real directory, with
/// any in-tree symlinks resolved, is still beneath the tree.
pub fn resolve_app_path(tree: &Path, rel: &str) -> Result<PathBuf, RequestError> {
    let tree_s = tree.display().to_string();
    let joined = glob::clean(&format!("{tree_s}/{rel}"));
    let tree_c = glob::clean(&tree_s);
    if joined != tree_c && !joined.starts_with(&format!("{tree_c}/")) {
        return Err(RequestError::AppPathOutOfBounds);
    }
    let joined = PathBuf::from(joined);
    if let (Ok(real), Ok(real_tree)) = (joined.canonicalize(), tree.canonicalize())
        && !real.starts_with(&real_tree)
    {
        return Err(RequestError::AppPathOutOfBounds);
    }
    Ok(joined)
}

fn command(
    spec: &RequestSpec,
    app: &Path,
    phase_argv: (&str, &[String]),
    cancel: &CancelToken,
) -> Result<String, CmdError> {
    command_with_stdin(spec, app, phase_argv, None, cancel)
}

fn command_with_stdin(
    spec: &RequestSpec,
    app: &Path,
    (phase, argv): (&str, &[String]),
    stdin: Option<&Path>,
    cancel: &CancelToken,
) -> Result<String, CmdError> {
    let cs = CmdSpec {
        argv,
        env: &spec.env,
        cwd: app,
        stdout_cap: spec.output_bytes,
        stderr_cap: spec.output_bytes,
        stdin,
    };
    // The earlier of the request's deadline and this command's own timeout wins, and the
    // error names the one that fired.
    let own = spec
        .command_timeout
        .as_ref()
        .map(|(d, text)| (Instant::now() + *d, text.clone()));
    let (deadline, limit) = match (spec.deadline, own) {
        (Some(r), Some((c, text))) if c < r => (Some(c), TimeLimit::Command { text }),
        (None, Some((c, text))) => (Some(c), TimeLimit::Command { text }),
        (r, _) => (r, spec.deadline_limit.clone()),
    };
    let mut rec = crate::record::CommandRecord {
        phase: phase.to_owned(),
        argv: argv.to_vec(),
        ..Default::default()
    };
    let out = run_recorded(&cs, deadline, cancel, &mut rec);
    crate::record::update(&spec.record, |r| r.commands.push(rec));
    let out = out.map_err(|e| match e {
        CmdError::Deadline { argv, stderr, .. } => CmdError::Deadline {
            argv,
            stderr,
            limit: limit.clone(),
        },
        other => other,
    })?;
    if !out.stderr.is_empty() {
        let stderr = crate::redact::redact(&String::from_utf8_lossy(&out.stderr), &spec.env);
        tracing::info!(%stderr, argv = ?argv, "plugin command stderr");
    }
    let mut s = String::from_utf8_lossy(&out.stdout).into_owned();
    if s.ends_with('\n') {
        s.pop();
    }
    Ok(s)
}

fn generate(spec: &RequestSpec, app: &Path, cancel: &CancelToken) -> Result<Outcome, RequestError> {
    let wrap = |source| RequestError::Command {
        prefix: "error generating manifests",
        source,
    };
    let init = spec.config.spec.init.argv();
    if !spec.config.spec.init.command.is_empty() {
        command(spec, app, ("init", &init), cancel).map_err(wrap)?;
    }
    let argv = spec.config.spec.generate.argv();
    let out = command(spec, app, ("generate", &argv), cancel).map_err(wrap)?;
    if out.is_empty() {
        tracing::warn!("Plugin command returned zero output");
    }
    Ok(Outcome::Manifests(split_manifests(&out)?))
}

fn discover(spec: &RequestSpec, app: &Path, cancel: &CancelToken) -> Result<Outcome, RequestError> {
    let d = &spec.config.spec.discover;
    let supported = if !d.file_name.is_empty() {
        let m = glob::go_glob(&spec.tree, app, &d.file_name).map_err(|e| {
            RequestError::Discovery(format!(
                "error finding filename match for pattern \"{}\": {e}",
                d.file_name
            ))
        })?;
        !m.is_empty()
    } else if !d.find.glob.is_empty() {
        let m = glob::zglob(&spec.tree, app, &d.find.glob).map_err(|e| {
            RequestError::Discovery(format!(
                "error finding glob match for pattern \"{}\": {e}",
                d.find.glob
            ))
        })?;
        !m.is_empty()
    } else if !d.find.command.command.is_empty() {
        let argv = d.find.command.argv();
        let out = command(spec, app, ("discover", &argv), cancel)
            .map_err(|e| RequestError::Discovery(format!("error running find command: {e}")))?;
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

fn parameters(
    spec: &RequestSpec,
    app: &Path,
    cancel: &CancelToken,
) -> Result<Outcome, RequestError> {
    let p = &spec.config.spec.parameters;
    let mut dynamic = Vec::new();
    if !p.dynamic.command.is_empty() {
        let argv = p.dynamic.argv();
        let out = command(spec, app, ("parameters", &argv), cancel).map_err(|source| RequestError::Command {
            prefix: "get parameters announcement error: error executing dynamic parameter output command",
            source,
        })?;
        dynamic = params::parse_dynamic(&out)?;
    }
    Ok(Outcome::Parameters(params::announce(dynamic, &p.static_)))
}

fn generator(
    spec: &RequestSpec,
    app: &Path,
    cancel: &CancelToken,
) -> Result<Outcome, RequestError> {
    let argv = spec.config.spec.generate.argv();
    let request = spec.tree.join(GENERATOR_REQUEST);
    let out = command_with_stdin(spec, app, ("generator", &argv), Some(&request), cancel).map_err(
        |source| RequestError::Command {
            prefix: "generator command failed",
            source,
        },
    )?;
    Ok(Outcome::Generated(parse_generated(&out)?))
}

/// The generator command's stdout: a JSON array whose elements are all objects, re-encoded
/// compactly (an empty output means no parameters).
pub fn parse_generated(out: &str) -> Result<String, RequestError> {
    if out.trim().is_empty() {
        return Ok("[]".into());
    }
    let v: serde_json::Value = serde_json::from_str(out).map_err(|e| {
        let head: String = out.chars().take(200).collect();
        RequestError::GeneratorOutput(format!("{e} (output starts: {head:?})"))
    })?;
    match &v {
        serde_json::Value::Array(items) => {
            if let Some(i) = items.iter().position(|x| !x.is_object()) {
                return Err(RequestError::GeneratorOutput(format!(
                    "element {i} is not an object"
                )));
            }
        }
        other => {
            return Err(RequestError::GeneratorOutput(format!(
                "got a JSON {}",
                match other {
                    serde_json::Value::Object(_) => "object",
                    serde_json::Value::String(_) => "string",
                    serde_json::Value::Number(_) => "number",
                    serde_json::Value::Bool(_) => "boolean",
                    _ => "null",
                }
            )));
        }
    }
    Ok(v.to_string())
}
