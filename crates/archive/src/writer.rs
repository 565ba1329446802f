//! Writing entries beneath a root directory fd without ever following a symlink.
//!
//! Parents are opened with `openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS |
//! RESOLVE_NO_MAGICLINKS | RESOLVE_NO_XDEV)`; where the kernel (or a seccomp filter) lacks
//! openat2 we walk component by component with `O_DIRECTORY | O_NOFOLLOW`, which is equally
//! safe because validated paths contain no `..`. Files are created `O_EXCL | O_NOFOLLOW` and
//! their mode is set with `fchmod` on the new fd (so the umask cannot change it) unless the
//! caller cleared the umask ([`DirWriter::umask_cleared`]); nothing is ever chmod-ed, chown-ed
//! or timestamped by path, and no xattr or device node is ever made.

use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::Path;

use rustix::fs::{self as rfs, AtFlags, Mode, OFlags, ResolveFlags};
use rustix::io::Errno;

use crate::path::EntryPath;

/// Where validated entries go. [`DirWriter`] writes a tree; [`NullSink`] only consumes data.
pub trait Sink {
    /// Create a directory at `path` (after its `new_parents` innermost missing ancestors).
    fn dir(&mut self, path: &EntryPath, new_parents: usize) -> io::Result<()>;
    /// Create a file and copy `data` into it; returns the bytes copied.
    fn file(
        &mut self,
        path: &EntryPath,
        new_parents: usize,
        mode: u32,
        data: &mut dyn Read,
    ) -> io::Result<u64>;
    /// Create a symlink.
    fn symlink(&mut self, path: &EntryPath, new_parents: usize, target: &[u8]) -> io::Result<()>;
    /// Remove everything written so far (called once, on rejection).
    fn abort(&mut self) -> io::Result<()>;
}

/// Consumes entries without writing them (`archive check`).
#[derive(Debug, Default)]
pub struct NullSink;

impl Sink for NullSink {
    fn dir(&mut self, _: &EntryPath, _: usize) -> io::Result<()> {
        Ok(())
    }
    fn file(&mut self, _: &EntryPath, _: usize, _: u32, data: &mut dyn Read) -> io::Result<u64> {
        io::copy(data, &mut io::sink())
    }
    fn symlink(&mut self, _: &EntryPath, _: usize, _: &[u8]) -> io::Result<()> {
        Ok(())
    }
    fn abort(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// How parents are resolved.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resolver {
    /// openat2 with RESOLVE_BENEATH|NO_SYMLINKS|NO_MAGICLINKS|NO_XDEV, falling back if missing.
    Auto,
    /// Component-wise O_NOFOLLOW walk only (used when openat2 is unavailable; tested directly).
    ComponentWise,
}

/// Writes a tree beneath a directory fd it owns.
#[derive(Debug)]
pub struct DirWriter {
    root: OwnedFd,
    resolver: Resolver,
    /// The most recently used parent directory (archives list siblings together).
    cached: Option<(Vec<u8>, OwnedFd)>,
    buf: Vec<u8>,
    /// The process umask is 0 while this writer writes: creation modes are exact.
    umask_clear: bool,
}

/// The file copy buffer starts small (most repository files are) and grows to its maximum with
/// the first file that fills it: zeroed up front, 256 KiB were 64 page faults of every jail,
/// whatever its archive held.
const COPY_BUF_FIRST: usize = 16 * 1024;
const COPY_BUF_MAX: usize = 256 * 1024;

const DIR_FLAGS: OFlags = OFlags::RDONLY
    .union(OFlags::DIRECTORY)
    .union(OFlags::NOFOLLOW)
    .union(OFlags::CLOEXEC);

impl DirWriter {
    /// Take ownership of `root`, which must be an empty directory.
    pub fn new(root: OwnedFd, resolver: Resolver) -> io::Result<Result<Self, crate::Reason>> {
        if !is_empty(root.as_fd())? {
            return Ok(Err(crate::Reason::DestinationNotEmpty));
        }
        Ok(Ok(Self {
            root,
            resolver,
            cached: None,
            buf: Vec::new(),
            umask_clear: false,
        }))
    }

    /// The caller cleared the process umask (`umask(0)`) for as long as this writer writes, so
    /// the mode given at creation is the mode the entry gets: the `fchmod` that otherwise
    /// follows every `mkdirat` and file `openat` is skipped (a third of a directory's
    /// syscalls). A umask that is not 0 would leave modes narrower than the archive's.
    #[must_use]
    pub fn umask_cleared(mut self) -> Self {
        self.umask_clear = true;
        self
    }

    /// Open a directory path as the root (the path itself is trusted: it comes from the operator).
    pub fn open_root(path: &Path) -> io::Result<OwnedFd> {
        Ok(rfs::open(path, DIR_FLAGS, Mode::empty())?)
    }

    /// The root fd.
    pub fn root(&self) -> BorrowedFd<'_> {
        self.root.as_fd()
    }

