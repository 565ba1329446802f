//! The jail factory: one process of our own binary, started once per runner, that forks every
//! jail. Exec'ing our binary per jail cost ~2 ms of CPU (the dynamic loader's relocations, libc
//! and runtime start-up, faulting the image in) against ~0.2 ms for a fork of this small,
//! already started, single-threaded process (BENCHMARKS.md).
//!
//! Each jail is forked with `CLONE_PARENT`: it is the supervisor's child, exactly as an exec'd
//! jail was, so the supervisor waits for it, reaps it and is charged for its CPU; the factory
//! keeps nothing of it. The factory holds no request data and no file of a request: it
//! receives a jail's stdin and stdout pipes, forks, and answers with the PID. Everything a
//! jail does to confine itself happens after the fork, in the jail.
//!
//! What the jails share is the factory's address-space layout (they are forks of one
//! process, not separate execs): SECURITY.md weighs that.

use std::io::{IoSlice, IoSliceMut};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, OwnedFd};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;

use rustix::io::Errno;
use rustix::net::{
    AddressFamily, RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags, SocketFlags, SocketType,
};
use rustix::process::{Pid, WaitOptions};

use jail_sys::sys::{Forked, fork_for_parent_single_threaded};

/// The argument that selects the factory entry point.
pub const FACTORY_ARG: &str = "__factory";

/// Ask for a jail (with its stdin and stdout as two `SCM_RIGHTS` descriptors).
const FORK: u8 = b'F';

/// How long the factory may take to answer a fork (normally well under a millisecond).
const ANSWER_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// A jail process: the supervisor's child, forked by the factory.
#[derive(Debug)]
pub(crate) struct JailProcess {
    pid: Pid,
    /// Readable once the process has exited (None on kernels without pidfds).
    pidfd: Option<OwnedFd>,
    /// Set once reaped.
    status: Option<std::process::ExitStatus>,
}

impl JailProcess {
    /// Its PID.
    pub(crate) fn id(&self) -> i32 {
        self.pid.as_raw_nonzero().get()
    }

    /// Reap it if it has exited.
    pub(crate) fn try_wait(&mut self) -> std::io::Result<Option<std::process::ExitStatus>> {
        self.reap(WaitOptions::NOHANG)
    }

    /// Wait for it to exit and reap it.
    pub(crate) fn wait(&mut self) -> std::io::Result<std::process::ExitStatus> {
        loop {
            if let Some(s) = self.reap(WaitOptions::empty())? {
                return Ok(s);
            }
        }
    }

