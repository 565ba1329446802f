//! The one place where request errors become gRPC statuses.
//!
//! Archive policy violations and `appRelPath` escapes → InvalidArgument; limits → ResourceExhausted;
//! checksum and corrupt data → DataLoss; deadline → DeadlineExceeded; client cancel → Cancelled;
//! command failures → Unknown with Argo CD's text; our own failures → Internal.

use jail::ErrorKind;
use jail::RequestError;
use tonic::{Code, Status};

/// Map a request error.
pub fn to_status(e: &RequestError) -> Status {
    Status::new(code(e.kind()), e.to_string())
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
}

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
        };
        Status::new(code, self.to_string())
    }
}
