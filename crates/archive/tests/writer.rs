//! The writer's own defence, attacked where the validator cannot help: a symbolic link already
//! in the tree (planted by another process between validation and writing, or by an archive
//! reader bug) that points out of it. Each entry beneath it must be refused by the kernel's
//! path resolution — `openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS …)`, or the component-wise
//! `O_NOFOLLOW` walk where openat2 is missing — and nothing may appear outside; an honest entry
//! beside it is written (mutants: `ResolveFlags::empty()` -> the Auto writer follows the link
//! and writes outside; `O_NOFOLLOW` out of `DIR_FLAGS` -> the component-wise walk does).

use std::io::Cursor;
use std::path::Path;

use archive::{DirWriter, Limits, Resolver, Sink};

fn entry(path: &str) -> archive::path::EntryPath {
    archive::path::normalize(path.as_bytes(), false, &Limits::default())
        .expect("a valid entry path")
        .expect("not the root")
}

fn writer(root: &Path, resolver: Resolver) -> DirWriter {
    DirWriter::new(DirWriter::open_root(root).expect("root"), resolver)
        .expect("writer")
        .expect("supported")
}

#[test]
fn a_planted_link_out_of_the_tree_is_never_followed() {
    for resolver in [Resolver::Auto, Resolver::ComponentWise] {
        let scratch = tempfile::tempdir().expect("tmp");
        let (root, outside) = (scratch.path().join("root"), scratch.path().join("outside"));
        std::fs::create_dir_all(&root).expect("mkdir");
        std::fs::create_dir_all(outside.join("sub")).expect("mkdir");
        // The writer takes an empty tree; the links appear after (another process's race).
        let mut w = writer(&root, resolver);
        w.dir(&entry("real"), 0).expect("a directory");
        std::os::unix::fs::symlink(&outside, root.join("link")).expect("plant");
        std::os::unix::fs::symlink("real/../../outside", root.join("rel")).expect("plant");
        for via in ["link", "rel"] {
            // Through the link as an inner component (what RESOLVE_NO_SYMLINKS stops; the
            // walk's O_NOFOLLOW stops it at the link), and as the parent itself.
            for path in [format!("{via}/sub/planted"), format!("{via}/planted")] {
                let file = w.file(&entry(&path), 0, 0o644, &mut Cursor::new(b"x"));
                let err = file.expect_err("a file beneath the link");
                assert!(
                    matches!(err.raw_os_error(), Some(libc::ELOOP | libc::ENOTDIR)),
                    "{resolver:?} {path}: {err}"
                );
            }
            let dir = w.dir(&entry(&format!("{via}/sub/deeper")), 1);
            assert!(
                dir.is_err(),
                "{resolver:?} {via}: a directory beneath the link"
            );
            // The link itself is never replaced or written through (O_EXCL | O_NOFOLLOW).
            let over = w.file(&entry(via), 0, 0o644, &mut Cursor::new(b"x"));
            assert_eq!(
                over.expect_err("a file over the link").raw_os_error(),
                Some(libc::EEXIST),
                "{resolver:?} {via}"
            );
        }
        let names: Vec<_> = std::fs::read_dir(&outside)
            .expect("outside")
            .chain(std::fs::read_dir(outside.join("sub")).expect("outside/sub"))
            .map(|e| e.expect("entry").file_name())
            .collect();
        assert_eq!(names, ["sub"], "{resolver:?}: written outside");
        // An honest entry beside the links.
        let n = w
            .file(&entry("real/ok.yaml"), 0, 0o644, &mut Cursor::new(b"ok"))
            .expect("an honest file");
        assert_eq!(n, 2);
        assert_eq!(
            std::fs::read(root.join("real/ok.yaml")).expect("read"),
            b"ok",
            "{resolver:?}"
        );
    }
}
