//! The jail: the confined side. A process forked by the jail factory (the `supervisor` crate) for
//! each request, which reads its preparation, confines itself (`confine`, a numbered sequence,
//! with `namespaces`) before any request exists, then reads the request header, extracts the
//! archive (`request`) and runs the plugin's commands (`run`). It talks to the supervisor only
//! through the pipe protocol (`jail_wire::protocol`).
//!
//! A crate of its own so the compiler holds the boundary: it cannot name the supervisor (no
//! dependency on the `supervisor` crate), and the supervisor can name only the entry points below.
// `unsafe` lives in `jail_sys::sys` only.
#![forbid(unsafe_code)]

mod confine;
mod fill;
mod layout;
mod mounter;
mod namespaces;
mod request;
mod run;

/// The entry points: the jail (the factory forks it), the filler (the keeper forks it), the
/// capability count the factory probes before it forks, and one command run as the jail
/// runs it (the benchmark harness).
pub use confine::last_cap;
pub use fill::{STAGING_FD, fill_main};
pub use run::{CmdSpec, run};

use std::io::{Read, Write};
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use rustix::fs::{self as rfs, Mode, OFlags};

use confine::confine;
use jail_sys::cancel::CancelToken;
use jail_wire::protocol::{
    Degraded, FrameReader, Header, Prepare, Reply, SelfTestOutcome, read_json_frame,
};
use jail_wire::spec::Task;
use layout::{HOME_DIR, REPO_DIR, TMP_DIR};
use request::{Failure, Request, extract, run_operation};
use vocab::record::Limit;
use vocab::request::ErrorKind;

/// Send the reply as one `R` frame; the supervisor answers the client as soon as it has it.
fn reply(r: &Reply) -> i32 {
    if send_frame(b'R', r) { 0 } else { 1 }
}

/// One frame on the reply pipe (stdout), whole: the lock keeps frames written from the stderr
/// readers' threads and the reply from interleaving.
fn send_frame(tag: u8, body: &impl serde::Serialize) -> bool {
    let Ok(body) = serde_json::to_vec(body) else {
        return false;
    };
    let mut out = std::io::stdout().lock();
    jail_wire::protocol::write_frame(&mut out, tag, &body).is_ok() && out.flush().is_ok()
}

/// After replying (or when retired unused): kill every other process of the jail — commands,
/// and daemons that left their group or session — then empty its directory, so the supervisor
/// only has to remove the then-empty entry. `kill(-1)` reaches exactly the jail's processes when
/// the UID is unique or when the jail is the init of its own PID namespace; in the shared-UID
/// model without one it would hit the server, so only the directory is emptied.
///
/// With the tree on the jail's private tmpfs and the jail as init of its PID namespace, the
/// file-by-file removal is skipped: every process that could hold the tmpfs dies with the PID
/// namespace, and the mount namespace then takes the tmpfs with it in one kernel teardown (on
/// the host the directory was never written to). Removing a large tree by `unlinkat` costs
/// more CPU than extracting it took, competing with the next request.
fn clean_up(dir: &std::os::fd::OwnedFd, unique_uid: bool, private_tree: bool) -> bool {
    let own_pid_ns = rustix::process::getpid().is_init();
    let can_kill = unique_uid || own_pid_ns;
    let killed = !can_kill || jail_sys::sys::kill_all_of_my_uid().is_ok();
    reap_children(can_kill);
    let emptied = (private_tree && own_pid_ns) || archive::remove_contents(dir.as_fd()).is_ok();
    killed && emptied
}

/// Reap the jail's children (its commands' orphans, of which it is the subreaper), so no zombie
/// of the request counts against the UID's next lease. After the kill, wait until none is left
/// (they die asynchronously; bounded); otherwise take only those already dead (the rest, in the
/// shared-UID model without a PID namespace, go on to the supervisor).
fn reap_children(killed: bool) {
    use rustix::process::{WaitOptions, wait};
    let deadline = Instant::now() + Duration::from_secs(2);
    loop {
        match wait(WaitOptions::NOHANG) {
            Ok(Some(_)) => continue,
            Ok(None) if killed && Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(1));
            }
            // ECHILD (none left), or live children we may not kill.
            _ => return,
        }
    }
}

fn internal(message: String) -> Reply {
    Reply::Err {
        kind: ErrorKind::Internal,
        message,
        report: None,
        record: Default::default(),
    }
}

