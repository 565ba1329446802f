//! Per-request namespaces, created by the jail itself after it switched to the leased UID.
//!
//! The supervisor holds no CAP_SYS_ADMIN, so the jail first creates a user namespace that maps
//! only its own UID/GID onto themselves (unprivileged, like bubblewrap), which gives it the
//! capabilities to create the others over its own resources: mount (a private tmpfs of
//! `diskBytes` holding the request tree and `/tmp`), PID (the request sees only its own
//! processes, and every process of it dies with the namespace's init), network (only a
//! loopback), IPC, UTS and cgroup. Every capability of the new namespace is cleared again by
//! the caller before any untrusted byte is read, and the seccomp profile forbids creating or
//! joining namespaces afterwards.
//!
//! Everything here is best effort unless the policy requires `namespaces`; what was created is
//! reported. Inside Kubernetes, the runtime's seccomp profile usually forbids `unshare`, so a
//! sidecar normally reports "unavailable" here and relies on the unique UID, Landlock and
//! cgroups.

use std::ffi::CString;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Component, Path, PathBuf};

use policy::Namespaces;
use rustix::fs::{self as rfs, Mode, OFlags};
use rustix::mount::{MountFlags, MountPropagationFlags};
use rustix::thread::UnshareFlags;

use super::layout::{ConfineError, TMP_DIR, fail, make_subdirs};
use jail_sys::sys::{Forked, fork_single_threaded, loopback_up, unshare_namespaces};
use jail_wire::protocol::{Creds, DiskLimit, NamespaceReport, NsNote};
use policy::Namespace;

/// Where the request tree lives after [`enter`], and on which side of the PID fork we are.
#[derive(Debug)]
pub struct Entered {
    /// What was created.
    pub report: NamespaceReport,
    /// The request directory, reopened inside the private tmpfs (None: unchanged).
    pub dir: Option<OwnedFd>,
    /// The socket to the mounter (the PID namespace's parent), for the supervisor: with
    /// `attach`, a mount namespace and a PID namespace.
    pub mounter: Option<OwnedFd>,
}

fn errno(e: impl std::fmt::Display) -> String {
    e.to_string()
}

fn write_proc(file: &str, text: &str) -> Result<(), ConfineError> {
    std::fs::write(format!("/proc/self/{file}"), text)
        .map_err(|e| fail("user namespace", format!("/proc/self/{file}: {e}")))
}

