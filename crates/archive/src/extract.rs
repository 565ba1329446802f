//! The pipeline: input → SHA-256/cap → gzip → counters → tar headers → validate → sink.

use std::io::{self, Read};
use std::time::Instant;

use crate::error::{ExtractError, LimitKind, Reason};
use crate::gzip::GzipReader;
use crate::header::BLOCK;
use crate::limits::Limits;
use crate::stream::{Compressed, Decompressed, Shared, Tripwire};
use crate::validate::{Decision, State, pax_body_len};
use crate::writer::Sink;

/// How to extract.
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub struct Options {
    /// Bounds.
    pub limits: Limits,
    /// plugin.yaml `preserveFileMode`: keep the owner-execute bit (files become 0755).
    pub preserve_file_mode: bool,
    /// Refuse the archive (and remove the tree) unless the compressed bytes hash to this.
    pub expected_sha256: Option<[u8; 32]>,
    /// The caller hashes the bytes itself (the server verifies what it forwards): skip the
    /// SHA-256 here unless `expected_sha256` asks for it. [`Summary::sha256`] is then `None`.
    #[serde(default)]
    pub skip_digest: bool,
}

/// What an accepted archive contained.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Summary {
    /// Entries accepted (files + directories + symlinks; the root entry is not counted).
    pub entries: u64,
    /// Regular files.
    pub files: u64,
    /// Directories (explicit entries).
    pub dirs: u64,
    /// Symlinks.
    pub symlinks: u64,
    /// Bytes of file data written.
    pub file_bytes: u64,
    /// Compressed bytes consumed.
    pub compressed_bytes: u64,
    /// Decompressed tar stream bytes.
    pub tar_bytes: u64,
    /// SHA-256 of the compressed bytes (`None` with [`Options::skip_digest`]).
    pub sha256: Option<[u8; 32]>,
}

impl Summary {
    /// Lowercase hex SHA-256, as Argo CD's metadata carries it (empty when not computed).
    pub fn sha256_hex(&self) -> String {
        self.sha256.map(hex::encode).unwrap_or_default()
    }
}

type TarStream<R> = Decompressed<GzipReader<Compressed<R>>>;

/// Extract (or, with [`crate::NullSink`], only check) one tar.gz read from `input` in one pass.
/// On any error the sink's partial output is removed before returning.
pub fn extract<R: Read>(
    input: R,
    sink: &mut dyn Sink,
    opts: &Options,
) -> Result<Summary, ExtractError> {
    let span = tracing::debug_span!("extract");
    let _guard = span.enter();
    let wire: Tripwire = std::rc::Rc::new(Shared::default());
    match run(input, sink, opts, &wire) {
        Ok(summary) => {
            tracing::debug!(
                entries = summary.entries,
                bytes = summary.file_bytes,
                "archive accepted"
            );
            Ok(summary)
        }
        Err(err) => {
            tracing::debug!(error = %err, "archive rejected");
            match sink.abort() {
                Ok(()) => Err(err),
                Err(e) => Err(err.with_cleanup_error(e)),
            }
        }
    }
}

/// Turn an I/O error from the parser chain into a reason, preferring what a reader recorded.
fn classify(wire: &Shared, e: &io::Error) -> Reason {
    if let Some(r) = wire.take() {
        return r;
    }
    if e.kind() == io::ErrorKind::UnexpectedEof {
        Reason::Truncated
    } else {
        Reason::Tar(e.to_string())
    }
}