/// The jail: read the preparation, join the cgroup and confine — all before any request
/// exists, so a spare jail is ready when one arrives — then read the request header and only
/// then extract the archive and run the operation. Returns the process exit code.
pub fn jail_main() -> i32 {
    let t0 = Instant::now();
    let stdin = std::io::stdin();
    let mut input = &stdin;
    let prep: Prepare = match read_json_frame(&mut input, b'P') {
        Ok(Some(p)) => p,
        // The supervisor went away before preparing this jail: nothing was made.
        Ok(None) => return 0,
        Err(e) => return reply(&internal(format!("jail: {e}"))),
    };
    let span = tracing::info_span!("jail", jail = %prep.name);
    let _e = span.enter();

    // 0. Join the cgroup first, so everything that follows is accounted and bounded.
    for procs in &prep.cgroup_procs {
        if let Err(e) = std::fs::write(procs, "0") {
            return reply(&internal(format!(
                "sandbox: joining the request cgroup: cgroups: writing {}: {e}",
                procs.display()
            )));
        }
    }
    let (report, dir) = match confine(&prep.sandbox, &prep.work_root, &prep.name) {
        Ok(r) => r,
        // The supervisor went away while this (spare) jail confined itself: nothing to say.
        Err(e) if e.supervisor_gone => {
            tracing::debug!(error = %e, "the supervisor left while this jail confined itself");
            return 0;
        }
        Err(e) => {
            tracing::error!(error = %e, "confinement failed; nothing untrusted was run");
            return reply(&internal(e.to_string()));
        }
    };
    tracing::debug!(
        landlock = report.landlock.as_str(),
        seccomp_filters = report.seccomp_filters,
        namespaces = %report.namespaces.created_list(),
        degraded = %Degraded::joined(&report.degraded),
        us = t0.elapsed().as_micros() as u64,
        "confined"
    );
    // The subreaper of its commands: a daemon that leaves its process tree stays below the
    // jail (and so below the supervisor, which tells its own commands from clients that way),
    // and its zombie is the jail's to reap before the UID goes back to the pool.
    if let Err(e) = rustix::process::set_child_subreaper(Some(rustix::process::getpid())) {
        return reply(&internal(format!("sandbox: PR_SET_CHILD_SUBREAPER: {e}")));
    }
    if rustix::process::getpid().is_init() {
        // PID 1 of the jail's namespace: orphans of the commands are ours to reap, which each
        // command's poll loop does while it runs (no orphan exists before a command, and the
        // ones left after the last die with the namespace).
        jail_sys::reaper::reap_in_command_loop();
    }
    let unique_uid = report.unique_uid;
    let private_tree = report.namespaces.disk_bytes.is_some();
    let header: Header = match read_json_frame(&mut input, b'H') {
        Ok(Some(h)) => h,
        Ok(None) => {
            // Retired unused (shutdown, or the supervisor is gone).
            tracing::debug!("jail retired before a request");
            return if clean_up(&dir, unique_uid, private_tree) {
                0
            } else {
                3
            };
        }
        Err(e) => {
            let code = reply(&internal(format!("jail: {e}")));
            clean_up(&dir, unique_uid, private_tree);
            return code;
        }
    };
    let code = match header {
        Header::Probe { writes } => probe(&prep.work_root, &writes, report, &dir),
        Header::Request {
            request,
            task,
            deadline_ms,
            tree_attached,
        } => {
            tracing::debug!(%request, us = t0.elapsed().as_micros() as u64, "header read");
            let loopback = prep.sandbox.loopback;
            run_confined(*task, deadline_ms, report, &dir, tree_attached, loopback)
        }
    };
    tracing::debug!(us = t0.elapsed().as_micros() as u64, "replied");
    if !clean_up(&dir, unique_uid, private_tree) {
        tracing::warn!("jail clean-up incomplete; the supervisor's helper will finish it");
        return 3;
    }
    code
}

/// With the tree from the cache: the `E` that says the request's bytes matched (nothing else).
fn archive_end(frames: &mut FrameReader<impl Read>) -> Result<(), Failure> {
    let mut b = [0u8; 1];
    let io = |e: std::io::Error| {
        Failure::Archive(archive::ExtractError::new(archive::Reason::Io {
            op: "reading the end of the archive",
            source: e,
        }))
    };
    match frames.read(&mut b) {
        Ok(0) => Ok(()),
        Ok(_) => Err(io(std::io::Error::other(
            "archive bytes for a tree from the cache",
        ))),
        Err(e) => Err(io(e)),
    }
}

