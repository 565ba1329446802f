//! Shared oracle for the archive fuzz targets.
//!
//! Every input is extracted into a root nested in a sentinel directory. Whatever the verdict:
//! no panic, the sentinel holds only the root and nothing around it changed. Accepted: the tree
//! passes the containment oracle (no special files, policy modes, every symlink resolves beneath
//! the root). Refused: the root is empty.

use archive::{Limits, Options, Resolver};
use testkit::{Sentinel, check_contained};

/// Small limits so each run is fast; the logic under test is the same.
pub fn options() -> Options {
    Options {
        limits: Limits {
            compressed_bytes: 1 << 20,
            extracted_bytes: 16 << 20,
            file_bytes: 4 << 20,
            entries: 2000,
            ..Limits::default()
        },
        preserve_file_mode: true,
        expected_sha256: None,
    }
}

/// Run one tar.gz through the pipeline and the oracle.
pub fn run_tgz(tgz: &[u8]) {
    let s = Sentinel::new();
    let fd = archive::DirWriter::open_root(&s.root).expect("open root");
    let mut w = archive::DirWriter::new(fd, Resolver::Auto).expect("read root").expect("empty root");
    match archive::extract(tgz, &mut w, &options()) {
        Ok(_) => {
            if let Err(e) = check_contained(&s.root) {
                panic!("accepted archive escaped: {e}");
            }
        }
        Err(e) => {
            // Only a cleanup failure could leave anything behind; that must not happen.
            let _ = e.to_string();
            s.assert_root_empty();
        }
    }
    s.assert_outside_untouched();
}

/// gzip with the fastest level (the compressed form is not what is under test here).
pub fn gzip_fast(data: &[u8]) -> Vec<u8> {
    use std::io::Write;
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    e.write_all(data).expect("vec");
    e.finish().expect("vec")
}
