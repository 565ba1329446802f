//! Typed extraction errors: what was wrong, where, and which class it falls into.

use std::fmt;
use std::io;

/// The four ways an archive can fail; the server maps each to one gRPC status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ErrorClass {
    /// The archive contains something the policy forbids (InvalidArgument).
    PolicyViolation,
    /// A configured limit was exceeded (ResourceExhausted).
    LimitExceeded,
    /// The bytes are corrupt, truncated or do not match their checksum (DataLoss).
    Integrity,
    /// Reading the input or writing the tree failed (Internal).
    Io,
}

impl fmt::Display for ErrorClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::PolicyViolation => "policy violation",
            Self::LimitExceeded => "limit exceeded",
            Self::Integrity => "integrity",
            Self::Io => "i/o",
        })
    }
}

/// Which limit of [`crate::Limits`] was exceeded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum LimitKind {
    /// Compressed bytes read from the input.
    CompressedBytes,
    /// Decompressed tar stream bytes (headers and data).
    ExtractedBytes,
    /// Size of one regular file.
    FileBytes,
    /// Decompressed-to-compressed ratio.
    CompressionRatio,
    /// Number of entries.
    Entries,
    /// Number of symlinks.
    Symlinks,
    /// Path components in one name.
    PathDepth,
    /// Bytes in one name.
    PathBytes,
    /// Bytes in one path component.
    ComponentBytes,
    /// Bytes in one symlink target.
    LinkTargetBytes,
    /// Size of one PAX extended header.
    PaxHeaderBytes,
    /// Bytes after the end-of-archive marker.
    TrailingBytes,
    /// Size of an optional gzip header field (name, comment, extra).
    GzipHeaderBytes,
    /// Wall-clock time spent extracting.
    WallClock,
}

impl fmt::Display for LimitKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::CompressedBytes => "compressed bytes",
            Self::ExtractedBytes => "extracted bytes",
            Self::FileBytes => "file size",
            Self::CompressionRatio => "compression ratio",
            Self::Entries => "entry count",
            Self::Symlinks => "symlink count",
            Self::PathDepth => "path depth",
            Self::PathBytes => "path length",
            Self::ComponentBytes => "path component length",
            Self::LinkTargetBytes => "symlink target length",
            Self::PaxHeaderBytes => "pax header size",
            Self::TrailingBytes => "bytes after end of archive",
            Self::GzipHeaderBytes => "gzip header field size",
            Self::WallClock => "extraction wall clock",
        })
    }
}

