//! Safe, streaming, bounded extraction of a gzip'd tar onto a directory fd.
//!
//! The input is read once, from any [`std::io::Read`]: its SHA-256 is computed as it streams,
//! gzip framing is checked strictly (one member, nothing after it), the `tar` crate is used only
//! to split raw headers (never to unpack), every header goes through the pure
//! [`validate::State::validate`] step, and accepted entries are written by a [`DirWriter`] that
//! never follows a symlink. Any violation rejects the whole archive and removes what was
//! written. The policy and its reasons are in docs/design.md (archive pipeline).
//!
//! # Compatibility
//! Accepts everything Argo CD's repo-server writes (`util/io/files/tar.go`): a root `.` entry,
//! regular files, directories and in-tree symlinks in ustar or PAX headers, names with `\` or
//! control bytes, and any link target that stays inside — absolute ones and ones with an inner
//! `..` included — read beneath the link's directory and written relative and clean, as Argo
//! CD's own `Untgz` does. Refuses what it never writes (hard links, devices,
//! FIFOs, sparse, GNU long names, global PAX headers) and anything that would leave the tree.
//! [`Limits::strict_names`] refuses the Argo-accepted oddities too.
//!
//! # Test strategy
//! Unit tests per module; `tests/` attacks every class (traversal, links, special files, header abuse, bombs) inside a
//! sentinel directory and compares Argo-shaped archives to their source trees; `fuzz/` drives the
//! whole pipeline with three targets.
#![forbid(unsafe_code)]

mod error;
mod extract;
mod gzip;
pub mod header;
mod limits;
pub mod pack;
pub mod path;
pub mod pax;
mod stream;
pub mod validate;
mod writer;

pub use error::{ErrorClass, ExtractError, LimitKind, Reason, escape};
pub use extract::{Options, Summary, extract};
pub use limits::Limits;
pub use pack::{PackSummary, pack_dir, pack_tree};
pub use writer::{DirWriter, NullSink, Resolver, Sink, regain_dir, remove_contents};

use std::io::Read;
use std::path::Path;

/// Validate an archive without writing anything.
pub fn check<R: Read>(input: R, opts: &Options) -> Result<Summary, ExtractError> {
    extract(input, &mut NullSink, opts)
}

/// Extract into the directory at `dir`, which must exist and be empty.
pub fn extract_to_dir<R: Read>(
    input: R,
    dir: &Path,
    opts: &Options,
) -> Result<Summary, ExtractError> {
    let fd = DirWriter::open_root(dir)
        .map_err(|e| ExtractError::new(Reason::io("open destination", e)))?;
    let mut writer = DirWriter::new(fd, Resolver::Auto)
        .map_err(|e| ExtractError::new(Reason::io("read destination", e)))?
        .map_err(ExtractError::new)?;
    extract(input, &mut writer, opts)
}
