//! The tree cache's keeper: a small, single-threaded process of our own binary that holds the
//! cache's filesystem and never reads a byte of any repository.
//!
//! The cache is a tmpfs mounted in the keeper's own user and mount namespaces, so no other
//! process on the node has a path to it: jails see a tree only through a read-only,
//! idmapped clone the keeper lends them, which they put under their own overlay. Its user
//! namespace maps only the cache identity (which never runs a plugin command) and the jails'
//! UID range (written by the supervisor, which holds CAP_SETUID), so that it can lend a tree
//! whose files appear owned by the borrowing jail's UID.
//!
//! Start-up, in order (`keeper_main`):
//!  1. its own session;
//!  2. a user namespace, made while still root so that the supervisor (root, with CAP_SETUID
//!     and CAP_SETGID but no CAP_SYS_ADMIN) owns it and may write its maps: the cache
//!     identity and the jails' range onto themselves, nothing else (`U` … `M` on the socket);
//!  3. inside it, `setgroups([])`, `setresgid`, `setresuid` to the cache identity; not
//!     dumpable; `no_new_privs` (its capabilities now only reach that namespace);
//!  4. a mount namespace, private, and the cache tmpfs (`size` = the budget plus room for the
//!     fills under way) on the work root as this namespace sees it, with `staging/` and `trees/`;
//!  5. Landlock: the cache and `/proc` (to map the lending namespaces) only — required: a
//!     kernel without it gets no cache; then (5b) a seccomp filter: no exec, no sockets, no
//!     other namespace, no classic mounts or new filesystems, no ID changes
//!     (`seccomp::KEEPER_DENIED`);
//!  6. one lend of the empty `trees` directory: a kernel that cannot idmap a tmpfs mount
//!     (before Linux 6.3) could fill trees but never lend one, so the keeper stops here;
//!  7. `R`, then one command at a time until the socket closes ([`KeeperCmd`]).
//!
//! A fill runs in a forked filler (`jail::fill_main`), confined before it reads the archive; the
//! keeper only makes its staging directory, later renames it into `trees/` (sealing: the
//! filler has exited by then and nothing of it can remain) or removes it.

use std::collections::HashMap;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use rustix::fs::{self as rfs, AtFlags, Mode, OFlags};
use rustix::mount::{MountFlags, MountPropagationFlags, OpenTreeFlags};
use rustix::process::{Pid, Signal, WaitOptions};
use rustix::thread::UnshareFlags;

use jail_sys::sys::{Forked, fork_single_threaded, unshare_namespaces};
use jail_wire::protocol::{KeeperCmd, KeeperReply, recv_msg, send_msg};

/// The argument that selects the keeper's entry point.
pub const KEEPER_ARG: &str = "__keeper";

/// The keeper's start-up, as arguments (`__keeper --uid U --gid G --mount DIR --bytes N`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeeperArgs {
    /// The cache identity.
    pub uid: u32,
    /// Its group.
    pub gid: u32,
    /// Where the tmpfs is mounted in the keeper's own mount namespace.
    pub mount: PathBuf,
    /// The tmpfs's size.
    pub bytes: u64,
}

impl KeeperArgs {
    /// As command-line arguments.
    pub fn to_args(&self) -> Vec<String> {
        vec![
            "--uid".into(),
            self.uid.to_string(),
            "--gid".into(),
            self.gid.to_string(),
            "--mount".into(),
            self.mount.display().to_string(),
            "--bytes".into(),
            self.bytes.to_string(),
        ]
    }

    /// From command-line arguments (`None` if malformed).
    pub fn parse(args: &[String]) -> Option<Self> {
        let mut it = args.iter();
        let (mut uid, mut gid, mut mount, mut bytes) = (None, None, None, None);
        while let Some(k) = it.next() {
            let v = it.next()?;
            match k.as_str() {
                "--uid" => uid = v.parse().ok(),
                "--gid" => gid = v.parse().ok(),
                "--mount" => mount = Some(PathBuf::from(v)),
                "--bytes" => bytes = v.parse().ok(),
                _ => return None,
            }
        }
        Some(KeeperArgs {
            uid: uid?,
            gid: gid?,
            mount: mount?,
            bytes: bytes?,
        })
    }
}

/// Lending namespaces kept (one per borrowing UID); more are made again when needed.
const USERNS_KEPT: usize = 64;
/// How long a sealed fill's filler may take to exit after answering.
const FILLER_EXIT: Duration = Duration::from_secs(2);

