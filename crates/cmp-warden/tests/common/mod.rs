//! Harness: a real `cmp-warden serve` on a real socket, and real clients (grpc-go, grpcio, ours).
#![allow(dead_code, clippy::print_stderr)]

pub mod archive_cases;
pub mod examples;
pub mod grpc;
pub mod otlp;
pub mod pki;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// The audit event's vocabulary, for tests that read events through the type.
#[allow(unused_imports)]
pub use vocab::egress::Decision;
#[allow(unused_imports)]
pub use vocab::record::{Limit, Phase, SeccompAction, TreeCacheUse};

pub struct Server {
    pub child: Option<Child>,
    /// How it was started (program, arguments, environment), for [`Server::restart`].
    spawn: (String, Vec<String>, Vec<(String, String)>),
    /// ARGOCD_CMP_WORKDIR (under `dir` unless the test gave its own).
    pub work: PathBuf,
    pub dir: tempfile::TempDir,
    pub sock: PathBuf,
    pub log: PathBuf,
}

pub fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_cmp-warden")
}

/// The requests' audit events among log lines, read through the server's own type (a line
/// marked `"log":"audit"` that reads neither as one nor as a reload's event fails the test: a
/// renamed field shows here).
pub fn audit_events_in(logs: &str) -> Vec<audit_event::AuditEvent> {
    logs.lines()
        .filter(|l| l.contains("\"log\":\"audit\""))
        .filter(|l| audit_event::ReloadEvent::from_line(l).is_none())
        .map(|l| {
            audit_event::AuditEvent::from_line(l)
                .unwrap_or_else(|| panic!("an audit line this build cannot read: {l}"))
        })
        .collect()
}

/// Wait (up to `timeout`) until `cond` holds; whether it did.
pub fn wait_until(timeout: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if cond() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The repository's `examples/`.
pub fn examples_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples")
}

/// The manifests of a client's JSON answer to `generate`.
pub fn manifests(v: &serde_json::Value) -> Vec<String> {
    v["manifests"]
        .as_array()
        .expect("manifests")
        .iter()
        .map(|m| m.as_str().expect("string").to_owned())
        .collect()
}

/// Skip the calling test when it cannot run for want of root ([`is_root`]: a failure
/// instead under `CMP_WARDEN_TESTS_MUST_RUN`, as in CI).
#[macro_export]
macro_rules! needs_root {
    ($why:expr) => {
        if !$crate::common::is_root($why) {
            return;
        }
    };
}

/// Whether this test can run: it needs root (leased UIDs need CAP_SETUID). When it cannot, it
/// says why on stderr and passes — unless `CMP_WARDEN_TESTS_MUST_RUN` is set (`scripts/test`
/// sets it: CI runs as root, so a skip there is a failure).
pub fn is_root(why: &str) -> bool {
    if rustix::process::geteuid().is_root() {
        return true;
    }
    if std::env::var_os("CMP_WARDEN_TESTS_MUST_RUN").is_some() {
        panic!("this test must run here (CMP_WARDEN_TESTS_MUST_RUN), but it cannot: {why}");
    }
    eprintln!("SKIP: {why}");
    false
}

impl Server {
    /// Start with this plugin.yaml; waits for the socket.
    pub fn start(plugin_yaml: &str, args: &[&str]) -> Server {
        Self::start_env(plugin_yaml, args, &[])
    }

    pub fn start_env(plugin_yaml: &str, args: &[&str], env: &[(&str, &str)]) -> Server {
        Self::start_under(&[], plugin_yaml, args, env)
    }

