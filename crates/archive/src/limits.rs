//! Every bound the extractor enforces, in one struct the sandbox policy fills.

use std::time::Duration;

/// Limits on one archive. Defaults are the embedded policy's `spec.archive`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Limits {
    /// Compressed bytes read from the input (Argo's `streamed-manifest-max-tar-size` default).
    pub compressed_bytes: u64,
    /// Decompressed tar stream, headers and data (Argo's `*-max-extracted-size` default).
    pub extracted_bytes: u64,
    /// One regular file.
    pub file_bytes: u64,
    /// Decompressed:compressed ratio above which the archive is refused ...
    pub max_ratio: u64,
    /// ... once this many bytes have been decompressed (small archives may compress well).
    pub ratio_grace_bytes: u64,
    /// Entries (files, directories, symlinks; PAX headers are not counted separately).
    pub entries: u64,
    /// Symlinks.
    pub symlinks: u64,
    /// Components in one path.
    pub path_depth: usize,
    /// Bytes in one path (PATH_MAX - 1).
    pub path_bytes: usize,
    /// Bytes in one component (NAME_MAX).
    pub component_bytes: usize,
    /// Bytes in one symlink target (PATH_MAX - 1).
    pub link_target_bytes: usize,
    /// One PAX extended header's data.
    pub pax_header_bytes: u64,
    /// Bytes after the end-of-archive marker (must all be zero).
    pub trailing_bytes: u64,
    /// Optional gzip header fields (FNAME, FCOMMENT, FEXTRA), each.
    pub gzip_header_field_bytes: usize,
    /// Wall clock for the whole extraction, checked on every read (a stalled read needs the
    /// caller's own timeout: the server kills the jail).
    pub wall_clock: Duration,
    /// Stricter than Argo CD: refuse names and link targets holding `\` or control bytes, and
    /// absolute link targets. Off by default: Argo CD accepts them, and real repositories
    /// hold them (links to `/dev/null`, escaped systemd unit names).
    #[serde(default)]
    pub strict_names: bool,
}

const KIB: u64 = 1024;
const MIB: u64 = 1024 * KIB;
const GIB: u64 = 1024 * MIB;

impl Default for Limits {
    fn default() -> Self {
        Self {
            compressed_bytes: 100 * MIB,
            extracted_bytes: GIB,
            file_bytes: 256 * MIB,
            max_ratio: 250,
            ratio_grace_bytes: 16 * MIB,
            entries: 100_000,
            symlinks: 10_000,
            path_depth: 64,
            path_bytes: 4095,
            component_bytes: 255,
            link_target_bytes: 4095,
            pax_header_bytes: 64 * KIB,
            trailing_bytes: MIB,
            gzip_header_field_bytes: 4 * KIB as usize,
            wall_clock: Duration::from_secs(120),
            strict_names: false,
        }
    }
}
