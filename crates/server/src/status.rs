//! The one place where gRPC statuses are made: request errors, the service's own refusals,
//! the listeners' and the generator's (HTTP statuses, for the audit event).
//!
//! Archive policy violations and `appRelPath` escapes → InvalidArgument; limits → ResourceExhausted;
//! checksum and corrupt data → DataLoss; deadline → DeadlineExceeded; client cancel → Cancelled;
//! command failures → Unknown with Argo CD's text; our own failures → Internal; a missing or
//! wrong token → Unauthenticated; a refused unix peer → PermissionDenied; a plaintext client on
//! the TLS port → Unavailable.

use tonic::{Code, Status};
use vocab::request::ErrorKind;
use vocab::request::RequestError;

/// The longest pause in a stream whose request holds a sandbox slot (`--stream-idle-timeout`
/// still bounds it when shorter): Argo CD's repo-server streams a ready archive without pauses,
/// and a slot is what honest requests wait for.
pub const HELD_STREAM_IDLE_SECS: u64 = 5;

/// The longest status message sent. Tools' stderr can be long and errors may echo request
/// fields; the message travels as an HTTP/2 header, which clients refuse past their limit
/// (then the user sees a transport error instead of ours).
pub const MAX_MESSAGE_BYTES: usize = 16 * 1024;

/// Map a request error.
pub fn to_status(e: &RequestError) -> Status {
    status(code(e.kind()), e.to_string())
}

/// A status whose message is at most [`MAX_MESSAGE_BYTES`]: the head and the tail (where
/// tools print the error that ended them), with what was cut in between said.
pub fn status(code: Code, message: String) -> Status {
    if message.len() <= MAX_MESSAGE_BYTES {
        return Status::new(code, message);
    }
    let floor = |mut i: usize| {
        while !message.is_char_boundary(i) {
            i -= 1;
        }
        i
    };
    let head = floor(MAX_MESSAGE_BYTES / 2);
    let tail = floor(message.len() - MAX_MESSAGE_BYTES / 4);
    let cut = tail - head;
    Status::new(
        code,
        format!(
            "{} … [{cut} bytes cut] … {}",
            &message[..head],
            &message[tail..]
        ),
    )
}

/// A call without the bearer token, or with another one.
pub fn unauthenticated(why: &dyn std::fmt::Display) -> Status {
    Status::unauthenticated(why.to_string())
}

/// Our own failure.
pub fn internal(why: impl Into<String>) -> Status {
    status(Code::Internal, why.into())
}

/// The request's own wall clock ran out.
pub fn request_wall_clock(seconds: u64) -> Status {
    Status::deadline_exceeded(format!(
        "request wall clock exceeded (policy spec.limits.wallSeconds: {seconds})"
    ))
}

/// The client cancelled, or its connection went away, before an answer.
pub fn client_went_away() -> Status {
    Status::cancelled("context canceled: the client went away")
}

/// A unix-socket peer refused before any call (its UID, or one of our own jailed processes).
pub fn peer_refused(why: impl Into<String>) -> Status {
    Status::permission_denied(why.into())
}

/// A plaintext HTTP/2 client on the TLS port.
pub fn plaintext_on_tls_port() -> Status {
    Status::unavailable(
        "this port serves gRPC over TLS and the client connected without TLS: connect with TLS (cmp-warden client: --tls-ca), or serve plaintext with --insecure",
    )
}

/// A health watch beyond the cap.
pub fn health_watches_full(max: usize) -> Status {
    Status::resource_exhausted(format!(
        "{max} health watches are open on this server already; use grpc.health.v1.Health/Check, or close a watch"
    ))
}

/// An unauthenticated stream beyond a connection's share.
pub fn unauthenticated_streams_full(max: usize) -> Status {
    Status::resource_exhausted(format!(
        "{max} streams without a valid bearer token are open on this connection already: a health check needs one at a time, and CMP calls need the token (the server's --token-file / --token-env)"
    ))
}

/// An unauthenticated stream that did not complete its request in time.
pub fn unauthenticated_too_slow(secs: u64) -> Status {
    Status::deadline_exceeded(format!(
        "a call without a valid bearer token must be answered within {secs} s (its request ended by then); send the token (the server's --token-file / --token-env) for longer calls"
    ))
}

/// The generator's HTTP answer as a status, for its audit event and metrics.
pub fn from_http(http: http::StatusCode, message: &str) -> Status {
    let code = match http.as_u16() {
        400 | 404 | 405 | 415 => Code::InvalidArgument,
        401 => Code::Unauthenticated,
        408 | 504 => Code::DeadlineExceeded,
        413 | 507 => Code::ResourceExhausted,
        503 => Code::Unavailable,
        _ => Code::Unknown,
    };
    status(code, message.to_owned())
}

