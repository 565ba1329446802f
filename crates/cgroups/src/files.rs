//! Reading and writing cgroupfs files: every write names its file in the error.

use std::io;
use std::path::Path;

use crate::CgroupError;

pub(crate) fn io_err(
    what: &'static str,
    path: &Path,
) -> impl FnOnce(io::Error) -> CgroupError + use<> {
    let path = path.display().to_string();
    move |source| CgroupError::Io { what, path, source }
}

pub(crate) fn write(path: &Path, value: &str) -> Result<(), CgroupError> {
    std::fs::write(path, value).map_err(io_err("writing", path))
}

/// A file holding one number (0 if missing or unreadable).
pub(crate) fn read_u64(path: &Path) -> u64 {
    std::fs::read_to_string(path)
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(0)
}

/// The value of `key` in a flat keyed file (`key value` lines; 0 if absent).
pub(crate) fn keyed(path: &Path, key: &str) -> u64 {
    std::fs::read_to_string(path)
        .ok()
        .and_then(|s| {
            s.lines().find_map(|l| {
                let (k, v) = l.split_once(' ')?;
                (k == key).then(|| v.trim().parse().ok()).flatten()
            })
        })
        .unwrap_or(0)
}
