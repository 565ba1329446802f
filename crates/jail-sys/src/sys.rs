//! The raw system calls the safe wrappers cannot express. Every `unsafe` block of the project
//! lives here, each with its SAFETY note; callers stay in safe code.
#![allow(unsafe_code)]

use std::io;

/// Send SIGKILL to every process this process may signal (all of the caller's real UID's
/// processes except itself; inside a PID namespace, every other process of the namespace).
/// Called only after switching to a request's unique UID, so "every process" means exactly
/// that request's processes. Returns `Ok(false)` on ESRCH (no other process at all).
pub fn kill_all_of_my_uid() -> io::Result<bool> {
    // SAFETY: kill(2) takes plain integers and touches no memory of ours; -1 is the documented
    // "all permitted processes" target. rustix's `Pid` cannot express -1.
    let r = unsafe { libc::kill(-1, libc::SIGKILL) };
    if r == 0 {
        return Ok(true);
    }
    let e = io::Error::last_os_error();
    if e.raw_os_error() == Some(libc::ESRCH) {
        Ok(false)
    } else {
        Err(e)
    }
}

/// Reap `pid` with `wait4(2)`: its raw wait status and peak resident set size in bytes (the
/// largest of the process and its reaped descendants).
pub fn wait4_rusage(pid: i32) -> io::Result<(i32, u64)> {
    let mut status: libc::c_int = 0;
    // SAFETY: `rusage` is plain old data; all-zero is a valid value.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    loop {
        // SAFETY: both pointers are to live, exclusively borrowed locals of the right types
        // that outlive the call; wait4 writes only through them.
        let r = unsafe { libc::wait4(pid, &mut status, 0, &mut ru) };
        if r == pid {
            return Ok((status, (ru.ru_maxrss as u64).saturating_mul(1024)));
        }
        let e = io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EINTR) {
            return Err(e);
        }
    }
}

/// Install a classic BPF seccomp program with SECCOMP_FILTER_FLAG_NEW_LISTENER and return the
/// listener. The caller has set no_new_privs (or holds CAP_SYS_ADMIN).
pub fn seccomp_install_with_listener(
    prog: &[(u16, u8, u8, u32)],
) -> io::Result<std::os::fd::OwnedFd> {
    use std::os::fd::FromRawFd;
    let mut insns: Vec<libc::sock_filter> = prog
        .iter()
        .map(|&(code, jt, jf, k)| libc::sock_filter { code, jt, jf, k })
        .collect();
    let len = u16::try_from(insns.len()).map_err(|_| io::Error::other("BPF program too long"))?;
    let fprog = libc::sock_fprog {
        len,
        filter: insns.as_mut_ptr(),
    };
    // SAFETY: `fprog` points at `insns`, a live vector of `len` instructions that outlives the
    // call; the kernel copies the program and writes no memory of ours.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_seccomp,
            libc::SECCOMP_SET_MODE_FILTER,
            libc::SECCOMP_FILTER_FLAG_NEW_LISTENER,
            &fprog as *const libc::sock_fprog,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: on success seccomp(2) returns a new file descriptor that nothing else owns.
    Ok(unsafe { std::os::fd::OwnedFd::from_raw_fd(fd as i32) })
}