/// The specific reason an archive was refused.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Reason {
    // ---- policy violations: names ----
    /// Name or target is empty.
    #[error("empty name")]
    EmptyName,
    /// Name starts with `/`.
    #[error("absolute path")]
    AbsolutePath,
    /// A `..` component.
    #[error("'..' component")]
    DotDot,
    /// A `.` component other than a leading `./`.
    #[error("'.' component inside the name")]
    DotComponent,
    /// `//` or a trailing `/` on a non-directory.
    #[error("empty path component")]
    EmptyComponent,
    /// NUL, newline, other control byte, or DEL.
    #[error("control byte 0x{0:02x} in name")]
    ControlByte(u8),
    /// Windows-style separator.
    #[error("backslash in name")]
    Backslash,
    /// Bytes after the NUL terminator of a header string field.
    #[error("bytes after NUL terminator in header field '{0}'")]
    GarbageAfterNul(&'static str),
    /// The same path appears twice (after normalisation).
    #[error("duplicate path")]
    Duplicate,
    /// The entry would be created beneath a symlink from this archive.
    #[error("path passes through a symlink")]
    BeneathSymlink,
    /// A parent of the entry is a regular file from this archive.
    #[error("parent is not a directory")]
    ParentNotDirectory,
    /// The root entry `.` is not a directory.
    #[error("root entry '.' must be a directory")]
    RootNotDirectory,
    // ---- policy violations: types and metadata ----
    /// Hard links are never emitted by Argo CD and are refused.
    #[error("hard link entries are not allowed")]
    HardLink,
    /// Character or block device.
    #[error("device node entries are not allowed")]
    Device,
    /// FIFO.
    #[error("fifo entries are not allowed")]
    Fifo,
    /// Contiguous file (typeflag 7).
    #[error("contiguous file entries are not allowed")]
    Contiguous,
    /// GNU sparse entry.
    #[error("sparse entries are not allowed")]
    Sparse,
    /// GNU long name or long link header.
    #[error("gnu long name/link headers are not allowed")]
    GnuLongName,
    /// PAX global header.
    #[error("pax global headers are not allowed")]
    PaxGlobal,
    /// Any other typeflag.
    #[error("entry type 0x{0:02x} is not allowed")]
    UnknownType(u8),
    /// A directory or symlink that carries data.
    #[error("non-file entry carries {0} bytes of data")]
    DataOnNonFile(u64),
    /// Unknown magic/version, or ambiguous header layout.
    #[error("unrecognised header format")]
    BadMagic,
    /// A numeric field in base-256.
    #[error("base-256 number in header field '{0}'")]
    Base256(&'static str),
    /// A numeric field that is not strict octal.
    #[error("malformed number in header field '{0}'")]
    BadNumber(&'static str),
    /// A PAX record that does not parse.
    #[error("malformed pax record: {0}")]
    PaxMalformed(&'static str),
    /// A PAX key outside the allowlist.
    #[error("pax key '{0}' is not allowed")]
    PaxKeyNotAllowed(String),
    /// A PAX key given twice.
    #[error("duplicate pax key '{0}'")]
    PaxDuplicateKey(String),
    /// PAX `size` differs from the header size.
    #[error("pax size {pax} differs from header size {header}")]
    PaxSizeMismatch {
        /// Size in the PAX record.
        pax: u64,
        /// Size in the ustar header.
        header: u64,
    },
    /// PAX `linkpath` on an entry that is not a symlink.
    #[error("pax linkpath on a non-symlink entry")]
    PaxLinkpathOnNonLink,
    /// A PAX header with no entry after it, or two in a row.
    #[error("pax header not followed by an entry")]
    PaxDangling,
    // ---- policy violations: symlinks ----
    /// Symlink target starting with `/`.
    #[error("absolute symlink target")]
    SymlinkAbsolute,
    /// Symlink target with more leading `..` than the link's depth.
    #[error("symlink target escapes the root")]
    SymlinkEscapes,
    /// `..` after a normal component in a symlink target (`archive.strictNames` only; by
    /// default the target is cleaned as Argo CD cleans it).
    #[error("symlink target has '..' after a name component")]
    SymlinkInnerDotDot,
    // ---- policy violations: container ----
    /// Non-zero bytes after the end-of-archive marker.
    #[error("data after the end-of-archive marker")]
    DataAfterEnd,
    /// Bytes after the single gzip member.
    #[error("trailing bytes after the gzip member (extra members are not accepted)")]
    TrailingGzipData,
    /// Destination directory was not empty.
    #[error("destination directory is not empty")]
    DestinationNotEmpty,
    // ---- limits ----
    /// A configured limit was exceeded.
    #[error("{kind} limit of {limit} exceeded")]
    Limit {
        /// Which limit.
        kind: LimitKind,
        /// The configured value.
        limit: u64,
    },
    // ---- integrity ----
    /// gzip framing or deflate data is invalid.
    #[error("gzip: {0}")]
    Gzip(String),
    /// tar structure invalid (checksum, truncated header or data).
    #[error("tar: {0}")]
    Tar(String),
    /// The input ended before the archive did.
    #[error("archive is truncated")]
    Truncated,
    /// No end-of-archive marker (two zero blocks).
    #[error("missing end-of-archive marker")]
    MissingEndMarker,
    /// SHA-256 of the compressed bytes differs from the expected value.
    #[error("sha256 mismatch: expected {expected}, got {actual}")]
    ChecksumMismatch {
        /// Expected hex digest.
        expected: String,
        /// Computed hex digest.
        actual: String,
    },
    // ---- i/o ----
    /// Reading input or writing output failed.
    #[error("{op}: {source}")]
    Io {
        /// What was being done.
        op: &'static str,
        /// The underlying error.
        #[source]
        source: io::Error,
    },
}

impl Reason {
    /// The class this reason belongs to.
    pub fn class(&self) -> ErrorClass {
        match self {
            Self::Limit { .. } => ErrorClass::LimitExceeded,
            Self::Gzip(_)
            | Self::Tar(_)
            | Self::Truncated
            | Self::MissingEndMarker
            | Self::ChecksumMismatch { .. } => ErrorClass::Integrity,
            Self::Io { .. } => ErrorClass::Io,
            _ => ErrorClass::PolicyViolation,
        }
    }

    pub(crate) fn limit(kind: LimitKind, limit: u64) -> Self {
        Self::Limit { kind, limit }
    }

    pub(crate) fn io(op: &'static str, source: io::Error) -> Self {
        Self::Io { op, source }
    }
}

/// An archive refused, with the entry it happened at.
#[derive(Debug, thiserror::Error)]
pub struct ExtractError {
    reason: Reason,
    entry: Option<u64>,
    name: Option<String>,
    cleanup: Option<io::Error>,
}

impl fmt::Display for ExtractError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.reason)?;
        match (&self.entry, &self.name) {
            (Some(i), Some(n)) => write!(f, " (entry {i}, name \"{n}\")")?,
            (Some(i), None) => write!(f, " (entry {i})")?,
            _ => {}
        }
        if let Some(c) = &self.cleanup {
            write!(f, "; removing the partial tree also failed: {c}")?;
        }
        Ok(())
    }
}