    /// Give back the root fd.
    pub fn into_root(self) -> OwnedFd {
        self.root
    }

    fn open_beneath(&mut self, rel: &[u8]) -> io::Result<OwnedFd> {
        if self.resolver == Resolver::Auto {
            let how = ResolveFlags::BENEATH
                | ResolveFlags::NO_SYMLINKS
                | ResolveFlags::NO_MAGICLINKS
                | ResolveFlags::NO_XDEV;
            match rfs::openat2(&self.root, rel, DIR_FLAGS, Mode::empty(), how) {
                Ok(fd) => return Ok(fd),
                // No openat2 (old kernel) or filtered by seccomp: fall back for good.
                Err(Errno::NOSYS) | Err(Errno::PERM) => self.resolver = Resolver::ComponentWise,
                Err(e) => return Err(e.into()),
            }
        }
        let mut fd: Option<OwnedFd> = None;
        for comp in rel.split(|&b| b == b'/') {
            let base = fd.as_ref().map_or(self.root.as_fd(), |f| f.as_fd());
            fd = Some(rfs::openat(base, comp, DIR_FLAGS, Mode::empty())?);
        }
        fd.ok_or_else(|| io::Error::other("empty parent path"))
    }

    /// Make the parent of `path` exist (creating `new_parents` of it) and return it, cached.
    fn parent(&mut self, path: &EntryPath, new_parents: usize) -> io::Result<BorrowedFd<'_>> {
        let (parent, _) = path.split_last();
        if parent.is_empty() {
            return Ok(self.root.as_fd());
        }
        let hit = self.cached.as_ref().is_some_and(|(p, _)| p == parent) && new_parents == 0;
        if !hit {
            let comps: Vec<&[u8]> = parent.split(|&b| b == b'/').collect();
            let existing = comps.len() - new_parents;
            let mut fd = if existing == 0 {
                None
            } else {
                let end = comps[..existing].iter().map(|c| c.len() + 1).sum::<usize>() - 1;
                Some(self.open_beneath(&parent[..end])?)
            };
            for comp in &comps[existing..] {
                let base = fd.as_ref().map_or(self.root.as_fd(), |f| f.as_fd());
                fd = Some(make_dir(base, comp, self.umask_clear)?);
            }
            let fd = fd.ok_or_else(|| io::Error::other("empty parent path"))?;
            self.cached = Some((parent.to_vec(), fd));
        }
        Ok(self
            .cached
            .as_ref()
            .map(|(_, fd)| fd.as_fd())
            .unwrap_or(self.root.as_fd()))
    }
}

/// mkdirat 0755 + open it no-follow + fchmod unless the umask is known clear (the umask must
/// not decide the mode).
fn make_dir(base: BorrowedFd<'_>, name: &[u8], umask_clear: bool) -> io::Result<OwnedFd> {
    rfs::mkdirat(base, name, Mode::from_raw_mode(0o755))?;
    let fd = rfs::openat(base, name, DIR_FLAGS, Mode::empty())?;
    if !umask_clear {
        rfs::fchmod(&fd, Mode::from_raw_mode(0o755))?;
    }
    Ok(fd)
}

impl Sink for DirWriter {
    fn dir(&mut self, path: &EntryPath, new_parents: usize) -> io::Result<()> {
        let (_, name) = path.split_last();
        let umask_clear = self.umask_clear;
        let parent = self.parent(path, new_parents)?;
        let fd = make_dir(parent, name, umask_clear)?;
        // Children usually follow their directory: keep it as the cached parent.
        self.cached = Some((path.as_bytes().to_vec(), fd));
        Ok(())
    }

    fn file(
        &mut self,
        path: &EntryPath,
        new_parents: usize,
        mode: u32,
        data: &mut dyn Read,
    ) -> io::Result<u64> {
        let (_, name) = path.split_last();
        let umask_clear = self.umask_clear;
        let parent = self.parent(path, new_parents)?;
        let flags =
            OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC;
        let fd = rfs::openat(parent, name, flags, Mode::from_raw_mode(mode))?;
        if !umask_clear {
            rfs::fchmod(&fd, Mode::from_raw_mode(mode))?;
        }
        let mut file = File::from(fd);
        let mut total = 0u64;
        if self.buf.is_empty() {
            self.buf.resize(COPY_BUF_FIRST, 0);
        }
        loop {
            let n = match data.read(&mut self.buf) {
                Ok(0) => break,
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            };
            file.write_all(&self.buf[..n])?;
            total += n as u64;
            if n == self.buf.len() && n < COPY_BUF_MAX {
                // A large file: fewer, larger writes.
                self.buf.resize((n * 4).min(COPY_BUF_MAX), 0);
            }
        }
        Ok(total)
    }

    fn symlink(&mut self, path: &EntryPath, new_parents: usize, target: &[u8]) -> io::Result<()> {
        let (_, name) = path.split_last();
        let parent = self.parent(path, new_parents)?;
        rfs::symlinkat(target, parent, name)?;
        Ok(())
    }

