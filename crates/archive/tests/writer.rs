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

/// Run this test's body again as a child in a private mount namespace (`unshare`), where it
/// may mount; `Some(dir)` in the child, `None` in the parent (which has checked the child).
fn in_mount_namespace(test: &str, dir: &Path) -> Option<std::path::PathBuf> {
    const VAR: &str = "ARCHIVE_TEST_MOUNT_NS_DIR";
    if let Some(d) = std::env::var_os(VAR) {
        return Some(d.into());
    }
    // /proc/self belongs to the effective UID.
    let euid = std::os::unix::fs::MetadataExt::uid(&std::fs::metadata("/proc/self").expect("proc"));
    if euid != 0 {
        assert!(
            std::env::var_os("CMP_WARDEN_TESTS_MUST_RUN").is_none(),
            "this test must run here (CMP_WARDEN_TESTS_MUST_RUN): it mounts, which needs root"
        );
        #[allow(clippy::print_stderr)] // A skip says why, as every root-only test here does.
        {
            eprintln!("SKIP: mounting needs root");
        }
        return None;
    }
    let out = std::process::Command::new("unshare")
        .args(["--mount", "--propagation", "private", "--"])
        .arg(std::env::current_exe().expect("the test binary"))
        .args(["--exact", test, "--nocapture", "--test-threads=1"])
        .env(VAR, dir)
        .output()
        .expect("unshare");
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success() && said.contains("1 passed"),
        "the child in its mount namespace: {said}"
    );
    None
}

#[test]
fn a_mount_inside_the_tree_is_never_crossed() {
    let scratch = tempfile::tempdir().expect("tmp");
    let Some(dir) = in_mount_namespace("a_mount_inside_the_tree_is_never_crossed", scratch.path())
    else {
        return;
    };
    let root = dir.join("root");
    std::fs::create_dir_all(&root).expect("mkdir");
    let mut w = writer(&root, Resolver::Auto);
    // Mounted after the writer took the tree (another process's doing): RESOLVE_NO_XDEV refuses
    // every path through it; the tree's own directories still take entries.
    std::fs::create_dir(root.join("mnt")).expect("mkdir");
    let st = std::process::Command::new("mount")
        .args(["-t", "tmpfs", "elsewhere"])
        .arg(root.join("mnt"))
        .status()
        .expect("mount");
    assert!(st.success(), "mount a tmpfs inside the tree");
    std::fs::create_dir(root.join("mnt/sub")).expect("mkdir");
    for path in ["mnt/planted", "mnt/sub/planted"] {
        let err = w
            .file(&entry(path), 0, 0o644, &mut Cursor::new(b"x"))
            .expect_err("a file beyond the mount");
        assert_eq!(err.raw_os_error(), Some(libc::EXDEV), "{path}: {err}");
    }
    assert_eq!(
        std::fs::read_dir(root.join("mnt/sub"))
            .expect("sub")
            .count(),
        0,
        "written through the mount"
    );
    w.dir(&entry("real"), 0).expect("a directory");
    w.file(&entry("real/ok"), 0, 0o644, &mut Cursor::new(b"ok"))
        .expect("an honest file");
}

#[test]
fn each_entry_lands_in_its_own_parent_whatever_the_order() {
    // The writer keeps the last parent it opened: going back up a level, across to a sibling,
    // or into a parent made implicitly must each open the right one.
    let scratch = tempfile::tempdir().expect("tmp");
    let mut w = writer(scratch.path(), Resolver::Auto);
    w.dir(&entry("a"), 0).expect("a");
    w.dir(&entry("a/b"), 0).expect("a/b");
    w.file(&entry("a/b/x"), 0, 0o644, &mut Cursor::new(b"1"))
        .expect("a/b/x");
    w.file(&entry("a/y"), 0, 0o644, &mut Cursor::new(b"2"))
        .expect("a/y");
    w.dir(&entry("c"), 0).expect("c");
    w.file(&entry("a/b/z"), 0, 0o644, &mut Cursor::new(b"3"))
        .expect("a/b/z");
    w.file(&entry("c/d/e/w"), 2, 0o644, &mut Cursor::new(b"4"))
        .expect("c/d/e/w");
    w.file(&entry("top"), 0, 0o644, &mut Cursor::new(b"5"))
        .expect("top");
    for (path, data) in [
        ("a/b/x", "1"),
        ("a/y", "2"),
        ("a/b/z", "3"),
        ("c/d/e/w", "4"),
        ("top", "5"),
    ] {
        assert_eq!(
            std::fs::read_to_string(scratch.path().join(path)).expect(path),
            data
        );
    }
    let tree = testkit::describe_tree(scratch.path());
    assert_eq!(tree.len(), 10, "{tree:?}");
}

