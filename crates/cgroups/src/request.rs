//! One request's cgroup: its directories, what the kernel counted, its limits read back, and
//! its removal (in the background: a memory cgroup's offlining takes a while).

use std::io;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::files::{io_err, keyed, read_u64};
use crate::{CPU_PERIOD_US, CgroupError, CgroupLimits, v1, v2};

/// One request's cgroup (one directory per hierarchy in v1).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RequestCgroup {
    /// v2 or v1.
    pub v2: bool,
    /// (controller, directory); v2 has one entry named "unified".
    pub dirs: Vec<(String, PathBuf)>,
    /// The controllers limiting it.
    pub controllers: Vec<String>,
}

/// Resource use read back after a request.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CgroupStats {
    /// Peak memory in bytes (0 if unknown).
    pub peak_memory_bytes: u64,
    /// OOM kills in the request's cgroup.
    pub oom_kills: u64,
    /// Times the pids limit refused a fork.
    pub pids_refused: u64,
    /// Most tasks at once (`pids.peak`, 0 if the kernel lacks it).
    pub pids_peak: u64,
}

/// A request cgroup's limits read back from the kernel's files (`None`: the controller or
/// file is not there), and whether a process ran in it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Readback {
    /// 1 or 2.
    pub version: u8,
    /// `memory.max` (v1 `memory.limit_in_bytes`); `u64::MAX` for "max".
    pub memory_max: Option<u64>,
    /// `memory.swap.max` (v1: memsw minus memory); `None` without swap accounting.
    pub swap_max: Option<u64>,
    /// `memory.oom.group` (v2).
    pub oom_group: Option<bool>,
    /// `pids.max`.
    pub pids_max: Option<u64>,
    /// `cpu.max` (quota, period) in µs (v1 `cpu.cfs_quota_us`, `cpu.cfs_period_us`).
    pub cpu_max: Option<(u64, u64)>,
    /// The CPU or memory accounting shows a process ran in it.
    pub ran: bool,
}

impl Readback {
    /// What differs from `asked`, one phrase each (empty: the kernel holds every limit asked
    /// of a controller that is there; a missing controller is the caller's to report).
    pub fn mismatches(&self, asked: &CgroupLimits) -> Vec<String> {
        let mut out = Vec::new();
        let quota = asked.cpu_millis.saturating_mul(CPU_PERIOD_US) / 1000;
        if let Some(m) = self.memory_max
            && m != asked.memory_bytes
        {
            out.push(format!("memory.max is {m}, not {}", asked.memory_bytes));
        }
        if let Some(s) = self.swap_max
            && s != 0
        {
            out.push(format!("swap allowed ({s} bytes)"));
        }
        if self.oom_group == Some(false) {
            out.push("memory.oom.group is 0".into());
        }
        if let Some(p) = self.pids_max
            && p != asked.pids
        {
            out.push(format!("pids.max is {p}, not {}", asked.pids));
        }
        if let Some((q, period)) = self.cpu_max
            && (q, period) != (quota, CPU_PERIOD_US)
        {
            out.push(format!(
                "cpu.max is {q} {period}, not {quota} {CPU_PERIOD_US}"
            ));
        }
        if !self.ran {
            out.push("no process ran in it".into());
        }
        out
    }

    /// The values, as the kernel's file names and contents, each with the policy field that
    /// sets it.
    pub fn describe(&self) -> String {
        let n = |v: u64| {
            if v == u64::MAX {
                "max".to_owned()
            } else {
                v.to_string()
            }
        };
        let mut parts = Vec::new();
        let v2 = self.version == 2;
        if let Some(m) = self.memory_max {
            parts.push(format!(
                "{}={} (spec.limits.memoryBytes)",
                if v2 {
                    "memory.max"
                } else {
                    "memory.limit_in_bytes"
                },
                n(m)
            ));
        }
        if let Some(s) = self.swap_max {
            parts.push(format!(
                "{}={}",
                if v2 { "memory.swap.max" } else { "swap" },
                n(s)
            ));
        }
        if let Some(g) = self.oom_group {
            parts.push(format!("memory.oom.group={}", u8::from(g)));
        }
        if let Some(p) = self.pids_max {
            parts.push(format!("pids.max={} (spec.limits.pids)", n(p)));
        }
        if let Some((q, p)) = self.cpu_max {
            parts.push(if v2 {
                format!("cpu.max={} {p} (spec.limits.cpuMillis)", n(q))
            } else {
                format!(
                    "cpu.cfs_quota_us={}, cpu.cfs_period_us={p} (spec.limits.cpuMillis)",
                    n(q)
                )
            });
        }
        parts.join(", ")
    }
}