/// The start-up probe: the extractor self-test, then the report.
fn probe(
    work_root: &Path,
    writes: &[PathBuf],
    mut report: jail_wire::protocol::Report,
    dir: &std::os::fd::OwnedFd,
) -> i32 {
    let base = report.request_dir.clone();
    let mut targets = vec![base.join(HOME_DIR), work_root.to_path_buf()];
    targets.extend(writes.iter().cloned());
    let private = report.namespaces.disk_bytes.is_some().then_some(dir);
    report.self_test = self_test(&base.join(REPO_DIR), &targets, private);
    reply(&Reply::Ok {
        outcome: None,
        report,
        record: Default::default(),
    })
}

/// Extract the archive and run the request's operation; reply with the outcome, or with the
/// failure classified and the limit that ended it named.
fn run_confined(
    mut task: Task,
    deadline_ms: Option<u64>,
    report: jail_wire::protocol::Report,
    dir: &std::os::fd::OwnedFd,
    tree_attached: bool,
    loopback: bool,
) -> i32 {
    let deadline = deadline_ms.map(|ms| Instant::now() + Duration::from_millis(ms));
    let stdin = std::io::stdin();
    let input = &stdin;
    let base = report.request_dir.clone();
    task.env.retain(|(k, _)| k != "HOME" && k != "TMPDIR");
    task.env
        .push(("HOME".into(), base.join(HOME_DIR).display().to_string()));
    task.env
        .push(("TMPDIR".into(), base.join(TMP_DIR).display().to_string()));
    if let Some(port) = report.egress_port {
        // curl, git, helm and Go, Python read one of these; Node's own http and fetch read them
        // from Node 24 on when NODE_USE_ENV_PROXY=1 (set here; older Node needs a proxy agent
        // in the plugin). A passed NO_PROXY would only send a tool to a direct connection that
        // cannot succeed.
        let proxy = format!("http://127.0.0.1:{port}");
        const NAMES: [&str; 6] = [
            "HTTPS_PROXY",
            "https_proxy",
            "HTTP_PROXY",
            "http_proxy",
            "ALL_PROXY",
            "all_proxy",
        ];
        task.env
            .retain(|(k, _)| !NAMES.contains(&k.as_str()) && k != "NO_PROXY" && k != "no_proxy");
        task.env
            .extend(NAMES.iter().map(|n| ((*n).to_owned(), proxy.clone())));
        task.env.retain(|(k, _)| k != "NODE_USE_ENV_PROXY");
        task.env.push(("NODE_USE_ENV_PROXY".into(), "1".into()));
        if loopback {
            // `network.loopback`: a tool's processes talk to each other on the jail's own
            // loopback, directly (the proxy would refuse them); gRPC's Node client reads
            // no_grpc_proxy before no_proxy.
            for name in ["NO_PROXY", "no_proxy", "no_grpc_proxy"] {
                task.env.retain(|(k, _)| k != name);
                task.env
                    .push((name.to_owned(), "localhost,127.0.0.1,::1".to_owned()));
            }
        }
    }
    let req = Request {
        task,
        tree: base.join(REPO_DIR),
        deadline,
        record: Default::default(),
    };
    let mut frames = FrameReader::new(input);
    // A tree from the cache is already in place: only the end of the verified archive comes.
    let tree = if tree_attached {
        archive_end(&mut frames)
    } else {
        extract(&req, &mut frames)
    };
    // From here on stdin carries nothing; its end means "stop" (client cancel, deadline, or
    // the supervisor died). Watched by each command's poll loop, and between commands.
    let cancel = CancelToken::watching(rustix::stdio::stdin());
    let result = tree.and_then(|()| run_operation(&req, &cancel));
    let mut record = jail_wire::record::snapshot(&req.record);
    record.seccomp_audit = seccomp::audited();
    match result {
        // Commands that succeeded on a disk that filled up may have written only part of what
        // they meant to (a script that hid the failed write): not served as a success.
        Ok(_) if disk_full(dir) => {
            let (limit, cause) = full_disk(report.namespaces.disk_bytes);
            record.limit = Some(limit);
            reply(&Reply::Err {
                kind: ErrorKind::ResourceExhausted,
                message: format!(
                    "{cause}: the disk filled up while the commands ran, so their output may be \
                     incomplete and is not served"
                ),
                report: Some(report),
                record,
            })
        }
        Ok(outcome) => reply(&Reply::Ok {
            outcome: Some(outcome),
            report,
            record,
        }),
        Err(e) => {
            // The supervisor closed the stream without its end (client gone, checksum
            // mismatch): not the archive's fault.
            let kind = match &e {
                Failure::Archive(_) if frames.aborted() => ErrorKind::Cancelled,
                _ => e.kind(),
            };
            // A failure on a full disk is that disk, whatever the tool said.
            let (kind, message) = if e.no_space() || disk_full(dir) {
                let (limit, cause) = full_disk(report.namespaces.disk_bytes);
                record.limit = Some(limit);
                (ErrorKind::ResourceExhausted, format!("{cause}: {e}"))
            } else {
                (kind, e.to_string())
            };
            if record.limit.is_none() {
                record.limit = match &e {
                    Failure::Archive(_) => Some(Limit::Archive),
                    _ => record.commands.last().and_then(|c| c.ended_by),
                };
            }
            // A failure after seccomp denied a call: name the denial.
            if record.limit.is_none()
                && record
                    .seccomp_audit
                    .iter()
                    .any(|d| d.action == vocab::record::SeccompAction::Denied)
            {
                record.limit = Some(Limit::Seccomp);
            }
            reply(&Reply::Err {
                kind,
                message,
                report: Some(report),
                record,
            })
        }
    }
}

