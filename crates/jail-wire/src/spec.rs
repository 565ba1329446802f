//! The vocabulary of one request, shared by the server, the supervisor and the jail: what is
//! asked ([`Operation`], [`Task`], [`RequestSpec`]), what comes back ([`Outcome`]) and how it can
//! fail ([`RequestError`], classified by [`ErrorKind`]). [`Task`] crosses the pipe to the jail
//! unchanged, inside the header frame.

use std::time::Duration;

use plugin::PluginConfig;
use plugin::config::ParameterAnnouncement;
use serde::{Deserialize, Serialize};

/// What the request asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
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

impl Operation {
    /// The RPC's name as Argo CD's service defines it (logs, audit events, metrics).
    pub fn rpc_name(self) -> &'static str {
        match self {
            Operation::Generate => "GenerateManifest",
            Operation::Match => "MatchRepository",
            Operation::Parameters => "GetParametersAnnouncement",
            Operation::Generator => "getparams.execute",
        }
    }
}

/// The file (at the tree's root) holding the generator's HTTP request body.
pub const GENERATOR_REQUEST: &str = ".cmp-warden-request.json";

/// Which time limit ended a command (the response names it).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum TimeLimit {
    /// The client's gRPC deadline.
    Client,
    /// The policy's per-request wall clock (`spec.limits.wallSeconds`).
    Request {
        /// Seconds.
        seconds: u64,
    },
    /// The per-command limit (`ARGOCD_EXEC_TIMEOUT`).
    Command {
        /// As configured (Go duration text).
        text: String,
    },
}

/// What the jail needs to run one request besides its archive bytes and its clock; built by
/// `supervisor::Plan::task` and sent to the jail as it is.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Task {
    /// Which RPC.
    pub op: Operation,
    /// The plugin.
    pub config: PluginConfig,
    /// `metadata.appRelPath`.
    pub app_rel_path: String,
    /// Environment for commands (the policy's server variables, then the request's).
    pub env: Vec<(String, String)>,
    /// Archive limits; `preserve_file_mode` comes from the plugin config.
    pub archive: archive::Options,
    /// Budget for each command's stdout and stderr.
    pub output_bytes: u64,
    /// The most a reply may carry (the gRPC message limit): generate's manifests, YAML
    /// aliases expanded, must fit in it.
    pub reply_bytes: u64,
    /// Which limit the request's deadline comes from (named in the error when it fires).
    pub deadline_limit: TimeLimit,
    /// Per-command limit (`ARGOCD_EXEC_TIMEOUT`) and its configured text.
    pub command_timeout: Option<(Duration, String)>,
    /// The SHA-256 the client claims for the archive (`metadata.checksum`): it only chooses
    /// a cached tree; the bytes are verified as they arrive all the same.
    #[serde(default)]
    pub archive_sha256: Option<String>,
    /// The archive's size the client states (`metadata.size`, bytes of the `.tar.gz`): it
    /// only decides whether the archive is worth caching.
    #[serde(default)]
    pub archive_size: Option<u64>,
}

/// A request's result.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
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

/// How a failure maps onto the client's error classes (the server turns these into gRPC codes
/// in one place).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum ErrorKind {
    /// Bad input (archive policy, appRelPath).
    InvalidArgument,
    /// A limit.
    ResourceExhausted,
    /// Integrity.
    DataLoss,
    /// Deadline.
    DeadlineExceeded,
    /// Client cancel or shutdown.
    Cancelled,
    /// A command or its output failed.
    Unknown,
    /// Our own failure (including a sandbox that could not be built).
    Internal,
}

/// Why a request failed, as the client sees it: a class and a message (Argo CD's wording where
/// it has one; the jail classifies its own failures before they cross the pipe).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct RequestError {
    /// Class.
    pub kind: ErrorKind,
    /// Message.
    pub message: String,
}

impl RequestError {
    /// An error of class `kind`.
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        RequestError {
            kind,
            message: message.into(),
        }
    }

    /// Our own failure.
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Internal, message)
    }

    /// The error class the client sees.
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }
}

/// Client-supplied text as an error may echo it: at most `max` bytes (cut at a character
/// boundary), with how much was left out.
pub fn bounded(s: &str, max: usize) -> std::borrow::Cow<'_, str> {
    if s.len() <= max {
        return s.into();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}… ({} bytes in all)", &s[..end], s.len()).into()
}

/// The generator command's stdout: a JSON array whose elements are all objects, re-encoded
/// compactly (an empty output means no parameters). Also the format of a generator's static
/// file source. The error reads `generator output is not a JSON array of objects: …`.
pub fn parse_generated(out: &str) -> Result<String, String> {
    generated(out).map_err(|e| format!("generator output is not a JSON array of objects: {e}"))
}

fn generated(out: &str) -> Result<String, String> {
    if out.trim().is_empty() {
        return Ok("[]".into());
    }
    let v: serde_json::Value = serde_json::from_str(out).map_err(|e| {
        let head: String = out.chars().take(200).collect();
        format!("{e} (output starts: {head:?})")
    })?;
    match &v {
        serde_json::Value::Array(items) => {
            if let Some(i) = items.iter().position(|x| !x.is_object()) {
                return Err(format!("element {i} is not an object"));
            }
        }
        other => {
            return Err(format!(
                "got a JSON {}",
                match other {
                    serde_json::Value::Object(_) => "object",
                    serde_json::Value::String(_) => "string",
                    serde_json::Value::Number(_) => "number",
                    serde_json::Value::Bool(_) => "boolean",
                    _ => "null",
                }
            ));
        }
    }
    Ok(v.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn echoed_client_text_is_bounded_at_a_character_boundary() {
        assert_eq!(bounded("apps/web", 256), "apps/web");
        let long = "é".repeat(100_000);
        let b = bounded(&long, 255);
        assert!(b.len() < 300, "{}", b.len());
        assert!(b.ends_with("… (200000 bytes in all)"), "{b}");
    }
}