impl RequestCgroup {
    /// The files a process writes "0" into to join (the jail, before it confines itself: they
    /// cross the pipe in the preparation frame).
    pub fn procs_files(&self) -> Vec<PathBuf> {
        self.dirs
            .iter()
            .map(|(_, d)| d.join("cgroup.procs"))
            .collect()
    }

    /// Whether the request's cgroup has controller `ctl` (always true for v2's delegated set).
    pub fn has(&self, ctl: &str) -> bool {
        self.dir(ctl).is_some()
    }

    pub(crate) fn dir(&self, ctl: &str) -> Option<&Path> {
        if !self.controllers.iter().any(|c| c == ctl) {
            return None;
        }
        self.dirs
            .iter()
            .find(|(c, _)| c == ctl || (self.v2 && c == "unified"))
            .map(|(_, d)| d.as_path())
    }

    /// Peak memory and OOM kills.
    pub fn stats(&self) -> CgroupStats {
        let mut s = CgroupStats::default();
        if let Some(d) = self.dir("memory") {
            if self.v2 {
                v2::memory_stats(d, &mut s);
            } else {
                v1::memory_stats(d, &mut s);
            }
        }
        if let Some(d) = self.dir("pids") {
            // Same files and keys in both versions.
            s.pids_refused = keyed(&d.join("pids.events"), "max");
            s.pids_peak = read_u64(&d.join("pids.peak"));
        }
        s
    }

    /// The limits as the kernel holds them, and whether a process ran in the cgroup (read
    /// after the start-up probe's jail has run in it, before its removal: what doctor reports).
    pub fn read_back(&self) -> Readback {
        let mut r = Readback {
            version: if self.v2 { 2 } else { 1 },
            ..Readback::default()
        };
        let max = |p: PathBuf| {
            std::fs::read_to_string(p)
                .ok()
                .and_then(|s| match s.trim() {
                    "max" => Some(u64::MAX),
                    n => n.parse().ok(),
                })
        };
        if let Some(d) = self.dir("memory") {
            if self.v2 {
                v2::read_back_memory(d, &mut r, max);
            } else {
                v1::read_back_memory(d, &mut r, max);
            }
        }
        if let Some(d) = self.dir("pids") {
            r.pids_max = max(d.join("pids.max"));
        }
        if let Some(d) = self.dir("cpu") {
            r.cpu_max = if self.v2 {
                v2::cpu_max(d)
            } else {
                v1::cpu_max(d, max)
            };
        }
        if self.v2 && !r.ran {
            // Without a memory controller: the core `cpu.stat` of any v2 cgroup.
            if let Some((_, d)) = self.dirs.first() {
                r.ran = v2::ran(d);
            }
        }
        r
    }

    /// v2: `cgroup.kill` (every process, atomically). v1 has no kill file: the UID-wide kill
    /// does it (the caller runs it); this reports whether the cgroup is empty.
    pub fn kill(&self) -> Result<(), CgroupError> {
        match self.dirs.first() {
            Some((_, d)) if self.v2 => v2::kill(d),
            _ => Ok(()),
        }
    }

    /// Whether no process is left in any of the directories.
    pub fn is_empty(&self) -> bool {
        self.procs_files().iter().all(|f| {
            std::fs::read_to_string(f)
                .map(|s| s.trim().is_empty())
                .unwrap_or(true)
        })
    }