/// Create the namespaces in `want` (after the UID switch, before the capability clean-up,
/// Landlock and seccomp). `base` is the request directory's absolute, canonical path, which
/// already exists (empty, owned by the leased UID) on the real filesystem. With a PID
/// namespace the process forks: the original waits for the new one (PID 1 of the namespace)
/// and exits with its status, never returning.
pub fn enter(
    want: Namespaces,
    creds: Creds,
    base: &Path,
    disk: DiskLimit,
    attach: bool,
) -> Result<Entered, ConfineError> {
    let mut report = NamespaceReport::default();
    if !want.any() {
        return Ok(Entered {
            report,
            dir: None,
            mounter: None,
        });
    }
    // The UID switch made us non-dumpable, which makes /proc/self/*_map root-owned; nothing
    // untrusted runs yet and no other process of this UID exists, so be dumpable while the maps
    // are written (the caller sets it back before going on).
    rustix::process::set_dumpable_behavior(rustix::process::DumpableBehavior::Dumpable)
        .map_err(|e| fail("user namespace", e))?;
    if let Err(e) = unshare_namespaces(UnshareFlags::NEWUSER) {
        report.failed.push(NsNote::of(Namespace::User, errno(e)));
        for (on, n) in [
            (want.mount, Namespace::Mount),
            (want.pid, Namespace::Pid),
            (want.net, Namespace::Net),
            (want.ipc, Namespace::Ipc),
            (want.uts, Namespace::Uts),
            (want.cgroup, Namespace::Cgroup),
        ] {
            if on {
                report.failed.push(NsNote::of(n, "needs a user namespace"));
            }
        }
        return Ok(Entered {
            report,
            dir: None,
            mounter: None,
        });
    }
    report.created.push(Namespace::User);
    write_proc("setgroups", "deny")?;
    write_proc("uid_map", &format!("{0} {0} 1\n", creds.uid))?;
    write_proc("gid_map", &format!("{0} {0} 1\n", creds.gid))?;

    let wanted: Vec<(UnshareFlags, Namespace)> = [
        (want.mount, UnshareFlags::NEWNS, Namespace::Mount),
        (want.ipc, UnshareFlags::NEWIPC, Namespace::Ipc),
        (want.uts, UnshareFlags::NEWUTS, Namespace::Uts),
        (want.net, UnshareFlags::NEWNET, Namespace::Net),
        (want.cgroup, UnshareFlags::NEWCGROUP, Namespace::Cgroup),
    ]
    .into_iter()
    .filter(|(on, _, _)| *on)
    .map(|(_, f, n)| (f, n))
    .collect();
    // One call for all of them (one nsproxy switch); one by one only to find which failed.
    let all = wanted
        .iter()
        .fold(UnshareFlags::empty(), |acc, (f, _)| acc | *f);
    if unshare_namespaces(all).is_ok() {
        report.created.extend(wanted.iter().map(|(_, n)| *n));
    } else {
        for (flag, n) in wanted {
            match unshare_namespaces(flag) {
                Ok(()) => report.created.push(n),
                Err(e) => report.failed.push(NsNote::of(n, errno(e))),
            }
        }
    }
    if report.has(Namespace::Uts)
        && let Err(e) = rustix::system::sethostname(b"cmp-warden")
    {
        report.notes.push(NsNote::of(
            Namespace::Uts,
            format!("hostname not set: {}", errno(e)),
        ));
    }
    if report.has(Namespace::Net)
        && let Err(e) = loopback_up()
    {
        // Still an empty network namespace: no loopback either.
        report
            .notes
            .push(NsNote::of(Namespace::Net, format!("loopback not up: {e}")));
    }
    let mut dir = None;
    if report.has(Namespace::Mount) {
        dir = private_tree(base, disk, &mut report)?;
        if let Some(d) = &dir {
            named_identity(creds, d, &base.join(super::layout::HOME_DIR), &mut report);
        }
    }
    let mut mounter = None;
    if want.pid {
        match unshare_namespaces(UnshareFlags::NEWPID) {
            Ok(()) => {
                let tree = (attach && dir.is_some()).then(|| base.to_owned());
                mounter = become_init(tree)?;
                report.created.push(Namespace::Pid);
                if report.has(Namespace::Mount) {
                    match rustix::mount::mount(
                        "proc",
                        "/proc",
                        "proc",
                        MountFlags::NOSUID | MountFlags::NODEV | MountFlags::NOEXEC,
                        None,
                    ) {
                        Ok(()) => report.private_proc = true,
                        // A runtime's masked /proc paths make a fresh proc mount "too
                        // revealing" (EPERM; a kubelet's pods have them): the container's
                        // /proc stays, so commands can list the container's processes and
                        // read their command lines; their environ, fds and memory stay closed
                        // by ptrace access checks. Said as the PID namespace's shortfall.
                        Err(e) => {
                            let note = NsNote::of(
                                Namespace::Pid,
                                format!(
                                    "private /proc: {e} (the runtime's masked /proc paths refuse a fresh proc mount; the container's /proc stays: commands can list its processes and read their command lines, not their environment, descriptors or memory)"
                                ),
                            );
                            // Degraded for the request (and refused where namespaces are
                            // required), and a shortfall of the PID namespace for doctor.
                            report.notes.push(note.clone());
                            report.failed.push(note);
                        }
                    }
                }
            }
            Err(e) => report.failed.push(NsNote::of(Namespace::Pid, errno(e))),
        }
    }
    Ok(Entered {
        report,
        dir,
        mounter,
    })
}