    /// [`Server::start_env`], the server run by `prefix` (a program that execs its arguments,
    /// e.g. `unshare --net`: the server keeps the child's PID).
    pub fn start_under(
        prefix: &[&str],
        plugin_yaml: &str,
        args: &[&str],
        env: &[(&str, &str)],
    ) -> Server {
        let dir = tempfile::Builder::new()
            .prefix("cmpw-srv")
            .tempdir()
            .expect("tmp");
        let cfg = dir.path().join("config");
        let socks = dir.path().join("plugins");
        // The work directory: the test's own when it gives ARGOCD_CMP_WORKDIR (e.g. a small disk).
        let work = env
            .iter()
            .find(|(k, _)| *k == "ARGOCD_CMP_WORKDIR")
            .map_or_else(|| dir.path().join("work"), |(_, v)| PathBuf::from(v));
        for d in [&cfg, &socks, &work] {
            std::fs::create_dir_all(d).expect("mkdir");
        }
        std::fs::write(cfg.join("plugin.yaml"), plugin_yaml).expect("write plugin.yaml");
        // Servers of one test run share this host's PID namespace, so each gets its own UID
        // range (a server's start-up sweep kills everything in its range).
        let mut args: Vec<&str> = args.to_vec();
        let policy_file = dir.path().join("policy/policy.yaml");
        if !args.contains(&"--policy") {
            write_policy(&policy_file, &[]);
            args.extend(["--policy", policy_file.to_str().expect("utf8")]);
        }
        let log = dir.path().join("server.log");
        let logf = std::fs::File::create(&log).expect("log");
        let (program, before) = match prefix.split_first() {
            Some((p, rest)) => (*p, [rest, &[bin()]].concat()),
            None => (bin(), Vec::new()),
        };
        let argv: Vec<String> = before
            .iter()
            .map(|a| (*a).to_owned())
            .chain(["--loglevel", "debug", "--config-dir-path"].map(str::to_owned))
            .chain([cfg.to_str().expect("utf8").to_owned()])
            .chain(args.iter().map(|a| (*a).to_owned()))
            .collect();
        let envs: Vec<(String, String)> = [
            ("ARGOCD_PLUGINSOCKFILEPATH", socks.to_str().expect("utf8")),
            ("ARGOCD_CMP_WORKDIR", work.to_str().expect("utf8")),
        ]
        .into_iter()
        .chain(env.iter().copied())
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
        let child = Command::new(program)
            .args(&argv)
            .envs(envs.iter().map(|(k, v)| (k, v)))
            .stdout(Stdio::null())
            .stderr(logf)
            .spawn()
            .expect("spawn server");
        let mut s = Server {
            child: Some(child),
            spawn: (program.to_owned(), argv, envs),
            work,
            dir,
            sock: PathBuf::new(),
            log,
        };
        s.wait_for_socket(&socks);
        s
    }

    /// Start the same server again (same directories, policy and UID range), as a container
    /// restart does after the old one died. The old log moves to `server.log.previous`, so
    /// [`Server::logs`] (and what is read from it: idle jails, audit events) is the new one's.
    #[allow(dead_code)] // not every test binary uses it
    pub fn restart(&mut self) {
        assert!(self.child.is_none(), "restart: the server is still running");
        std::fs::rename(&self.log, self.log.with_extension("log.previous")).expect("old log");
        let logf = std::fs::File::create(&self.log).expect("log");
        let (program, argv, envs) = &self.spawn;
        self.child = Some(
            Command::new(program)
                .args(argv)
                .envs(envs.iter().map(|(k, v)| (k, v)))
                .stdout(Stdio::null())
                .stderr(logf)
                .spawn()
                .expect("spawn server"),
        );
        // The dead server's socket is still there (and a new one may get its inode number):
        // wait for the new server to say it serves.
        self.wait_logged("serving on", 1);
        let socks = self.dir.path().join("plugins");
        self.wait_for_socket(&socks);
    }