/// Block for the next seccomp user notification: (id, pid, system call number, arguments).
pub fn seccomp_notif_recv(
    fd: std::os::fd::BorrowedFd<'_>,
) -> io::Result<(u64, u32, i32, [u64; 6])> {
    use std::os::fd::AsRawFd;
    // SAFETY: `seccomp_notif` is plain old data; the kernel requires it zeroed on input.
    let mut n: libc::seccomp_notif = unsafe { std::mem::zeroed() };
    // SAFETY: NOTIF_RECV writes one `seccomp_notif` into `n`, a live, exclusively borrowed
    // value of exactly that type; `fd` is an open listener.
    let r = unsafe { libc::ioctl(fd.as_raw_fd(), libc::SECCOMP_IOCTL_NOTIF_RECV, &mut n) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok((n.id, n.pid, n.data.nr, n.data.args))
}

/// Answer notification `id`: `None` = continue (the call runs as if unfiltered), `Some(e)` =
/// fail it with errno `e`.
pub fn seccomp_notif_respond(
    fd: std::os::fd::BorrowedFd<'_>,
    id: u64,
    errno: Option<i32>,
) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    let mut resp = libc::seccomp_notif_resp {
        id,
        val: 0,
        error: errno.map_or(0, |e| -e),
        flags: if errno.is_none() {
            libc::SECCOMP_USER_NOTIF_FLAG_CONTINUE as u32
        } else {
            0
        },
    };
    // SAFETY: NOTIF_SEND reads one `seccomp_notif_resp` from `resp`, a live value of exactly
    // that type; `fd` is an open listener.
    let r = unsafe { libc::ioctl(fd.as_raw_fd(), libc::SECCOMP_IOCTL_NOTIF_SEND, &mut resp) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// `unshare(2)` for namespace flags only.
pub fn unshare_namespaces(flags: rustix::thread::UnshareFlags) -> io::Result<()> {
    if flags.contains(rustix::thread::UnshareFlags::FILES) {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    }
    // SAFETY: the hazard rustix marks unsafe is CLONE_FILES (threads seeing another fd
    // table), refused above; namespace flags change no memory or fd of this process.
    unsafe { rustix::thread::unshare_unsafe(flags) }.map_err(io::Error::from)
}

/// The side of a [`fork_single_threaded`] the caller is on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Forked {
    /// The original process; the child's PID.
    Parent(i32),
    /// The new process.
    Child,
}

/// Refuse unless the calling process has exactly one thread (from `/proc/self/status`).
fn single_threaded(who: &str) -> io::Result<()> {
    let status = std::fs::read_to_string("/proc/self/status")?;
    let threads = status
        .lines()
        .find_map(|l| l.strip_prefix("Threads:"))
        .and_then(|v| v.trim().parse::<u32>().ok());
    if threads != Some(1) {
        return Err(io::Error::other(format!(
            "fork refused: {who} must be single-threaded here (Threads: {threads:?})"
        )));
    }
    Ok(())
}

/// `fork(2)`, only when the calling process has exactly one thread (checked in
/// `/proc/self/status`), so the child starts with consistent memory (no lock held by a thread
/// that does not exist in it) and may go on running ordinary Rust.
pub fn fork_single_threaded() -> io::Result<Forked> {
    single_threaded("the jail")?;
    // SAFETY: the process has a single thread (checked just above; the jail starts no thread
    // before confinement), so no other thread can hold a lock or be mid-update of memory the
    // child inherits; the child continues with ordinary, allocation-safe code.
    let pid = unsafe { libc::fork() };
    match pid {
        -1 => Err(io::Error::last_os_error()),
        0 => Ok(Forked::Child),
        p => Ok(Forked::Parent(p)),
    }
}

/// Like [`fork_single_threaded`], but the new process is a child of the caller's parent
/// (`clone(CLONE_PARENT)`), not of the caller: the jail factory forks jails that the
/// supervisor waits for, reaps and accounts as its own children.
pub fn fork_for_parent_single_threaded() -> io::Result<Forked> {
    single_threaded("the jail factory")?;
    let flags = (libc::CLONE_PARENT | libc::SIGCHLD) as libc::c_ulong;
    // SAFETY: the raw clone(2) with no new stack behaves as fork(2) does: the child continues
    // on a copy-on-write copy of this stack. The process has a single thread (checked above),
    // so no lock is held and no memory is mid-update in the copy. glibc's fork bookkeeping is
    // skipped: its cached thread ID in the child still names the factory, which only
    // pthread calls on the calling thread's own ID (scheduling, error-checking mutexes) would
    // read; the jail makes none (std's locks are futex-based and it names threads through
    // their own handles). Arguments are plain integers; no pointer is passed.
    let pid = unsafe { libc::syscall(libc::SYS_clone, flags, 0usize, 0usize, 0usize, 0usize) };
    match pid {
        -1 => Err(io::Error::last_os_error()),
        0 => Ok(Forked::Child),
        p => Ok(Forked::Parent(p as i32)),
    }
}

/// End the process now with `code`, after flushing stdout (the jail's reply pipe), without
/// libc's exit sequence: a jail or its PID namespace's parent is a fork, and `exit(3)`'s atexit
/// handlers and every library's destructors (`_dl_fini`, resolving their lazily bound calls)
/// only fault pages of the inherited image in to tear down what the kernel frees anyway.
/// Nothing they run is ours: the jail writes its frames and logs unbuffered (stdout is flushed
/// here all the same).
pub fn exit_now(code: i32) -> ! {
    use std::io::Write;
    let _ = io::stdout().flush();
    // SAFETY: _exit(2) takes a plain integer and does not return; it runs no user-space code
    // (no atexit handler, no destructor), so no invariant of ours can be observed half-done.
    unsafe { libc::_exit(code) }
}

/// One malloc arena for the whole process (glibc): a thread's first allocation otherwise maps
/// a new 64 MiB arena and faults its first pages in, in every jail that starts its seccomp
/// listener thread. The jail's two threads rarely allocate at the same time. A no-op elsewhere
/// (musl has no arenas).
pub fn single_malloc_arena() {
    #[cfg(target_env = "gnu")]
    // SAFETY: mallopt(3) takes two integers and only changes malloc's tuning; called by the
    // single-threaded factory before any jail exists, so no allocation runs concurrently.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 1);
    }
}