/// Mount the request's tmpfs (size `disk`) so that both the request directory `base` and `/tmp`
/// are inside it, and return the request directory reopened there (with `repo/`, `home/`,
/// `tmp/`). If `base` is beneath `/tmp` (Argo CD's default work dir), the tmpfs goes on `/tmp`
/// and `base` is recreated inside it; otherwise it goes on `base` and its `tmp/` is bound onto
/// `/tmp`. Either way the real work root is unreachable or empty, and paths are unchanged.
fn private_tree(
    base: &Path,
    disk: DiskLimit,
    report: &mut NamespaceReport,
) -> Result<Option<OwnedFd>, ConfineError> {
    let step = "mount namespace";
    // Nothing we mount may propagate back to the host. Refused (a container runtime's seccomp
    // profile may deny mount): nothing is mounted, the tree stays where it is, and the disk
    // limit is reported missing.
    if let Err(e) = rustix::mount::mount_change(
        "/",
        MountPropagationFlags::PRIVATE | MountPropagationFlags::REC,
    ) {
        report.notes.push(NsNote::of(
            Namespace::Mount,
            format!("no private tmpfs: making / private: {}", errno(e)),
        ));
        return Ok(None);
    }
    let opts = CString::new(format!(
        "size={},nr_inodes={},mode=0700",
        disk.bytes, disk.inodes
    ))
    .map_err(|e| fail(step, e))?;
    let tmp = Path::new("/tmp");
    let under_tmp = base.strip_prefix(tmp).ok().filter(|r| {
        !r.as_os_str().is_empty() && r.components().all(|c| matches!(c, Component::Normal(_)))
    });
    let mount_tmpfs = |at: &Path| {
        rustix::mount::mount(
            "cmp-warden",
            at,
            "tmpfs",
            MountFlags::NOSUID | MountFlags::NODEV,
            Some(opts.as_c_str()),
        )
        .map_err(|e| fail(step, format!("tmpfs on {}: {e}", at.display())))
    };
    // The first mount decides: refused → degrade as above; later failures are real errors.
    let target = if under_tmp.is_some() { tmp } else { base };
    if let Err(e) = mount_tmpfs(target) {
        report.notes.push(NsNote::of(
            Namespace::Mount,
            format!("no private tmpfs: {}", e.why),
        ));
        return Ok(None);
    }
    let dir = match under_tmp {
        Some(rel) => {
            // Recreate the request directory's path inside the new /tmp.
            let mut at = open_dir(tmp)?;
            let mut parents = Vec::new();
            for c in rel.components() {
                rfs::mkdirat(&at, c.as_os_str(), Mode::from_raw_mode(0o700))
                    .map_err(|e| fail(step, format!("{}: {e}", c.as_os_str().display())))?;
                let next = openat_dir(&at, c.as_os_str())?;
                parents.push(std::mem::replace(&mut at, next));
            }
            // The copies of the work root's ancestors are search-only, as the real, sticky,
            // unlistable work root is: nothing can be listed or planted beside the tree.
            for p in parents.iter().skip(1) {
                rfs::fchmod(p, Mode::from_raw_mode(0o111)).map_err(|e| fail(step, e))?;
            }
            make_subdirs(&at)?;
            at
        }
        None => {
            let at = open_dir(base)?;
            make_subdirs(&at)?;
            if std::fs::symlink_metadata(tmp).is_ok_and(|m| m.is_dir()) {
                rustix::mount::mount_bind(base.join(TMP_DIR), tmp)
                    .map_err(|e| fail(step, format!("binding {TMP_DIR} on /tmp: {e}")))?;
            }
            at
        }
    };
    report.private_tmp = true;
    report.disk_bytes = Some(disk.bytes);
    Ok(Some(dir))
}

/// The leased UID and GID have no entry in the image's `/etc/passwd` and `/etc/group`, and
/// tools that look their user up refuse to run without one (ssh and ssh-keygen: "No user exists
/// for uid"; git's commit identity, `whoami`, Python's `getpass`). In the jail's own mount
/// namespace, bind a copy of each file with the lease's entry appended (user `cmp-warden`, home
/// the request's `home`) over the original, read-only; the copy's name is unlinked at once, so
/// only the bound file remains. Best effort: a note, never a failure.
fn named_identity(creds: Creds, dir: &OwnedFd, home: &Path, report: &mut NamespaceReport) {
    let entries = [
        (
            "/etc/passwd",
            format!(
                "cmp-warden:x:{}:{}:cmp-warden request:{}:/bin/sh\n",
                creds.uid,
                creds.gid,
                home.display()
            ),
            creds.uid,
        ),
        (
            "/etc/group",
            format!("cmp-warden:x:{}:\n", creds.gid),
            creds.gid,
        ),
    ];
    for (file, entry, id) in entries {
        if let Err(e) = bind_with_entry(file, &entry, id, dir) {
            report.notes.push(NsNote::other(format!(
                "{file}: no entry for the lease: {e}"
            )));
        }
    }
}

fn bind_with_entry(file: &str, entry: &str, id: u32, dir: &OwnedFd) -> std::io::Result<()> {
    let original = match std::fs::read_to_string(file) {
        Ok(t) => t,
        // Not in the image (or not readable): nothing to extend.
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    };
    let taken = original
        .lines()
        .any(|l| l.split(':').nth(2).and_then(|n| n.parse::<u32>().ok()) == Some(id));
    if taken {
        return Ok(());
    }
    let name = ".cmp-warden-identity";
    let fd = rfs::openat(
        dir,
        name,
        OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::from_raw_mode(0o644),
    )?;
    // The jail's umask is 077; the entry is as readable as the image's file.
    rfs::fchmod(&fd, Mode::from_raw_mode(0o644))?;
    let mut text = original;
    if !text.is_empty() && !text.ends_with('\n') {
        text.push('\n');
    }
    text.push_str(entry);
    let written = rustix::io::write(&fd, text.as_bytes());
    drop(fd);
    let bound = written.map_err(std::io::Error::from).and_then(|n| {
        if n != text.len() {
            return Err(std::io::Error::other("short write"));
        }
        let src = format!(
            "/proc/self/fd/{}/{name}",
            std::os::fd::AsRawFd::as_raw_fd(dir)
        );
        rustix::mount::mount_bind(src.as_str(), file)?;
        rustix::mount::mount_remount(
            file,
            MountFlags::BIND | MountFlags::RDONLY | MountFlags::NOSUID | MountFlags::NODEV,
            "",
        )?;
        Ok(())
    });
    let _ = rfs::unlinkat(dir, name, rfs::AtFlags::empty());
    bound
}

