//! Running one plugin command: no shell, a new process group, stdin from /dev/null, stdout and
//! stderr read with byte budgets, and on deadline, cancel or budget overrun SIGTERM to the whole
//! group, then SIGKILL after a grace period. Whatever happens, the group is SIGKILLed when the
//! command ends (Argo CD does the same), and the exit is observed with `waitid(WNOWAIT)` before
//! that kill, so the process-group id cannot have been reused.

use std::os::fd::AsFd;
use std::os::unix::process::{CommandExt, ExitStatusExt};

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};
use vocab::record::{CommandRecord, Limit};
use vocab::request::TimeLimit;

use rustix::process::{Pid, Signal, WaitIdOptions, kill_process_group};

use jail_sys::cancel::{CancelReason, CancelToken};
use jail_wire::protocol::KILL_GRACE;

/// One command to run.
#[derive(Clone)]
pub struct CmdSpec<'a> {
    /// argv (argv[0] looked up in the child's PATH).
    pub argv: &'a [String],
    /// The complete environment.
    pub env: &'a [(String, String)],
    /// Working directory.
    pub cwd: &'a Path,
    /// Maximum stdout bytes.
    pub stdout_cap: u64,
    /// Maximum stderr bytes.
    pub stderr_cap: u64,
    /// A file to read as stdin (the generator's request); `None` is /dev/null.
    pub stdin: Option<&'a Path>,
    /// Called with each stderr line as it arrives (the line without its newline; a line longer
    /// than [`LIVE_LINE_BYTES`] in pieces of that size).
    pub stderr_lines: Option<LineSink>,
}

impl std::fmt::Debug for CmdSpec<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CmdSpec")
            .field("argv", &self.argv)
            .field("cwd", &self.cwd)
            .field("stdout_cap", &self.stdout_cap)
            .field("stderr_cap", &self.stderr_cap)
            .field("stdin", &self.stdin)
            .field("stderr_lines", &self.stderr_lines.is_some())
            .finish_non_exhaustive()
    }
}

/// Receives a command's stderr lines as they arrive.
pub type LineSink = Arc<dyn Fn(&[u8]) + Send + Sync>;

/// Longest piece of a stderr line handed to a [`LineSink`].
pub const LIVE_LINE_BYTES: usize = 1024;

/// What a successful command printed.
#[derive(Debug, Clone, Default)]
pub struct CmdOutput {
    /// stdout.
    pub stdout: Vec<u8>,
    /// stderr.
    pub stderr: Vec<u8>,
}

/// How a command failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CmdError {
    /// Empty command.
    #[error("Command is empty")]
    Empty,
    /// Could not start (Go-style message).
    #[error("{0}")]
    Start(String),
    /// Non-zero exit or killed by a signal: Argo's `` `argv` failed <cause>: <stderr> ``.
    #[error("`{argv}` failed {cause}{}", if stderr.is_empty() { String::new() } else { format!(": {stderr}") })]
    Failed {
        /// argv as Argo prints it.
        argv: String,
        /// `exit status N` or `signal: killed`.
        cause: String,
        /// stderr, trimmed and capped.
        stderr: String,
    },
    /// A time limit passed; the group was killed.
    #[error("{}", deadline_message(limit, argv))]
    Deadline {
        /// argv.
        argv: String,
        /// stderr collected before the kill.
        stderr: String,
        /// Which limit fired.
        limit: TimeLimit,
    },
    /// Cancelled by the client or shutdown.
    #[error("context canceled: `{argv}` was killed")]
    Cancelled {
        /// argv.
        argv: String,
        /// Why.
        reason: CancelReason,
    },
    /// stdout or stderr exceeded its budget.
    #[error(
        "`{argv}` exceeded the {stream} limit of {limit} bytes (policy spec.limits.outputBytes) and was killed"
    )]
    OutputLimit {
        /// argv.
        argv: String,
        /// "stdout" or "stderr".
        stream: &'static str,
        /// The budget.
        limit: u64,
    },
}