    fn wait_for_socket(&mut self, socks: &Path) {
        let s = self;
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            // The socket (the directory also holds the lease locks, as in a pod).
            if let Some(p) = std::fs::read_dir(socks).ok().and_then(|r| {
                r.flatten()
                    .map(|e| e.path())
                    .find(|p| p.extension().is_some_and(|x| x == "sock"))
            }) {
                s.sock = p;
                return;
            }
            if let Some(st) = s.child.as_mut().and_then(|c| c.try_wait().ok().flatten()) {
                panic!("server exited early ({st}):\n{}", s.logs());
            }
            assert!(
                Instant::now() < deadline,
                "socket never appeared:\n{}",
                s.logs()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn logs(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The audit events in the server's log so far.
    pub fn audit_events(&self) -> Vec<audit_event::AuditEvent> {
        audit_events_in(&self.logs())
    }

    /// The audit events once at least `n` are logged (up to 15 s): a refused request's event
    /// is written once its jail is reclaimed, after the client has its error.
    #[allow(dead_code)] // not every test binary uses it
    pub fn audited(&self, n: usize) -> Vec<audit_event::AuditEvent> {
        self.wait_logged("\"log\":\"audit\"", n);
        self.audit_events()
    }

    /// The last audit event, once one is logged (a request a client gave up on is logged after
    /// its jail is reclaimed), read through the server's own type.
    #[allow(dead_code)]
    pub fn last_audit_event(&self) -> audit_event::AuditEvent {
        self.audited(1).pop().expect("an audit event")
    }

    /// Wait (up to 15 s) until the log has `what` at least `n` times: a test that acts once
    /// the server reached a stage (a command started) waits for it, whatever the machine's pace.
    #[allow(dead_code)]
    pub fn wait_logged(&self, what: &str, n: usize) {
        let deadline = Instant::now() + Duration::from_secs(15);
        while self.logs().matches(what).count() < n {
            assert!(
                Instant::now() < deadline,
                "never logged {n} times: {what}\n{}",
                self.logs()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Wait (up to 15 s) until `n` requests are audited and a spare jail is ready: the
    /// server idle again, for a test that counts its threads or descriptors.
    #[allow(dead_code)] // not every test binary uses it
    pub fn wait_settled(&self, n: usize) {
        assert!(
            wait_until(Duration::from_secs(15), || self.audit_events().len() >= n
                && !self.idle_jails().is_empty()),
            "never settled after {n} requests:\n{}",
            self.logs()
        );
    }

    /// How many jails requests (and the start-up probe) have taken so far.
    #[allow(dead_code)] // not every test binary uses it
    pub fn jails_taken(&self) -> usize {
        self.logs().matches("\"msg\":\"jail taken\"").count()
    }

    /// The address a server started with `--metrics-address` logged it listens on.
    #[allow(dead_code)] // not every test binary uses it
    pub fn metrics_address(&self) -> String {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(a) = self.logs().lines().find_map(|l| {
                let v: serde_json::Value = serde_json::from_str(l).ok()?;
                (v["msg"].as_str()?.starts_with("metrics on"))
                    .then(|| v["address"].as_str().map(str::to_owned))?
            }) {
                return a;
            }
            assert!(Instant::now() < deadline, "metrics address never logged");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The port of [`Server::metrics_address`].
    #[allow(dead_code)] // not every test binary uses it
    pub fn metrics_port(&self) -> String {
        let addr = self.metrics_address();
        addr.rsplit_once(':').expect("host:port").1.to_owned()
    }

    /// `GET /metrics` of a server started with `--metrics-address`.
    #[allow(dead_code)] // not every test binary uses it
    pub fn metrics(&self) -> String {
        scrape(&self.metrics_address())
    }

    /// The PID of the tree cache keeper started last (from its log line).
    #[allow(dead_code)] // not every test binary uses it
    pub fn keeper_pid(&self) -> u64 {
        self.logs()
            .lines()
            .rev()
            .find_map(|l| {
                let v: serde_json::Value = serde_json::from_str(l).ok()?;
                (v["msg"] == "tree cache keeper started").then(|| v["pid"].as_u64())?
            })
            .expect("keeper pid logged")
    }

    /// The `treeCache` of each audit event in the log (null where the event has none), once
    /// there are at least `n` events (an event follows its response).
    pub fn tree_cache_uses(&self, n: usize) -> Vec<serde_json::Value> {
        let uses = || -> Vec<serde_json::Value> {
            self.audit_events()
                .into_iter()
                .map(|e| serde_json::to_value(e.tree_cache).expect("treeCache"))
                .collect()
        };
        let until = Instant::now() + Duration::from_secs(10);
        while uses().len() < n && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(20));
        }
        uses()
    }

    /// Every log line is shaped as logrus writes JSON (`time`, a logrus `level`, `msg`) and
    /// no value is Rust debug text (`Some(…)`, `None`, a struct, a quoted list).
    #[allow(dead_code)]
    pub fn assert_logs_are_logrus_json(&self) {
        let logs = self.logs();
        let mut n = 0;
        for line in logs.lines().filter(|l| !l.trim().is_empty()) {
            let v: serde_json::Value = serde_json::from_str(line)
                .unwrap_or_else(|e| panic!("not a JSON log line ({e}): {line}"));
            let o = v.as_object().expect("object");
            if o.get("log").and_then(|l| l.as_str()) == Some("audit") {
                continue;
            }
            n += 1;
            for k in ["time", "level", "msg"] {
                assert!(o.contains_key(k), "no {k:?}: {line}");
            }
            assert!(
                [
                    "trace", "debug", "info", "warning", "error", "fatal", "panic"
                ]
                .contains(&o["level"].as_str().unwrap_or("")),
                "level: {line}"
            );
            for (k, val) in o {
                let Some(t) = val.as_str() else { continue };
                let debug_text = t.starts_with("Some(")
                    || t == "None"
                    || t.contains(" { ")
                    || t.starts_with("[\"")
                    || t.starts_with("[(");
                assert!(!debug_text, "{k} is debug text: {line}");
            }
        }
        assert!(n > 0, "no log lines");
    }

    /// `<ARGOCD_CMP_WORKDIR>/_cmp_server` entries.
    /// A work dir that cannot be read is a failure, not an empty directory (only one that does
    /// not exist yet is empty).
    pub fn work_entries(&self) -> Vec<PathBuf> {
        let w = self.work.join("_cmp_server");
        match std::fs::read_dir(&w) {
            Ok(r) => r
                .map(|e| {
                    e.unwrap_or_else(|err| panic!("{}: {err}", w.display()))
                        .path()
                })
                .collect(),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
            Err(e) => panic!("cannot read the work dir {}: {e}", w.display()),
        }
    }

    /// The jails the server has prepared and neither handed to a request nor retired, from its
    /// own log ("jail prepared" / "jail taken" / "jail discarded"): the spare kept ready for
    /// the next request (at most one once requests are done).
    pub fn idle_jails(&self) -> Vec<IdleJail> {
        idle_jails_in(&self.logs())
    }

    /// Work dir entries that belong to no idle jail: request trees left behind.
    pub fn leftover_work_entries(&self) -> Vec<PathBuf> {
        let idle = self.idle_jails();
        self.work_entries()
            .into_iter()
            .filter(|p| !idle.iter().any(|j| p.file_name() == Some(j.name.as_ref())))
            .collect()
    }

    /// Wait until no request tree is left (removal happens right after the response); the
    /// idle spare jail's own directory is not a request's.
    pub fn assert_work_dir_empties(&self) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !self.leftover_work_entries().is_empty() {
            assert!(
                Instant::now() < deadline,
                "request trees left behind: {:?} (idle jails {:?})\nthe server's jail log:\n{}",
                self.leftover_work_entries(),
                self.idle_jails(),
                self.logs()
                    .lines()
                    .filter(|l| l.contains("\"jail\"") || l.contains("reclaim"))
                    .collect::<Vec<_>>()
                    .join("\n")
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        assert!(
            self.idle_jails().len() <= 1,
            "more than one idle jail: {:?}",
            self.idle_jails()
        );
    }

    /// Processes in the UID range `first..first+count` that belong to no idle jail. A spare's
    /// UID is leased after the previous holder was reclaimed with nothing left (else it is
    /// quarantined, never leased again), so its processes are the spare's own.
    /// The UIDs of `first..first+count` that requests (not idle spares) hold processes under.
    #[allow(dead_code)] // not every test binary uses it
    pub fn busy_uids(&self, first: u32, count: u32) -> std::collections::BTreeSet<u32> {
        self.leftover_processes(first, count)
            .into_iter()
            .filter_map(supervisor::proc_uid)
            .collect()
    }

    /// Wait (up to 20 s) until `n` requests hold a jail of `first..first+count`, or `done`
    /// says they ended first: a test that acts beside a running request waits for it.
    #[allow(dead_code)] // not every test binary uses it
    pub fn wait_running(&self, first: u32, count: u32, n: usize, done: impl Fn() -> bool) {
        assert!(
            wait_until(Duration::from_secs(20), || done()
                || self.busy_uids(first, count).len() >= n),
            "{n} requests never ran:\n{}",
            self.logs()
        );
    }

    pub fn leftover_processes(&self, first: u32, count: u32) -> Vec<i32> {
        let idle: Vec<u32> = self.idle_jails().iter().filter_map(|j| j.uid).collect();
        supervisor::processes_in_range(Path::new("/proc"), first, count)
            .into_iter()
            .filter(|pid| supervisor::proc_uid(*pid).is_none_or(|u| !idle.contains(&u)))
            .collect()
    }

    pub fn stop(&mut self) -> std::process::ExitStatus {
        let mut c = self.child.take().expect("running");
        rustix::process::kill_process(
            rustix::process::Pid::from_child(&c),
            rustix::process::Signal::TERM,
        )
        .expect("kill");
        c.wait().expect("wait")
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            stop_gracefully(&mut c, Duration::from_secs(3));
        }
    }
}

/// Stop a server as Kubernetes stops a container: SIGTERM, then SIGKILL if it has not ended
/// within `grace`. On SIGTERM a server drains and retires its jails and cgroups; killed at
/// once it leaves them, and a suite of servers piles them up on the host.
pub fn stop_gracefully(c: &mut Child, grace: Duration) {
    if let Some(pid) = rustix::process::Pid::from_raw(c.id() as i32) {
        let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
    }
    let deadline = Instant::now() + grace;
    while matches!(c.try_wait(), Ok(None)) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    let _ = c.kill();
    let _ = c.wait();
}

/// The instance cgroups of the server whose UID range starts at `first`: on cgroup v1 one per
/// controller, memory first; on v2 the one directory `<delegated>/cmp-warden/cmp-warden-FIRST`,
/// the delegated cgroup being the test's own (the server moves its cgroup's processes, this
/// test's included, into the leaf `cmp-warden-supervisor`, whose parent it then is). Where the
/// layout moves, a running server's directory is missing and the callers say so.
#[allow(dead_code)] // not every test binary uses it
pub fn instance_cgroups(first: u32) -> Vec<PathBuf> {
    let own = std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
    let root = Path::new("/sys/fs/cgroup");
    let instance = format!("cmp-warden-{first}");
    if root.join("cgroup.controllers").exists() {
        let Some(path) = own.lines().find_map(|l| l.strip_prefix("0::")) else {
            return Vec::new();
        };
        let mut delegated = root.join(path.trim().trim_start_matches('/'));
        if delegated.file_name() == Some(std::ffi::OsStr::new("cmp-warden-supervisor")) {
            delegated.pop();
        }
        return vec![delegated.join("cmp-warden").join(instance)];
    }
    ["memory", "pids", "cpu"]
        .into_iter()
        .filter_map(|ctl| {
            let path = own.lines().find_map(|l| {
                let mut f = l.splitn(3, ':');
                let (_, list, path) = (f.next()?, f.next()?, f.next()?);
                list.split(',').any(|c| c == ctl).then(|| path.to_owned())
            })?;
            Some(
                root.join(ctl)
                    .join(path.trim_start_matches('/'))
                    .join("cmp-warden")
                    .join(&instance),
            )
        })
        .collect()
}

/// A jail prepared ahead of a request (see [`Server::idle_jails`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdleJail {
    /// Its directory and cgroup name.
    pub name: String,
    /// Its leased UID (none in the shared-UID model).
    pub uid: Option<u32>,
}

/// [`Server::idle_jails`] over a log's text.
pub fn idle_jails_in(log: &str) -> Vec<IdleJail> {
    let mut idle: Vec<IdleJail> = Vec::new();
    for line in log.lines() {
        let Ok(v) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        let Some(name) = v["jail"].as_str() else {
            continue;
        };
        match v["msg"].as_str() {
            Some("jail prepared") => idle.push(IdleJail {
                name: name.to_owned(),
                uid: v["uid"].as_u64().map(|u| u as u32),
            }),
            Some("jail taken" | "jail discarded") => idle.retain(|j| j.name != name),
            _ => {}
        }
    }
    idle
}

/// A UID range no other server of this test process (or a concurrent one) uses, with the UID
/// just above it (the tree cache's identity) free as well.
pub fn private_uid_range() -> (u32, u32) {
    use std::sync::atomic::{AtomicU32, Ordering};
    static N: AtomicU32 = AtomicU32::new(0);
    let n = N.fetch_add(1, Ordering::SeqCst) % 32;
    (200_000 + (std::process::id() % 20_000) * 1024 + n * 32, 16)
}

/// A liveness bound, never a measurement (speed is measured in benches/): generous for a loaded
/// 2-core machine, and far below what the failure it guards against would take (a wall clock of
/// minutes, a command that never ends, a tunnel left open).
#[allow(dead_code)] // not every test binary uses it
pub const LIVENESS: Duration = Duration::from_secs(60);

/// A policy edit that turns per-request namespaces off (to test the layers below them alone).
#[allow(dead_code)] // not every test binary uses it
pub const NO_NAMESPACES: (&str, &str) = (
    "namespaces: [mount, pid, net, ipc, uts, cgroup]",
    "namespaces: []",
);

/// The default policy's tree cache line, which [`tree_cache_under_test`] may switch off.
pub const TREE_CACHE_ON: &str = "cache: {enabled: true, bytes: 512Mi}";

/// Whether this run's servers have the tree cache (`spec.cache`) on: the default policy's
/// choice, unless `CMP_WARDEN_TEST_TREE_CACHE=off` (scripts/test runs the compatibility suites
/// once more that way, so they pass with the cache on and off).
pub fn tree_cache_under_test() -> bool {
    match std::env::var("CMP_WARDEN_TEST_TREE_CACHE").as_deref() {
        Err(_) | Ok("on") => true,
        Ok("off") => false,
        Ok(other) => panic!("CMP_WARDEN_TEST_TREE_CACHE={other}: on or off"),
    }
}

/// [`write_policy`], with only the first `count` UIDs of this test's range: returns the first.
#[allow(dead_code)] // not every test binary uses it
pub fn write_policy_with_uids(path: &Path, edits: &[(&str, &str)], count: u32) -> u32 {
    let (first, all) = write_policy(path, edits);
    assert!(count <= all, "{count} UIDs of {all}");
    let text = std::fs::read_to_string(path).expect("policy");
    let narrowed = text.replacen(
        &format!("uidRange: {{first: {first}, count: {all}}}"),
        &format!("uidRange: {{first: {first}, count: {count}}}"),
        1,
    );
    assert_ne!(text, narrowed, "policy fixture: uidRange");
    std::fs::write(path, narrowed).expect("write policy");
    first
}

/// Incompressible text, different for each `seed` ([`testkit::noise`]).
pub fn noise(n: usize, seed: u64) -> String {
    testkit::noise(n, seed)
}

/// A selected policy of a policy directory, from the default's text: what is node-wide left
/// out (require, namespaces, uidRange, cache: the default's), named `name`, selecting
/// requests of Argo CD project `project`.
pub fn selected_policy(default: &str, name: &str, project: &str) -> String {
    testkit::selected_policy(default, name, &format!("{{projects: [{project}]}}"))
}

/// Write the default policy with a private UID range and `edits` (from, to) applied, plus
/// the default seccomp profile beside it. Returns the UID range.
pub fn write_policy(path: &Path, edits: &[(&str, &str)]) -> (u32, u32) {
    let (first, count) = private_uid_range();
    let mut text = include_str!("../../../../policies/default.yaml").replacen(
        "uidRange: {first: 20000, count: 40000}",
        &format!("uidRange: {{first: {first}, count: {count}}}"),
        1,
    );
    if !tree_cache_under_test() {
        assert!(
            text.contains(TREE_CACHE_ON),
            "policy fixture: {TREE_CACHE_ON}"
        );
        text = text.replacen(TREE_CACHE_ON, "cache: {enabled: false, bytes: 512Mi}", 1);
    }
    for (from, to) in edits {
        assert!(text.contains(from), "policy fixture: {from}");
        text = text.replacen(from, to, 1);
    }
    // The tests' archives are small: with the cache under test, every one is cached (unless
    // an edit says otherwise), so the suites exercise it.
    if !text.contains("minArchiveBytes") {
        text = text.replacen(
            "cache: {enabled: true, ",
            "cache: {minArchiveBytes: 0, enabled: true, ",
            1,
        );
    }
    let dir = path.parent().expect("parent");
    std::fs::create_dir_all(dir.join("seccomp")).expect("mkdir");
    std::fs::write(path, text).expect("write policy");
    std::fs::write(
        dir.join("seccomp/default.json"),
        include_str!("../../../../policies/seccomp/default.json"),
    )
    .expect("write profile");
    (first, count)
}

/// `cmp-warden policy suggest --audit-log LOG --policy POLICY --out OUT`, its output.
pub fn policy_suggest(
    log: impl AsRef<Path>,
    policy: impl AsRef<Path>,
    out: impl AsRef<Path>,
) -> std::process::Output {
    Command::new(bin())
        .args(["policy", "suggest", "--audit-log"])
        .arg(log.as_ref())
        .arg("--policy")
        .arg(policy.as_ref())
        .arg("--out")
        .arg(out.as_ref())
        .output()
        .expect("policy suggest")
}

/// The grpc-go client (built once, as the Go module tests/interop/go, from the module proxy).
pub fn go_client() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        let out = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("cmpclient-go");
        let script =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/interop/build-go-client.sh");
        let st = Command::new("bash").arg(&script).arg(&out).status().expect(
            "run build-go-client.sh (needs the machine's Go and protoc: scripts/setup checks them)",
        );
        assert!(st.success(), "building the grpc-go client failed");
        out
    })
}

/// Result of a client call: Ok(JSON response) or Err((grpc code, message)).
pub type CallResult = Result<serde_json::Value, (i64, String)>;

/// Run the Go client: `-rpc RPC` and extra args.
pub fn go(server: &Server, rpc: &str, args: &[&str]) -> CallResult {
    let out = Command::new(go_client())
        .arg("-socket")
        .arg(&server.sock)
        .args(["-rpc", rpc])
        .args(args)
        .output()
        .expect("run go client");
    parse_client_output(&out)
}

pub fn parse_client_output(out: &std::process::Output) -> CallResult {
    let stdout = String::from_utf8_lossy(&out.stdout);
    let v: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap_or_else(|e| {
        panic!(
            "client output not JSON ({e}): {stdout}\nstderr: {}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    match out.status.code() {
        Some(0) => Ok(v),
        Some(3) => Err((
            v["code"].as_i64().unwrap_or(-1),
            v["message"].as_str().unwrap_or_default().to_owned(),
        )),
        other => panic!(
            "client failed ({other:?}): {stdout} {}",
            String::from_utf8_lossy(&out.stderr)
        ),
    }
}

/// Write files (`path` → content; content starting with `->` makes a symlink).
pub fn repo(files: &[(&str, &str)]) -> tempfile::TempDir {
    let d = tempfile::Builder::new()
        .prefix("cmpw-repo")
        .tempdir()
        .expect("tmp");
    for (p, c) in files {
        let path = d.path().join(p);
        std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
        match c.strip_prefix("->") {
            Some(target) => std::os::unix::fs::symlink(target, &path).expect("symlink"),
            None => std::fs::write(&path, c).expect("write"),
        }
    }
    d
}

pub fn plugin(spec: &str) -> String {
    format!(
        "apiVersion: argoproj.io/v1alpha1\nkind: ConfigManagementPlugin\nmetadata:\n  name: test\nspec:\n{spec}"
    )
}

/// gRPC codes.
pub const INVALID_ARGUMENT: i64 = 3;
pub const DEADLINE_EXCEEDED: i64 = 4;
pub const RESOURCE_EXHAUSTED: i64 = 8;
pub const UNKNOWN: i64 = 2;
pub const PERMISSION_DENIED: i64 = 7;
pub const DATA_LOSS: i64 = 15;
pub const UNAVAILABLE: i64 = 14;
pub const INTERNAL: i64 = 13;

/// Turns the host's kernel audit on for a test and restores what it was (even on a panic), so
/// that Landlock's denial records reach the server.
#[allow(dead_code)]
pub struct AuditOn(());

/// The tests holding kernel audit on, and whether it was on before the first: the last to let
/// go puts back what the first found (each restoring its own reading would leave it on when two
/// overlap, and the test binaries after them would run with audit on).
static AUDIT_HOLDERS: std::sync::Mutex<(usize, bool)> = std::sync::Mutex::new((0, false));

#[allow(dead_code)]
impl AuditOn {
    pub fn enable() -> std::io::Result<AuditOn> {
        use supervisor::landlock_log;
        let mut h = AUDIT_HOLDERS.lock().unwrap_or_else(|e| e.into_inner());
        if h.0 == 0 {
            h.1 = landlock_log::audit_enabled()?;
            landlock_log::set_audit_enabled(true)?;
        }
        h.0 += 1;
        Ok(AuditOn(()))
    }
}

impl Drop for AuditOn {
    fn drop(&mut self) {
        let mut h = AUDIT_HOLDERS.lock().unwrap_or_else(|e| e.into_inner());
        h.0 -= 1;
        if h.0 == 0 {
            let _ = supervisor::landlock_log::set_audit_enabled(h.1);
        }
    }
}

/// The body of `GET /metrics` at `addr` (a 200 is asserted).
#[allow(dead_code)] // not every test binary uses it
pub fn scrape(addr: &str) -> String {
    use std::io::{Read, Write};
    let mut c = std::net::TcpStream::connect(addr).expect("connect metrics");
    c.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .expect("write");
    let mut s = String::new();
    c.read_to_string(&mut s).expect("read");
    assert!(s.starts_with("HTTP/1.1 200 OK"), "{s}");
    s.split_once("\r\n\r\n").expect("body").1.to_owned()
}