/// Run the keeper (stdin: its socket to the supervisor). Returns the exit code.
pub fn keeper_main(args: &[String]) -> i32 {
    let Some(a) = KeeperArgs::parse(args) else {
        tracing::error!(args = %args.join(" "), "keeper: bad arguments");
        return 2;
    };
    let sock = jail_sys::sys::take_fd(0);
    let started = start(&a, sock.as_fd()).and_then(|cache| {
        let mut k = Keeper {
            uid: a.uid,
            gid: a.gid,
            cache,
            fills: HashMap::new(),
            userns: HashMap::new(),
        };
        // 6.
        k.check_lending()?;
        Ok(k)
    });
    // 7.
    let started = started.and_then(|k| {
        send_msg(sock.as_fd(), &KeeperReply::Ok, &[])
            .map(|()| k)
            .map_err(|e| e.to_string())
    });
    match started {
        Ok(mut k) => {
            tracing::debug!(bytes = a.bytes, "tree cache keeper ready");
            k.serve(sock.as_fd());
            0
        }
        Err(e) => {
            tracing::error!(error = %e, "tree cache keeper: start-up failed");
            let _ = send_msg(sock.as_fd(), &KeeperReply::Failed(e), &[]);
            1
        }
    }
}

/// The cache's two directories.
struct Cache {
    staging: OwnedFd,
    trees: OwnedFd,
}

fn start(a: &KeeperArgs, sock: std::os::fd::BorrowedFd<'_>) -> Result<Cache, String> {
    use rustix::process::{Gid, Uid};
    // 1.
    let _ = rustix::process::setsid();
    // 2. The supervisor writes the maps of the namespace we are now in.
    unshare_namespaces(UnshareFlags::NEWUSER).map_err(|e| format!("user namespace: {e}"))?;
    send_msg(sock, &KeeperReply::Ok, &[]).map_err(|e| e.to_string())?;
    match recv_msg::<KeeperReply>(sock) {
        Ok(Some((KeeperReply::Ok, _))) => {}
        other => return Err(format!("no user namespace maps: {other:?}")),
    }
    // 3.
    rustix::thread::set_thread_groups(&[]).map_err(|e| format!("setgroups: {e}"))?;
    let g = Gid::from_raw(a.gid);
    rustix::thread::set_thread_res_gid(g, g, g).map_err(|e| format!("setresgid: {e}"))?;
    let u = Uid::from_raw(a.uid);
    rustix::thread::set_thread_res_uid(u, u, u).map_err(|e| format!("setresuid: {e}"))?;
    rustix::process::set_dumpable_behavior(rustix::process::DumpableBehavior::NotDumpable)
        .map_err(|e| format!("dumpable: {e}"))?;
    rustix::thread::set_no_new_privs(true).map_err(|e| format!("no_new_privs: {e}"))?;
    // 4.
    unshare_namespaces(UnshareFlags::NEWNS).map_err(|e| format!("mount namespace: {e}"))?;
    rustix::mount::mount_change(
        "/",
        MountPropagationFlags::PRIVATE | MountPropagationFlags::REC,
    )
    .map_err(|e| format!("making / private: {e}"))?;
    // The supervisor charges every entry ENTRY_OVERHEAD, so an inode per that many bytes (and
    // some for the cache's own layout) is all the trees and fills can use; stated, not the
    // kernel's default (half the RAM's pages), which a small node could run out of first.
    let opts = std::ffi::CString::new(format!(
        "size={},nr_inodes={},mode=0700",
        a.bytes,
        (a.bytes / jail_wire::protocol::ENTRY_OVERHEAD).saturating_add(1024)
    ))
    .map_err(|e| e.to_string())?;
    rustix::mount::mount(
        "cmp-warden-cache",
        &a.mount,
        "tmpfs",
        // Not noexec: lent trees are the repositories commands run scripts from.
        MountFlags::NOSUID | MountFlags::NODEV,
        Some(opts.as_c_str()),
    )
    .map_err(|e| format!("tmpfs on {}: {e}", a.mount.display()))?;
    let root = open_dir_at(rfs::CWD, &a.mount).map_err(|e| format!("cache root: {e}"))?;
    for d in ["staging", "trees"] {
        rfs::mkdirat(&root, d, Mode::from_raw_mode(0o700)).map_err(|e| format!("{d}: {e}"))?;
    }
    let cache = Cache {
        staging: open_dir_at(&root, "staging").map_err(|e| e.to_string())?,
        trees: open_dir_at(&root, "trees").map_err(|e| e.to_string())?,
    };
    // 5.
    landlock_cache_only(&root)?;
    // 5b.
    let denied = seccomp::install_keeper_filter().map_err(|e| format!("seccomp: {e}"))?;
    tracing::debug!(denied, "tree cache keeper: Landlock and seccomp in force");
    Ok(cache)
}