fn open_dir(p: &Path) -> Result<OwnedFd, ConfineError> {
    rfs::open(
        p,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| fail("mount namespace", format!("{}: {e}", p.display())))
}

fn openat_dir(at: &OwnedFd, name: &std::ffi::OsStr) -> Result<OwnedFd, ConfineError> {
    rfs::openat(
        at,
        name,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| fail("mount namespace", format!("{}: {e}", name.display())))
}

/// After `unshare(CLONE_NEWPID)`: fork; the child is PID 1 of the new namespace and returns;
/// the parent stays outside it, waits, and exits with the child's status. With `tree` (the
/// request directory's path) the parent is first the mounter: the child gets the socket to it
/// (for the supervisor).
fn become_init(tree: Option<PathBuf>) -> Result<Option<OwnedFd>, ConfineError> {
    let step = "pid namespace";
    // The child learns of the parent's death through this pipe as well as PDEATHSIG (which
    // cannot cover a parent that died before the child set it).
    let (alive_r, alive_w) =
        rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC).map_err(|e| fail(step, e))?;
    let pair = match &tree {
        Some(_) => Some(
            rustix::net::socketpair(
                rustix::net::AddressFamily::UNIX,
                rustix::net::SocketType::SEQPACKET,
                rustix::net::SocketFlags::CLOEXEC,
                None,
            )
            .map_err(|e| fail(step, e))?,
        ),
        None => None,
    };
    match fork_single_threaded().map_err(|e| fail(step, e))? {
        Forked::Parent(child) => {
            drop(alive_r);
            // Not dumpable before anything else: the jail's commands share our UID.
            let _ = rustix::process::set_dumpable_behavior(
                rustix::process::DumpableBehavior::NotDumpable,
            );
            if let (Some((ours, theirs)), Some(base)) = (pair, tree) {
                drop(theirs);
                super::mounter::serve_once(&ours, &base);
            }
            let code = wait_for_init(child);
            drop(alive_w);
            jail_sys::sys::exit_now(code);
        }
        Forked::Child => {
            drop(alive_w);
            let mounter = pair.map(|(ours, theirs)| {
                drop(ours);
                theirs
            });
            rustix::process::set_parent_process_death_signal(Some(rustix::process::Signal::KILL))
                .map_err(|e| fail(step, e))?;
            let mut fds = [rustix::event::PollFd::new(
                &alive_r,
                rustix::event::PollFlags::IN,
            )];
            let ready = rustix::event::poll(&mut fds, Some(&rustix::event::Timespec::default()))
                .map_err(|e| fail(step, e))?;
            if ready > 0 {
                // Readable without data = the write end is closed: the parent is gone.
                std::process::exit(1);
            }
            drop(alive_r);
            Ok(mounter)
        }
    }
}

/// The parent outside the PID namespace: hold nothing, wait for the namespace's init.
fn wait_for_init(child: i32) -> i32 {
    // Nothing here runs untrusted code, but drop what the user namespace gave anyway.
    let _ = rustix::thread::set_capabilities(
        None,
        rustix::thread::CapabilitySets {
            effective: rustix::thread::CapabilitySet::empty(),
            permitted: rustix::thread::CapabilitySet::empty(),
            inheritable: rustix::thread::CapabilitySet::empty(),
        },
    );
    let _ = rustix::process::set_dumpable_behavior(rustix::process::DumpableBehavior::NotDumpable);
    let Some(pid) = rustix::process::Pid::from_raw(child) else {
        return 1;
    };
    loop {
        match rustix::process::waitpid(Some(pid), rustix::process::WaitOptions::empty()) {
            Ok(Some((_, status))) => {
                if let Some(code) = status.exit_status() {
                    return code;
                }
                if let Some(sig) = status.terminating_signal() {
                    return 128 + sig;
                }
            }
            Err(rustix::io::Errno::INTR) => continue,
            _ => return 1,
        }
    }
}

/// Resolve the request directory's path for use inside the namespaces: absolute and without
/// symlinks, so that "is it under /tmp" is answered about the real location.
pub fn canonical_base(work_root: &Path, name: &str) -> Result<PathBuf, ConfineError> {
    std::fs::canonicalize(work_root)
        .map(|r| r.join(name))
        .map_err(|e| fail("request directory", format!("{}: {e}", work_root.display())))
}

/// Whether `fd` lies on the request's own tmpfs `tree` (same device).
pub fn same_filesystem(a: impl AsFd, b: impl AsFd) -> bool {
    match (rfs::fstat(a), rfs::fstat(b)) {
        (Ok(x), Ok(y)) => x.st_dev == y.st_dev,
        _ => false,
    }
}
