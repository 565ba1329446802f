//! Test-only helpers shared by the archive tests, the fuzz targets and (later) the server tests.
//!
//! - [`TarBuilder`]: writes raw tar headers byte by byte, so hostile archives (bad PAX records,
//!   GNU headers, odd typeflags, base-256 fields, trailing data) can be expressed without
//!   checked-in binary blobs.
//! - [`argo_tgz`]: packs a directory the way Argo CD's repo-server does (`util/io/files/tar.go`
//!   with Go's `archive/tar` writer), for compatibility tests.
//! - [`Sentinel`]: an extraction root nested in a sentinel directory inside a scratch dir with
//!   decoys, plus the oracle checks.
//! - [`argo_split::ArgoSplit`]: Argo CD's own reading of plugin output, as a process to ask.
#![forbid(unsafe_code)]
#![allow(clippy::print_stderr)]

pub mod argo_split;
mod builder;
mod oracle;

pub use builder::{Hdr, Magic, TarBuilder, argo_tgz, argo_tgz_with, gzip, pax_record};
pub use oracle::{Node, Sentinel, check_contained, describe_paths, describe_tree};

/// A selected policy's text made from a default policy's `default`: the node-wide fields
/// (`require`, `namespaces`, `uidRange`, `cache`: the default's alone) left out, named `name`,
/// choosing requests by `select` (a YAML flow mapping, e.g. `{projects: [team-a]}`).
pub fn selected_policy(default: &str, name: &str, select: &str) -> String {
    let text: String = default
        .lines()
        .filter(|l| {
            !["  require:", "  namespaces:", "  uidRange:", "  cache:"]
                .iter()
                .any(|f| l.starts_with(f))
        })
        .map(|l| format!("{l}\n"))
        .collect();
    assert!(
        text.contains("name: default") && text.contains("spec:\n"),
        "policy fixture: not the default's text"
    );
    text.replacen("name: default", &format!("name: {name}"), 1)
        .replacen("spec:\n", &format!("spec:\n  select: {select}\n"), 1)
}

/// Incompressible text, lowercase letters only (the archive's compression is not what such a
/// test is about), from [`incompressible`].
pub fn noise(n: usize, seed: u64) -> String {
    incompressible(n, seed)
        .into_iter()
        .map(|b| char::from(b'a' + b % 26))
        .collect()
}

/// `n` bytes deflate cannot shrink (xorshift from `seed`; no RNG dependency).
pub fn incompressible(n: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}
