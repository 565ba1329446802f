//! One request's vocabulary, shared by the server, the supervisor and the jail: what is asked
//! ([`Operation`]), what comes back ([`Outcome`]) and how it can fail ([`RequestError`],
//! classified by [`ErrorKind`]).

use std::collections::BTreeMap;

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

/// `repository.ParameterAnnouncement`, as in plugin.yaml and dynamic-command output.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ParameterAnnouncement {
    /// name
    pub name: String,
    /// title
    pub title: String,
    /// tooltip
    pub tooltip: String,
    /// required
    pub required: bool,
    /// itemType
    pub item_type: String,
    /// collectionType
    pub collection_type: String,
    /// string default
    pub string: String,
    /// array default
    pub array: Vec<String>,
    /// map default
    pub map: BTreeMap<String, String>,
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
#[derive(Debug, Clone, PartialEq, Eq)]
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

impl std::fmt::Display for RequestError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for RequestError {}

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