fn run<R: Read>(
    input: R,
    sink: &mut dyn Sink,
    opts: &Options,
    wire: &Tripwire,
) -> Result<Summary, ExtractError> {
    let limits = &opts.limits;
    let deadline = Instant::now() + limits.wall_clock;
    let digest = opts.expected_sha256.is_some() || !opts.skip_digest;
    let compressed = Compressed::new(input, limits, deadline, wire.clone(), digest);
    let gz = GzipReader::new(compressed, limits.gzip_header_field_bytes, wire.clone());
    let tar_stream: TarStream<R> = Decompressed::new(gz, limits, deadline, wire.clone());
    let mut archive = tar::Archive::new(tar_stream);
    let mut state = State::new(limits.clone(), opts.preserve_file_mode);
    let mut s = Summary {
        entries: 0,
        files: 0,
        dirs: 0,
        symlinks: 0,
        file_bytes: 0,
        compressed_bytes: 0,
        tar_bytes: 0,
        sha256: None,
    };
    // Where the byte after the last entry's (padded) data is; the end marker starts there.
    let mut end_of_entries: u64 = 0;
    let mut headers: u64 = 0;
    {
        let entries = archive
            .entries()
            .map_err(|e| ExtractError::new(classify(wire, &e)))?;
        for (index, entry) in entries.raw(true).enumerate() {
            let index = index as u64;
            headers = index + 1;
            let mut entry = entry.map_err(|e| ExtractError::at(classify(wire, &e), index, None))?;
            let block: [u8; BLOCK] = *entry.header().as_bytes();
            let raw_name = entry.path_bytes().into_owned();
            let fail = |r: Reason| ExtractError::at(r, index, Some(&raw_name));
            let size = entry.size();
            end_of_entries = entry
                .raw_file_position()
                .checked_add(size.div_ceil(BLOCK as u64) * BLOCK as u64)
                .ok_or_else(|| fail(Reason::Tar("size overflow".into())))?;

            let pax_body = match pax_body_len(&block, limits).map_err(fail)? {
                Some(len) => {
                    let mut body = vec![0u8; len];
                    entry
                        .read_exact(&mut body)
                        .map_err(|e| fail(classify(wire, &e)))?;
                    Some(body)
                }
                None => None,
            };
            match state.validate(&block, pax_body.as_deref()).map_err(fail)? {
                Decision::SkipRoot | Decision::Pax => {}
                Decision::Dir { at, exists } => {
                    if !exists {
                        sink.dir(&at.path, at.new_parents)
                            .map_err(|e| fail(Reason::io("create directory", e)))?;
                    }
                    s.dirs += 1;
                    s.entries += 1;
                }
                Decision::File { at, size, mode } => {
                    let mut tracked = Tracked {
                        inner: &mut entry,
                        failed: None,
                    };
                    let written = sink.file(&at.path, at.new_parents, mode, &mut tracked);
                    let failed = tracked.failed.take();
                    let written = match (written, failed) {
                        (Ok(n), _) => n,
                        (Err(_), Some(read_err)) => return Err(fail(classify(wire, &read_err))),
                        (Err(e), None) => return Err(fail(Reason::io("write file", e))),
                    };
                    if written != size {
                        return Err(fail(wire.take().unwrap_or(Reason::Truncated)));
                    }
                    s.files += 1;
                    s.entries += 1;
                    s.file_bytes += written;
                }
                Decision::Symlink { at, target } => {
                    sink.symlink(&at.path, at.new_parents, &target)
                        .map_err(|e| fail(Reason::io("create symlink", e)))?;
                    s.symlinks += 1;
                    s.entries += 1;
                }
            }
        }
    }
    state
        .finish()
        .map_err(|r| ExtractError::at(r, headers, None))?;

    // The tar parser stopped at a zero block or at EOF; what follows must be zeros, and there
    // must be the two-block end marker in total.
    let mut tar_stream = archive.into_inner();
    let consumed_at_stop = tar_stream.count();
    let zeros_at_stop = consumed_at_stop - end_of_entries;
    let budget = (2 * BLOCK as u64 + limits.trailing_bytes).saturating_sub(zeros_at_stop);
    let trailing = drain_zeros(&mut tar_stream, budget, limits, wire)?;
    let zeros_after_entries = zeros_at_stop + trailing;
    if consumed_at_stop == end_of_entries || zeros_after_entries < 2 * BLOCK as u64 {
        return Err(ExtractError::new(Reason::MissingEndMarker));
    }
    s.tar_bytes = tar_stream.count();
    let compressed = tar_stream.into_inner().into_inner();
    s.compressed_bytes = wire.compressed();
    s.sha256 = compressed.finish();
    if let Some(expected) = opts.expected_sha256
        && Some(expected) != s.sha256
    {
        return Err(ExtractError::new(Reason::ChecksumMismatch {
            expected: hex::encode(expected),
            actual: s.sha256_hex(),
        }));
    }
    Ok(s)
}

/// Read the rest of the tar stream (which also verifies the gzip trailer and that nothing
/// follows the member); every byte must be zero and there may be at most `budget` of them: the
/// end marker's blocks the parser has not read yet and `trailing_bytes` after it.
fn drain_zeros<R: Read>(
    r: &mut R,
    budget: u64,
    limits: &Limits,
    wire: &Shared,
) -> Result<u64, ExtractError> {
    // What follows the end-of-archive blocks is a record's padding (10 KiB for GNU tar).
    let mut buf = vec![0u8; 16 * 1024];
    let mut total = 0u64;
    loop {
        let n = match r.read(&mut buf) {
            Ok(0) => return Ok(total),
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(ExtractError::new(classify(wire, &e))),
        };
        if buf[..n].iter().any(|&b| b != 0) {
            return Err(ExtractError::new(Reason::DataAfterEnd));
        }
        total += n as u64;
        if total > budget {
            return Err(ExtractError::new(Reason::limit(
                LimitKind::TrailingBytes,
                limits.trailing_bytes,
            )));
        }
    }
}

/// Remembers whether the data source (rather than the sink) failed.
struct Tracked<'a, R: Read> {
    inner: &'a mut R,
    failed: Option<io::Error>,
}

impl<R: Read> Read for Tracked<'_, R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.inner.read(buf).inspect_err(|e| {
            self.failed = Some(io::Error::new(e.kind(), e.to_string()));
        })
    }
}