fn open_dir_at(at: impl AsFd, name: impl rustix::path::Arg) -> rustix::io::Result<OwnedFd> {
    rfs::openat(
        at,
        name,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )
}

/// The keeper itself is confined to the cache (and `/proc`, where it maps the namespaces it
/// lends through); mounts it makes are not path accesses.
fn landlock_cache_only(root: &OwnedFd) -> Result<(), String> {
    use landlock::{
        ABI, Access, AccessFs, CompatLevel, Compatible, PathBeneath, PathFd, Ruleset, RulesetAttr,
        RulesetCreatedAttr,
    };
    let abi = ABI::V7;
    let all = AccessFs::from_all(abi);
    let proc = PathFd::new("/proc").map_err(|e| format!("landlock: /proc: {e}"))?;
    Ruleset::default()
        .set_compatibility(CompatLevel::BestEffort)
        .handle_access(all)
        .and_then(|r| r.create())
        .and_then(|r| r.add_rule(PathBeneath::new(root.as_fd(), all)))
        .and_then(|r| {
            r.add_rule(PathBeneath::new(
                proc,
                AccessFs::ReadFile | AccessFs::WriteFile | AccessFs::ReadDir,
            ))
        })
        .and_then(|r| r.restrict_self())
        .map_err(|e| format!("landlock: {e}"))
        .and_then(|status| match status.ruleset {
            // An older ABI handles fewer rights but still keeps the keeper's files to the
            // cache and /proc; without Landlock it would reach everything its identity
            // may, so the cache does not start (and start-up and doctor say why).
            landlock::RulesetStatus::NotEnforced => Err(
                "landlock: not enforced by this kernel, so the keeper would not be confined to the cache (turn the cache off: spec.cache.enabled: false)".to_owned(),
            ),
            _ => Ok(()),
        })
}

struct Keeper {
    uid: u32,
    gid: u32,
    cache: Cache,
    /// Fills under way: staging number → filler.
    fills: HashMap<u64, Pid>,
    /// Lending namespaces by borrowing (UID, GID).
    userns: HashMap<(u32, u32), OwnedFd>,
}

impl Keeper {
    fn serve(&mut self, sock: std::os::fd::BorrowedFd<'_>) {
        loop {
            let (cmd, fds) = match recv_msg::<KeeperCmd>(sock) {
                Ok(Some(m)) => m,
                // The supervisor is gone: so is the cache (the tmpfs goes with our namespace).
                Ok(None) => return,
                Err(e) => {
                    tracing::error!(error = %e, "tree cache keeper: bad command");
                    return;
                }
            };
            let (reply, fd) = match self.handle(cmd, fds) {
                Ok((r, fd)) => (r, fd),
                Err(e) => (KeeperReply::Failed(e), None),
            };
            let fds: Vec<_> = fd.iter().map(AsFd::as_fd).collect();
            if send_msg(sock, &reply, &fds).is_err() {
                return;
            }
        }
    }