/// Bring the loopback interface of the current network namespace up (a new network namespace
/// starts with `lo` down); needs CAP_NET_ADMIN over that namespace.
pub fn loopback_up() -> io::Result<()> {
    use std::os::fd::AsRawFd;
    let sock = rustix::net::socket(
        rustix::net::AddressFamily::INET,
        rustix::net::SocketType::DGRAM,
        None,
    )?;
    // SAFETY: `ifreq` is plain old data; all-zero is a valid value.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (dst, src) in req.ifr_name.iter_mut().zip(b"lo\0") {
        *dst = *src as libc::c_char;
    }
    // The request number's C type differs between glibc (unsigned long) and musl (int).
    #[allow(clippy::unnecessary_cast)]
    let (get, set) = (
        libc::SIOCGIFFLAGS as libc::Ioctl,
        libc::SIOCSIFFLAGS as libc::Ioctl,
    );
    // SAFETY: SIOCGIFFLAGS reads the interface named in `req` and writes its flags into `req`,
    // a valid, exclusively borrowed ifreq that outlives the call; `sock` is an open socket.
    if unsafe { libc::ioctl(sock.as_raw_fd(), get, &mut req) } == -1 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `ifru_flags` is the union member SIOCGIFFLAGS just filled in.
    let flags = unsafe { req.ifr_ifru.ifru_flags };
    req.ifr_ifru.ifru_flags = flags | libc::IFF_UP as libc::c_short;
    // SAFETY: as above; SIOCSIFFLAGS only reads `req`.
    if unsafe { libc::ioctl(sock.as_raw_fd(), set, &req) } == -1 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// `mount_setattr(2)` on the detached mount `mnt` (from `open_tree(OPEN_TREE_CLONE)`),