    fn abort(&mut self) -> io::Result<()> {
        self.cached = None;
        remove_contents(self.root.as_fd())
    }
}

fn is_empty(dir: BorrowedFd<'_>) -> io::Result<bool> {
    for ent in rfs::Dir::read_from(dir)? {
        let name = ent?.file_name().to_bytes().to_vec();
        if name != b"." && name != b".." {
            return Ok(false);
        }
    }
    Ok(true)
}

/// Make the directory `name` in `parent` 0700 again after a tool locked it down: open the
/// exact inode with `O_PATH|O_NOFOLLOW` (works without any permission on it) and chmod it
/// through its `/proc/self/fd` link (`fchmodat(AT_SYMLINK_NOFOLLOW)` is unsupported on many
/// kernels, and `fchmod` refuses `O_PATH` descriptors).
pub fn regain_dir(parent: BorrowedFd<'_>, name: &[u8]) -> io::Result<()> {
    let p = rfs::openat(
        parent,
        name,
        OFlags::PATH | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    let link = format!("/proc/self/fd/{}", std::os::fd::AsRawFd::as_raw_fd(&p));
    rfs::chmod(link.as_str(), Mode::from_raw_mode(0o700))?;
    Ok(())
}

/// Whether `name` in `dir` is a directory (not a link to one): from readdir's type, or from an
/// lstat where the filesystem reports none.
fn is_dir(dir: BorrowedFd<'_>, name: &[u8], ftype: rfs::FileType) -> io::Result<bool> {
    Ok(match ftype {
        rfs::FileType::Directory => true,
        rfs::FileType::Unknown => {
            let st = rfs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW)?;
            rfs::FileType::from_raw_mode(st.st_mode) == rfs::FileType::Directory
        }
        _ => false,
    })
}

/// Deepest directory nesting `remove_contents` descends (one fd is held per level).
const MAX_REMOVE_DEPTH: usize = 512;

/// Remove everything beneath `dir`, fd-relative, never following a symlink. The directory itself
/// is kept. Directories without search/write permission for the caller are made 0700 through
/// their own fd first (a confined tool may have chmod-ed its own tree).
pub fn remove_contents(dir: BorrowedFd<'_>) -> io::Result<()> {
    remove_level(dir, 0)
}

fn remove_level(dir: BorrowedFd<'_>, depth: usize) -> io::Result<()> {
    if depth > MAX_REMOVE_DEPTH {
        return Err(io::Error::other("tree too deep to remove"));
    }
    let mut names = Vec::new();
    for ent in rfs::Dir::read_from(dir)? {
        let ent = ent?;
        let name = ent.file_name().to_bytes();
        if name != b"." && name != b".." {
            names.push((name.to_vec(), ent.file_type()));
        }
    }
    for (name, ftype) in names {
        if is_dir(dir, &name, ftype)? {
            let sub = match rfs::openat(dir, name.as_slice(), DIR_FLAGS, Mode::empty()) {
                Err(Errno::ACCESS) => {
                    regain_dir(dir, name.as_slice())?;
                    rfs::openat(dir, name.as_slice(), DIR_FLAGS, Mode::empty())?
                }
                other => other?,
            };
            // A readable but read-only directory (0500) still refuses unlinks inside it.
            rfs::fchmod(&sub, Mode::from_raw_mode(0o700))?;
            remove_level(sub.as_fd(), depth + 1)?;
            rfs::unlinkat(dir, name.as_slice(), AtFlags::REMOVEDIR)?;
        } else {
            match rfs::unlinkat(dir, name.as_slice(), AtFlags::empty()) {
                Ok(()) | Err(Errno::NOENT) => {}
                Err(e) => return Err(e.into()),
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A filesystem without types in its directory entries (`DT_UNKNOWN`, as XFS without
    /// `ftype` and some FUSE ones): each name is told apart by an lstat, and a link to a
    /// directory is not one.
    #[test]
    fn an_entry_of_unknown_type_is_a_directory_only_if_lstat_says_so() {
        let scratch = tempfile::tempdir().expect("tmp");
        std::fs::create_dir(scratch.path().join("d")).expect("mkdir");
        std::fs::write(scratch.path().join("f"), b"").expect("write");
        std::os::unix::fs::symlink("d", scratch.path().join("l")).expect("symlink");
        let fd = DirWriter::open_root(scratch.path()).expect("open");
        for (name, want) in [(&b"d"[..], true), (b"f", false), (b"l", false)] {
            let got = is_dir(fd.as_fd(), name, rfs::FileType::Unknown).expect("lstat");
            assert_eq!(got, want, "{}", String::from_utf8_lossy(name));
        }
        assert!(is_dir(fd.as_fd(), b"gone", rfs::FileType::Unknown).is_err());
        assert!(is_dir(fd.as_fd(), b"f", rfs::FileType::Directory).expect("typed"));
    }
}