    fn handle(
        &mut self,
        cmd: KeeperCmd,
        fds: Vec<OwnedFd>,
    ) -> Result<(KeeperReply, Option<OwnedFd>), String> {
        match cmd {
            KeeperCmd::Fill {
                id,
                options,
                limits,
            } => {
                let [archive, reply]: [OwnedFd; 2] = fds
                    .try_into()
                    .map_err(|_| "fill: two descriptors expected".to_owned())?;
                let name = id.to_string();
                rfs::mkdirat(
                    &self.cache.staging,
                    name.as_str(),
                    Mode::from_raw_mode(0o755),
                )
                .map_err(|e| format!("staging {id}: {e}"))?;
                let dir = open_dir_at(&self.cache.staging, name.as_str())
                    .map_err(|e| format!("staging {id}: {e}"))?;
                match fork_single_threaded().map_err(|e| format!("fork: {e}"))? {
                    Forked::Child => {
                        let placed = [(archive, 0), (reply, 1), (dir, jail::STAGING_FD)];
                        for (fd, at) in &placed {
                            if jail_sys::sys::dup_to(fd.as_fd(), *at).is_err() {
                                std::process::exit(1);
                            }
                        }
                        jail::fill_main(&options, limits)
                    }
                    Forked::Parent(pid) => {
                        let pid = Pid::from_raw(pid).ok_or("fork: bad PID")?;
                        self.fills.insert(id, pid);
                        Ok((
                            KeeperReply::Started {
                                pid: pid.as_raw_nonzero().get(),
                            },
                            None,
                        ))
                    }
                }
            }
            KeeperCmd::Seal { id, key } => {
                let pid = self.fills.remove(&id).ok_or("seal: no such fill")?;
                let status = wait_bounded(pid, FILLER_EXIT);
                if status != FillerEnd::Exited(0) {
                    if status == FillerEnd::Running {
                        // Still ours (not reaped): its PID cannot have been reused.
                        let _ = rustix::process::kill_process(pid, Signal::KILL);
                        let _ = rustix::process::waitpid(Some(pid), WaitOptions::empty());
                    }
                    remove_entry(&self.cache.staging, &id.to_string());
                    return Err(format!("seal: the filler {status:?}"));
                }
                rfs::renameat(
                    &self.cache.staging,
                    id.to_string(),
                    &self.cache.trees,
                    key.as_str(),
                )
                .map_err(|e| format!("seal {key}: {e}"))?;
                Ok((KeeperReply::Ok, None))
            }
            KeeperCmd::Discard { id } => {
                if let Some(pid) = self.fills.remove(&id) {
                    let _ = rustix::process::kill_process(pid, Signal::KILL);
                    let _ = rustix::process::waitpid(Some(pid), WaitOptions::empty());
                }
                remove_entry(&self.cache.staging, &id.to_string());
                Ok((KeeperReply::Ok, None))
            }
            KeeperCmd::Evict { key } => {
                remove_entry(&self.cache.trees, &key);
                Ok((KeeperReply::Ok, None))
            }
            KeeperCmd::Lend { key, uid, gid } => {
                let userns = self.userns_for(uid, gid)?;
                let mnt = rustix::mount::open_tree(
                    &self.cache.trees,
                    key.as_str(),
                    OpenTreeFlags::OPEN_TREE_CLONE
                        | OpenTreeFlags::OPEN_TREE_CLOEXEC
                        | OpenTreeFlags::AT_RECURSIVE
                        | OpenTreeFlags::AT_SYMLINK_NOFOLLOW,
                )
                .map_err(|e| format!("lend {key}: open_tree: {e}"))?;
                jail_sys::sys::mount_setattr_idmapped_readonly(mnt.as_fd(), userns.as_fd())
                    .map_err(|e| format!("lend {key}: idmapped mount: {e}"))?;
                Ok((KeeperReply::Ok, Some(mnt)))
            }
        }
    }

    /// Step 6: lend the (empty) `trees` directory once, to the cache identity itself. The
    /// kernel idmaps tmpfs mounts from Linux 6.3 on; without that every lend would fail, and
    /// so would every request whose archive filled a tree: the keeper refuses to start instead,
    /// and start-up says why.
    fn check_lending(&mut self) -> Result<(), String> {
        let userns = self.userns_for(self.uid, self.gid)?;
        let mnt = rustix::mount::open_tree(
            &self.cache.trees,
            ".",
            OpenTreeFlags::OPEN_TREE_CLONE
                | OpenTreeFlags::OPEN_TREE_CLOEXEC
                | OpenTreeFlags::AT_RECURSIVE,
        )
        .map_err(|e| format!("lending a tree: open_tree: {e}"))?;
        jail_sys::sys::mount_setattr_idmapped_readonly(mnt.as_fd(), userns.as_fd()).map_err(|e| {
            format!(
                "this kernel cannot lend a tree: an idmapped mount of the cache's tmpfs failed ({e}); tmpfs supports idmapped mounts from Linux 6.3"
            )
        })
    }

