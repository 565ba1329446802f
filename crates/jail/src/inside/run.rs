//! Running one plugin command: no shell, a new process group, stdin from /dev/null, stdout and
//! stderr read with byte budgets, and on deadline, cancel or budget overrun SIGTERM to the whole
//! group, then SIGKILL after a grace period. Whatever happens, the group is SIGKILLed when the
//! command ends (Argo CD does the same), and the exit is observed with `waitid(WNOWAIT)` before
//! that kill, so the process-group id cannot have been reused.

use std::io::Read;
use std::os::unix::process::{CommandExt, ExitStatusExt};

use crate::record::{CommandRecord, Limit};
use crate::spec::TimeLimit;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use rustix::process::{Pid, Signal, WaitIdOptions, kill_process_group};

use crate::cancel::{CancelReason, CancelToken};

/// Time between SIGTERM and SIGKILL (Argo CD's value).
pub const KILL_GRACE: Duration = Duration::from_secs(5);

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
    let s = crate::redact::redact(&String::from_utf8_lossy(b), env);
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

/// A pipe being read on its own thread; the capture is shared so a reader that never sees EOF
/// can be abandoned without losing what it read.
struct Reader {
    capture: Arc<std::sync::Mutex<Capture>>,
    done: std::sync::mpsc::Receiver<()>,
}

impl Reader {
    fn finish(self, wait: Duration) -> Capture {
        let _ = self.done.recv_timeout(wait);
        let mut c = self.capture.lock().unwrap_or_else(|e| e.into_inner());
        Capture {
            data: std::mem::take(&mut c.data),
            over: c.over,
        }
    }
}

/// A helper thread started before the command: a command that exhausts the task limit (a fork
/// bomb filling `pids.max` / `RLIMIT_NPROC`) must not leave the jail unable to watch it.
struct Parked {
    job: std::sync::mpsc::Sender<Box<dyn FnOnce() + Send>>,
    handle: thread::JoinHandle<()>,
}

impl Parked {
    fn start(name: &str) -> Result<Self, CmdError> {
        let (job, rx) = std::sync::mpsc::channel::<Box<dyn FnOnce() + Send>>();
        let handle = thread::Builder::new()
            .name(name.into())
            .spawn(move || {
                // A dropped sender (the command never started) ends the thread unused.
                if let Ok(f) = rx.recv() {
                    f();
                }
            })
            .map_err(|e| CmdError::Start(format!("starting the {name} thread: {e}")))?;
        Ok(Self { job, handle })
    }

    fn run(self, f: impl FnOnce() + Send + 'static) -> thread::JoinHandle<()> {
        let _ = self.job.send(Box::new(f));
        self.handle
    }
}

fn reader(
    thread: Parked,
    mut src: impl Read + Send + 'static,
    cap: u64,
    over: Arc<AtomicBool>,
    token: CancelToken,
    lines: Option<LineSink>,
) -> Reader {
    let capture = Arc::new(std::sync::Mutex::new(Capture {
        data: Vec::new(),
        over: false,
    }));
    let (tx, done) = std::sync::mpsc::channel();
    let shared = capture.clone();
    thread.run(move || {
        let mut buf = [0u8; 64 * 1024];
        let mut pending = Vec::new();
        loop {
            match src.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => {
                    {
                        let mut c = shared.lock().unwrap_or_else(|e| e.into_inner());
                        if c.over {
                            continue; // keep draining so the writer is not blocked while we kill it
                        }
                        if c.data.len() as u64 + n as u64 > cap {
                            c.over = true;
                            over.store(true, Ordering::SeqCst);
                            token.poke();
                            continue;
                        }
                        c.data.extend_from_slice(&buf[..n]);
                    }
                    if let Some(sink) = &lines {
                        split_lines(&mut pending, &buf[..n], sink);
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(_) => break,
            }
        }
        if let Some(sink) = lines.filter(|_| !pending.is_empty()) {
            sink(&pending);
        }
        let _ = tx.send(());
    });
    Reader { capture, done }
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

/// [`run`], filling `rec` with how the command ended (argv and phase are the caller's).
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
    let (out_thread, err_thread, wait_thread) = (
        Parked::start("stdout")?,
        Parked::start("stderr")?,
        Parked::start("waiter")?,
    );
    let mut child: Child =
        crate::reaper::spawn_tracked(&mut cmd).map_err(|e| start_error(program, &e))?;
    let pid = child.id() as i32;
    let started = Instant::now();
    tracing::debug!(pid, argv = %argv_log, cwd = %spec.cwd.display(), "command started");

    let out_over = Arc::new(AtomicBool::new(false));
    let err_over = Arc::new(AtomicBool::new(false));
    let out_t = reader(
        out_thread,
        child.stdout.take().expect("piped"),
        spec.stdout_cap,
        out_over.clone(),
        cancel.clone(),
        None,
    );
    let err_t = reader(
        err_thread,
        child.stderr.take().expect("piped"),
        spec.stderr_cap,
        err_over.clone(),
        cancel.clone(),
        spec.stderr_lines.clone(),
    );

    // A waiter observes the exit without reaping it, so the group id stays ours until we reap.
    let exited = Arc::new(AtomicBool::new(false));
    let waiter = {
        let exited = exited.clone();
        let token = cancel.clone();
        wait_thread.run(move || {
            let p = Pid::from_raw(pid).expect("child pid is positive");
            let opts = WaitIdOptions::EXITED | WaitIdOptions::NOWAIT;
            while let Err(rustix::io::Errno::INTR) =
                rustix::process::waitid(rustix::process::WaitId::Pid(p), opts)
            {}
            exited.store(true, Ordering::SeqCst);
            token.poke();
        })
    };

    let timed_out = cancel.wait_until(deadline, || {
        exited.load(Ordering::SeqCst)
            || out_over.load(Ordering::SeqCst)
            || err_over.load(Ordering::SeqCst)
    });
    let cancelled = cancel.reason();
    let overrun = out_over.load(Ordering::SeqCst) || err_over.load(Ordering::SeqCst);
    let must_stop = !exited.load(Ordering::SeqCst) && (timed_out || cancelled.is_some() || overrun);
    let pgid = Pid::from_raw(pid).expect("child pid is positive");
    if must_stop {
        let _ = kill_process_group(pgid, Signal::TERM);
        let grace_end = Instant::now() + KILL_GRACE;
        let fresh = CancelToken::new();
        // Wait for the exit (poked by nobody: poll the flag on a short cadence within the grace).
        while !exited.load(Ordering::SeqCst) && Instant::now() < grace_end {
            let _ = fresh.wait_until(
                Some((Instant::now() + Duration::from_millis(20)).min(grace_end)),
                || exited.load(Ordering::SeqCst),
            );
        }
    }
    // Kill whatever is left of the group (daemons, stragglers) while the id is still reserved.
    let _ = kill_process_group(pgid, Signal::KILL);
    let _ = waiter.join();
    // wait4 rather than Child::wait: the rusage carries the command's peak memory.
    let reaped = crate::sys::wait4_rusage(pid);
    crate::reaper::untrack(pid);
    drop(child);
    let (raw, peak_rss) = reaped.map_err(|e| CmdError::Start(e.to_string()))?;
    let status = std::process::ExitStatus::from_raw(raw);
    let out = out_t.finish(PIPE_DRAIN);
    let err = err_t.finish(PIPE_DRAIN);
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
}
