//! The mounter: the parent a jail leaves outside its PID namespace holds, until the request is
//! read, the capabilities the jail's own user namespace gave it (over the jail's namespaces
//! only, never the host's). It does one thing, once, before any byte of a request reaches the
//! jail: put a tree lent by the cache's keeper under the request directory, as an overlay —
//! the lent tree (read-only, idmapped so its files belong to the jail's UID) below, a private
//! tmpfs above — so commands see what a fresh extraction would give them, and whatever they
//! write stays in their own layer. Then it drops every capability and only waits.
//!
//! The layers are mounted on a directory beside `repo/` and detached once the overlay holds
//! them: nothing of them is reachable by path afterwards.

use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;

use rustix::fs::{self as rfs, Mode, OFlags};
use rustix::mount::{MountFlags, MoveMountFlags, UnmountFlags};

use crate::protocol::{DiskLimit, MounterCmd, MounterReply, recv_msg, send_msg};

/// The layers' directory, beside `repo/`, only while the overlay is made.
const LAYERS: &str = ".cmp-warden-layers";

/// Serve one command (or none: the socket closed) and return.
pub(crate) fn serve_once(sock: &OwnedFd, base: &Path, disk: DiskLimit) {
    let Ok(Some((MounterCmd::Attach, mut fds))) = recv_msg::<MounterCmd>(sock.as_fd()) else {
        return;
    };
    let reply = match fds.pop() {
        Some(tree) => match attach(tree, base, disk) {
            Ok(()) => MounterReply::Ok,
            Err(e) => MounterReply::Failed(e),
        },
        None => MounterReply::Failed("no tree came with the command".into()),
    };
    let _ = send_msg(sock.as_fd(), &reply, &[]);
}

fn attach(tree: OwnedFd, base: &Path, disk: DiskLimit) -> Result<(), String> {
    let layers = base.join(LAYERS);
    rfs::mkdir(&layers, Mode::from_raw_mode(0o700)).map_err(|e| format!("layers: {e}"))?;
    let made = make_overlay(tree, base, &layers, disk);
    // Detached whatever happened: the overlay (if made) keeps its own hold on the layers.
    let _ = rustix::mount::unmount(&layers, UnmountFlags::DETACH);
    let _ = rfs::rmdir(&layers);
    made
}

fn make_overlay(tree: OwnedFd, base: &Path, layers: &Path, disk: DiskLimit) -> Result<(), String> {
    let opts = std::ffi::CString::new(format!(
        "size={},nr_inodes={},mode=0700",
        disk.bytes, disk.inodes
    ))
    .map_err(|e| e.to_string())?;
    rustix::mount::mount(
        "cmp-warden-layer",
        layers,
        "tmpfs",
        MountFlags::NOSUID | MountFlags::NODEV,
        Some(opts.as_c_str()),
    )
    .map_err(|e| format!("layer tmpfs: {e}"))?;
    let dir = rfs::open(
        layers,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| format!("layers: {e}"))?;
    // `upper` is the tree's root as commands see it: 0700, as a fresh `repo/` is.
    for (d, mode) in [("lower", 0o700), ("upper", 0o700), ("work", 0o700)] {
        rfs::mkdirat(&dir, d, Mode::from_raw_mode(mode)).map_err(|e| format!("{d}: {e}"))?;
    }
    let at = |d: &str| -> Result<OwnedFd, String> {
        rfs::openat(
            &dir,
            d,
            OFlags::PATH | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| format!("{d}: {e}"))
    };
    let lower = at("lower")?;
    rustix::mount::move_mount(
        tree.as_fd(),
        "",
        lower.as_fd(),
        "",
        MoveMountFlags::MOVE_MOUNT_F_EMPTY_PATH | MoveMountFlags::MOVE_MOUNT_T_EMPTY_PATH,
    )
    .map_err(|e| format!("attaching the lent tree: {e}"))?;
    // Paths (not /proc/self/fd: /proc here is the jail's PID namespace's, in which this
    // process does not exist), with the separators overlayfs gives meaning escaped.
    let path = |d: &str| escape(&layers.join(d).display().to_string());
    let options = std::ffi::CString::new(format!(
        "lowerdir={},upperdir={},workdir={},userxattr",
        path("lower"),
        path("upper"),
        path("work")
    ))
    .map_err(|e| e.to_string())?;
    rustix::mount::mount(
        "cmp-warden-tree",
        base.join(super::confine::REPO_DIR),
        "overlay",
        MountFlags::NOSUID | MountFlags::NODEV,
        Some(options.as_c_str()),
    )
    .map_err(|e| format!("overlay: {e}"))
}

/// A path in overlayfs' mount options: `\`, `,` and `:` escaped with a backslash.
fn escape(p: &str) -> String {
    let mut o = String::with_capacity(p.len());
    for c in p.chars() {
        if matches!(c, '\\' | ',' | ':') {
            o.push('\\');
        }
        o.push(c);
    }
    o
}