/// What a full work-directory disk is, and what changes it.
const WORK_DISK_FULL: &str = "the work directory's disk is full (the node's disk under the \
    server's --work-dir / ARGOCD_CMP_WORKDIR: without a mount namespace the request's tree is \
    written there and spec.limits.diskBytes does not apply; free space on it, or let the jail \
    have its mount namespace, spec.namespaces, for a tmpfs of its own)";

/// The full disk a request's tree is on, as its limit and the cause said in front of the
/// message: the request's tmpfs (its policy limit) or, without a mount namespace, the node's
/// disk under the work directory, which no policy limit bounds.
fn full_disk(disk_bytes: Option<u64>) -> (Limit, String) {
    match disk_bytes {
        Some(limit) => (
            Limit::Disk,
            format!("disk limit reached (policy spec.limits.diskBytes: {limit})"),
        ),
        None => (Limit::WorkDisk, WORK_DISK_FULL.to_owned()),
    }
}

/// Whether the request's tmpfs (or, without one, the work directory's disk) has (almost) no
/// blocks or inodes left.
fn disk_full(dir: &std::os::fd::OwnedFd) -> bool {
    let full = |st: rfs::StatVfs| {
        // A few pages may stay free when a write of a larger block failed.
        st.f_bavail.saturating_mul(st.f_bsize) < 64 * 1024 || st.f_favail == 0
    };
    // A tree from the cache writes into its overlay's own layer, which `repo/` reports.
    let repo = rfs::openat(
        dir,
        REPO_DIR,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .ok();
    rfs::fstatvfs(dir).is_ok_and(full) || repo.is_some_and(|r| rfs::fstatvfs(&r).is_ok_and(full))
}

/// The confinement self-test: pack a one-file tree and run the real extractor, confined, into
/// each target. Only targets inside the request directory can succeed — or, with a private
/// tmpfs (`private`: the request directory on it), targets that the mount namespace replaced
/// by the request's own tmpfs (reported as "private", the real directory being unreachable).
fn self_test(
    repo: &Path,
    targets: &[PathBuf],
    private: Option<&std::os::fd::OwnedFd>,
) -> Vec<(String, SelfTestOutcome)> {
    let mut tgz = Vec::new();
    let packed = std::fs::write(repo.join("probe.txt"), b"probe\n")
        .and_then(|()| archive::pack_dir(repo, &|_| false, &mut tgz));
    if let Err(e) = packed {
        return vec![(
            "pack".into(),
            SelfTestOutcome::Denied(format!("error: {e}")),
        )];
    }
    targets
        .iter()
        .enumerate()
        .map(|(i, t)| {
            let outcome = archive::DirWriter::open_root(t)
                .and_then(|root| {
                    archive::DirWriter::new(root, archive::Resolver::Auto)?
                        .map_err(|r| std::io::Error::other(r.to_string()))
                })
                .map_err(|e| e.to_string())
                .and_then(|mut w| {
                    archive::extract(&tgz[..], &mut w, &archive::Options::default())
                        .map_err(|e| e.to_string())
                });
            let on_private_tmpfs = || {
                private.is_some_and(|tree| {
                    rfs::open(t, OFlags::PATH | OFlags::CLOEXEC, Mode::empty())
                        .is_ok_and(|fd| namespaces::same_filesystem(&fd, tree))
                })
            };
            let outcome = match outcome {
                Ok(_) if i > 0 && on_private_tmpfs() => SelfTestOutcome::Private,
                Ok(_) => SelfTestOutcome::Extracted,
                Err(e) => SelfTestOutcome::Denied(e),
            };
            (t.display().to_string(), outcome)
        })
        .collect()
}
