//! The pure decision step: one raw header (plus a PAX body) in, one [`Decision`] out.
//!
//! No I/O happens here, so the whole policy can be unit-tested and fuzzed. The state remembers
//! every path seen and what it is, which is what makes the symlink rule sound: nothing may be
//! created beneath a symlink or replace an earlier entry.

use std::collections::HashMap;

use crate::error::{LimitKind, Reason};
use crate::header::{self, BLOCK};
use crate::limits::Limits;
use crate::path::{self, EntryPath};
use crate::pax::{self, Pax};

/// What an accepted path is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Dir,
    File,
    Symlink,
}

/// Where an entry goes: its path and how many of its parent directories do not exist yet
/// (always the innermost ones, created 0755 by the writer before the entry).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Planned {
    /// Normalised path.
    pub path: EntryPath,
    /// Trailing ancestors to create.
    pub new_parents: usize,
}

/// The verdict on one header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// The root entry `.`: nothing to do.
    SkipRoot,
    /// A PAX header, remembered for the next entry.
    Pax,
    /// Create a directory (0755). An explicit entry for a directory created implicitly earlier
    /// has `exists` set and needs no write.
    Dir {
        /// Where.
        at: Planned,
        /// Already created as an implicit parent.
        exists: bool,
    },
    /// Create a regular file with exactly `size` bytes and `mode` (0644 or 0755).
    File {
        /// Where.
        at: Planned,
        /// Data bytes that follow.
        size: u64,
        /// Sanitised mode.
        mode: u32,
    },
    /// Create a symlink.
    Symlink {
        /// Where.
        at: Planned,
        /// Checked relative target.
        target: Vec<u8>,
    },
}

/// Per-archive validation state.
#[derive(Debug)]
pub struct State {
    limits: Limits,
    preserve_file_mode: bool,
    paths: HashMap<Vec<u8>, (Kind, bool)>,
    pending: Option<Pax>,
    entries: u64,
    symlinks: u64,
}

impl State {
    /// Fresh state for one archive.
    pub fn new(limits: Limits, preserve_file_mode: bool) -> Self {
        Self {
            limits,
            preserve_file_mode,
            paths: HashMap::new(),
            pending: None,
            entries: 0,
            symlinks: 0,
        }
    }

    /// Called at end of archive: a PAX header must not dangle.
    pub fn finish(&self) -> Result<(), Reason> {
        if self.pending.is_some() {
            Err(Reason::PaxDangling)
        } else {
            Ok(())
        }
    }

