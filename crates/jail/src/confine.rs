//! Confining the jail process itself, in one fixed order, before it reads any untrusted byte.
//!
//! Runs in a fresh single-threaded process of our own binary (never in the multithreaded
//! supervisor), so ordinary Rust — allocation, the `landlock` builder — is safe here. Every
//! step is checked; a step the policy requires that cannot be applied aborts the request.
//!
//! Order (docs/supervisor.md mirrors it):
//!  1. `setsid` — a new session and process group, detached from any terminal;
//!  2. rlimits (NOFILE, FSIZE, CORE=0, DATA, AS; NPROC when the UID is unique), and
//!     `oom_score_adj` 1000 (the OOM killer takes a command before the server);
//!  3. bounding set emptied (needs CAP_SETPCAP, so it must precede the UID switch);
//!  4. `setgroups([])`, `setresgid`, `setresuid` to the lease — read back and verified;
//!  5. ambient, inheritable, permitted and effective capabilities cleared — read back;
//!  6. the request directory created as the leased UID (0700);
//!  7. namespaces (user → mount with the request's tmpfs, IPC, UTS, network, cgroup, PID with a
//!     fork so the jail is the namespace's init), then steps 3 and 5 again inside the new user
//!     namespace, which handed out a full set;
//!  8. not dumpable (same-UID commands cannot open our /proc fds or memory);
//!  9. `no_new_privs`;
//! 10. Landlock: the request directory read-write (and the private `/tmp`), the policy's paths,
//!     TCP denied when `network: none` (unless `network.loopback`, which step 7 has checked
//!     has the jail's own network namespace), abstract-socket and signal scoping;
//! 11. seccomp, installed once; every command the jail starts inherits it.

use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};

use landlock::{
    ABI, Access, AccessFs, AccessNet, CompatLevel, Compatible, NetPort, PathBeneath, PathFd,
    Ruleset, RulesetAttr, RulesetCreatedAttr, RulesetStatus, Scope,
};
use policy::{LandlockFeature, NetworkMode, Protection};
use rustix::fs::{self as rfs, Mode, OFlags};
use rustix::process::{Resource, Rlimit};
use rustix::thread::{CapabilitySet, CapabilitySets};

use super::layout::{ConfineError, fail, make_subdirs};
use jail_wire::protocol::{
    Creds, Degraded, LandlockStatus, MOUNTER_SOCKET, NO_MOUNTER, Reduced, Report, Sandbox,
    TESTED_LANDLOCK_ABI,
};
use policy::Namespace;

/// A failed hand-over: the supervisor gone (its end closed) or something to report.
fn handing_over(step: &'static str, what: &str, e: rustix::io::Errno) -> ConfineError {
    ConfineError {
        supervisor_gone: matches!(e, rustix::io::Errno::PIPE | rustix::io::Errno::CONNRESET),
        ..fail(step, format!("handing the {what} over: {e}"))
    }
}

/// Lines of /proc/thread-self/status starting with one of `keys`.
pub fn status_lines(keys: &[&str]) -> Vec<String> {
    let text = std::fs::read_to_string("/proc/thread-self/status").unwrap_or_default();
    text.lines()
        .filter(|l| l.split_once(':').is_some_and(|(k, _)| keys.contains(&k)))
        .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
        .collect()
}

/// The status lines a report proves itself with.
pub const STATUS_KEYS: &[&str] = &[
    "Uid",
    "Gid",
    "Groups",
    "CapInh",
    "CapPrm",
    "CapEff",
    "CapBnd",
    "CapAmb",
    "NoNewPrivs",
    "Seccomp",
    "Seccomp_filters",
];

/// The highest capability number this kernel knows, read once: the jail factory reads it
/// before its first fork (`factory::warm_up`), so every jail inherits it instead of reading
/// `/proc/sys` twice.
pub fn last_cap() -> u32 {
    static LAST: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
    *LAST.get_or_init(|| {
        std::fs::read_to_string("/proc/sys/kernel/cap_last_cap")
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(40)
            .min(63)
    })
}

