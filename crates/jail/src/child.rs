//! Entry points of the processes that run apart from the supervisor: the per-request jail
//! (forked by the jail factory, `crate::factory`) and the reclaim helper (our binary
//! re-executed as `__reclaim`).

use std::io::{Read, Write};
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use rustix::fs::{self as rfs, AtFlags, Mode, OFlags};

use crate::cancel::{CancelReason, CancelToken};
use crate::confine::{HOME_DIR, REPO_DIR, TMP_DIR, confine};
use crate::protocol::{ErrorKind, FrameReader, Header, JailOp, Prepare, Reply, read_json_frame};
use crate::request::{Operation, RequestError, RequestSpec, extract, run_operation};

/// The argument that selects the reclaim helper.
pub const RECLAIM_ARG: &str = "__reclaim";

/// Send the reply as one `R` frame; the supervisor answers the client as soon as it has it.
fn reply(r: &Reply) -> i32 {
    let body = match serde_json::to_vec(r) {
        Ok(b) => b,
        Err(_) => return 1,
    };
    let mut out = std::io::stdout().lock();
    let ok = crate::protocol::write_frame(&mut out, b'R', &body).is_ok() && out.flush().is_ok();
    if ok { 0 } else { 1 }
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
    let killed = !(unique_uid || own_pid_ns) || crate::sys::kill_all_of_my_uid().is_ok();
    let emptied = (private_tree && own_pid_ns) || archive::remove_contents(dir.as_fd()).is_ok();
    killed && emptied
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
    if let Some(cg) = &prep.cgroup
        && let Err(e) = cg.join_self()
    {
        return reply(&internal(format!(
            "sandbox: joining the request cgroup: {e}"
        )));
    }
    let (report, dir) = match confine(&prep.sandbox, &prep.work_root, &prep.name) {
        Ok(r) => r,
        Err(e) => {
            tracing::error!(error = %e, "confinement failed; nothing untrusted was run");
            return reply(&internal(e.to_string()));
        }
    };
    tracing::debug!(?report, us = t0.elapsed().as_micros() as u64, "confined");
    if rustix::process::getpid().is_init() {
        // PID 1 of the jail's namespace: orphans of the commands are ours to reap.
        crate::reaper::start_orphan_reaper();
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
    tracing::debug!(request = %header.request, us = t0.elapsed().as_micros() as u64, "header read");
    let code = run_confined(&prep.work_root, header, report, &dir);
    tracing::debug!(us = t0.elapsed().as_micros() as u64, "replied");
    if !clean_up(&dir, unique_uid, private_tree) {
        tracing::warn!("jail clean-up incomplete; the supervisor's helper will finish it");
        return 3;
    }
    code
}

fn run_confined(
    work_root: &Path,
    header: Header,
    report: crate::confine::Report,
    dir: &std::os::fd::OwnedFd,
) -> i32 {
    let deadline = header
        .deadline_ms
        .map(|ms| Instant::now() + Duration::from_millis(ms));
    let stdin = std::io::stdin();
    let input = &stdin;
    let op = match header.op {
        JailOp::Probe => {
            let mut report = report;
            let base = report.request_dir.clone();
            let mut targets = vec![base.join(HOME_DIR), work_root.to_path_buf()];
            targets.extend(header.probe_writes.iter().cloned());
            let private = report.namespaces.disk_bytes.is_some().then_some(dir);
            report.self_test = self_test(&base.join(REPO_DIR), &targets, private);
            return reply(&Reply::Ok {
                outcome: None,
                report,
                record: Default::default(),
            });
        }
        JailOp::Generate => Operation::Generate,
        JailOp::Match => Operation::Match,
        JailOp::Parameters => Operation::Parameters,
        JailOp::Generator => Operation::Generator,
    };
    let base = report.request_dir.clone();
    let mut env = header.env.clone();
    env.retain(|(k, _)| k != "HOME" && k != "TMPDIR");
    env.push(("HOME".into(), base.join(HOME_DIR).display().to_string()));
    env.push(("TMPDIR".into(), base.join(TMP_DIR).display().to_string()));
    let spec = RequestSpec {
        op,
        config: header.config,
        tree: base.join(REPO_DIR),
        app_rel_path: header.app_rel_path,
        env,
        archive: header.archive,
        output_bytes: header.output_bytes,
        deadline,
        deadline_limit: header.deadline_limit,
        command_timeout: header
            .command_timeout
            .map(|(ms, t)| (Duration::from_millis(ms), t)),
        record: Default::default(),
    };
    let cancel = CancelToken::new();
    let mut frames = FrameReader::new(input);
    let result = extract(&spec, &mut frames).and_then(|()| {
        // From here on stdin carries nothing; its end means "stop" (client cancel, deadline,
        // or the supervisor died).
        let watch = cancel.clone();
        let _ = std::thread::Builder::new()
            .name("cancel-watch".into())
            .spawn(move || {
                let mut b = [0u8; 1];
                let _ = std::io::stdin().read(&mut b);
                watch.cancel(CancelReason::Cancelled);
            });
        run_operation(&spec, &cancel)
    });
    let mut record = crate::record::snapshot(&spec.record);
    record.seccomp_audit = crate::seccomp::audited();
    match result {
        Ok(outcome) => reply(&Reply::Ok {
            outcome: Some(outcome),
            report,
            record,
        }),
        Err(e) => {
            let kind = match &e {
                RequestError::Archive(a) if a.to_string().contains("archive stream aborted") => {
                    ErrorKind::Cancelled
                }
                _ => e.kind(),
            };
            // A failure on a full request tmpfs is the disk limit, whatever the tool said.
            let (kind, message) = match report.namespaces.disk_bytes {
                Some(limit) if disk_full(dir) => {
                    record.limit = Some("disk".into());
                    (
                        ErrorKind::ResourceExhausted,
                        format!("disk limit reached (policy spec.limits.diskBytes: {limit}): {e}"),
                    )
                }
                _ => (kind, e.to_string()),
            };
            if record.limit.is_none() {
                record.limit = match &e {
                    RequestError::Archive(_) => Some("archive".into()),
                    _ => record.commands.last().and_then(|c| c.ended_by.clone()),
                };
            }
            // A failure after seccomp denied a call: name the denial.
            if record.limit.is_none() && record.seccomp_audit.iter().any(|d| d.action == "denied") {
                record.limit = Some("seccomp".into());
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

/// Whether the request's tmpfs has (almost) no blocks or inodes left.
fn disk_full(dir: &std::os::fd::OwnedFd) -> bool {
    rfs::fstatvfs(dir).is_ok_and(|st| {
        // A few pages may stay free when a write of a larger block failed.
        st.f_bavail.saturating_mul(st.f_bsize) < 64 * 1024 || st.f_favail == 0
    })
}

/// The confinement self-test: pack a one-file tree and run the real extractor, confined, into
/// each target. Only targets inside the request directory can succeed — or, with a private
/// tmpfs (`private`: the request directory on it), targets that the mount namespace replaced
/// by the request's own tmpfs (reported as "private", the real directory being unreachable).
fn self_test(
    repo: &Path,
    targets: &[PathBuf],
    private: Option<&std::os::fd::OwnedFd>,
) -> Vec<(String, String)> {
    let mut tgz = Vec::new();
    let packed = std::fs::write(repo.join("probe.txt"), b"probe\n")
        .and_then(|()| archive::pack_dir(repo, &|_| false, &mut tgz));
    if let Err(e) = packed {
        return vec![("pack".into(), format!("error: {e}"))];
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
                        .is_ok_and(|fd| crate::namespaces::same_filesystem(&fd, tree))
                })
            };
            let outcome = match outcome {
                Ok(_) if i > 0 && on_private_tmpfs() => {
                    "private: the request's own tmpfs here; the real directory is not reachable"
                        .to_owned()
                }
                Ok(_) => "extracted".to_owned(),
                Err(e) => format!("denied: {e}"),
            };
            (t.display().to_string(), outcome)
        })
        .collect()
}

/// What the reclaim helper is asked to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReclaimArgs {
    /// Switch to this UID/GID first (and kill everything it owns); `None` in the shared model.
    pub creds: Option<(u32, u32)>,
    /// The work root.
    pub work_root: PathBuf,
    /// The request directory to remove; `None` = only kill.
    pub name: Option<String>,
}