/// Fails with EINTR before each chunk it yields.
struct Interrupting<'a> {
    data: &'a [u8],
    interrupt: bool,
}
impl std::io::Read for Interrupting<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        self.interrupt = !self.interrupt;
        if self.interrupt {
            return Err(std::io::ErrorKind::Interrupted.into());
        }
        let n = self.data.len().min(buf.len()).min(1000);
        buf[..n].copy_from_slice(&self.data[..n]);
        self.data = &self.data[n..];
        Ok(n)
    }
}

#[test]
fn a_file_copy_retries_an_interrupted_read() {
    let scratch = tempfile::tempdir().expect("tmp");
    let mut w = writer(scratch.path(), Resolver::Auto);
    let data = testkit::incompressible(300_000, 7);
    let mut input = Interrupting {
        data: &data,
        interrupt: false,
    };
    let n = w.file(&entry("f"), 0, 0o644, &mut input).expect("copied");
    assert_eq!(n, data.len() as u64);
    assert_eq!(std::fs::read(scratch.path().join("f")).expect("read"), data);
}

#[test]
fn a_locked_directory_is_regained_and_a_link_in_its_place_is_not_followed() {
    use std::os::unix::fs::PermissionsExt;
    let scratch = tempfile::tempdir().expect("tmp");
    let (parent, outside) = (scratch.path().join("tree"), scratch.path().join("outside"));
    std::fs::create_dir_all(parent.join("locked/inner")).expect("mkdir");
    std::fs::create_dir(&outside).expect("mkdir");
    let mode = |p: &Path| {
        std::fs::symlink_metadata(p)
            .expect("stat")
            .permissions()
            .mode()
            & 0o7777
    };
    std::fs::set_permissions(
        parent.join("locked"),
        std::fs::Permissions::from_mode(0o000),
    )
    .expect("lock");
    std::fs::set_permissions(&outside, std::fs::Permissions::from_mode(0o751)).expect("chmod");
    std::os::unix::fs::symlink(&outside, parent.join("link")).expect("plant");
    let fd = DirWriter::open_root(&parent).expect("parent");
    archive::regain_dir(std::os::fd::AsFd::as_fd(&fd), b"locked").expect("regained");
    assert_eq!(mode(&parent.join("locked")), 0o700);
    let err = archive::regain_dir(std::os::fd::AsFd::as_fd(&fd), b"link")
        .expect_err("a link is not a directory to regain");
    assert!(
        matches!(err.raw_os_error(), Some(libc::ELOOP | libc::ENOTDIR)),
        "{err}"
    );
    assert_eq!(mode(&outside), 0o751, "the link's target was chmod-ed");
}

#[test]
fn removal_descends_512_levels_and_refuses_deeper() {
    for (depth, removable) in [(512, true), (513, false)] {
        let scratch = tempfile::tempdir().expect("tmp");
        let deepest = (0..depth).fold(scratch.path().to_path_buf(), |p, _| p.join("d"));
        std::fs::create_dir_all(&deepest).expect("mkdir");
        std::fs::write(deepest.join("f"), b"x").expect("write");
        let fd = DirWriter::open_root(scratch.path()).expect("root");
        let removed = archive::remove_contents(std::os::fd::AsFd::as_fd(&fd));
        if removable {
            removed.expect("512 levels are removed");
            assert_eq!(std::fs::read_dir(scratch.path()).expect("root").count(), 0);
        } else {
            let err = removed.expect_err("513 levels are too deep");
            assert_eq!(err.to_string(), "tree too deep to remove");
        }
    }
}