fn set_rlimit(res: Resource, want: u64) -> Result<(), ConfineError> {
    // Never try to raise a hard limit (needs CAP_SYS_RESOURCE); lowering always works.
    let cur = rustix::process::getrlimit(res);
    let v = cur.maximum.map_or(want, |m| m.min(want));
    rustix::process::setrlimit(
        res,
        Rlimit {
            current: Some(v),
            maximum: Some(v),
        },
    )
    .map_err(|e| fail("rlimits", format!("{res:?}: {e}")))
}

/// Apply the sandbox to the calling (only) thread and create the request directory
/// `work_root/name`; returns the report and the directory.
pub fn confine(
    sb: &Sandbox,
    work_root: &Path,
    name: &str,
) -> Result<(Report, OwnedFd), ConfineError> {
    let required = |p| sb.require.contains(&p);
    let mut degraded = Vec::new();

    // 1. New session: its own process group, no controlling terminal.
    rustix::process::setsid().map_err(|e| fail("setsid", e))?;

    // 2. rlimits (a backstop; cgroups bound memory and pids where delegated).
    set_rlimit(Resource::Core, 0)?;
    set_rlimit(Resource::Nofile, sb.rlimits.open_files)?;
    set_rlimit(Resource::Fsize, sb.rlimits.file_size_bytes)?;
    set_rlimit(Resource::Data, sb.rlimits.data_bytes)?;
    set_rlimit(Resource::As, sb.rlimits.address_space_bytes)?;
    if sb.creds.is_some() {
        // Per real UID: only meaningful when the UID belongs to this request alone.
        set_rlimit(Resource::Nproc, sb.rlimits.processes)?;
    }
    let rlimits = [
        ("CORE", Resource::Core),
        ("NOFILE", Resource::Nofile),
        ("FSIZE", Resource::Fsize),
        ("DATA", Resource::Data),
        ("AS", Resource::As),
        ("NPROC", Resource::Nproc),
    ]
    .into_iter()
    .map(|(n, r)| {
        let v = rustix::process::getrlimit(r).maximum.unwrap_or(u64::MAX);
        (n.to_owned(), v)
    })
    .collect();

    // 2b. The OOM killer's first choice: where no request cgroup bounds memory (a container
    //     runtime delegates none), a command that fills the container's memory limit must die
    //     before the server. Raising oom_score_adj needs no privilege; commands inherit it.
    let oom_score_adj = std::fs::write("/proc/self/oom_score_adj", "1000")
        .and_then(|()| std::fs::read_to_string("/proc/self/oom_score_adj"))
        .map(|v| v.trim().to_owned());
    if oom_score_adj.as_deref().ok() != Some("1000") {
        degraded.push(Degraded::new(
            Reduced::OomScoreAdj,
            format!("not raised to 1000 ({oom_score_adj:?}): a command filling the container's memory may take the server with it"),
        ));
    }

    // 3. Bounding set: needs CAP_SETPCAP, which the UID switch below takes away.
    clear_bounding_set()?;

    // 4. Credentials, checked by reading them back.
    let mut unique_uid = false;
    if let Some(c) = sb.creds {
        use rustix::process::{Gid, Uid};
        rustix::thread::set_thread_groups(&[]).map_err(|e| fail("setgroups", e))?;
        let g = Gid::from_raw(c.gid);
        rustix::thread::set_thread_res_gid(g, g, g).map_err(|e| fail("setresgid", e))?;
        let u = Uid::from_raw(c.uid);
        rustix::thread::set_thread_res_uid(u, u, u).map_err(|e| fail("setresuid", e))?;
        let want_uid = format!("Uid: {0} {0} {0} {0}", c.uid);
        let want_gid = format!("Gid: {0} {0} {0} {0}", c.gid);
        let got = status_lines(&["Uid", "Gid", "Groups"]);
        if !got.contains(&want_uid)
            || !got.contains(&want_gid)
            || !got.contains(&"Groups:".to_owned())
        {
            return Err(fail("credentials", format!("read back {got:?}")));
        }
        unique_uid = true;
    } else if required(Protection::UniqueUid) {
        return Err(fail(
            "credentials",
            "policy requires uniqueUid but no lease was given",
        ));
    } else {
        degraded.push(Degraded::new(
            Reduced::UniqueUid,
            "commands share the server's UID",
        ));
    }

    // 5. Every capability set, read back.
    clear_capabilities()?;

    // 6. The request directory, owned by the leased UID.
    let base = super::namespaces::canonical_base(work_root, name)?;
    let ns_mount = sb.namespaces.mount;
    let mut dir = make_request_dir(work_root, name, !ns_mount)?;

    // 7. Namespaces, then drop what the new user namespace handed out.
    let me = Creds {
        uid: rustix::process::getuid().as_raw(),
        gid: rustix::process::getgid().as_raw(),
    };
    let entered = super::namespaces::enter(sb.namespaces, me, &base, sb.disk, sb.tree_attach)?;
    let mounter = entered.mounter;
    let namespaces = entered.report;
    match entered.dir {
        Some(d) => dir = d,
        None if ns_mount => {
            // No mount namespace after all: the tree lives on the real filesystem.
            make_subdirs(&dir)?;
        }
        None => {}
    }
    if namespaces.has(Namespace::User) {
        clear_bounding_set()?;
        clear_capabilities()?;
    }
    if !namespaces.failed.is_empty() {
        if required(Protection::Namespaces) {
            return Err(fail(
                "namespaces",
                format!(
                    "required but not available: {:?}",
                    namespaces.failed_lines()
                ),
            ));
        }
        degraded.push(Degraded::new(
            Reduced::Namespaces,
            format!("{:?}", namespaces.failed_lines()),
        ));
    }
    // `spec.network.loopback` lets commands use inet sockets; only the jail's own network
    // namespace, whose one device is its loopback, keeps them there. Never best effort.
    if sb.loopback {
        let lo_down = namespaces
            .notes
            .iter()
            .find(|n| n.ns == Some(Namespace::Net));
        if !namespaces.has(Namespace::Net) || lo_down.is_some() {
            let why = match lo_down {
                Some(n) => n.what.clone(),
                None => "the jail has no network namespace of its own here (doctor's namespace.net; a container runtime's default seccomp profile refuses it: deploy/'s Localhost profile allows it)".to_owned(),
            };
            return Err(fail(
                "network",
                format!(
                    "spec.network.loopback needs the jail's own network namespace with its loopback up, and {why}; without it commands' inet sockets would reach the pod's network. Remove spec.network.loopback, or give the jail a network namespace"
                ),
            ));
        }
    }
    if namespaces.disk_bytes.is_none() {
        degraded.push(Degraded::new(
            Reduced::Disk,
            "no private tmpfs (no mount namespace); spec.limits.diskBytes not enforced, only RLIMIT_FSIZE per file",
        ));
    }
    let bounding_cleared = (0..=last_cap()).all(|n| {
        !rustix::thread::capability_is_in_bounding_set(CapabilitySet::from_bits_retain(1u64 << n))
            .unwrap_or(true)
    });
    if !bounding_cleared {
        degraded.push(Degraded::new(
            Reduced::BoundingSet,
            "kept (no CAP_SETPCAP); no_new_privs and empty permitted/ambient sets still prevent regaining capabilities",
        ));
    }

    // 7b. `network: allowList`: the egress listener, on the new namespace's loopback (the
    // only place commands can connect to) or, without one, on the server's loopback with
    // Landlock's TCP rules as the fence; handed to the supervisor, which proxies it.
    let egress_port = egress_listener(sb, &namespaces)?;
    let tcp_fence = egress_port.is_some() && !namespaces.has(Namespace::Net);

    // 7c. The tree cache: the socket to the mounter (the PID namespace's parent), handed to
    // the supervisor; the jail keeps no copy. Or word that there is none here.
    if sb.tree_attach {
        match &mounter {
            Some(m) => hand_over(MOUNTER_SOCKET, Some(m.as_fd())),
            None => hand_over(NO_MOUNTER, None),
        }
        .map_err(|e| handing_over("tree cache", "mounter", e))?;
    }
    drop(mounter);

    // 8. Not dumpable: commands of the same UID cannot reach our fds, memory or environ.
    rustix::process::set_dumpable_behavior(rustix::process::DumpableBehavior::NotDumpable)
        .map_err(|e| fail("dumpable", e))?;

    // 9. no_new_privs: setuid binaries and file capabilities grant nothing from here on.
    rustix::thread::set_no_new_privs(true).map_err(|e| fail("no_new_privs", e))?;
    let no_new_privs = rustix::thread::no_new_privs().unwrap_or(false);
    if !no_new_privs {
        return Err(fail("no_new_privs", "did not read back as set"));
    }

    // 10. Landlock (never left out but by a benchmark build's layer pass).
    let off = sb.landlock_switched_off();
    let ll = if off {
        degraded.push(Degraded::new(
            Reduced::Landlock,
            "switched off (a benchmark build's layer pass)",
        ));
        LandlockResult {
            features: Vec::new(),
            status: LandlockStatus::None,
            abi: None,
            tcp_denied: false,
            rights: Vec::new(),
            missing: Vec::new(),
        }
    } else {
        landlock(
            sb,
            &dir,
            namespaces.private_tmp,
            required(Protection::Landlock),
            egress_port,
            tcp_fence,
        )?
    };
    if ll.status == LandlockStatus::None && !off {
        degraded.push(Degraded::new(
            Reduced::Landlock,
            "not enforced by this kernel",
        ));
    } else if ll.status == LandlockStatus::Partial {
        degraded.push(Degraded::new(
            Reduced::Landlock,
            format!(
                "partially enforced (kernel ABI {:?} < tested {})",
                ll.abi, TESTED_LANDLOCK_ABI as i32
            ),
        ));
    }

    // 11. seccomp, last: it may deny calls the steps above needed. Its listener's thread is
    // started first, outside the filters (it makes `allowList`'s loopback sockets itself).
    let mut seccomp_filters = 0;
    match &sb.seccomp {
        Some(f) => match f.install_and_serve() {
            Ok(n) => seccomp_filters = n,
            Err(e) if required(Protection::Seccomp) => return Err(fail("seccomp", e)),
            Err(e) => degraded.push(Degraded::new(Reduced::Seccomp, e.to_string())),
        },
        None if required(Protection::Seccomp) => {
            return Err(fail(
                "seccomp",
                "policy requires seccomp but no filter was given",
            ));
        }
        None => degraded.push(Degraded::new(Reduced::Seccomp, "no filter")),
    }

    // 11b. `allowList`: every inet socket a command makes is bound to the loopback device, and
    // cannot be unbound; read back on a socket of our own. Without a network namespace this
    // and Landlock's port rule are the whole fence, so nothing less is accepted.
    let loopback_sockets = loopback_fence(sb, seccomp_filters > 0, tcp_fence)?;

    let ids = status_lines(&["Uid", "Gid"]);
    let first = |k: &str| {
        ids.iter()
            .find_map(|l| l.strip_prefix(k))
            .and_then(|r| r.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .unwrap_or(u32::MAX)
    };
    let report = Report {
        uid: first("Uid: "),
        gid: first("Gid: "),
        unique_uid,
        bounding_cleared,
        capabilities_cleared: true,
        no_new_privs,
        landlock: ll.status,
        landlock_abi: ll.abi,
        landlock_tcp_denied: ll.tcp_denied,
        landlock_rights: ll.rights,
        landlock_features: ll.features,
        rlimits,
        missing_paths: ll.missing,
        seccomp_filters,
        degraded,
        status: status_lines(STATUS_KEYS),
        self_test: Vec::new(),
        namespaces,
        request_dir: base,
        egress_port,
        loopback_sockets,
    };
    Ok((report, dir))
}

/// Step 11b: with `network: allowList` and the seccomp filter installed, a socket of ours (made
/// by the listener, as every command's is) must come back bound to `lo`, and unbinding it must
/// be refused. `tcp_fence` (no network namespace of the jail's own): required, else the jail
/// stops here naming the ways out. Whether the fence holds.
fn loopback_fence(sb: &Sandbox, filtered: bool, tcp_fence: bool) -> Result<bool, ConfineError> {
    if sb.network != NetworkMode::AllowList {
        return Ok(false);
    }
    let held = if filtered {
        check_loopback_socket()
    } else {
        Err("no seccomp filter is installed".to_owned())
    };
    match held {
        Ok(()) => Ok(true),
        Err(why) if tcp_fence || filtered => Err(fail(
            "network",
            format!(
                "spec.network.mode allowList: inet sockets must be bound to the loopback device (seccomp user notification, Linux 5.14), and here {why}; without the jail's own network namespace nothing else keeps commands from the proxy's port on other hosts. Give the jail a network namespace (deploy/'s Localhost seccomp profile, or spec.namespaces with net) or use mode none"
            ),
        )),
        Err(_) => Ok(false),
    }
}

/// A socket made as a command's would be: bound to `lo`, and not to be unbound.
fn check_loopback_socket() -> Result<(), String> {
    use rustix::net::{AddressFamily, SocketFlags, SocketType};
    let sock = rustix::net::socket_with(
        AddressFamily::INET,
        SocketType::STREAM,
        SocketFlags::CLOEXEC,
        None,
    )
    .map_err(|e| format!("a socket could not be made: {e}"))?;
    let dev = jail_sys::sys::bound_device(sock.as_fd())
        .map_err(|e| format!("its device binding could not be read: {e}"))?;
    if dev != b"lo" {
        return Err(format!(
            "a new socket is bound to {:?}, not lo",
            String::from_utf8_lossy(&dev)
        ));
    }
    match jail_sys::sys::bind_to_device(sock.as_fd(), b"") {
        Err(e) if e.raw_os_error() == Some(libc::EPERM) => Ok(()),
        Err(e) => Err(format!("unbinding a socket failed with {e}, not EPERM")),
        Ok(()) => Err("a command could unbind its socket from lo".to_owned()),
    }
}

/// Step 7b: with `network: allowList`, bind the egress listener on 127.0.0.1 and send it to
/// the supervisor over stdin (a socket); the jail keeps no copy. In the jail's own network
/// namespace nothing else is reachable. Without one (a container runtime's default seccomp
/// profile refuses namespaces) the listener is on the server's loopback, and what keeps the
/// commands to it is Landlock's TCP rules (ABI 4: connect to its port only, bind(2) nowhere),
/// made a hard requirement in step 10, with seccomp refusing every inet socket but TCP and
/// TCP Fast Open; a kernel without them is refused here, naming both ways out.
fn egress_listener(
    sb: &Sandbox,
    ns: &jail_wire::protocol::NamespaceReport,
) -> Result<Option<u16>, ConfineError> {
    if sb.network != NetworkMode::AllowList {
        return Ok(None);
    }
    let step = "network";
    let own_namespace = ns.has(Namespace::Net);
    if !own_namespace && !landlock_tcp_available() {
        return Err(fail(
            step,
            "spec.network.mode allowList needs the jail's own network namespace (doctor's namespace.net; a container runtime's default seccomp profile refuses it: deploy/'s Localhost profile allows it) or Landlock TCP rules (kernel ABI 4 or later; doctor's landlock), and this node has neither; use mode none or egress here",
        ));
    }
    let listener = if own_namespace {
        std::net::TcpListener::bind("127.0.0.1:0").map_err(|e| fail(step, e))?
    } else {
        shared_listener().map_err(|e| fail(step, format!("the egress listener: {e}")))?
    };
    let port = listener.local_addr().map_err(|e| fail(step, e))?.port();
    let tag = if own_namespace {
        jail_wire::protocol::EGRESS_LISTENER
    } else {
        jail_wire::protocol::EGRESS_LISTENER_SHARED
    };
    hand_over(tag, Some(listener.as_fd())).map_err(|e| handing_over(step, "egress listener", e))?;
    Ok(Some(port))
}

/// The egress listener on the pod's network (no namespace of the jail's own): bound to every
/// address (IPv6 and IPv4 at once where the node has IPv6) and to the loopback device. Bound
/// to every address, it leaves the port to no one else: no other socket of the pod can listen
/// on that port number at any address, so the commands' loopback sockets (step 11b), which
/// Landlock lets connect to this port alone, find the proxy and nothing else behind it. Bound
/// to the loopback device, it accepts nothing that arrives from another host.
fn shared_listener() -> std::io::Result<std::net::TcpListener> {
    use rustix::net::{AddressFamily, SocketFlags, SocketType};
    use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};
    let make = |family: AddressFamily| {
        rustix::net::socket_with(family, SocketType::STREAM, SocketFlags::CLOEXEC, None)
    };
    let bound = (|| -> std::io::Result<OwnedFd> {
        let s = make(AddressFamily::INET6)?;
        rustix::net::sockopt::set_ipv6_v6only(&s, false)?;
        jail_sys::sys::bind_to_device(s.as_fd(), b"lo")?;
        rustix::net::bind(&s, &SocketAddr::from((Ipv6Addr::UNSPECIFIED, 0)))?;
        Ok(s)
    })();
    let sock = match bound {
        Ok(s) => s,
        // No IPv6 on this node: commands cannot make IPv6 sockets that go anywhere either.
        Err(_) => {
            let s = make(AddressFamily::INET)?;
            jail_sys::sys::bind_to_device(s.as_fd(), b"lo")?;
            rustix::net::bind(&s, &SocketAddr::from((Ipv4Addr::UNSPECIFIED, 0)))?;
            s
        }
    };
    rustix::net::listen(&sock, 128)?;
    Ok(std::net::TcpListener::from(sock))
}

