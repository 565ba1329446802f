//! The mounter: the parent a jail leaves outside its PID namespace holds, until the request is
//! read, the capabilities the jail's own user namespace gave it (over the jail's namespaces
//! only, never the host's). It does one thing, once, before any byte of a request reaches the
//! jail: put a tree lent by the cache's keeper under the request directory, as an overlay —
//! the lent tree (read-only, idmapped so its files belong to the jail's UID) below, a layer on
//! the request's own tmpfs above — so commands see what a fresh extraction would give them,
//! whatever they write stays in their own layer, and it counts against the same disk limit
//! (`spec.limits.diskBytes`) as their `/tmp` and an extracted tree would. Then it drops every
//! capability and only waits.
//!
//! The layers are made in a directory beside `repo/`, which an empty read-only tmpfs covers
//! once the overlay holds them: nothing of them is reachable by path afterwards.

use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;

use rustix::fs::{self as rfs, Mode, OFlags};
use rustix::mount::{MountFlags, MoveMountFlags, UnmountFlags};

use jail_wire::protocol::{MounterCmd, MounterReply, recv_msg, send_msg};

/// The layers' directory, beside `repo/`.
const LAYERS: &str = ".cmp-warden-layers";

/// Serve one command (or none: the socket closed) and return.
pub(crate) fn serve_once(sock: &OwnedFd, base: &Path) {
    let Ok(Some((MounterCmd::Attach, mut fds))) = recv_msg::<MounterCmd>(sock.as_fd()) else {
        return;
    };
    let reply = match fds.pop() {
        Some(tree) => match attach(tree, base) {
            Ok(()) => MounterReply::Ok,
            Err(e) => MounterReply::Failed(e),
        },
        None => MounterReply::Failed("no tree came with the command".into()),
    };
    let _ = send_msg(sock.as_fd(), &reply, &[]);
}

fn attach(tree: OwnedFd, base: &Path) -> Result<(), String> {
    let layers = base.join(LAYERS);
    rfs::mkdir(&layers, Mode::from_raw_mode(0o700)).map_err(|e| format!("layers: {e}"))?;
    let made = make_overlay(tree, base, &layers);
    // The lent tree's mount point detached (the overlay keeps its own hold on it), then the
    // layers covered, whatever happened: commands (no capabilities, seccomp forbids mounts)
    // cannot uncover them, so they reach the tree only through the overlay.
    let _ = rustix::mount::unmount(layers.join("lower"), UnmountFlags::DETACH);
    let cover = std::ffi::CString::new("size=4k,nr_inodes=1,mode=0").map_err(|e| e.to_string())?;
    rustix::mount::mount(
        "cmp-warden-cover",
        &layers,
        "tmpfs",
        MountFlags::NOSUID | MountFlags::NODEV | MountFlags::NOEXEC | MountFlags::RDONLY,
        Some(cover.as_c_str()),
    )
    .map_err(|e| format!("covering the layers: {e}"))?;
    made
}

fn make_overlay(tree: OwnedFd, base: &Path, layers: &Path) -> Result<(), String> {
    let dir = rfs::open(
        layers,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| format!("layers: {e}"))?;
    // `upper` is the tree's root as commands see it: 0700, as a fresh `repo/` is. It and
    // `work` are on the request's tmpfs (overlayfs wants them on one filesystem).
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
        base.join(super::layout::REPO_DIR),
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