/// recursively: read-only, nosuid, nodev, and idmapped through the user namespace `userns`
/// (files appear owned as that namespace maps their owners). rustix has no wrapper.
pub fn mount_setattr_idmapped_readonly(
    mnt: std::os::fd::BorrowedFd<'_>,
    userns: std::os::fd::BorrowedFd<'_>,
) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    // struct mount_attr (linux/mount.h), size 32 (MOUNT_ATTR_SIZE_VER0).
    #[repr(C)]
    struct MountAttr {
        attr_set: u64,
        attr_clr: u64,
        propagation: u64,
        userns_fd: u64,
    }
    const MOUNT_ATTR_RDONLY: u64 = 0x1;
    const MOUNT_ATTR_NOSUID: u64 = 0x2;
    const MOUNT_ATTR_NODEV: u64 = 0x4;
    const MOUNT_ATTR_IDMAP: u64 = 0x0010_0000;
    const AT_RECURSIVE: libc::c_int = 0x8000;
    let attr = MountAttr {
        attr_set: MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV | MOUNT_ATTR_IDMAP,
        attr_clr: 0,
        propagation: 0,
        userns_fd: userns.as_raw_fd() as u64,
    };
    // SAFETY: `attr` is a live, correctly laid out `struct mount_attr` whose size is passed;
    // the path is a NUL-terminated empty string (AT_EMPTY_PATH: the fd itself); both fds are
    // open for the duration of the call; the kernel only reads this memory.
    let r = unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            mnt.as_raw_fd(),
            c"".as_ptr(),
            libc::AT_EMPTY_PATH | AT_RECURSIVE,
            &attr as *const MountAttr,
            size_of::<MountAttr>(),
        )
    };
    if r == -1 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Close every descriptor numbered `first` or above (`close_range(2)`). For a freshly forked
/// process that will never return to its caller's frames (it exits): descriptors those frames
/// own are closed here and never dropped again.
pub fn close_fds_from(first: i32) -> io::Result<()> {
    let first = u32::try_from(first).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    // SAFETY: plain integer arguments; the kernel closes descriptors of this process only.
    // The caller guarantees no live object will use or close them again (see above).
    let r = unsafe { libc::syscall(libc::SYS_close_range, first, u32::MAX, 0u32) };
    if r == -1 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Own descriptor `fd`, which this process was given for that purpose (placed at a fixed
/// number by its parent before the fork and owned by nothing else here).
pub fn take_fd(fd: i32) -> std::os::fd::OwnedFd {
    use std::os::fd::FromRawFd;
    // SAFETY: by the caller's contract `fd` is open and no other object owns it.
    unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) }
}

/// Place `fd` at number `at` (`dup2(2)`), closing what was there. Same contract as
/// [`close_fds_from`]: for a forked process that never returns to its caller's frames.
pub fn dup_to(fd: std::os::fd::BorrowedFd<'_>, at: i32) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    if fd.as_raw_fd() == at {
        return Ok(());
    }
    // SAFETY: plain integer arguments; `fd` is open. What was at `at` is closed, which the
    // caller's contract allows (nothing will use or close it again).
    if unsafe { libc::dup2(fd.as_raw_fd(), at) } == -1 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// The device name the kernel calls the loopback interface.
const LOOPBACK: &[u8] = b"lo";

/// A new socket (`socket(2)` with the caller's own `domain`, `ty` including its
/// `SOCK_NONBLOCK`/`SOCK_CLOEXEC` flags, and `protocol`) bound to the loopback device
/// (`SO_BINDTODEVICE`): its packets can leave only through `lo`, whatever address it is later
/// connected or sent to. A first binding needs no privilege (Linux 5.7); changing it needs
/// CAP_NET_RAW over the network namespace, which no command has.
pub fn socket_on_loopback(domain: i32, ty: i32, protocol: i32) -> io::Result<std::os::fd::OwnedFd> {
    use std::os::fd::{AsFd, FromRawFd};
    // SAFETY: socket(2) takes plain integers and touches no memory of ours.
    let fd = unsafe { libc::socket(domain, ty, protocol) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: on success socket(2) returns a new descriptor nothing else owns.
    let sock = unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) };
    bind_to_device(sock.as_fd(), LOOPBACK)?;
    Ok(sock)
}

