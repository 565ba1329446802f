//! The sentinel layout and the checks every archive test and fuzz run applies.

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use rustix::fs::{Mode, OFlags, ResolveFlags};
use rustix::io::Errno;
use sha2::{Digest, Sha256};

/// What a path in a tree is, for comparisons.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Node {
    /// Directory with permission bits.
    Dir(u32),
    /// File with permission bits and SHA-256 of its content.
    File(u32, String),
    /// Symlink with its target.
    Symlink(String),
    /// Anything else (device, FIFO, socket).
    Special,
}

/// Describe every path beneath `root` (not following symlinks), keyed by relative path
/// (lossy UTF-8 for display and comparison; see [`describe_paths`] for exact names).
pub fn describe_tree(root: &Path) -> BTreeMap<String, Node> {
    describe_paths(root)
        .into_iter()
        .map(|(p, n)| (p.to_string_lossy().into_owned(), n))
        .collect()
}

/// Like [`describe_tree`], keyed by the exact relative paths (names may be any bytes).
pub fn describe_paths(root: &Path) -> BTreeMap<PathBuf, Node> {
    let mut out = BTreeMap::new();
    describe(root, root, &mut out);
    out
}

fn describe(root: &Path, dir: &Path, out: &mut BTreeMap<PathBuf, Node>) {
    let Ok(rd) = fs::read_dir(dir) else { return };
    for e in rd {
        let p = e.expect("dir entry").path();
        let rel = p.strip_prefix(root).expect("beneath").to_path_buf();
        let md = fs::symlink_metadata(&p).expect("lstat");
        let perm = md.permissions().mode() & 0o7777;
        let ft = md.file_type();
        let node = if ft.is_symlink() {
            Node::Symlink(
                fs::read_link(&p)
                    .expect("readlink")
                    .to_string_lossy()
                    .into_owned(),
            )
        } else if ft.is_dir() {
            describe(root, &p, out);
            Node::Dir(perm)
        } else if ft.is_file() {
            Node::File(perm, hex(&Sha256::digest(fs::read(&p).expect("read"))))
        } else {
            Node::Special
        };
        out.insert(rel, node);
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// Check an extracted tree: no special files, modes within policy, no setuid/setgid/sticky,
/// owned by us, and every symlink resolves beneath the root (RESOLVE_BENEATH never says EXDEV).
pub fn check_contained(root: &Path) -> Result<(), String> {
    let rootfd = rustix::fs::open(root, OFlags::PATH | OFlags::DIRECTORY, Mode::empty())
        .map_err(|e| format!("open root: {e}"))?;
    let euid = rustix::process::geteuid().as_raw();
    for (path, node) in describe_paths(root) {
        let rel = path.display().to_string();
        let md = fs::symlink_metadata(root.join(&path)).map_err(|e| format!("{rel}: {e}"))?;
        if md.uid() != euid {
            return Err(format!("{rel}: owned by uid {}", md.uid()));
        }
        match node {
            Node::Special => return Err(format!("{rel}: special file")),
            Node::Dir(m) if m != 0o755 => return Err(format!("{rel}: dir mode {m:o}")),
            Node::File(m, _) if m != 0o644 && m != 0o755 => {
                return Err(format!("{rel}: file mode {m:o}"));
            }
            Node::Symlink(_) => {
                let how = ResolveFlags::BENEATH | ResolveFlags::NO_MAGICLINKS;
                match rustix::fs::openat2(&rootfd, path.as_path(), OFlags::PATH, Mode::empty(), how)
                {
                    Ok(_) | Err(Errno::NOENT) | Err(Errno::LOOP) | Err(Errno::NOTDIR) => {}
                    Err(Errno::XDEV) => {
                        return Err(format!("{rel}: symlink resolves outside the root"));
                    }
                    Err(e) => return Err(format!("{rel}: resolving: {e}")),
                }
            }
            _ => {}
        }
    }
    Ok(())
}

/// `outer/{decoy/{victim.txt, dir/}, sentinel/root/}` with a snapshot of everything outside the
/// root, so a test can prove an attack touched nothing.
#[derive(Debug)]
pub struct Sentinel {
    outer: tempfile::TempDir,
    /// The extraction root (exists, empty).
    pub root: PathBuf,
    /// The sentinel directory containing only `root`.
    pub sentinel: PathBuf,
    /// A directory outside the sentinel that attacks aim at.
    pub decoy: PathBuf,
    before: BTreeMap<PathBuf, Node>,
}

impl Sentinel {
    /// Fresh layout.
    pub fn new() -> Self {
        let outer = tempfile::Builder::new()
            .prefix("cmpw-sentinel")
            .tempdir()
            .expect("tempdir");
        let decoy = outer.path().join("decoy");
        fs::create_dir_all(decoy.join("dir")).expect("mkdir");
        fs::write(decoy.join("victim.txt"), b"original\n").expect("write");
        let sentinel = outer.path().join("sentinel");
        let root = sentinel.join("root");
        fs::create_dir_all(&root).expect("mkdir");
        let before = describe_outside(outer.path());
        Self {
            outer,
            root,
            sentinel,
            decoy,
            before,
        }
    }

    /// The scratch directory holding everything.
    pub fn outer(&self) -> &Path {
        self.outer.path()
    }

    /// Nothing exists in the sentinel besides the root, and nothing outside changed.
    pub fn assert_outside_untouched(&self) {
        let in_sentinel: Vec<_> = fs::read_dir(&self.sentinel)
            .expect("read sentinel")
            .map(|e| e.expect("entry").file_name())
            .collect();
        assert_eq!(
            in_sentinel,
            vec![std::ffi::OsString::from("root")],
            "sentinel holds only the root"
        );
        assert_eq!(
            describe_outside(self.outer.path()),
            self.before,
            "scratch dir outside the root changed"
        );
    }

    /// The root exists and is empty.
    pub fn assert_root_empty(&self) {
        let left: Vec<_> = fs::read_dir(&self.root).expect("read root").collect();
        assert!(left.is_empty(), "root not empty after rejection: {left:?}");
    }
}

impl Default for Sentinel {
    fn default() -> Self {
        Self::new()
    }
}

fn describe_outside(outer: &Path) -> BTreeMap<PathBuf, Node> {
    let mut all = describe_paths(outer);
    all.retain(|k, _| !k.starts_with("sentinel/root"));
    all
}