/// The gRPC code of an error class.
pub fn code(kind: ErrorKind) -> Code {
    match kind {
        ErrorKind::InvalidArgument => Code::InvalidArgument,
        ErrorKind::ResourceExhausted => Code::ResourceExhausted,
        ErrorKind::DataLoss => Code::DataLoss,
        ErrorKind::DeadlineExceeded => Code::DeadlineExceeded,
        ErrorKind::Cancelled => Code::Cancelled,
        ErrorKind::Unknown => Code::Unknown,
        ErrorKind::Internal => Code::Internal,
    }
}

/// Errors found by the service itself while receiving the stream.
#[derive(Debug, thiserror::Error)]
pub enum StreamError {
    /// First message missing or unreadable.
    #[error("error receiving stream header: {0}")]
    Header(String),
    /// First message is not metadata.
    #[error("error getting stream metadata: metadata is nil")]
    NoMetadata,
    /// A later message is not a file chunk.
    #[error("stream request file is nil")]
    NotAFile,
    /// The client's stream failed.
    #[error("error receiving tgz file: {0}")]
    Receive(String),
    /// More compressed bytes than allowed.
    #[error("error receiving tgz file: compressed archive exceeds the limit of {0} bytes")]
    TooLarge(u64),
    /// SHA-256 mismatch (Argo's exact text).
    #[error("file checksum validation error")]
    Checksum,
    /// The request deadline passed.
    #[error("context deadline exceeded")]
    Deadline,
    /// The client cancelled.
    #[error("context canceled")]
    Cancelled,
    /// Server-side setup failed.
    #[error("error creating workdir for manifest generation: {0}")]
    Workdir(String),
    /// The request's environment is beyond what any client sends.
    #[error("error getting stream metadata: {0}")]
    Env(#[from] plugin::env::EnvError),
    /// No request slot (queue full, or the deadline passed while waiting).
    #[error("server busy: {0}")]
    Busy(String),
    /// The client stopped sending.
    #[error(
        "error receiving tgz file: no message for {0} s (the stream stalled; --stream-idle-timeout)"
    )]
    Stalled(u64),
    /// The client stopped sending while its request held a sandbox slot.
    #[error(
        "error receiving tgz file: no message for {0} s while the request held a sandbox slot (a stream holding one may pause at most {HELD_STREAM_IDLE_SECS} s, or --stream-idle-timeout if shorter, so stalled clients cannot keep honest requests waiting)"
    )]
    StalledHoldingSlot(u64),
    /// The archive took longer to arrive than the policy allows extraction to take.
    #[error(
        "error receiving tgz file: the archive did not arrive within {0} s (policy spec.archive.wallSeconds)"
    )]
    ReceiveTimeout(u64),
    /// `appRelPath` longer than any path.
    #[error(
        "error getting stream metadata: appRelPath is {0} bytes long; at most {MAX_APP_REL_PATH} are accepted (PATH_MAX)"
    )]
    AppRelPath(usize),
    /// Argo CD's own variables that choose the policy (`spec.select`) do not say one thing.
    #[error(
        "error getting stream metadata: {0}; the policy is chosen by it (spec.select), so it must be given once"
    )]
    Selection(policy::select::GivenTwice),
}

/// The longest `appRelPath` accepted (Linux's PATH_MAX).
pub const MAX_APP_REL_PATH: usize = 4096;

impl StreamError {
    /// Its status.
    pub fn to_status(&self) -> Status {
        let code = match self {
            Self::Header(_) | Self::NoMetadata | Self::NotAFile => Code::InvalidArgument,
            Self::Receive(_) => Code::Unknown,
            Self::TooLarge(_) => Code::ResourceExhausted,
            Self::Checksum => Code::DataLoss,
            Self::Deadline => Code::DeadlineExceeded,
            Self::Cancelled => Code::Cancelled,
            Self::Workdir(_) => Code::Internal,
            Self::Env(_) | Self::AppRelPath(_) | Self::Selection(_) => Code::InvalidArgument,
            Self::Busy(_) => Code::ResourceExhausted,
            Self::Stalled(_) | Self::StalledHoldingSlot(_) | Self::ReceiveTimeout(_) => {
                Code::DeadlineExceeded
            }
        };
        status(code, self.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_long_message_keeps_its_head_and_tail_within_the_bound() {
        let msg = format!(
            "error generating manifests: {}FATAL: the end",
            "é".repeat(40_000)
        );
        let s = status(Code::Unknown, msg);
        assert!(
            s.message().len() <= MAX_MESSAGE_BYTES + 64,
            "{}",
            s.message().len()
        );
        assert!(s.message().starts_with("error generating manifests: "));
        assert!(s.message().ends_with("FATAL: the end"));
        assert!(s.message().contains(" bytes cut] "));
        assert_eq!(status(Code::Unknown, "short".into()).message(), "short");
    }
}