/// Longest stderr excerpt put into an error message.
const STDERR_IN_ERROR: usize = 16 * 1024;

/// Argo's argv rendering: args with whitespace Go-quoted, empty args as `""`.
pub fn argv_for_log(argv: &[String]) -> String {
    argv.iter()
        .map(|a| {
            if a.is_empty() {
                "\"\"".to_owned()
            } else if a.chars().any(char::is_whitespace) {
                go_quote(a)
            } else {
                a.clone()
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

fn go_quote(s: &str) -> String {
    let mut o = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => o.push_str("\\\""),
            '\\' => o.push_str("\\\\"),
            '\n' => o.push_str("\\n"),
            '\t' => o.push_str("\\t"),
            '\r' => o.push_str("\\r"),
            c if c.is_control() => o.push_str(&format!("\\x{:02x}", c as u32)),
            c => o.push(c),
        }
    }
    o.push('"');
    o
}

/// `SIGKILL`-style name for the audit record.
fn signal_abbrev(sig: i32) -> String {
    let name = match sig {
        1 => "SIGHUP",
        2 => "SIGINT",
        3 => "SIGQUIT",
        4 => "SIGILL",
        6 => "SIGABRT",
        7 => "SIGBUS",
        8 => "SIGFPE",
        9 => "SIGKILL",
        11 => "SIGSEGV",
        13 => "SIGPIPE",
        14 => "SIGALRM",
        15 => "SIGTERM",
        24 => "SIGXCPU",
        25 => "SIGXFSZ",
        31 => "SIGSYS",
        n => return format!("signal {n}"),
    };
    name.to_owned()
}

fn signal_name(sig: i32) -> String {
    let name = match sig {
        1 => "hangup",
        2 => "interrupt",
        3 => "quit",
        4 => "illegal instruction",
        6 => "aborted",
        7 => "bus error",
        8 => "floating point exception",
        9 => "killed",
        11 => "segmentation fault",
        13 => "broken pipe",
        14 => "alarm clock",
        15 => "terminated",
        24 => "CPU time limit exceeded",
        25 => "file size limit exceeded",
        31 => "bad system call",
        n => return format!("signal {n}"),
    };
    name.to_owned()
}

/// stderr for an error message: credentials redacted, trimmed, capped.
fn trimmed_stderr(b: &[u8], env: &[(String, String)]) -> String {
    let s = jail_wire::redact::redact(&String::from_utf8_lossy(b), env);
    let t = s.trim();
    if t.len() > STDERR_IN_ERROR {
        let mut cut = STDERR_IN_ERROR;
        while !t.is_char_boundary(cut) {
            cut -= 1;
        }
        format!("{}... (truncated)", &t[..cut])
    } else {
        t.to_owned()
    }
}

struct Capture {
    data: Vec<u8>,
    over: bool,
}

/// How long, after the command's group is gone, its output is still awaited: a process that
/// left the group (a daemon) may hold the pipe open indefinitely; what it has not written by
/// then is dropped (and the jail kills it with the rest of the UID).
const PIPE_DRAIN: Duration = Duration::from_secs(2);

/// Most bytes read from one pipe per wake-up, so a command writing without pause cannot keep
/// the loop from its deadline, its exit or a cancel.
const READ_PER_WAKE: usize = 1 << 20;

/// Without pidfds (Linux before 5.3), how often the loop looks for the command's exit.
const EXIT_TICK: Duration = Duration::from_millis(10);

/// One of the command's output pipes, read without blocking by the command's poll loop.
struct Stream {
    /// None once the pipe has ended.
    pipe: Option<std::os::fd::OwnedFd>,
    cap: u64,
    capture: Capture,
    lines: Option<LineSink>,
    /// The unfinished line handed to `lines` so far.
    pending: Vec<u8>,
}

impl Stream {
    fn new(pipe: impl Into<std::os::fd::OwnedFd>, cap: u64, lines: Option<LineSink>) -> Self {
        let pipe = pipe.into();
        // A failure leaves it blocking: reads then wait for data the poll said was there.
        let _ = rustix::io::ioctl_fionbio(&pipe, true);
        Self {
            pipe: Some(pipe),
            cap,
            capture: Capture {
                data: Vec::new(),
                over: false,
            },
            lines,
            pending: Vec::new(),
        }
    }

    fn open(&self) -> bool {
        self.pipe.is_some()
    }

    /// Read what the pipe holds (up to [`READ_PER_WAKE`]): kept within the budget, handed to
    /// the line sink; past the budget, read and dropped, so the writer is not blocked while it
    /// is being killed.
    fn read_available(&mut self, buf: &mut Vec<u8>) {
        let mut taken = 0;
        while taken < READ_PER_WAKE {
            let Some(pipe) = &self.pipe else { return };
            buf.clear();
            match rustix::io::read(pipe, rustix::buffer::spare_capacity(buf)) {
                Ok(0) => return self.end(),
                Ok(n) => {
                    taken += n;
                    self.take(&buf[..n]);
                }
                Err(rustix::io::Errno::INTR) => {}
                Err(rustix::io::Errno::AGAIN) => return,
                Err(_) => return self.end(),
            }
        }
    }

    fn take(&mut self, data: &[u8]) {
        if self.capture.over {
            return;
        }
        if self.capture.data.len() as u64 + data.len() as u64 > self.cap {
            self.capture.over = true;
            return;
        }
        self.capture.data.extend_from_slice(data);
        if let Some(sink) = &self.lines {
            split_lines(&mut self.pending, data, sink);
        }
    }

    fn end(&mut self) {
        self.pipe = None;
        if let Some(sink) = self.lines.as_ref().filter(|_| !self.pending.is_empty()) {
            sink(&self.pending);
            self.pending.clear();
        }
    }
}

/// Whether the command has exited, without reaping it (its group id stays ours).
fn has_exited(pid: Pid) -> bool {
    let opts = WaitIdOptions::EXITED | WaitIdOptions::NOWAIT | WaitIdOptions::NOHANG;
    match rustix::process::waitid(rustix::process::WaitId::Pid(pid), opts) {
        Ok(status) => status.is_some(),
        Err(rustix::io::Errno::INTR) => false,
        // Not our child any more (cannot happen before we reap it): nothing left to wait for.
        Err(_) => true,
    }
}

/// Hand each complete line of `pending` + `data` to `sink`; keep the unfinished rest, cut at
/// [`LIVE_LINE_BYTES`] so a line without a newline cannot grow without bound.
fn split_lines(pending: &mut Vec<u8>, data: &[u8], sink: &LineSink) {
    pending.extend_from_slice(data);
    let mut start = 0;
    while let Some(nl) = pending[start..].iter().position(|&b| b == b'\n') {
        let line = &pending[start..start + nl];
        for piece in line.chunks(LIVE_LINE_BYTES) {
            sink(piece.strip_suffix(b"\r").unwrap_or(piece));
        }
        start += nl + 1;
    }
    pending.drain(..start);
    while pending.len() > LIVE_LINE_BYTES {
        sink(&pending[..LIVE_LINE_BYTES]);
        pending.drain(..LIVE_LINE_BYTES);
    }
}

/// Run `spec` until it exits, `deadline` passes, `cancel` fires or an output budget is exceeded.
pub fn run(
    spec: &CmdSpec<'_>,
    deadline: Option<Instant>,
    cancel: &CancelToken,
) -> Result<CmdOutput, CmdError> {
    run_recorded(spec, deadline, cancel, &mut CommandRecord::default())
}

/// [`run`], filling `rec` with how the command ended (argv and phase are the caller's):
///
/// 1. resolve the program as Go's `exec.LookPath` does; a command cancelled before it
///    starts does not start;
/// 2. start it in its own process group, its pipes and the cancel's descriptors watched
///    from before it exists;
/// 3. supervise it to its exit or its stop ([`supervise`]);
/// 4. kill what is left of its group and reap it, with its peak memory;
/// 5. read what is left in its pipes ([`drain`]);
/// 6. record how it ended, and answer ([`outcome`]).
pub fn run_recorded(
    spec: &CmdSpec<'_>,
    deadline: Option<Instant>,
    cancel: &CancelToken,
    rec: &mut CommandRecord,
) -> Result<CmdOutput, CmdError> {
    let Some(program) = spec.argv.first() else {
        return Err(CmdError::Empty);
    };
    let argv_log = argv_for_log(spec.argv);
    if !spec.cwd.is_dir() {
        return Err(CmdError::Start(format!(
            "chdir {}: no such file or directory",
            spec.cwd.display()
        )));
    }
    // Resolve like Go's exec.LookPath (what Argo CD does): skip PATH entries we cannot
    // search, so an inaccessible directory early in PATH does not hide a later match.
    let resolved = if program.contains('/') {
        PathBuf::from(program)
    } else {
        look_path(program, spec.env).ok_or_else(|| {
            CmdError::Start(format!(
                "exec: \"{program}\": executable file not found in $PATH"
            ))
        })?
    };
    // Cancelled before it started (between two commands): it does not start.
    if let Some(reason) = cancel.reason() {
        rec.ended_by = Some(Limit::Cancelled);
        return Err(CmdError::Cancelled {
            argv: argv_log,
            reason,
        });
    }
    let mut cmd = Command::new(&resolved);
    cmd.arg0(program);
    cmd.args(&spec.argv[1..])
        .env_clear()
        .envs(spec.env.iter().map(|(k, v)| (k, v)))
        .current_dir(spec.cwd)
        .stdin(match spec.stdin {
            Some(p) => Stdio::from(
                std::fs::File::open(p)
                    .map_err(|e| CmdError::Start(format!("opening stdin {}: {e}", p.display())))?,
            ),
            None => Stdio::null(),
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0);
    // What the loop below watches exists before the command does: a command that exhausts
    // its task limit (a fork bomb filling `pids.max` / `RLIMIT_NPROC`) cannot leave the jail
    // unable to watch it, and no thread is needed for it.
    let (wake, watch) = cancel
        .poll_fds()
        .map_err(|e| CmdError::Start(format!("watching for a cancel: {e}")))?;
    let mut child: Child =
        jail_sys::reaper::spawn_tracked(&mut cmd).map_err(|e| start_error(program, &e))?;
    let pid = child.id() as i32;
    let started = Instant::now();
    tracing::debug!(pid, argv = %argv_log, cwd = %spec.cwd.display(), "command started");
    let pgid = Pid::from_raw(pid).expect("child pid is positive");
    // Readable once the command has exited (not reaped); without pidfds, EXIT_TICK.
    let pidfd = rustix::process::pidfd_open(pgid, rustix::process::PidfdFlags::empty()).ok();
    let mut out = Stream::new(child.stdout.take().expect("piped"), spec.stdout_cap, None);
    let mut err = Stream::new(
        child.stderr.take().expect("piped"),
        spec.stderr_cap,
        spec.stderr_lines.clone(),
    );
    // Read into its spare capacity: never zeroed, so a command that prints little touches
    // a page of it, not 64 KiB (a fresh fork's every touched page is a fault).
    let mut buf: Vec<u8> = Vec::with_capacity(64 * 1024);

    let (must_stop, cancelled) = supervise(
        pgid,
        pidfd.as_ref(),
        (&mut out, &mut err, &mut buf),
        deadline,
        cancel,
        (wake, watch),
    );
    // Kill whatever is left of the group (daemons, stragglers) while the id is still reserved.
    let _ = kill_process_group(pgid, Signal::KILL);
    // wait4 rather than Child::wait: the rusage carries the command's peak memory.
    let reaped = jail_sys::sys::wait4_rusage(pid);
    jail_sys::reaper::untrack(pid);
    drop(child);
    let (raw, peak_rss) = reaped.map_err(|e| CmdError::Start(e.to_string()))?;
    let status = std::process::ExitStatus::from_raw(raw);
    drain(&mut out, &mut err, &mut buf);
    let (out, err) = (out.capture, err.capture);
    rec.exit_code = status.code();
    rec.signal = status.signal().map(signal_abbrev);
    rec.duration_ms = started.elapsed().as_millis() as u64;
    rec.peak_rss_bytes = Some(peak_rss);
    rec.stdout_bytes = out.data.len() as u64;
    rec.stderr_bytes = err.data.len() as u64;
    rec.ended_by = if out.over || err.over {
        Some(Limit::Output)
    } else if must_stop && cancelled.is_some() {
        Some(Limit::Cancelled)
    } else if must_stop {
        Some(Limit::Timeout)
    } else if status.signal() == Some(libc::SIGSYS) {
        Some(Limit::Seccomp)
    } else {
        None
    };
    tracing::debug!(pid, status = %status, ms = started.elapsed().as_millis() as u64, "command finished");

    outcome(spec, argv_log, status, (out, err), must_stop, cancelled)
}

/// The command until it exits, or, once it must stop (deadline, cancel, output budget),
/// SIGTERM to its group and up to [`KILL_GRACE`] for it to exit: one loop for both pipes,
/// the exit, the deadline and a cancel. Returns whether it had to stop, and the cancel's
/// reason if that was why.
fn supervise(
    pgid: Pid,
    pidfd: Option<&std::os::fd::OwnedFd>,
    (out, err, buf): (&mut Stream, &mut Stream, &mut Vec<u8>),
    deadline: Option<Instant>,
    cancel: &CancelToken,
    (wake, watch): (
        std::os::fd::BorrowedFd<'_>,
        Option<std::os::fd::BorrowedFd<'_>>,
    ),
) -> (bool, Option<CancelReason>) {
    let mut cancelled = None;
    let mut grace_end: Option<Instant> = None;
    let reaps = jail_sys::reaper::reaps_in_command_loop();
    let mut next_pass = Instant::now() + jail_sys::reaper::ORPHAN_PASS;
    loop {
        if has_exited(pgid) {
            break;
        }
        if reaps && Instant::now() >= next_pass {
            // The jail is PID 1: orphans of this command (a daemonising child that exited)
            // are its zombies; the command itself is tracked and left alone.
            let n = jail_sys::reaper::reap_orphans();
            if n > 0 {
                tracing::debug!(reaped = n, "reaped orphaned processes");
            }
            next_pass = Instant::now() + jail_sys::reaper::ORPHAN_PASS;
        }
        if grace_end.is_none() {
            cancelled = cancel.reason();
            let timed_out = deadline.is_some_and(|d| Instant::now() >= d);
            if timed_out || cancelled.is_some() || out.capture.over || err.capture.over {
                let _ = kill_process_group(pgid, Signal::TERM);
                grace_end = Some(Instant::now() + KILL_GRACE);
            }
        }
        let until = grace_end.or(deadline);
        if grace_end.is_some_and(|g| Instant::now() >= g) {
            break;
        }
        let mut timeout = until.map(|t| t.saturating_duration_since(Instant::now()));
        if pidfd.is_none() {
            timeout = Some(timeout.map_or(EXIT_TICK, |t| t.min(EXIT_TICK)));
        }
        if reaps {
            let pass = next_pass.saturating_duration_since(Instant::now());
            timeout = Some(timeout.map_or(pass, |t| t.min(pass)));
        }
        // The watched descriptor stays readable once it ended: only until the stop began.
        let watched = watch.filter(|_| grace_end.is_none());
        let ready = jail_sys::cancel::wait_readable(
            &[
                out.pipe.as_ref().map(AsFd::as_fd),
                err.pipe.as_ref().map(AsFd::as_fd),
                pidfd.as_ref().map(AsFd::as_fd),
                Some(wake),
                watched,
            ],
            timeout,
        );
        if ready[0] {
            out.read_available(buf);
        }
        if ready[1] {
            err.read_available(buf);
        }
        if ready[3] {
            cancel.clear_wake();
        }
    }
    (grace_end.is_some(), cancelled)
}

/// What the group wrote before it ended may still be in the pipes; a process that left the
/// group (a daemon) may hold them open: read until both end, at most [`PIPE_DRAIN`].
fn drain(out: &mut Stream, err: &mut Stream, buf: &mut Vec<u8>) {
    let drain_end = Instant::now() + PIPE_DRAIN;
    while (out.open() || err.open()) && Instant::now() < drain_end {
        let ready = jail_sys::cancel::wait_readable(
            &[
                out.pipe.as_ref().map(AsFd::as_fd),
                err.pipe.as_ref().map(AsFd::as_fd),
            ],
            Some(drain_end.saturating_duration_since(Instant::now())),
        );
        if ready[0] {
            out.read_available(buf);
        }
        if ready[1] {
            err.read_available(buf);
        }
    }
}

/// The command's result from how it ended: its output over budget, stopped (cancelled or
/// out of time), failed (Argo CD's words), or its output.
fn outcome(
    spec: &CmdSpec<'_>,
    argv_log: String,
    status: std::process::ExitStatus,
    (out, err): (Capture, Capture),
    must_stop: bool,
    cancelled: Option<CancelReason>,
) -> Result<CmdOutput, CmdError> {
    if out.over || err.over {
        let (stream, limit) = if out.over {
            ("stdout", spec.stdout_cap)
        } else {
            ("stderr", spec.stderr_cap)
        };
        return Err(CmdError::OutputLimit {
            argv: argv_log,
            stream,
            limit,
        });
    }
    if must_stop {
        if let Some(reason) = cancelled {
            return Err(CmdError::Cancelled {
                argv: argv_log,
                reason,
            });
        }
        return Err(CmdError::Deadline {
            argv: argv_log,
            stderr: trimmed_stderr(&err.data, spec.env),
            limit: TimeLimit::Client,
        });
    }
    if !status.success() {
        let cause = match (status.code(), status.signal()) {
            (Some(c), _) => format!("exit status {c}"),
            (None, Some(s)) => format!("signal: {}", signal_name(s)),
            _ => "unknown status".to_owned(),
        };
        return Err(CmdError::Failed {
            argv: argv_log,
            cause,
            stderr: trimmed_stderr(&err.data, spec.env),
        });
    }
    Ok(CmdOutput {
        stdout: out.data,
        stderr: err.data,
    })
}

fn deadline_message(limit: &TimeLimit, argv: &str) -> String {
    match limit {
        // Argo CD's wording for the client's deadline.
        TimeLimit::Client => format!("context deadline exceeded: `{argv}` was killed"),
        TimeLimit::Request { seconds } => format!(
            "request wall clock exceeded (policy spec.limits.wallSeconds: {seconds}): `{argv}` was killed"
        ),
        TimeLimit::Command { text } => {
            format!("command timeout exceeded (ARGOCD_EXEC_TIMEOUT={text}): `{argv}` was killed")
        }
    }
}

/// The first executable regular file named `program` in the `PATH` of `env`.
fn look_path(program: &str, env: &[(String, String)]) -> Option<PathBuf> {
    let path = env
        .iter()
        .rev()
        .find(|(k, _)| k == "PATH")
        .map(|(_, v)| v.as_str())?;
    path.split(':').find_map(|dir| {
        let dir = if dir.is_empty() { "." } else { dir };
        let cand = Path::new(dir).join(program);
        let st = rustix::fs::stat(&cand).ok()?;
        let regular =
            rustix::fs::FileType::from_raw_mode(st.st_mode) == rustix::fs::FileType::RegularFile;
        (regular && rustix::fs::access(&cand, rustix::fs::Access::EXEC_OK).is_ok()).then_some(cand)
    })
}

fn start_error(program: &str, e: &std::io::Error) -> CmdError {
    if e.kind() == std::io::ErrorKind::NotFound {
        if program.starts_with("/tmp/") {
            CmdError::Start(format!(
                "fork/exec {program}: no such file or directory (in the sandbox /tmp is the request's own, empty; install the program under a spec.filesystem.readOnly path)"
            ))
        } else if program.contains('/') {
            CmdError::Start(format!("fork/exec {program}: no such file or directory"))
        } else {
            CmdError::Start(format!(
                "exec: \"{program}\": executable file not found in $PATH"
            ))
        }
    } else if e.kind() == std::io::ErrorKind::PermissionDenied {
        // Go's text first (what Argo CD users know), then what the sandbox adds: outside the
        // policy's paths, Landlock refuses execution (upstream would have run it).
        CmdError::Start(format!(
            "fork/exec {program}: permission denied (the sandbox may refuse it: a program outside spec.filesystem.readOnly cannot be executed; list its directory there)"
        ))
    } else {
        CmdError::Start(format!("fork/exec {program}: {e}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::thread;

    #[test]
    fn a_missing_program_keeps_gos_words_and_says_what_the_sandbox_changes() {
        let nf = std::io::Error::from(std::io::ErrorKind::NotFound);
        let msg = |p: &str, e: &std::io::Error| match start_error(p, e) {
            CmdError::Start(m) => m,
            other => panic!("{other:?}"),
        };
        assert_eq!(
            msg("/opt/x/gen.sh", &nf),
            "fork/exec /opt/x/gen.sh: no such file or directory"
        );
        assert!(msg("/tmp/cfg/gen.sh", &nf).contains("/tmp is the request's own"));
        let pd = std::io::Error::from(std::io::ErrorKind::PermissionDenied);
        assert!(msg("/srv/gen.sh", &pd).contains("spec.filesystem.readOnly"));
    }

    fn sh(script: &str) -> Vec<String> {
        vec!["sh".into(), "-c".into(), script.into()]
    }

    fn env() -> Vec<(String, String)> {
        vec![("PATH".into(), std::env::var("PATH").unwrap_or_default())]
    }

    fn spec<'a>(argv: &'a [String], env: &'a [(String, String)]) -> CmdSpec<'a> {
        CmdSpec {
            argv,
            env,
            cwd: Path::new("/"),
            stdout_cap: 1 << 20,
            stderr_cap: 1 << 20,
            stdin: None,
            stderr_lines: None,
        }
    }

    #[test]
    fn success_failure_and_not_found() {
        let e = env();
        let argv = sh("echo out; echo err >&2");
        let o = run(&spec(&argv, &e), None, &CancelToken::new()).unwrap();
        assert_eq!(o.stdout, b"out\n");
        let argv = sh("echo boom >&2; exit 3");
        let err = run(&spec(&argv, &e), None, &CancelToken::new()).unwrap_err();
        assert_eq!(
            err.to_string(),
            "`sh -c \"echo boom >&2; exit 3\"` failed exit status 3: boom"
        );
        let argv = vec!["bad-command".to_owned()];
        let err = run(&spec(&argv, &e), None, &CancelToken::new()).unwrap_err();
        assert_eq!(
            err.to_string(),
            "exec: \"bad-command\": executable file not found in $PATH"
        );
        assert_eq!(
            run(&spec(&[], &e), None, &CancelToken::new())
                .unwrap_err()
                .to_string(),
            "Command is empty"
        );
    }

    #[test]
    fn deadline_kills_the_group_with_term_first() {
        let e = env();
        let argv = sh("trap 'echo cleanup completed >&2; exit 1' TERM; sleep 30 & wait");
        let t = Instant::now();
        let err = run(
            &spec(&argv, &e),
            Some(Instant::now() + Duration::from_millis(300)),
            &CancelToken::new(),
        )
        .unwrap_err();
        assert!(
            t.elapsed() < Duration::from_secs(4),
            "took {:?}",
            t.elapsed()
        );
        match err {
            CmdError::Deadline { stderr, limit, .. } => {
                assert_eq!(stderr, "cleanup completed");
                assert_eq!(limit, TimeLimit::Client);
            }
            other => panic!("{other}"),
        }
    }

    #[test]
    fn stderr_lines_arrive_while_the_command_runs_cut_and_without_newlines() {
        let e = env();
        let dir = tempfile::tempdir().expect("tmp");
        let done = dir.path().join("done");
        let argv = sh(&format!(
            "printf 'a\\nb\\r\\n' >&2; sleep 2; touch {}; head -c 2500 /dev/zero | tr '\\0' x >&2; printf tail >&2",
            done.display()
        ));
        let got = Arc::new(std::sync::Mutex::new(Vec::<(String, bool)>::new()));
        let sink: LineSink = {
            let (got, done) = (got.clone(), done.clone());
            Arc::new(move |l: &[u8]| {
                let line = String::from_utf8_lossy(l).into_owned();
                got.lock().expect("lock").push((line, done.exists()));
            })
        };
        let s = CmdSpec {
            stderr_lines: Some(sink),
            ..spec(&argv, &e)
        };
        let o = run(&s, None, &CancelToken::new()).expect("run");
        assert!(
            o.stderr.ends_with(b"tail"),
            "the error text still gets all of stderr"
        );
        let got = got.lock().expect("lock").clone();
        let x = |n| "x".repeat(n);
        assert_eq!(
            got,
            [
                ("a".to_owned(), false),
                ("b".to_owned(), false),
                (x(1024), true),
                (x(1024), true),
                (format!("{}tail", x(452)), true),
            ],
            "the first lines were handed over before the command went on"
        );
    }

    #[test]
    fn output_budget() {
        let e = env();
        let argv = sh("yes");
        let s = CmdSpec {
            stdout_cap: 100_000,
            ..spec(&argv, &e)
        };
        assert!(matches!(
            run(&s, None, &CancelToken::new()),
            Err(CmdError::OutputLimit {
                stream: "stdout",
                ..
            })
        ));
    }

    #[test]
    fn cancel() {
        let e = env();
        let argv = sh("sleep 30");
        let tok = CancelToken::new();
        let t2 = tok.clone();
        thread::spawn(move || {
            thread::sleep(Duration::from_millis(200));
            t2.cancel(CancelReason::Cancelled);
        });
        assert!(matches!(
            run(&spec(&argv, &e), None, &tok),
            Err(CmdError::Cancelled { .. })
        ));
    }

    /// The jail's cancel: its stdin ending, seen by the command's poll loop with no thread
    /// reading it. While the pipe is open, commands run to their end.
    #[test]
    fn the_watched_descriptor_ending_cancels() {
        let e = env();
        let (r, w) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC).expect("pipe");
        let r: &'static std::os::fd::OwnedFd = Box::leak(Box::new(r));
        let tok = CancelToken::watching(r.as_fd());
        let argv = sh("sleep 0.3; echo done");
        let o = run(&spec(&argv, &e), None, &tok).expect("runs while the pipe is open");
        assert_eq!(o.stdout, b"done\n");
        assert_eq!(tok.reason(), None);
        let closer = thread::spawn(move || {
            thread::sleep(Duration::from_millis(300));
            drop(w);
        });
        let t = Instant::now();
        let argv = sh("sleep 30");
        let err = run(&spec(&argv, &e), None, &tok).unwrap_err();
        assert!(matches!(err, CmdError::Cancelled { .. }), "{err}");
        assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
        assert_eq!(tok.reason(), Some(CancelReason::Cancelled));
        closer.join().expect("closer");
        // Once cancelled, the next command does not start.
        let dir = tempfile::tempdir().expect("tmp");
        let argv = sh(&format!("touch {}/started", dir.path().display()));
        let err = run(&spec(&argv, &e), None, &tok).unwrap_err();
        assert!(matches!(err, CmdError::Cancelled { .. }), "{err}");
        assert!(!dir.path().join("started").exists());
    }
}