    /// Remove the directories (they must be empty of processes). v1's memory directory goes
    /// last: its removal waits in the kernel for the cgroup's offlining, and the others, which
    /// go at once, must not be left behind when the server is killed during that wait.
    pub fn remove(&self) -> Result<(), CgroupError> {
        let mut first_err = None;
        for d in self.removal_order() {
            match std::fs::remove_dir(d) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => {
                    first_err.get_or_insert(io_err("removing", d)(e));
                }
            }
        }
        first_err.map_or(Ok(()), Err)
    }

    /// The directories in the order `remove` takes them: memory last.
    fn removal_order(&self) -> Vec<&Path> {
        let (memory, rest): (Vec<_>, Vec<_>) = self.dirs.iter().partition(|(c, _)| c == "memory");
        rest.into_iter()
            .chain(memory)
            .map(|(_, d)| d.as_path())
            .collect()
    }
}

/// Removes emptied request cgroups in the background. Removing a memory cgroup waits in the
/// kernel for its offlining (measured on v1: 4–24 ms on an idle machine, ~0.1 ms on a busy
/// one, no CPU either way); nothing waits for the directory to go once no process is left in
/// it, so reclaim hands it here instead.
#[derive(Debug)]
pub struct Remover {
    tx: std::sync::Mutex<Option<std::sync::mpsc::Sender<RemoverMsg>>>,
}

#[derive(Debug)]
enum RemoverMsg {
    Remove(RequestCgroup),
    /// Answer once everything sent before has been handled.
    Flush(std::sync::mpsc::Sender<()>),
}

impl Default for Remover {
    fn default() -> Self {
        Self::new()
    }
}

impl Remover {
    /// Start the remover thread (lazily: none until the first cgroup arrives).
    pub fn new() -> Self {
        Remover {
            tx: std::sync::Mutex::new(None),
        }
    }

    fn send(&self, msg: RemoverMsg) -> Result<(), RemoverMsg> {
        let mut tx = self.tx.lock().unwrap_or_else(|e| e.into_inner());
        if tx.is_none() {
            let (s, r) = std::sync::mpsc::channel();
            let started = std::thread::Builder::new()
                .name("cgroup-remover".into())
                .spawn(move || remover_loop(&r));
            if started.is_err() {
                return Err(msg);
            }
            *tx = Some(s);
        }
        match tx.as_ref().map(|s| s.send(msg)) {
            Some(Ok(())) => Ok(()),
            Some(Err(e)) => Err(e.0),
            None => unreachable!("sender set above"),
        }
    }

    /// Remove `cg` (empty of processes) soon; done inline if the thread cannot be started.
    pub fn remove_later(&self, cg: RequestCgroup) {
        if let Err(RemoverMsg::Remove(cg)) = self.send(RemoverMsg::Remove(cg)) {
            remove_patiently(&cg);
        }
    }

    /// Wait until every cgroup handed over so far is removed (or given up on).
    pub fn flush(&self) {
        let (done, wait) = std::sync::mpsc::channel();
        if self.send(RemoverMsg::Flush(done)).is_ok() {
            let _ = wait.recv();
        }
    }
}

fn remover_loop(rx: &std::sync::mpsc::Receiver<RemoverMsg>) {
    for msg in rx {
        match msg {
            RemoverMsg::Remove(cg) => remove_patiently(&cg),
            RemoverMsg::Flush(done) => {
                let _ = done.send(());
            }
        }
    }
}