    fn reap(&mut self, opts: WaitOptions) -> std::io::Result<Option<std::process::ExitStatus>> {
        use std::os::unix::process::ExitStatusExt;
        if let Some(s) = self.status {
            return Ok(Some(s));
        }
        loop {
            match rustix::process::waitpid(Some(self.pid), opts) {
                Ok(Some((_, st))) => {
                    let s = std::process::ExitStatus::from_raw(st.as_raw());
                    self.status = Some(s);
                    jail_sys::reaper::untrack(self.id());
                    return Ok(Some(s));
                }
                Ok(None) => return Ok(None),
                Err(Errno::INTR) => continue,
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// Sleep until it exits or `timeout` passes (without reaping it).
    pub(crate) fn wait_exit_for(&self, timeout: std::time::Duration) {
        match &self.pidfd {
            Some(fd) => {
                let timeout = rustix::event::Timespec::try_from(timeout).ok();
                let mut fds = [rustix::event::PollFd::new(fd, rustix::event::PollFlags::IN)];
                let _ = rustix::event::poll(&mut fds, timeout.as_ref());
            }
            None => std::thread::sleep(timeout.min(std::time::Duration::from_micros(200))),
        }
    }
}

/// A jail just forked, with the supervisor's ends of its stdin and stdout.
#[derive(Debug)]
pub(crate) struct Spawned {
    pub(crate) process: JailProcess,
    pub(crate) stdin: std::fs::File,
    pub(crate) stdout: std::fs::File,
}

/// The supervisor's handle on the factory process (started on first use, restarted if it
/// dies).
#[derive(Debug)]
pub(crate) struct Factory {
    exe: PathBuf,
    log_args: Vec<String>,
    running: Mutex<Option<Running>>,
}

#[derive(Debug)]
struct Running {
    child: Child,
    /// Our end of the control socket (SOCK_SEQPACKET: one message per request and answer).
    ctl: OwnedFd,
}

impl Factory {
    /// A factory running `exe __factory LOG_ARGS` when first needed.
    pub(crate) fn new(exe: PathBuf, log_args: Vec<String>) -> Self {
        Factory {
            exe,
            log_args,
            running: Mutex::new(None),
        }
    }

    /// Fork a jail. A factory that has died is restarted once.
    pub(crate) fn fork(&self) -> std::io::Result<Spawned> {
        let mut running = lock(&self.running);
        let mut attempt = 0;
        loop {
            let r = match &mut *running {
                Some(r) => r,
                None => running.insert(self.start()?),
            };
            match r.fork() {
                Ok(f) => return Ok(f),
                Err(e) => {
                    tracing::warn!(error = %e, "the jail factory failed; restarting it");
                    if let Some(old) = running.take() {
                        old.stop();
                    }
                    attempt += 1;
                    if attempt == 2 {
                        return Err(e);
                    }
                }
            }
        }
    }

    /// Stop the factory and reap it.
    pub(crate) fn stop(&self) {
        if let Some(r) = lock(&self.running).take() {
            r.stop();
        }
    }

    fn start(&self) -> std::io::Result<Running> {
        let (ours, theirs) = rustix::net::socketpair(
            AddressFamily::UNIX,
            SocketType::SEQPACKET,
            SocketFlags::CLOEXEC,
            None,
        )?;
        // A factory that stops answering (stopped, wedged) fails the fork instead of holding
        // every later jail: the caller restarts it.
        rustix::net::sockopt::set_socket_timeout(
            &ours,
            rustix::net::sockopt::Timeout::Recv,
            Some(ANSWER_TIMEOUT),
        )?;
        let mut cmd = Command::new(&self.exe);
        cmd.arg(FACTORY_ARG)
            .args(&self.log_args)
            .env_clear()
            .stdin(Stdio::from(theirs))
            .stdout(Stdio::null())
            .stderr(Stdio::inherit());
        let child = jail_sys::reaper::spawn_tracked(&mut cmd)?;
        tracing::debug!(pid = child.id(), "jail factory started");
        Ok(Running { child, ctl: ours })
    }
}

impl Drop for Factory {
    fn drop(&mut self) {
        self.stop();
    }
}

impl Running {
    fn fork(&mut self) -> std::io::Result<Spawned> {
        // The jail's stdin is a stream socket rather than a pipe, so that the jail can hand
        // the supervisor a descriptor back over it (its egress listener).
        let (in_r, in_w) = rustix::net::socketpair(
            AddressFamily::UNIX,
            SocketType::STREAM,
            SocketFlags::CLOEXEC,
            None,
        )?;
        let (out_r, out_w) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)?;
        // Tracked from the moment it exists: an orphan reaper must never reap a jail that
        // exits before we know its PID.
        let pid = jail_sys::reaper::track_pid(|| {
            let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(2))];
            let mut anc = SendAncillaryBuffer::new(&mut space);
            let fds = [in_r.as_fd(), out_w.as_fd()];
            anc.push(SendAncillaryMessage::ScmRights(&fds));
            rustix::net::sendmsg(
                &self.ctl,
                &[IoSlice::new(&[FORK])],
                &mut anc,
                SendFlags::NOSIGNAL,
            )?;
            let mut answer = [0u8; 4];
            let n = loop {
                match rustix::net::recv(&self.ctl, &mut answer, RecvFlags::empty()) {
                    Ok((n, _)) => break n,
                    Err(Errno::INTR) => continue,
                    Err(e) => return Err(e.into()),
                }
            };
            if n != 4 {
                return Err(std::io::Error::other("the jail factory closed its socket"));
            }
            match i32::from_le_bytes(answer) {
                p if p > 0 => Ok(p),
                e => Err(std::io::Error::from_raw_os_error(-e)),
            }
        })?;
        drop((in_r, out_w));
        let pid = Pid::from_raw(pid).ok_or_else(|| std::io::Error::other("bad PID"))?;
        let pidfd = rustix::process::pidfd_open(pid, rustix::process::PidfdFlags::empty()).ok();
        Ok(Spawned {
            process: JailProcess {
                pid,
                pidfd,
                status: None,
            },
            stdin: std::fs::File::from(in_w),
            stdout: std::fs::File::from(out_r),
        })
    }