impl ExtractError {
    /// An error not tied to an entry.
    pub fn new(reason: Reason) -> Self {
        Self {
            reason,
            entry: None,
            name: None,
            cleanup: None,
        }
    }

    /// An error at entry `index` (0-based, counting every header) named `name` (raw bytes).
    pub fn at(reason: Reason, index: u64, name: Option<&[u8]>) -> Self {
        Self {
            reason,
            entry: Some(index),
            name: name.map(escape),
            cleanup: None,
        }
    }

    pub(crate) fn with_cleanup_error(mut self, e: io::Error) -> Self {
        self.cleanup = Some(e);
        self
    }

    /// The reason.
    pub fn reason(&self) -> &Reason {
        &self.reason
    }

    /// The class of the reason.
    pub fn class(&self) -> ErrorClass {
        self.reason.class()
    }

    /// Index of the offending header, when known.
    pub fn entry_index(&self) -> Option<u64> {
        self.entry
    }

    /// The offending name, escaped for logs (printable ASCII kept, everything else `\xNN`).
    pub fn entry_name(&self) -> Option<&str> {
        self.name.as_deref()
    }
}

impl From<Reason> for ExtractError {
    fn from(reason: Reason) -> Self {
        Self::new(reason)
    }
}

/// Escape raw name bytes for a log line: printable ASCII as is, the rest as `\xNN`; long names cut.
pub fn escape(raw: &[u8]) -> String {
    const MAX: usize = 256;
    let mut s = String::with_capacity(raw.len().min(MAX) + 8);
    for &b in raw.iter().take(MAX) {
        match b {
            b'\\' => s.push_str("\\\\"),
            b'"' => s.push_str("\\\""),
            0x20..=0x7e => s.push(b as char),
            _ => s.push_str(&format!("\\x{b:02x}")),
        }
    }
    if raw.len() > MAX {
        s.push_str(&format!("...({} bytes)", raw.len()));
    }
    s
}