/// `rmdir` the cgroup, retrying briefly (a process that just left may still be counted).
fn remove_patiently(cg: &RequestCgroup) {
    let mut last = None;
    for attempt in 0..50 {
        match cg.remove() {
            Ok(()) => return,
            Err(e) => last = Some(e),
        }
        std::thread::sleep(std::time::Duration::from_millis(2 << attempt.min(6)));
    }
    if let Some(e) = last {
        tracing::error!(error = %e, "request cgroup not removed");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cg(v2: bool, dirs: &[(&str, PathBuf)]) -> RequestCgroup {
        RequestCgroup {
            v2,
            dirs: dirs
                .iter()
                .map(|(c, d)| ((*c).to_owned(), d.clone()))
                .collect(),
            controllers: dirs.iter().map(|(c, _)| (*c).to_owned()).collect(),
        }
    }

    #[test]
    fn v1_memory_directory_is_removed_last() {
        let (m, p, c) = (
            PathBuf::from("/m"),
            PathBuf::from("/p"),
            PathBuf::from("/c"),
        );
        let cg = cg(
            false,
            &[
                ("memory", m.clone()),
                ("pids", p.clone()),
                ("cpu", c.clone()),
            ],
        );
        assert_eq!(cg.removal_order(), [&p, &c, &m]);
    }

    /// Every directory is taken; one already gone is no error; one that cannot go (here: not
    /// empty) is the error, named, and the others still go.
    #[test]
    fn remove_takes_each_directory_and_names_the_one_that_stays() {
        let t = tempfile::tempdir().expect("tmp");
        let d = |n: &str| t.path().join(n);
        for n in ["memory", "pids"] {
            std::fs::create_dir(d(n)).expect("mkdir");
        }
        let gone = cg(
            false,
            &[
                ("memory", d("memory")),
                ("pids", d("pids")),
                ("cpu", d("cpu")),
            ],
        );
        gone.remove().expect("an absent directory is no error");
        assert!(!d("memory").exists() && !d("pids").exists());
        gone.remove().expect("removed twice: no error");

        for n in ["memory", "pids"] {
            std::fs::create_dir(d(n)).expect("mkdir");
        }
        std::fs::write(d("pids").join("held"), "").expect("w");
        let busy = cg(false, &[("memory", d("memory")), ("pids", d("pids"))]);
        let err = busy
            .remove()
            .expect_err("a directory that stays is an error");
        assert!(
            matches!(&err, CgroupError::Io { what: "removing", path, .. } if *path == d("pids").display().to_string()),
            "{err:?}"
        );
        assert!(!d("memory").exists(), "the others still go");
    }

    /// Whether a process ran: v1 decides from memory's peak alone (a v1 `cpu.stat` has no
    /// `usage_usec`); a v2 cgroup without the memory controller from the core `cpu.stat`.
    #[test]
    fn ran_is_v1_memorys_peak_and_v2s_cpu_stat() {
        let t = tempfile::tempdir().expect("tmp");
        std::fs::write(t.path().join("cpu.stat"), "usage_usec 5\n").expect("w");
        assert!(!cg(false, &[("cpu", t.path().into())]).read_back().ran);
        assert!(cg(true, &[("cpu", t.path().into())]).read_back().ran);
        std::fs::write(t.path().join("cpu.stat"), "usage_usec 0\n").expect("w");
        assert!(!cg(true, &[("cpu", t.path().into())]).read_back().ran);
    }

    /// `remove_later` hands the removal to the remover's thread and returns at once, the thread
    /// retries while the directory cannot go (for seconds, backing off), and `flush` returns
    /// once everything handed over before it is done.
    #[test]
    fn the_remover_retries_in_the_background_and_flush_waits_for_it() {
        let t = tempfile::tempdir().expect("tmp");
        let dir = t.path().join("r1");
        std::fs::create_dir(&dir).expect("mkdir");
        std::fs::write(dir.join("held"), "").expect("w");
        let remover = Remover::new();
        remover.remove_later(cg(true, &[("unified", dir.clone())]));
        assert!(dir.exists(), "cannot go yet");
        // The directory stays refused for longer than retries without backing off would last.
        std::thread::sleep(std::time::Duration::from_millis(200));
        std::fs::remove_file(dir.join("held")).expect("rm");
        remover.flush();
        assert!(
            !dir.exists(),
            "removed by the remover before flush returned"
        );
    }
}