impl ReclaimArgs {
    /// As command-line arguments (after [`RECLAIM_ARG`]).
    pub fn to_args(&self) -> Vec<String> {
        let (u, g) = self.creds.map_or(("-".into(), "-".into()), |(u, g)| {
            (u.to_string(), g.to_string())
        });
        vec![
            u,
            g,
            self.work_root.display().to_string(),
            self.name.clone().unwrap_or_else(|| "-".into()),
        ]
    }

    /// Parse [`Self::to_args`] output.
    pub fn parse(args: &[String]) -> Option<Self> {
        let [u, g, root, name] = args else {
            return None;
        };
        let creds = match (u.as_str(), g.as_str()) {
            ("-", "-") => None,
            (u, g) => Some((u.parse().ok()?, g.parse().ok()?)),
        };
        Some(ReclaimArgs {
            creds,
            work_root: PathBuf::from(root),
            name: (name != "-").then(|| name.clone()),
        })
    }
}

/// The reclaim helper: become the request's UID, kill every process it owns, remove its
/// directory fd-relative without following links. Exit 0 when both are done.
pub fn reclaim_main(args: &[String]) -> i32 {
    let Some(a) = ReclaimArgs::parse(args) else {
        tracing::error!(?args, "reclaim: bad arguments");
        return 2;
    };
    if let Some((uid, gid)) = a.creds {
        use rustix::process::{Gid, Uid};
        let g = Gid::from_raw(gid);
        let u = Uid::from_raw(uid);
        let switched = rustix::thread::set_thread_groups(&[])
            .and_then(|()| rustix::thread::set_thread_res_gid(g, g, g))
            .and_then(|()| rustix::thread::set_thread_res_uid(u, u, u));
        if let Err(e) = switched {
            tracing::error!(uid, error = %e, "reclaim: cannot switch to the request's UID");
            return 1;
        }
        // Repeat until /proc shows no live process of the UID: a fork bomb may create
        // processes between two sweeps. (kill(-1) itself reports success whenever any other
        // process exists, so its result says nothing.)
        let mut rounds = 0;
        loop {
            if let Err(e) = crate::sys::kill_all_of_my_uid() {
                tracing::error!(uid, error = %e, "reclaim: kill failed");
                return 1;
            }
            if live_processes_of(uid) == 0 {
                break;
            }
            rounds += 1;
            if rounds > 2000 {
                tracing::error!(uid, "reclaim: processes keep appearing");
                return 1;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    if let Some(name) = &a.name
        && let Err(e) = remove_request_dir(&a.work_root, name)
    {
        tracing::error!(dir = %name, error = %e, "reclaim: cannot remove the request directory");
        return 1;
    }
    0
}

/// Processes (not zombies, not ourselves) whose real UID is `uid`.
fn live_processes_of(uid: u32) -> usize {
    let me = std::process::id().to_string();
    let Ok(rd) = std::fs::read_dir("/proc") else {
        return 0;
    };
    rd.flatten()
        .filter(|e| {
            let n = e.file_name();
            let n = n.to_string_lossy();
            if !n.bytes().all(|b| b.is_ascii_digit()) || n == me {
                return false;
            }
            let Ok(s) = std::fs::read_to_string(e.path().join("status")) else {
                return false;
            };
            let zombie = s
                .lines()
                .find_map(|l| l.strip_prefix("State:"))
                .is_some_and(|st| st.trim_start().starts_with('Z'));
            let owner = s
                .lines()
                .find_map(|l| l.strip_prefix("Uid:"))
                .and_then(|u| u.split_whitespace().next()?.parse::<u32>().ok());
            !zombie && owner == Some(uid)
        })
        .count()
}

fn remove_request_dir(work_root: &Path, name: &str) -> std::io::Result<()> {
    let root = rfs::open(
        work_root,
        OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    let dir = match rfs::openat(
        &root,
        name,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    ) {
        Ok(d) => d,
        Err(rustix::io::Errno::NOENT) => return Ok(()),
        Err(rustix::io::Errno::ACCESS) => {
            archive::regain_dir(root.as_fd(), name.as_bytes())?;
            rfs::openat(
                &root,
                name,
                OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                Mode::empty(),
            )?
        }
        Err(rustix::io::Errno::NOTDIR | rustix::io::Errno::LOOP) => {
            // Not a directory (a previous run's stray file or link): unlink the entry itself.
            rfs::unlinkat(&root, name, AtFlags::empty())?;
            return Ok(());
        }
        Err(e) => return Err(e.into()),
    };
    rfs::fchmod(&dir, Mode::from_raw_mode(0o700))?;
    archive::remove_contents(dir.as_fd())?;
    rfs::unlinkat(&root, name, AtFlags::REMOVEDIR)?;
    Ok(())
}
