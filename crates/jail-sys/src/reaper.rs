//! Reaping orphans when we are PID 1 (Argo CD's cmp-server does not, issues #13026, #29349).
//!
//! Our own command children are reaped by the runner; a blanket `waitpid(-1)` would steal their
//! statuses. So the reaper looks in /proc for zombies whose parent is us and reaps only those the
//! runner is not tracking.

use std::collections::HashSet;
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use rustix::process::{Pid, WaitOptions, waitpid};

fn tracked() -> &'static Mutex<HashSet<i32>> {
    static T: OnceLock<Mutex<HashSet<i32>>> = OnceLock::new();
    T.get_or_init(Mutex::default)
}

/// Spawn a child the caller will reap, and track it atomically with its creation: a child that
/// exits at once must never be mistaken for an orphan by a concurrent reaper pass.
pub fn spawn_tracked(cmd: &mut std::process::Command) -> std::io::Result<std::process::Child> {
    let mut set = tracked().lock().unwrap_or_else(|e| e.into_inner());
    let child = cmd.spawn()?;
    set.insert(child.id() as i32);
    Ok(child)
}

/// Track the child `create` makes (and returns the PID of) atomically with its creation, as
/// [`spawn_tracked`] does for a `Command`.
pub fn track_pid(create: impl FnOnce() -> std::io::Result<i32>) -> std::io::Result<i32> {
    let mut set = tracked().lock().unwrap_or_else(|e| e.into_inner());
    let pid = create()?;
    set.insert(pid);
    Ok(pid)
}

/// The runner reaped `pid`.
pub fn untrack(pid: i32) {
    tracked()
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .remove(&pid);
}

/// Reap untracked zombie children once.
pub fn reap_orphans() -> usize {
    let me = rustix::process::getpid().as_raw_nonzero().get();
    let mut reaped = 0;
    let Ok(rd) = std::fs::read_dir("/proc") else {
        return 0;
    };
    for e in rd.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        // Fields after the parenthesised command name: state ppid ...
        let Some(rest) = stat.rsplit_once(')').map(|(_, r)| r) else {
            continue;
        };
        let mut f = rest.split_whitespace();
        let (Some(state), Some(ppid)) = (f.next(), f.next().and_then(|p| p.parse::<i32>().ok()))
        else {
            continue;
        };
        if state != "Z"
            || ppid != me
            || tracked()
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .contains(&pid)
        {
            continue;
        }
        if let Some(p) = Pid::from_raw(pid)
            && matches!(waitpid(Some(p), WaitOptions::NOHANG), Ok(Some(_)))
        {
            reaped += 1;
        }
    }
    reaped
}

/// The jail is its PID namespace's init: its commands' poll loop reaps orphans (see
/// [`orphan_pass_due`]) instead of a thread of its own.
static IN_COMMAND_LOOP: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// How often orphans are looked for.
pub const ORPHAN_PASS: Duration = Duration::from_secs(1);

/// Have the command loop reap orphans (a single-threaded jail that is PID 1: only its
/// commands make orphans, and only while they run).
pub fn reap_in_command_loop() {
    IN_COMMAND_LOOP.store(true, std::sync::atomic::Ordering::Relaxed);
}

/// Whether the command loop reaps orphans.
pub fn reaps_in_command_loop() -> bool {
    IN_COMMAND_LOOP.load(std::sync::atomic::Ordering::Relaxed)
}

/// Start a background thread reaping orphans every second. The first pass comes a second
/// after the start, not at once: a jail starts one per request (as its PID namespace's init),
/// most requests end sooner, and their zombies die with the namespace; a pass reads every
/// process's `stat`, which was ~4% of a short request's CPU (BENCHMARKS.md).
pub fn start_orphan_reaper() {
    let _ = std::thread::Builder::new().name("reaper".into()).spawn(|| {
        loop {
            std::thread::sleep(Duration::from_secs(1));
            let n = reap_orphans();
            if n > 0 {
                tracing::debug!(reaped = n, "reaped orphaned processes");
            }
        }
    });
}
