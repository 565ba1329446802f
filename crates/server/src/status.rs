//! The one place where request errors become gRPC statuses.
//!
//! Archive policy violations and `appRelPath` escapes → InvalidArgument; limits → ResourceExhausted;
//! checksum and corrupt data → DataLoss; deadline → DeadlineExceeded; client cancel → Cancelled;
//! command failures → Unknown with Argo CD's text; our own failures → Internal.

use jail::ErrorKind;
use jail::RequestError;
use tonic::{Code, Status};

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
            Self::Env(_) | Self::AppRelPath(_) => Code::InvalidArgument,
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