    /// The namespace whose map makes the cache identity appear as `uid`/`gid`: made by a
    /// child of ours (so we hold every capability over it) and mapped by us (CAP_SETUID over
    /// our own namespace, where `uid` is mapped).
    fn userns_for(&mut self, uid: u32, gid: u32) -> Result<OwnedFd, String> {
        if let Some(fd) = self.userns.get(&(uid, gid)) {
            return rustix::io::fcntl_dupfd_cloexec(fd, 0).map_err(|e| e.to_string());
        }
        let (ready_r, ready_w) =
            rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC).map_err(|e| e.to_string())?;
        let (hold_r, hold_w) =
            rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC).map_err(|e| e.to_string())?;
        let child = match fork_single_threaded().map_err(|e| format!("fork: {e}"))? {
            Forked::Child => {
                drop((ready_r, hold_w));
                // Our /proc files must be writable by the keeper (same UID).
                let _ = rustix::process::set_dumpable_behavior(
                    rustix::process::DumpableBehavior::Dumpable,
                );
                let ok = unshare_namespaces(UnshareFlags::NEWUSER).is_ok();
                let _ = rustix::io::write(&ready_w, if ok { b"y" } else { b"n" });
                let mut b = [0u8; 1];
                let _ = rustix::io::read(&hold_r, &mut b);
                std::process::exit(0);
            }
            Forked::Parent(pid) => Pid::from_raw(pid).ok_or("fork: bad PID")?,
        };
        drop((ready_w, hold_r));
        let result = (|| {
            let mut b = [0u8; 1];
            match rustix::io::read(&ready_r, &mut b) {
                Ok(1) if b[0] == b'y' => {}
                _ => return Err("lending namespace: unshare failed".to_owned()),
            }
            let proc = format!("/proc/{}", child.as_raw_nonzero().get());
            write_map(
                &format!("{proc}/uid_map"),
                &format!("{} {uid} 1\n", self.uid),
            )?;
            write_map(
                &format!("{proc}/gid_map"),
                &format!("{} {gid} 1\n", self.gid),
            )?;
            rfs::open(
                Path::new(&format!("{proc}/ns/user")),
                OFlags::RDONLY | OFlags::CLOEXEC,
                Mode::empty(),
            )
            .map_err(|e| format!("lending namespace: {e}"))
        })();
        drop(hold_w);
        let _ = rustix::process::waitpid(Some(child), WaitOptions::empty());
        let fd = result?;
        if self.userns.len() >= USERNS_KEPT {
            self.userns.clear();
        }
        let copy = rustix::io::fcntl_dupfd_cloexec(&fd, 0).map_err(|e| e.to_string())?;
        self.userns.insert((uid, gid), fd);
        Ok(copy)
    }
}

/// Write a namespace map (opened write-only, without truncation: Landlock grants this
/// process no right to truncate).
fn write_map(path: &str, text: &str) -> Result<(), String> {
    let fd = rfs::open(path, OFlags::WRONLY | OFlags::CLOEXEC, Mode::empty())
        .map_err(|e| format!("lending namespace: {path}: {e}"))?;
    rustix::io::write(&fd, text.as_bytes())
        .map(|_| ())
        .map_err(|e| format!("lending namespace: {path}: {e}"))
}

/// The filler's exit code, waiting at most `limit` (`None`: still running, or killed).
/// How a filler ended, as far as waiting for it showed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum FillerEnd {
    /// Exited (reaped) with this status.
    Exited(i32),
    /// Reaped, killed by a signal (or no longer ours to wait for).
    Ended,
    /// Still running at the limit (not reaped).
    Running,
}

fn wait_bounded(pid: Pid, limit: Duration) -> FillerEnd {
    let end = Instant::now() + limit;
    loop {
        match rustix::process::waitpid(Some(pid), WaitOptions::NOHANG) {
            Ok(Some((_, st))) => {
                return st.exit_status().map_or(FillerEnd::Ended, FillerEnd::Exited);
            }
            Ok(None) if Instant::now() < end => std::thread::sleep(Duration::from_millis(1)),
            Ok(None) => return FillerEnd::Running,
            Err(_) => return FillerEnd::Ended,
        }
    }
}

/// Remove `name` beneath `dir` and everything in it (never following links).
fn remove_entry(dir: &OwnedFd, name: &str) {
    if let Ok(d) = open_dir_at(dir, name) {
        let _ = archive::remove_contents(d.as_fd());
    }
    let _ = rfs::unlinkat(dir, name, AtFlags::REMOVEDIR);
}
