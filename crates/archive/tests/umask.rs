//! The modes the writer gives do not depend on the process umask: under a umask of 077 (a
//! jail's) it sets them on each new fd itself; told the umask is clear, it trusts creation
//! (mutants: either `!umask_clear` test inverted -> 0700 directories or 0600 files under 077).
//! A test binary of its own: the umask is the process's, and no other test may run beside it.

use std::io::Cursor;
use std::os::unix::fs::PermissionsExt;

use archive::{DirWriter, Limits, Resolver, Sink};
use rustix::fs::Mode;

fn entry(path: &str) -> archive::path::EntryPath {
    archive::path::normalize(path.as_bytes(), false, &Limits::default())
        .expect("a valid entry path")
        .expect("not the root")
}

fn mode(p: &std::path::Path) -> u32 {
    std::fs::symlink_metadata(p)
        .expect("stat")
        .permissions()
        .mode()
        & 0o7777
}

#[test]
fn modes_are_exact_whatever_the_umask() {
    for clear in [false, true] {
        let scratch = tempfile::tempdir().expect("tmp");
        let root = DirWriter::open_root(scratch.path()).expect("root");
        let w = DirWriter::new(root, Resolver::Auto)
            .expect("writer")
            .expect("empty");
        let mut w = if clear { w.umask_cleared() } else { w };
        let old = rustix::process::umask(Mode::from_raw_mode(if clear { 0 } else { 0o077 }));
        w.dir(&entry("d"), 0).expect("dir");
        w.file(&entry("d/f"), 0, 0o644, &mut Cursor::new(b"x"))
            .expect("file");
        w.file(&entry("e/x"), 1, 0o755, &mut Cursor::new(b"x"))
            .expect("file beneath an implicit parent");
        rustix::process::umask(old);
        for (path, want) in [("d", 0o755), ("d/f", 0o644), ("e", 0o755), ("e/x", 0o755)] {
            assert_eq!(
                mode(&scratch.path().join(path)),
                want,
                "{path} (umask cleared: {clear})"
            );
        }
    }
}