    /// Decide one header. `pax_body` is the data of a `x` header (the caller reads at most
    /// `limits.pax_header_bytes` of it, see [`pax_body_len`]).
    pub fn validate(
        &mut self,
        block: &[u8; BLOCK],
        pax_body: Option<&[u8]>,
    ) -> Result<Decision, Reason> {
        let hdr = header::parse(block)?;
        match hdr.typeflag {
            b'x' => {
                if self.pending.is_some() {
                    return Err(Reason::PaxDangling);
                }
                let body = pax_body.ok_or(Reason::PaxMalformed("missing body"))?;
                self.pending = Some(pax::parse(body)?);
                return Ok(Decision::Pax);
            }
            b'0' | b'5' | b'2' => {}
            other => return Err(type_reason(other)),
        }
        let pax = self.pending.take().unwrap_or_default();
        let name = pax.path.as_deref().unwrap_or(&hdr.name);
        if let Some(size) = pax.size
            && size != hdr.size
        {
            return Err(Reason::PaxSizeMismatch {
                pax: size,
                header: hdr.size,
            });
        }
        if pax.linkpath.is_some() && hdr.typeflag != b'2' {
            return Err(Reason::PaxLinkpathOnNonLink);
        }
        let kind = match hdr.typeflag {
            b'5' => Kind::Dir,
            b'2' => Kind::Symlink,
            _ => Kind::File,
        };
        if kind != Kind::File && hdr.size != 0 {
            return Err(Reason::DataOnNonFile(hdr.size));
        }
        if kind != Kind::Symlink && !hdr.linkname.is_empty() {
            return Err(Reason::PaxLinkpathOnNonLink);
        }
        self.entries += 1;
        if self.entries > self.limits.entries {
            return Err(Reason::limit(LimitKind::Entries, self.limits.entries));
        }
        let Some(path) = path::normalize(name, kind == Kind::Dir, &self.limits)? else {
            return Ok(Decision::SkipRoot);
        };

        // The same path twice is refused, except an explicit directory for an implicit parent.
        let mut exists = false;
        if let Some(&(prev, explicit)) = self.paths.get(path.as_bytes()) {
            if prev == Kind::Dir && kind == Kind::Dir && !explicit {
                exists = true;
            } else {
                return Err(Reason::Duplicate);
            }
        }
        let new_parents = self.check_parents(&path)?;
        let at = Planned { path, new_parents };
        let decision = match kind {
            Kind::Dir => Decision::Dir { at, exists },
            Kind::File => {
                if hdr.size > self.limits.file_bytes {
                    return Err(Reason::limit(LimitKind::FileBytes, self.limits.file_bytes));
                }
                let exec = self.preserve_file_mode && hdr.mode & 0o100 != 0;
                Decision::File {
                    at,
                    size: hdr.size,
                    mode: if exec { 0o755 } else { 0o644 },
                }
            }
            Kind::Symlink => {
                let target = pax.linkpath.unwrap_or(hdr.linkname);
                let target = path::check_symlink(&at.path, &target, &self.limits)?;
                self.symlinks += 1;
                if self.symlinks > self.limits.symlinks {
                    return Err(Reason::limit(LimitKind::Symlinks, self.limits.symlinks));
                }
                Decision::Symlink { at, target }
            }
        };
        let key = match &decision {
            Decision::Dir { at, .. } | Decision::File { at, .. } | Decision::Symlink { at, .. } => {
                at
            }
            _ => unreachable!("only entries reach here"),
        };
        self.paths
            .insert(key.path.as_bytes().to_vec(), (kind, true));
        Ok(decision)
    }

    /// Every ancestor must be a directory seen or implied earlier; missing ones are recorded as
    /// implicit directories. Returns how many are new.
    fn check_parents(&mut self, path: &EntryPath) -> Result<usize, Reason> {
        let bytes = path.as_bytes();
        let cuts: Vec<usize> = bytes
            .iter()
            .enumerate()
            .filter(|(_, b)| **b == b'/')
            .map(|(i, _)| i)
            .collect();
        // Walk up from the immediate parent until an existing directory is found.
        let mut missing = 0;
        for &cut in cuts.iter().rev() {
            match self.paths.get(&bytes[..cut]) {
                Some((Kind::Dir, _)) => break,
                Some((Kind::Symlink, _)) => return Err(Reason::BeneathSymlink),
                Some((Kind::File, _)) => return Err(Reason::ParentNotDirectory),
                None => missing += 1,
            }
        }
        for &cut in &cuts[cuts.len() - missing..] {
            self.paths.insert(bytes[..cut].to_vec(), (Kind::Dir, false));
        }
        Ok(missing)
    }
}

fn type_reason(t: u8) -> Reason {
    match t {
        b'1' => Reason::HardLink,
        b'3' | b'4' => Reason::Device,
        b'6' => Reason::Fifo,
        b'7' => Reason::Contiguous,
        b'S' => Reason::Sparse,
        b'L' | b'K' => Reason::GnuLongName,
        b'g' => Reason::PaxGlobal,
        other => Reason::UnknownType(other),
    }
}

/// For a `x` header, how many body bytes to read (refusing oversized ones before reading);
/// `None` for every other header.
pub fn pax_body_len(block: &[u8; BLOCK], limits: &Limits) -> Result<Option<usize>, Reason> {
    let (typeflag, size) = header::typeflag_and_size(block)?;
    if typeflag != b'x' {
        return Ok(None);
    }
    if size > limits.pax_header_bytes {
        return Err(Reason::limit(
            LimitKind::PaxHeaderBytes,
            limits.pax_header_bytes,
        ));
    }
    Ok(Some(size as usize))
}

/// Free-function form of [`State::validate`].
pub fn validate(
    block: &[u8; BLOCK],
    pax_body: Option<&[u8]>,
    state: &mut State,
) -> Result<Decision, Reason> {
    state.validate(block, pax_body)
}