    /// Close its socket and kill it (it holds nothing of any jail, and a stopped or wedged
    /// factory would never see the socket close), then reap it.
    fn stop(self) {
        let Running { mut child, ctl } = self;
        drop(ctl);
        let _ = child.kill();
        let _ = child.wait();
        jail_sys::reaper::untrack(child.id() as i32);
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The factory process: fork a jail for each request on the control socket (our stdin) until
/// it closes. Single-threaded by construction: it starts no thread, so each fork is safe.
pub fn factory_main() -> i32 {
    // Move the control socket off fd 0, which each jail gets as its own stdin.
    let ctl = match rustix::io::fcntl_dupfd_cloexec(rustix::stdio::stdin(), 3) {
        Ok(fd) => fd,
        Err(e) => {
            tracing::error!(error = %e, "jail factory: no control socket");
            return 1;
        }
    };
    // Not dumpable: in the shared-UID model the commands run as our UID, and must not ptrace
    // or read the process every later jail is forked from. Each jail undoes it (see
    // `become_jail`).
    if let Err(e) =
        rustix::process::set_dumpable_behavior(rustix::process::DumpableBehavior::NotDumpable)
    {
        tracing::error!(error = %e, "jail factory: dumpable");
        return 1;
    }
    let null = rustix::fs::open(
        "/dev/null",
        rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::CLOEXEC,
        rustix::fs::Mode::empty(),
    );
    if let Err(e) = null.and_then(|n| rustix::stdio::dup2_stdin(&n)) {
        tracing::error!(error = %e, "jail factory: /dev/null");
        return 1;
    }
    jail_sys::sys::single_malloc_arena();
    warm_up();
    loop {
        let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(2))];
        let mut anc = RecvAncillaryBuffer::new(&mut space);
        let mut op = [0u8; 1];
        let got = rustix::net::recvmsg(
            &ctl,
            &mut [IoSliceMut::new(&mut op)],
            &mut anc,
            RecvFlags::CMSG_CLOEXEC,
        );
        let msg = match got {
            Ok(m) => m,
            Err(Errno::INTR) => continue,
            Err(e) => {
                tracing::error!(error = %e, "jail factory: control socket");
                return 1;
            }
        };
        let fds: Vec<OwnedFd> = anc
            .drain()
            .flat_map(|m| match m {
                RecvAncillaryMessage::ScmRights(fds) => fds.collect::<Vec<_>>(),
                _ => Vec::new(),
            })
            .collect();
        if msg.bytes == 0 {
            // The supervisor closed the socket: stop.
            return 0;
        }
        let answer = match (op[0], <[OwnedFd; 2]>::try_from(fds)) {
            (FORK, Ok([stdin, stdout])) => match fork_for_parent_single_threaded() {
                Ok(Forked::Child) => {
                    drop(ctl);
                    jail_sys::sys::exit_now(become_jail(stdin, stdout));
                }
                Ok(Forked::Parent(pid)) => pid,
                Err(e) => -e.raw_os_error().unwrap_or(libc::EIO),
            },
            _ => -libc::EINVAL,
        };
        if let Err(e) = rustix::net::send(&ctl, &answer.to_le_bytes(), SendFlags::NOSIGNAL) {
            tracing::error!(error = %e, "jail factory: answering");
            return 1;
        }
    }
}

/// Run the archive reader once over a one-file archive made in memory, so that what it
/// initialises on first use — CPU feature detection for inflate and SHA-256, each a `cpuid`
/// that traps to the hypervisor in a VM (~0.1 ms of every jail in the profile) — is done here
/// once and inherited by every jail; likewise the kernel's highest capability number.
fn warm_up() {
    let _ = jail::last_cap();
    let mut tgz = Vec::new();
    let packed = archive::pack_tree(None, &[("warm-up", b"x")], &|_| false, &mut tgz);
    if packed.is_ok() {
        let _ = archive::check(&tgz[..], &archive::Options::default());
    }
}

/// In the forked child: take the pipes as stdin and stdout, look like a freshly exec'd
/// process (dumpable, as exec leaves it), and run the jail.
fn become_jail(stdin: OwnedFd, stdout: OwnedFd) -> i32 {
    let set = rustix::stdio::dup2_stdin(&stdin).and_then(|()| rustix::stdio::dup2_stdout(&stdout));
    drop((stdin, stdout));
    if let Err(e) = set {
        tracing::error!(error = %e, "jail: taking its pipes");
        return 1;
    }
    if let Err(e) =
        rustix::process::set_dumpable_behavior(rustix::process::DumpableBehavior::Dumpable)
    {
        tracing::error!(error = %e, "jail: dumpable");
        return 1;
    }
    jail::jail_main()
}