/// Bind socket `fd` to the device `name` (`SO_BINDTODEVICE`; empty unbinds).
pub fn bind_to_device(fd: std::os::fd::BorrowedFd<'_>, name: &[u8]) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    // SAFETY: the option value is `name`, a live slice whose length is passed; the kernel only
    // reads it (it copies at most IFNAMSIZ bytes and NUL-terminates its copy).
    let r = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_BINDTODEVICE,
            name.as_ptr().cast(),
            name.len() as libc::socklen_t,
        )
    };
    if r == -1 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// The device socket `fd` is bound to (`SO_BINDTODEVICE` read back; empty when none).
pub fn bound_device(fd: std::os::fd::BorrowedFd<'_>) -> io::Result<Vec<u8>> {
    use std::os::fd::AsRawFd;
    let mut name = [0u8; libc::IFNAMSIZ];
    let mut len = name.len() as libc::socklen_t;
    // SAFETY: `name` and `len` are live, exclusively borrowed locals; the kernel writes at most
    // `len` bytes into `name` and the length it wrote into `len`.
    let r = unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_BINDTODEVICE,
            name.as_mut_ptr().cast(),
            &mut len,
        )
    };
    if r == -1 {
        return Err(io::Error::last_os_error());
    }
    let got = &name[..(len as usize).min(name.len())];
    Ok(got.split(|b| *b == 0).next().unwrap_or_default().to_vec())
}

/// Answer notification `id` by installing `fd` in the notifying process (at the lowest free
/// number, close-on-exec when `cloexec`) and making that number the call's return value, in
/// one step (`SECCOMP_IOCTL_NOTIF_ADDFD` with `SECCOMP_ADDFD_FLAG_SEND`, Linux 5.14): the
/// process gets our descriptor where it asked the kernel for a new one.
pub fn seccomp_notif_addfd_send(
    listener: std::os::fd::BorrowedFd<'_>,
    id: u64,
    fd: std::os::fd::BorrowedFd<'_>,
    cloexec: bool,
) -> io::Result<i32> {
    use std::os::fd::AsRawFd;
    let add = libc::seccomp_notif_addfd {
        id,
        flags: libc::SECCOMP_ADDFD_FLAG_SEND as u32,
        srcfd: fd.as_raw_fd() as u32,
        newfd: 0,
        newfd_flags: if cloexec { libc::O_CLOEXEC as u32 } else { 0 },
    };
    // SAFETY: NOTIF_ADDFD reads one `seccomp_notif_addfd` from `add`, a live value of exactly
    // that type; `listener` and `fd` are open for the duration of the call.
    let r = unsafe { libc::ioctl(listener.as_raw_fd(), libc::SECCOMP_IOCTL_NOTIF_ADDFD, &add) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(r)
}

/// Connect to the unix socket at `path` as its owner: this thread's filesystem UID is the
/// socket file's owner for the `connect` (a unix socket admits a connection from whoever may
/// write the socket file, and Argo CD's repo-server makes its askpass socket `0755` as UID
/// 999), then back to what it was. Needs CAP_SETUID; without it the filesystem UID does not
/// change and the connection is attempted as ourselves. Per thread: no other thread's
/// permissions change.
pub fn connect_unix_as_owner(path: &std::path::Path) -> io::Result<std::os::unix::net::UnixStream> {
    use std::os::unix::fs::MetadataExt;
    let owner = std::fs::symlink_metadata(path)?.uid();
    // SAFETY: setfsuid(2) takes a plain integer and changes only this thread's filesystem
    // UID; the raw system call (not glibc's wrapper) so that no other thread is touched.
    let before = unsafe { libc::syscall(libc::SYS_setfsuid, owner) } as libc::uid_t;
    let connected = std::os::unix::net::UnixStream::connect(path);
    // SAFETY: as above; restores the filesystem UID this thread had.
    unsafe { libc::syscall(libc::SYS_setfsuid, before) };
    connected
}