/// Whether this kernel's Landlock has TCP rules (ABI 4): a ruleset that must handle them can
/// be made.
fn landlock_tcp_available() -> bool {
    Ruleset::default()
        .set_compatibility(CompatLevel::HardRequirement)
        .handle_access(AccessNet::from_all(ABI::V4))
        .and_then(|r| r.create())
        .is_ok()
}

/// Send the supervisor one tagged byte over stdin (a socket), with `fd` as `SCM_RIGHTS`.
fn hand_over(tag: u8, fd: Option<std::os::fd::BorrowedFd<'_>>) -> rustix::io::Result<()> {
    use rustix::net::{SendAncillaryBuffer, SendAncillaryMessage, SendFlags};
    let mut space = [std::mem::MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
    let mut anc = SendAncillaryBuffer::new(&mut space);
    let fds: Vec<_> = fd.into_iter().collect();
    if !fds.is_empty() {
        anc.push(SendAncillaryMessage::ScmRights(&fds));
    }
    rustix::net::sendmsg(
        std::io::stdin().as_fd(),
        &[std::io::IoSlice::new(&[tag])],
        &mut anc,
        SendFlags::NOSIGNAL,
    )
    .map(|_| ())
}

fn make_request_dir(work_root: &Path, name: &str, subdirs: bool) -> Result<OwnedFd, ConfineError> {
    let step = "request directory";
    if name.is_empty() || name.contains('/') || name == "." || name == ".." {
        return Err(fail(step, format!("bad name {name:?}")));
    }
    // O_PATH: the work root is 1733 (others may create entries but not list them).
    let root = rfs::open(
        work_root,
        OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| fail(step, format!("{}: {e}", work_root.display())))?;
    rfs::mkdirat(&root, name, Mode::from_raw_mode(0o700)).map_err(|e| fail(step, e))?;
    let dir = rfs::openat(
        &root,
        name,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| fail(step, e))?;
    if subdirs {
        make_subdirs(&dir)?;
    }
    rustix::process::umask(Mode::from_raw_mode(0o077));
    Ok(dir)
}

/// Empty the bounding set when CAP_SETPCAP is held (a no-op otherwise; reported by the caller).
pub(crate) fn clear_bounding_set() -> Result<(), ConfineError> {
    let caps = rustix::thread::capabilities(None).map_err(|e| fail("capget", e))?;
    if caps.effective.contains(CapabilitySet::SETPCAP) {
        for n in 0..=last_cap() {
            let c = CapabilitySet::from_bits_retain(1u64 << n);
            rustix::thread::remove_capability_from_bounding_set(c)
                .map_err(|e| fail("bounding set", format!("cap {n}: {e}")))?;
        }
    }
    Ok(())
}

/// Clear the ambient, inheritable, permitted and effective sets and read them back.
pub(crate) fn clear_capabilities() -> Result<(), ConfineError> {
    match rustix::thread::clear_ambient_capability_set() {
        Ok(()) | Err(rustix::io::Errno::INVAL) => {}
        Err(e) => return Err(fail("ambient capabilities", e)),
    }
    let empty = CapabilitySets {
        effective: CapabilitySet::empty(),
        permitted: CapabilitySet::empty(),
        inheritable: CapabilitySet::empty(),
    };
    rustix::thread::set_capabilities(None, empty).map_err(|e| fail("capset", e))?;
    let now = rustix::thread::capabilities(None).map_err(|e| fail("capget", e))?;
    if now != empty {
        return Err(fail("capabilities", format!("still held: {now:?}")));
    }
    Ok(())
}

/// The features this jail's ruleset has in effect on a kernel of `abi` (TCP only when the
/// ruleset handles it, with `network: none`).
fn features_in_effect(abi: Option<i32>, status: LandlockStatus, tcp: bool) -> Vec<LandlockFeature> {
    let Some(abi) = abi.filter(|_| status != LandlockStatus::None) else {
        return Vec::new();
    };
    let abi = abi.min(TESTED_LANDLOCK_ABI as i32);
    LandlockFeature::ALL
        .into_iter()
        .filter(|f| i32::from(f.abi()) <= abi)
        .filter(|f| tcp || *f != LandlockFeature::Tcp)
        .collect()
}

/// Fail closed on what a required Landlock must provide: the policy's minimum ABI and named
/// features, and — whatever the policy names — every feature this kernel offers (a kernel at
/// the tested ABI must enforce the whole ruleset).
fn check_landlock_requirement(
    req: &policy::LandlockRequirement,
    abi: Option<i32>,
    status: LandlockStatus,
    features: &[LandlockFeature],
) -> Result<(), ConfineError> {
    let have = abi.unwrap_or(0);
    if have < i32::from(req.min_abi) {
        return Err(fail(
            "landlock",
            format!(
                "the policy requires Landlock ABI {} (spec.landlock.minAbi), this kernel offers ABI {have}",
                req.min_abi
            ),
        ));
    }
    let missing: Vec<&str> = req
        .features
        .iter()
        .filter(|f| !features.contains(f))
        .map(|f| f.as_str())
        .collect();
    if !missing.is_empty() {
        return Err(fail(
            "landlock",
            format!(
                "the policy requires {missing:?} (spec.landlock.features), not in effect on this kernel (Landlock ABI {have})"
            ),
        ));
    }
    if have >= TESTED_LANDLOCK_ABI as i32 && status != LandlockStatus::Full {
        return Err(fail(
            "landlock",
            format!(
                "this kernel offers Landlock ABI {have}, but the ruleset is only {}",
                status.as_str()
            ),
        ));
    }
    Ok(())
}

/// The access rights a kernel of `abi` enforces for the ruleset built here (what this build
/// asks for, capped at the kernel's ABI).
fn enforced_rights(abi: Option<i32>, tcp_denied: bool, status: LandlockStatus) -> Vec<String> {
    let Some(abi) = abi.filter(|_| status != LandlockStatus::None) else {
        return Vec::new();
    };
    let eff = ABI::from(abi.min(TESTED_LANDLOCK_ABI as i32));
    let mut v: Vec<String> = AccessFs::from_all(eff)
        .iter()
        .map(|r| format!("fs:{r:?}"))
        .collect();
    if tcp_denied {
        v.extend(
            AccessNet::from_all(eff)
                .iter()
                .map(|r| format!("net:{r:?}")),
        );
    }
    v.extend(Scope::from_all(eff).iter().map(|r| format!("scope:{r:?}")));
    v
}

struct LandlockResult {
    features: Vec<LandlockFeature>,
    status: LandlockStatus,
    abi: Option<i32>,
    tcp_denied: bool,
    rights: Vec<String>,
    missing: Vec<PathBuf>,
}

fn landlock(
    sb: &Sandbox,
    dir: &OwnedFd,
    private_tmp: bool,
    required: bool,
    egress_port: Option<u16>,
    tcp_fence: bool,
) -> Result<LandlockResult, ConfineError> {
    let ll = |e: landlock::RulesetError| fail("landlock", e);
    let abi = TESTED_LANDLOCK_ABI;
    // Fail closed on the filesystem rights of ABI 1 when required; everything newer (refer,
    // truncate, ioctl on devices, TCP, scoping) is added best-effort and reported.
    let floor = if required {
        CompatLevel::HardRequirement
    } else {
        CompatLevel::BestEffort
    };
    let mut rs = Ruleset::default()
        .set_compatibility(floor)
        .handle_access(AccessFs::from_all(ABI::V1))
        .map_err(ll)?
        .set_compatibility(CompatLevel::BestEffort)
        .handle_access(AccessFs::from_all(abi))
        .map_err(ll)?;
    // TCP is denied except, with `allowList`, connecting to the egress listener's port; a
    // hard requirement when that rule is the only fence (`tcp_fence`: no network namespace).
    // With `loopback` the jail's own network namespace (checked in step 7) is the fence, and
    // commands bind and connect on its loopback at ports they choose.
    let deny_tcp = sb.network != NetworkMode::Egress && !sb.loopback;
    if tcp_fence {
        rs = rs
            .set_compatibility(CompatLevel::HardRequirement)
            .handle_access(AccessNet::from_all(ABI::V4))
            .map_err(ll)?
            .set_compatibility(CompatLevel::BestEffort);
    }
    if deny_tcp {
        rs = rs.handle_access(AccessNet::from_all(abi)).map_err(ll)?;
    }
    rs = rs.scope(Scope::from_all(abi)).map_err(ll)?;
    let mut created = rs.create().map_err(ll)?;
    // Commands are new executables: without this (ABI 7) the kernel would audit only our own
    // denials, never theirs, and the supervisor could not explain what was refused.
    created = created.log_new_exec(true).map_err(ll)?;
    created = created
        .add_rule(PathBeneath::new(dir.as_fd(), AccessFs::from_all(abi)))
        .map_err(ll)?;
    if private_tmp {
        // /tmp is the request's own tmpfs (or its tree's tmp/) in its mount namespace.
        let tmp = PathFd::new("/tmp").map_err(|e| fail("landlock", e))?;
        created = created
            .add_rule(PathBeneath::new(tmp, AccessFs::from_all(abi)))
            .map_err(ll)?;
    }
    if let Some(port) = egress_port.filter(|_| deny_tcp) {
        created = created
            .add_rule(NetPort::new(port, AccessNet::ConnectTcp))
            .map_err(ll)?;
    }
    let mut missing = Vec::new();
    let read = AccessFs::from_read(abi);
    let write = AccessFs::from_all(abi);
    for (paths, access) in [(&sb.read_only, read), (&sb.read_write, write)] {
        for p in paths {
            let fd = match PathFd::new(p) {
                Ok(fd) => fd,
                Err(_) => {
                    missing.push(p.clone());
                    continue;
                }
            };
            let is_dir = rfs::fstat(&fd)
                .map(|st| rfs::FileType::from_raw_mode(st.st_mode) == rfs::FileType::Directory)
                .unwrap_or(false);
            let access = if is_dir {
                access
            } else {
                access & AccessFs::from_file(abi)
            };
            created = created.add_rule(PathBeneath::new(fd, access)).map_err(ll)?;
        }
    }
    let status = created.restrict_self().map_err(ll)?;
    let kernel_abi = match status.landlock {
        landlock::LandlockStatus::Available { effective_abi, .. } => Some(effective_abi as i32),
        _ => None,
    };
    let s = match status.ruleset {
        RulesetStatus::FullyEnforced => LandlockStatus::Full,
        RulesetStatus::PartiallyEnforced => LandlockStatus::Partial,
        RulesetStatus::NotEnforced => LandlockStatus::None,
    };
    if required && s == LandlockStatus::None {
        return Err(fail(
            "landlock",
            "required (spec.require) but not enforced by this kernel",
        ));
    }
    let tcp_denied = deny_tcp && kernel_abi.is_some_and(|a| a >= 4);
    let features = features_in_effect(kernel_abi, s, deny_tcp);
    if required {
        check_landlock_requirement(&sb.landlock, kernel_abi, s, &features)?;
    }
    Ok(LandlockResult {
        features,
        status: s,
        abi: kernel_abi,
        tcp_denied,
        rights: enforced_rights(kernel_abi, tcp_denied, s),
        missing,
    })
}
