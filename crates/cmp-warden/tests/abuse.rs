//! Resource abuse through the real server (issue 5): each hostile request runs beside honest
//! requests on the same server, which must all be answered correctly; the hostile one must fail
//! with an error naming the limit, and afterwards nothing of it may remain — no process of the
//! leased UIDs, no request cgroup, no request directory, no quarantined UID — and the server
//! still serves.
#![allow(clippy::print_stderr)] // a skip must say why

#[macro_use]
mod common;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::*;

/// Why these tests need root (printed when one skips).
const NEEDS_ROOT: &str = "abuse tests need root (CI runs as root): leased UIDs need CAP_SETUID";

/// One plugin, many behaviours, chosen by `ARGOCD_ENV_MODE`; without it: print the manifest.
const MODES: &str = r#"  generate:
    command: [sh, -c]
    args:
      - |
        case "$ARGOCD_ENV_MODE" in
          cpu) while :; do :; done ;;
          stdout) head -c 209715200 /dev/zero ;;
          disk) dd if=/dev/zero of=big bs=1M count=200 || exit 1 ;;
          tmp) dd if=/dev/zero of=/tmp/big bs=1M count=200 || exit 1 ;;
          files) exec /usr/bin/python3 -c 'fs = [open("/dev/null") for _ in range(10000)]; print(len(fs))' ;;
          zombies) exec /usr/bin/python3 -c '
        import os
        for _ in range(100000):
            if os.fork() == 0:
                os._exit(0)
        ' ;;
          daemon) setsid sh -c 'sleep 300 & sleep 300' </dev/null >/dev/null 2>&1 &
                  sleep 0.3
                  echo "kind: Daemons"
                  echo "running: $(pgrep -c -u "$(id -u)" -x sleep)"
                  echo "---" ;;
          sleep) sleep 60 ;;
          slow) sleep 1.5 ;;
          slow3) echo started >&2; sleep 3 ;;
          amplify) exec /usr/bin/python3 -c 'import sys; sys.stdout.write("a: &x " + "y" * (512 << 10) + "\nb: [" + ", ".join(["*x"] * 200) + "]\n")' ;;
          large) exec /usr/bin/python3 -c '
        import os, sys, time
        # A barrier: print once every party has started (a file each in the shared directory).
        b = os.environ["ARGOCD_ENV_BARRIER"]
        open(os.path.join(b, os.urandom(8).hex()), "w").close()
        while len(os.listdir(b)) < int(os.environ["ARGOCD_ENV_PARTIES"]):
            time.sleep(0.01)
        sys.stdout.write("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: big}\ndata:\n  v: \x27" + "\"q\"" * 700000 + "\x27\n")
        ' ;;
        esac
        cat cm.yaml
"#;

const CM: &str = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: cm\n";
const CM_JSON: &str = r#"{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"cm"}}"#;

/// Small limits so each abuse trips quickly.
const LIMITS: &[(&str, &str)] = &[
    ("memoryBytes: 1Gi", "memoryBytes: 128Mi"),
    ("pids: 512", "pids: 64"),
    ("wallSeconds: 300", "wallSeconds: 5"),
    ("outputBytes: 64Mi", "outputBytes: 1Mi"),
    ("openFiles: 4096", "openFiles: 256"),
    ("diskBytes: 2Gi", "diskBytes: 32Mi"),
    // Within the disk, so the tree cache stays on (its overlay's upper layer is on the
    // request's tmpfs, and is attacked here too).
    ("extractedBytes: 1Gi", "extractedBytes: 16Mi"),
];

struct Bed {
    s: Server,
    repo: tempfile::TempDir,
    first: u32,
    count: u32,
    _pol: tempfile::TempDir,
}

fn bed(extra_args: &[&str]) -> Bed {
    bed_with(LIMITS, extra_args)
}

fn bed_with(limits: &[(&str, &str)], extra_args: &[&str]) -> Bed {
    let pol = tempfile::tempdir().expect("tmp");
    let pol_file = pol.path().join("policy.yaml");
    let (first, count) = write_policy(&pol_file, limits);
    let mut args = vec!["--policy", pol_file.to_str().expect("utf8")];
    args.extend_from_slice(extra_args);
    let s = Server::start(&plugin(MODES), &args);
    go_client();
    Bed {
        s,
        repo: repo(&[("cm.yaml", CM)]),
        first,
        count,
        _pol: pol,
    }
}

impl Bed {
    fn dir(&self) -> String {
        self.repo.path().to_str().expect("utf8").to_owned()
    }

    /// A hostile request in the background.
    fn hostile(&self, mode: &str, timeout: &str) -> std::thread::JoinHandle<CallResult> {
        generate_in_background(
            &self.s,
            &self.dir(),
            &[
                "-env",
                &format!("ARGOCD_ENV_MODE={mode}"),
                "-timeout",
                timeout,
            ],
        )
    }

    /// Honest requests while the hostile one runs: every one answered correctly.
    fn honest(&self, n: usize) {
        for _ in 0..n {
            let v = go(&self.s, "generate", &["-dir", &self.dir()])
                .unwrap_or_else(|e| panic!("honest request failed: {e:?}\n{}", self.s.logs()));
            assert_eq!(v["manifests"][0], CM_JSON);
        }
    }

    /// Nothing of any request remains, and the server still serves.
    fn assert_clean(&self) {
        self.s.assert_work_dir_empties();
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let procs = self.s.leftover_processes(self.first, self.count);
            let idle = self.s.idle_jails();
            let cgroups: Vec<PathBuf> = request_cgroups(self.first, true)
                .into_iter()
                .filter(|c| !idle.iter().any(|j| c.file_name() == Some(j.name.as_ref())))
                .collect();
            if procs.is_empty() && cgroups.is_empty() {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "left behind: processes {procs:?}, cgroups {cgroups:?}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        let logs = self.s.logs();
        assert!(
            !logs.contains("quarantined"),
            "a UID was quarantined:\n{logs}"
        );
        self.honest(1);
    }
}

/// A GenerateManifest of `dir` with extra grpc-go client `args`, on its own thread.
fn generate_in_background(
    s: &Server,
    dir: &str,
    args: &[&str],
) -> std::thread::JoinHandle<CallResult> {
    let sock = s.sock.clone();
    let mut argv: Vec<String> = vec!["-rpc".into(), "generate".into(), "-dir".into(), dir.into()];
    argv.extend(args.iter().map(|a| (*a).to_owned()));
    std::thread::spawn(move || {
        let out = std::process::Command::new(go_client())
            .arg("-socket")
            .arg(&sock)
            .args(&argv)
            .output()
            .expect("go client");
        parse_client_output(&out)
    })
}

/// The server process's peak RSS (VmHWM), KiB.
fn peak_rss_kib(s: &Server) -> u64 {
    let pid = s.child.as_ref().expect("server").id();
    let st = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    st.lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .expect("VmHWM")
}

/// Request cgroups in [`instance_cgroups`]; `running`: the server is up, so its instance
/// directories must exist.
fn request_cgroups(first: u32, running: bool) -> Vec<PathBuf> {
    let mut left = Vec::new();
    for base in instance_cgroups(first) {
        match std::fs::read_dir(&base) {
            Ok(rd) => left.extend(rd.flatten().filter(|e| e.path().is_dir()).map(|e| e.path())),
            // Gone with a server that stopped; while one runs, it must be where we look.
            Err(e) => assert!(!running, "instance cgroup {}: {e}", base.display()),
        }
    }
    left
}

/// Run `mode` beside honest requests; return its error.
fn abuse(mode: &str) -> ((i64, String), Bed) {
    let b = bed(&[]);
    let h = b.hostile(mode, "60s");
    b.s.wait_running(b.first, b.count, 1, || h.is_finished());
    b.honest(3);
    let err = h
        .join()
        .expect("thread")
        .expect_err("the hostile request must fail");
    b.assert_clean();
    (err, b)
}

#[test]
fn cpu_spin_is_killed_by_the_wall_clock() {
    needs_root!(NEEDS_ROOT);
    let ((code, msg), _) = abuse("cpu");
    assert_eq!(code, DEADLINE_EXCEEDED, "{msg}");
    assert!(
        msg.contains("request wall clock exceeded (policy spec.limits.wallSeconds: 5)"),
        "{msg}"
    );
}

#[test]
fn a_200_mib_stdout_flood_hits_the_output_budget_and_the_server_stays_small() {
    needs_root!(NEEDS_ROOT);
    let b = bed(&[]);
    let before = peak_rss_kib(&b.s);
    let h = b.hostile("stdout", "60s");
    b.s.wait_running(b.first, b.count, 1, || h.is_finished());
    b.honest(3);
    let (code, msg) = h.join().expect("thread").expect_err("must fail");
    assert_eq!(code, RESOURCE_EXHAUSTED, "{msg}");
    assert!(
        msg.contains("exceeded the stdout limit of 1048576 bytes (policy spec.limits.outputBytes)"),
        "{msg}"
    );
    b.assert_clean();
    // The flood went to the jail's budgeted reader, never to the supervisor: its peak RSS
    // grew by far less than the 200 MiB printed.
    let grown_kib = peak_rss_kib(&b.s).saturating_sub(before);
    assert!(
        grown_kib < 32 * 1024,
        "supervisor peak RSS grew {grown_kib} KiB"
    );
}

#[test]
fn filling_the_disk_stops_at_the_request_tmpfs() {
    needs_root!(NEEDS_ROOT);
    for mode in ["disk", "tmp"] {
        let ((code, msg), b) = abuse(mode);
        assert_eq!(code, RESOURCE_EXHAUSTED, "{mode}: {msg}");
        assert!(
            msg.contains("disk limit reached (policy spec.limits.diskBytes: 33554432)"),
            "{mode}: {msg}"
        );
        assert!(msg.contains("No space left on device"), "{mode}: {msg}");
        // The host's /tmp got nothing.
        assert!(!Path::new("/tmp/big").exists());
        drop(b);
    }
}

#[test]
fn thousands_of_open_files_hit_rlimit_nofile() {
    needs_root!(NEEDS_ROOT);
    let ((code, msg), _) = abuse("files");
    assert_eq!(code, UNKNOWN, "{msg}");
    assert!(msg.contains("Too many open files"), "{msg}");
}

#[test]
fn a_zombie_factory_is_stopped_by_the_pids_limit() {
    needs_root!(NEEDS_ROOT);
    let ((code, msg), _) = abuse("zombies");
    assert_eq!(code, RESOURCE_EXHAUSTED, "{msg}");
    assert!(
        msg.contains("process limit reached (policy spec.limits.pids: 64)"),
        "{msg}"
    );
}

/// Without namespaces (the layer that would otherwise take the daemon with the request's PID
/// namespace), a successful generate leaves two `sleep`s in a new session — proven running by
/// the request itself — and nothing of them is left once it is answered.
#[test]
fn a_daemon_left_by_a_successful_generate_dies_with_its_request() {
    needs_root!(NEEDS_ROOT);
    let mut limits = LIMITS.to_vec();
    limits.push(NO_NAMESPACES);
    let b = bed_with(&limits, &[]);
    let v = go(
        &b.s,
        "generate",
        &["-dir", &b.dir(), "-env", "ARGOCD_ENV_MODE=daemon"],
    )
    .expect("generate succeeds");
    assert_eq!(v["manifests"][0], r#"{"kind":"Daemons","running":2}"#);
    assert_eq!(v["manifests"][1], CM_JSON);
    b.assert_clean();
}

/// The client process dies mid-command (its connection closes; no deadline was reached: the
/// client asked for 120 s and the policy's wall clock is 300 s): the server cancels the
/// command, says so in the audit event, and reclaims everything well before any clock would.
#[test]
fn a_client_that_disconnects_mid_generate_leaves_nothing() {
    needs_root!(NEEDS_ROOT);
    let no_wall_clock: Vec<(&str, &str)> = LIMITS
        .iter()
        .copied()
        .filter(|(from, _)| !from.starts_with("wallSeconds"))
        .collect();
    let b = bed_with(&no_wall_clock, &[]);
    let started = b.s.logs().matches("command started").count();
    let mut client = std::process::Command::new(go_client())
        .arg("-socket")
        .arg(&b.s.sock)
        .args(["-rpc", "generate", "-dir", &b.dir(), "-env"])
        .arg("ARGOCD_ENV_MODE=sleep")
        .args(["-timeout", "120s"])
        .stdout(std::process::Stdio::null())
        .spawn()
        .expect("go client");
    // Wait until the command runs, then kill the client.
    let audit_lines = || b.s.audit_events().into_iter().collect::<Vec<_>>();
    b.s.wait_logged("command started", started + 1);
    let _ = client.kill();
    let _ = client.wait();
    let killed = Instant::now();
    b.honest(2);
    b.assert_clean();
    // A liveness bound: the reclaim follows the client's death, not the request's wall clock.
    assert!(
        killed.elapsed() < LIVENESS,
        "reclaimed only after {:?}",
        killed.elapsed()
    );
    let events = audit_lines();
    let gone = events
        .iter()
        .find(|e| e.code == "Cancelled")
        .unwrap_or_else(|| panic!("no audit event for the abandoned request: {events:?}"));
    assert_eq!(gone.commands[0].ended_by, Some(Limit::Cancelled), "{gone}");
    assert_eq!(gone.limit, Some(Limit::Cancelled), "{gone}");
}

/// SIGTERM while an honest (slow) request and a hostile (endless) one are both running: the
/// honest one is drained (answered within the grace period), the hostile one is cancelled when
/// the grace ends, and the server exits 0 with nothing left.
#[test]
fn sigterm_mid_request_drains_the_honest_request_and_reclaims_the_rest() {
    needs_root!(NEEDS_ROOT);
    let mut b = bed(&["--shutdown-grace", "3"]);
    let started = b.s.logs().matches("command started").count();
    let hostile = b.hostile("sleep", "60s");
    let honest = b.hostile("slow", "60s");
    // Both are running their commands.
    b.s.wait_logged("command started", started + 2);
    let status = b.s.stop();
    assert_eq!(status.code(), Some(0), "{}", b.s.logs());
    let v = honest
        .join()
        .expect("thread")
        .unwrap_or_else(|e| panic!("the in-flight honest request was not drained: {e:?}"));
    assert_eq!(v["manifests"][0], CM_JSON);
    let (code, msg) = hostile
        .join()
        .expect("thread")
        .expect_err("cancelled by shutdown");
    assert!(
        [UNAVAILABLE, 1 /* Cancelled */].contains(&code),
        "{code}: {msg}"
    );
    // The server is gone; so is everything of its requests, and the spare jail it kept ready
    // was retired on the way out.
    assert_eq!(b.s.idle_jails(), [], "{}", b.s.logs());
    b.s.assert_work_dir_empties();
    assert!(
        supervisor::processes_in_range(Path::new("/proc"), b.first, b.count).is_empty(),
        "processes survived the supervisor"
    );
    assert!(request_cgroups(b.first, false).is_empty());
    // ... and its instance directories: nothing of it stays in the host's cgroup tree.
    let left: Vec<_> = instance_cgroups(b.first)
        .into_iter()
        .filter(|d| d.exists())
        .collect();
    assert!(left.is_empty(), "instance cgroups left: {left:?}");
    assert!(!b.s.logs().contains("quarantined"), "{}", b.s.logs());
}

/// The server's child processes: (pid, real UID, state, command line).
fn children_of(parent: u32) -> Vec<(u32, Option<u32>, String, String)> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").expect("/proc").flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        let Some(rest) = stat.rfind(')').map(|i| &stat[i + 2..]) else {
            continue;
        };
        let mut f = rest.split_whitespace();
        let (Some(state), Some(ppid)) = (f.next(), f.next()) else {
            continue;
        };
        if ppid.parse::<u32>().ok() != Some(parent) {
            continue;
        }
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline"))
            .map(|c| String::from_utf8_lossy(&c).replace('\0', " "))
            .unwrap_or_default();
        out.push((
            pid,
            supervisor::proc_uid(pid as i32),
            state.to_owned(),
            cmdline,
        ));
    }
    out
}

/// `probe`'s answer once it has one (polled for up to 20 s).
fn settle<T>(what: &str, mut probe: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(v) = probe() {
            return v;
        }
        assert!(Instant::now() < deadline, "never: {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Jails are forked by the jail factory but are the server's own children (it waits for,
/// reaps and accounts them); a factory that dies — killed from outside here — is restarted
/// for the next jail, and requests go on being answered with nothing left behind.
#[test]
fn a_killed_jail_factory_is_restarted_and_jails_stay_the_servers_children() {
    needs_root!(NEEDS_ROOT);
    let b = bed(&[]);
    b.honest(2);
    let server = b.s.child.as_ref().expect("running").id();
    // The factory: the server's child running as root with the factory's command line. A jail
    // it has just forked carries the same until it switches to its UID (microseconds), so
    // wait for exactly one such process.
    let factory = |not: Option<u32>| {
        settle("exactly one factory", || {
            let found: Vec<u32> = children_of(server)
                .into_iter()
                .filter(|(_, uid, _, cmd)| *uid == Some(0) && cmd.contains("__factory"))
                .map(|k| k.0)
                .collect();
            match found[..] {
                [pid] if Some(pid) != not => Some(pid),
                _ => None,
            }
        })
    };
    let first = factory(None);
    // The idle spare jail (its leased UID) is the server's child, not the factory's.
    let idle = b.s.idle_jails();
    assert_eq!(idle.len(), 1, "{idle:?}");
    settle("the spare jail among the server's children", || {
        children_of(server)
            .iter()
            .any(|(_, uid, _, _)| uid.is_some() && *uid == idle[0].uid)
            .then_some(())
    });
    assert!(children_of(first).is_empty(), "the factory keeps no child");

    rustix::process::kill_process(
        rustix::process::Pid::from_raw(first as i32).expect("pid"),
        rustix::process::Signal::KILL,
    )
    .expect("kill the factory");
    b.honest(3);
    let logs = b.s.logs();
    assert!(
        logs.contains("the jail factory failed; restarting it"),
        "{logs}"
    );
    let second = factory(Some(first));

    // A factory that stops answering (SIGSTOP) is given up after its answer timeout (5 s)
    // and replaced: the request after the stop takes the spare made before it, the next
    // spare comes from the replacement.
    rustix::process::kill_process(
        rustix::process::Pid::from_raw(second as i32).expect("pid"),
        rustix::process::Signal::STOP,
    )
    .expect("stop the factory");
    b.honest(1);
    let third = factory(Some(second));
    settle("a spare from the replacement", || {
        (b.s.idle_jails().len() == 1).then_some(())
    });
    b.honest(2);
    assert_eq!(factory(None), third, "the replacement serves on");
    assert!(
        !Path::new(&format!("/proc/{second}")).exists(),
        "the stopped factory was killed and reaped"
    );
    b.assert_clean();
    // Every jail that ran was reaped by the server (the dead factory too): no zombie child.
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let zombies: Vec<_> = children_of(server)
            .into_iter()
            .filter(|(_, _, st, _)| st == "Z")
            .collect();
        if zombies.is_empty() {
            break;
        }
        assert!(Instant::now() < deadline, "unreaped children: {zombies:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn an_environment_flood_and_a_huge_app_rel_path_are_refused_at_once_with_bounded_text() {
    needs_root!(NEEDS_ROOT);
    let b = bed(&[]);
    let dir = b.dir();
    // 60,000 distinct ARGOCD_ENV_* entries (~1.6 MB): once a worker thread's ~10 s.
    let flood = generate_in_background(&b.s, &dir, &["-env-flood", "60000"]);
    // Fewer entries, but over a MiB of values (each argument stays under the kernel's 128 KiB).
    let value = "v".repeat(120 << 10);
    let big: Vec<String> = (0..9)
        .flat_map(|i| ["-env".to_owned(), format!("ARGOCD_ENV_BIG_{i}={value}")])
        .collect();
    let big_args: Vec<&str> = big.iter().map(String::as_str).collect();
    let heavy = generate_in_background(&b.s, &dir, &big_args);
    // A 100,000-character appRelPath: once echoed whole in the status message.
    let long = generate_in_background(&b.s, &dir, &["-app-rel-path", &"a/".repeat(50_000)]);
    // A missing app directory: said plainly, without the server's own paths.
    let missing = generate_in_background(&b.s, &dir, &["-app-rel-path", "apps/nope"]);
    b.honest(3);
    let (code, msg) = flood.join().expect("thread").expect_err("flood refused");
    assert_eq!(code, INVALID_ARGUMENT, "{msg}");
    assert!(
        msg.contains("the request carries 60000 environment entries; at most 4096"),
        "{msg}"
    );
    let (code, msg) = heavy
        .join()
        .expect("thread")
        .expect_err("heavy env refused");
    assert_eq!(code, INVALID_ARGUMENT, "{msg}");
    assert!(
        msg.contains("the request's environment holds more than 1048576 bytes"),
        "{msg}"
    );
    assert!(msg.len() < 1024, "{} bytes", msg.len());
    let (code, msg) = long.join().expect("thread").expect_err("long path refused");
    assert_eq!(code, INVALID_ARGUMENT, "{msg}");
    assert!(
        msg.contains("appRelPath is 100000 bytes long; at most 4096"),
        "{msg}"
    );
    assert!(msg.len() < 1024, "{} bytes", msg.len());
    let (code, msg) = missing
        .join()
        .expect("thread")
        .expect_err("missing app dir");
    assert_eq!(code, UNKNOWN, "{msg}");
    assert_eq!(
        msg,
        "error generating manifests: chdir apps/nope: no such file or directory (appRelPath \"apps/nope\" does not exist in the repository)"
    );
    b.assert_clean();
}

#[test]
fn yaml_alias_amplification_is_refused_as_it_expands_and_the_supervisor_stays_small() {
    needs_root!(NEEDS_ROOT);
    // ~513 KiB of output that expands (200 aliases of a 512 KiB scalar) to ~100 MiB of JSON;
    // with a 16 MiB message limit the expansion is refused after ~32 copies.
    let pol = tempfile::tempdir().expect("tmp");
    let pol_file = pol.path().join("policy.yaml");
    let (first, count) = write_policy(&pol_file, LIMITS);
    let s = Server::start_env(
        &plugin(MODES),
        &["--policy", pol_file.to_str().expect("utf8")],
        &[("ARGOCD_GRPC_MAX_SIZE_MB", "16")],
    );
    let b = Bed {
        s,
        repo: repo(&[("cm.yaml", CM)]),
        first,
        count,
        _pol: pol,
    };
    let before = peak_rss_kib(&b.s);
    let attacks: Vec<_> = (0..3).map(|_| b.hostile("amplify", "60s")).collect();
    b.honest(3);
    for a in attacks {
        let (code, msg) = a.join().expect("thread").expect_err("refused");
        assert_eq!(code, RESOURCE_EXHAUSTED, "{msg}");
        assert!(
            msg.contains(
                "the manifests expand to more than 16777216 bytes (YAML aliases included)"
            ) && msg.contains("ARGOCD_GRPC_MAX_SIZE_MB"),
            "{msg}"
        );
    }
    b.assert_clean();
    // Nothing of the expansion reached the supervisor.
    let grown_kib = peak_rss_kib(&b.s).saturating_sub(before);
    assert!(
        grown_kib < 32 * 1024,
        "supervisor peak RSS grew {grown_kib} KiB"
    );
}

#[test]
fn concurrent_large_replies_wait_their_turn_and_all_arrive() {
    needs_root!(NEEDS_ROOT);
    // Four legal replies of ~3.5 MB of manifest each (quotes: ~5.6 MB once escaped in the
    // jail's frame) against a 4 MiB message limit, whose reply memory (8 MiB) holds one at a
    // time: they take turns, and every one arrives whole.
    let pol = tempfile::tempdir().expect("tmp");
    let pol_file = pol.path().join("policy.yaml");
    // The default output budget (each command prints ~2 MB) and wall clock (the four wait for
    // each other), the other limits small; a directory every jail may write: their barrier.
    let barrier = tempfile::tempdir_in("/var/tmp").expect("tmp");
    std::fs::set_permissions(
        barrier.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o1777),
    )
    .expect("chmod");
    let rw = format!(
        "readWrite: [/dev/null, /dev/zero, /dev/full, {}]",
        barrier.path().display()
    );
    let mut limits: Vec<(&str, &str)> = LIMITS
        .iter()
        .copied()
        .filter(|(from, _)| !from.starts_with("outputBytes") && !from.starts_with("wallSeconds"))
        .collect();
    limits.push(("readWrite: [/dev/null, /dev/zero, /dev/full]", &rw));
    let (first, count) = write_policy(&pol_file, &limits);
    let s = Server::start_env(
        &plugin(MODES),
        &["--policy", pol_file.to_str().expect("utf8")],
        &[("ARGOCD_GRPC_MAX_SIZE_MB", "4")],
    );
    let b = Bed {
        s,
        repo: repo(&[("cm.yaml", CM)]),
        first,
        count,
        _pol: pol,
    };
    let before = peak_rss_kib(&b.s);
    // All four print once all four run (whatever the machine's pace), so their replies overlap.
    let barrier_env = format!("ARGOCD_ENV_BARRIER={}", barrier.path().display());
    let large: Vec<_> = (0..4)
        .map(|_| {
            generate_in_background(
                &b.s,
                &b.dir(),
                &[
                    "-env",
                    "ARGOCD_ENV_MODE=large",
                    "-env",
                    &barrier_env,
                    "-env",
                    "ARGOCD_ENV_PARTIES=4",
                    "-timeout",
                    "120s",
                ],
            )
        })
        .collect();
    b.honest(2);
    let value = "\"q\"".repeat(700_000);
    for l in large {
        let v = l
            .join()
            .expect("thread")
            .unwrap_or_else(|e| panic!("a large reply failed: {e:?}\n{}", b.s.logs()));
        let doc: serde_json::Value =
            serde_json::from_str(v["manifests"][0].as_str().expect("manifest")).expect("json");
        assert_eq!(doc["data"]["v"].as_str(), Some(value.as_str()));
    }
    // They took turns: the budget held the others back.
    assert!(
        b.s.logs()
            .contains("a large reply waits for the server's reply memory"),
        "{}",
        b.s.logs()
    );
    b.assert_clean();
    // A sanity bound on the process (each reply's copies land in its thread's malloc arena, so
    // RSS counts every arena's high-water mark, not only what is live at once).
    let grown_kib = peak_rss_kib(&b.s).saturating_sub(before);
    assert!(
        grown_kib < 64 * 1024,
        "supervisor peak RSS grew {grown_kib} KiB"
    );
}

#[test]
fn a_full_queue_refuses_at_once_naming_the_flags_and_queued_requests_keep_their_archive_clock() {
    needs_root!(NEEDS_ROOT);
    // One slot, one queue place, and an archive wall clock shorter than the wait in the queue.
    let limits: Vec<(&str, &str)> = LIMITS
        .iter()
        .copied()
        .filter(|(from, _)| !from.starts_with("wallSeconds"))
        .chain([
            ("wallSeconds: 300", "wallSeconds: 20"),
            ("wallSeconds: 120", "wallSeconds: 2"),
        ])
        .collect();
    let b = bed_with(
        &limits,
        &[
            "--max-in-flight",
            "1",
            "--max-queued",
            "1",
            "--metrics-address",
            "127.0.0.1:0",
        ],
    );
    let dir = b.dir();
    // Holds the slot ~3 s, past the queued one's 2 s archive clock.
    let running = generate_in_background(
        &b.s,
        &dir,
        &["-env", "ARGOCD_ENV_MODE=slow3", "-timeout", "30s"],
    );
    assert!(wait_for_log(&b.s, "\"phase\":\"generate\""));
    // Still sending when its slot comes (six 1 KiB chunks, 0.7 s apart), so its archive clock
    // is really waited on after the queue.
    let noise = noise_repo();
    let queued = generate_in_background(
        &b.s,
        noise.path().to_str().expect("utf8"),
        &["-chunk", "1024", "-chunk-delay", "700ms", "-timeout", "30s"],
    );
    b.s.wait_logged("request queued for a slot", 1);
    // The queue is full: refused at once, saying which flags bound it.
    let (code, msg) = go(&b.s, "generate", &["-dir", &dir]).expect_err("queue full");
    assert_eq!(code, RESOURCE_EXHAUSTED, "{msg}");
    assert!(
        msg.contains("--max-in-flight 1, --max-queued 1") && msg.contains("retry"),
        "{msg}"
    );
    // At once: while the running request still holds the only slot (a refusal that waited
    // for a slot would come after it).
    assert!(
        !running.is_finished(),
        "the refusal waited for the running request to end"
    );
    // Counted where an alert reads it (deploy/monitoring).
    assert!(
        b.s.metrics()
            .contains("\ncmp_warden_admission_refusals_total 1\n")
    );
    // And audited, once, with the admission as its cause (docs/audit.md: one line per request,
    // those refused before any sandbox too).
    let refused: Vec<_> =
        b.s.audited(1)
            .into_iter()
            .filter(|e| e.limit.map(|l| l.as_str()) == Some("concurrency"))
            .collect();
    assert_eq!(refused.len(), 1, "{refused:#?}");
    assert_eq!(
        (refused[0].rpc.as_str(), refused[0].code.as_str()),
        ("GenerateManifest", "ResourceExhausted"),
        "{refused:#?}"
    );
    running
        .join()
        .expect("thread")
        .expect("the running request");
    // The queued request waited ~3 s for its slot, longer than archive.wallSeconds, and still
    // succeeds: time in the queue is not time spent receiving.
    let v = queued
        .join()
        .expect("thread")
        .unwrap_or_else(|e| panic!("the queued request failed: {e:?}\n{}", b.s.logs()));
    assert_eq!(v["manifests"][0], CM_JSON);
    b.assert_clean();
}

/// A server whose range leases 8 UIDs, with a short stream idle timeout.
fn small_pool_bed(idle: &str) -> Bed {
    small_pool_bed_with(idle, LIMITS)
}

/// [`small_pool_bed`] with other policy edits.
fn small_pool_bed_with(idle: &str, edits: &[(&str, &str)]) -> Bed {
    let pol = tempfile::tempdir().expect("tmp");
    let pol_file = pol.path().join("policy.yaml");
    let (first, _) = write_policy(&pol_file, edits);
    let text = std::fs::read_to_string(&pol_file).expect("policy");
    let text = text.replacen(
        &format!("first: {first}, count: 16"),
        &format!("first: {first}, count: 8"),
        1,
    );
    std::fs::write(&pol_file, text).expect("policy");
    let s = Server::start(
        &plugin(MODES),
        &[
            "--policy",
            pol_file.to_str().expect("utf8"),
            "--stream-idle-timeout",
            idle,
        ],
    );
    assert!(s.logs().contains("\"max_in_flight\":7") || wait_for_log(&s, "\"max_in_flight\":7"));
    Bed {
        s,
        repo: repo(&[("cm.yaml", CM)]),
        first,
        count: 8,
        _pol: pol,
    }
}

fn wait_for_log(s: &Server, what: &str) -> bool {
    let deadline = Instant::now() + Duration::from_secs(5);
    while Instant::now() < deadline {
        if s.logs().contains(what) {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    false
}

/// A client that pauses `delay` before each 1 KiB chunk of a ~3 KiB repository.
fn slow_client(b: &Bed, dir: &Path, delay: &str) -> std::thread::JoinHandle<CallResult> {
    generate_in_background(
        &b.s,
        dir.to_str().expect("utf8"),
        &["-chunk", "1024", "-chunk-delay", delay, "-timeout", "60s"],
    )
}

fn noise_repo() -> tempfile::TempDir {
    // Incompressible, so the archive is several 1 KiB chunks.
    let noise: String = (0..6000u32)
        .map(|i| char::from(b'a' + (i.wrapping_mul(2_654_435_761) >> 27) as u8 % 26))
        .collect();
    repo(&[("cm.yaml", CM), ("noise.txt", &noise)])
}

#[test]
fn stalled_streams_hold_no_jail_and_end_at_the_idle_timeout() {
    needs_root!(NEEDS_ROOT);
    let b = small_pool_bed("2");
    let r = noise_repo();
    // Twenty clients that send metadata and then nothing for 30 s: once 604 jail processes
    // and every UID of the pool.
    let stalled: Vec<_> = (0..20).map(|_| slow_client(&b, r.path(), "30s")).collect();
    // Every stream's metadata received (where a jail would have been prepared), then an
    // observation window: what is checked is that nothing happens in it.
    b.s.wait_logged("\"request received\"", 20);
    std::thread::sleep(Duration::from_millis(500));
    let procs = b.s.leftover_processes(b.first, b.count);
    assert!(
        procs.len() <= 2,
        "jails prepared for streams that sent no archive: {procs:?}"
    );
    b.honest(3);
    for h in stalled {
        let (code, msg) = h.join().expect("thread").expect_err("stalled");
        assert_eq!(code, DEADLINE_EXCEEDED, "{msg}");
        assert!(
            msg.contains("no message for 2 s (the stream stalled; --stream-idle-timeout)"),
            "{msg}"
        );
    }
    b.assert_clean();
}

/// Twenty clients that send their metadata and the first part of the archive — so each
/// holds a slot, a jail and a UID — and then stall: against 7 slots, they would keep every one
/// until the archive's wall clock. A stream holding a slot may pause only briefly
/// (`HELD_STREAM_IDLE_SECS`), so those holding one are ended with DeadlineExceeded naming it,
/// their slots go back, and an honest request queued behind them succeeds within its 30 s
/// deadline: the 13 queued ahead of it hold slots in two more waves of at most 5 s each
/// (with the bound removed, each stalled stream keeps its slot for the whole
/// `--stream-idle-timeout`, 60 s here, and the honest request starves).
#[test]
fn streams_that_stall_mid_archive_lose_their_slot_and_do_not_starve_an_honest_request() {
    needs_root!(NEEDS_ROOT);
    // A wall clock far beyond the test: only the bound on a held stream's pauses frees slots.
    let edits: Vec<(&str, &str)> = LIMITS
        .iter()
        .map(|&(from, to)| {
            if from.starts_with("wallSeconds") {
                (from, "wallSeconds: 120")
            } else {
                (from, to)
            }
        })
        .collect();
    let b = small_pool_bed_with("60", &edits);
    let r = noise_repo();
    let stalled: Vec<_> = (0..20)
        .map(|_| {
            generate_in_background(
                &b.s,
                r.path().to_str().expect("utf8"),
                &[
                    "-chunk",
                    "64",
                    "-stall-after",
                    "2",
                    "-stall",
                    "70s",
                    "-timeout",
                    "90s",
                ],
            )
        })
        .collect();
    // Every slot taken by a stalled stream, more of them queued.
    let deadline = Instant::now() + Duration::from_secs(30);
    while b.s.logs().matches("\"jail taken\"").count() < 7 {
        assert!(
            Instant::now() < deadline,
            "the stalled streams never held the slots:\n{}",
            b.s.logs()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let started = Instant::now();
    let honest = generate_in_background(
        &b.s,
        b.repo.path().to_str().expect("utf8"),
        &["-timeout", "30s"],
    );
    let v = honest
        .join()
        .expect("thread")
        .unwrap_or_else(|e| panic!("the honest request was starved: {e:?}\n{}", b.s.logs()));
    assert_eq!(v["manifests"][0], CM_JSON);
    // A liveness bound (not starved behind the stalled streams' bounds).
    assert!(started.elapsed() < LIVENESS, "{:?}", started.elapsed());
    // Every stalled stream got a slot in its turn (nothing is read from a queued stream, so
    // it held nothing while queued) and was ended at the bound, long before its stall ended.
    for h in stalled {
        let (code, msg) = h.join().expect("thread").expect_err("stalled");
        assert_eq!(code, DEADLINE_EXCEEDED, "{msg}");
        assert!(
            msg.contains("while the request held a sandbox slot"),
            "{msg}"
        );
    }
    b.assert_clean();
}

#[test]
fn more_slow_requests_than_uids_wait_their_turn_instead_of_failing() {
    needs_root!(NEEDS_ROOT);
    let b = small_pool_bed("5");
    let r = noise_repo();
    // 20 requests that each hold a jail ~4 s (chunks 1 s apart), against 7 slots: they and an
    // honest request queue for a slot; none fails for want of a UID.
    let slow: Vec<_> = (0..20).map(|_| slow_client(&b, r.path(), "1s")).collect();
    // The honest request comes once the server has received all of them.
    b.s.wait_logged("\"msg\":\"request received\"", 20);
    b.honest(1);
    for h in slow {
        let v = h
            .join()
            .expect("thread")
            .unwrap_or_else(|e| panic!("a queued request failed: {e:?}\n{}", b.s.logs()));
        assert_eq!(v["manifests"][0], CM_JSON);
    }
    assert!(
        !b.s.logs().contains("no sandbox UID free"),
        "{}",
        b.s.logs()
    );
    b.assert_clean();
}

/// A second instance on the same UID range that does not share the first's lease directory
/// (its own socket directory, so its own default lease directory) cannot tell the first's
/// leases; its start-up sweep once killed the first's in-flight work ("the jail exited without
/// a reply"). It now finds the live instance above those processes, refuses to start (exit
/// 20) naming it, the range and the fix, and the first's requests all succeed.
#[test]
fn a_second_instance_on_the_same_range_without_its_leases_refuses_and_harms_nothing() {
    needs_root!(NEEDS_ROOT);
    let pol = tempfile::tempdir().expect("tmp");
    let pol_file = pol.path().join("policy.yaml");
    write_policy(&pol_file, LIMITS);
    let args = ["--policy", pol_file.to_str().expect("utf8")];
    let a = Server::start(&plugin(MODES), &args);
    let r = repo(&[("cm.yaml", CM)]);
    let dir = r.path().to_str().expect("utf8").to_owned();
    let started = a.logs().matches("command started").count();
    let load: Vec<_> = (0..3)
        .map(|_| generate_in_background(&a, &dir, &["-env", "ARGOCD_ENV_MODE=slow"]))
        .collect();
    a.wait_logged("command started", started + 3);
    // B: the same policy (range), its own socket and work directories.
    let b = tempfile::tempdir().expect("tmp");
    for d in ["config", "plugins", "work"] {
        std::fs::create_dir_all(b.path().join(d)).expect("mkdir");
    }
    std::fs::write(b.path().join("config/plugin.yaml"), plugin(MODES)).expect("plugin");
    let out = std::process::Command::new(bin())
        .arg("--config-dir-path")
        .arg(b.path().join("config"))
        .args(args)
        .env("ARGOCD_PLUGINSOCKFILEPATH", b.path().join("plugins"))
        .env("ARGOCD_CMP_WORKDIR", b.path().join("work"))
        .output()
        .expect("second instance");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(20), "{err}");
    let a_pid = a.child.as_ref().expect("child").id();
    assert!(
        err.contains(&format!("another live cmp-warden (PID {a_pid})"))
            && err.contains("CMP_WARDEN_LEASE_DIR")
            && err.contains("nothing of the other instance was touched"),
        "{err}"
    );
    for h in load {
        h.join()
            .expect("thread")
            .unwrap_or_else(|e| panic!("A's request was harmed: {e:?}\n{}", a.logs()));
    }
    a.assert_work_dir_empties();
}

/// Two instances with adjacent ranges (B's starts where A's ends), each with its own socket
/// and so lease directory, the tree cache on: A's cache identity was once `first + count`,
/// B's first UID, so B's start-up sweep killed A's keeper and A's next new archive failed
/// (`Internal: tree cache: fill: keeper: sending Fill: Broken pipe`). The identity now
/// defaults to 65535, outside both ranges (one a process already runs as is skipped), and
/// both instances fill new archives after B started.
#[test]
fn adjacent_ranges_with_their_own_lease_directories_lose_no_request() {
    needs_root!(NEEDS_ROOT);
    let pol = tempfile::tempdir().expect("tmp");
    let pol_a = pol.path().join("a/policy.yaml");
    let pol_b = pol.path().join("b/policy.yaml");
    std::fs::create_dir_all(pol_a.parent().expect("dir")).expect("mkdir");
    std::fs::create_dir_all(pol_b.parent().expect("dir")).expect("mkdir");
    let (first, count) = write_policy(&pol_a, LIMITS);
    // B: the range right above A's (this test's allocation leaves it free).
    write_policy(&pol_b, LIMITS);
    let text = std::fs::read_to_string(&pol_b).expect("policy");
    let at = text.find("uidRange: {first: ").expect("uidRange");
    let end = at + text[at..].find('}').expect("}") + 1;
    let text = format!(
        "{}uidRange: {{first: {}, count: {count}}}{}",
        &text[..at],
        first + count,
        &text[end..]
    );
    std::fs::write(&pol_b, text).expect("policy");
    let keeper_uid = |s: &Server| -> u32 {
        let pid = s.keeper_pid();
        let st = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("keeper alive");
        st.lines()
            .find_map(|l| l.strip_prefix("Uid:"))
            .and_then(|ids| ids.split_whitespace().next()?.parse().ok())
            .expect("uid")
    };
    let new_archive = |s: &Server, tag: &str| {
        let r = repo(&[(
            "cm.yaml",
            &CM.replace("name: cm", &format!("name: cm-{tag}")),
        )]);
        go(s, "generate", &["-dir", r.path().to_str().expect("utf8")])
            .unwrap_or_else(|e| panic!("{tag}: {e:?}\n{}", s.logs()))
    };
    let a = Server::start(&plugin(MODES), &["--policy", pol_a.to_str().expect("utf8")]);
    new_archive(&a, "a1");
    let b = Server::start(&plugin(MODES), &["--policy", pol_b.to_str().expect("utf8")]);
    new_archive(&a, "a2");
    new_archive(&b, "b1");
    new_archive(&a, "a3");
    assert_eq!(
        a.tree_cache_uses(3),
        ["filled", "filled", "filled"],
        "{}",
        a.logs()
    );
    assert_eq!(b.tree_cache_uses(1), ["filled"], "{}", b.logs());
    let (ka, kb) = (keeper_uid(&a), keeper_uid(&b));
    let both = first..first + 2 * count;
    assert!(
        !both.contains(&ka) && !both.contains(&kb) && ka != kb,
        "{ka} {kb} {both:?}"
    );
    assert!(!a.logs().contains("OUT OF SERVICE"), "{}", a.logs());
}

#[test]
fn two_instances_sharing_a_uid_range_never_touch_each_others_requests() {
    needs_root!(NEEDS_ROOT);
    // One policy (one UID range) for both, and the lease directory they share (in a pod: the
    // plugin socket directory).
    let pol = tempfile::tempdir().expect("tmp");
    let pol_file = pol.path().join("policy.yaml");
    let (first, count) = write_policy(&pol_file, LIMITS);
    let leases = pol.path().join("leases");
    let lease_env = [("CMP_WARDEN_LEASE_DIR", leases.to_str().expect("utf8"))];
    let args = ["--policy", pol_file.to_str().expect("utf8")];
    let a = Server::start_env(&plugin(MODES), &args, &lease_env);
    let r = repo(&[("cm.yaml", CM)]);
    let dir = r.path().to_str().expect("utf8").to_owned();
    let call = |s: &Server, mode: &str| {
        generate_in_background(s, &dir, &["-env", &format!("ARGOCD_ENV_MODE={mode}")])
    };
    // A is busy (each request holds its UID ~1.5 s) while B starts: B's start-up sweep must
    // leave A's jails alone.
    let started = a.logs().matches("command started").count();
    let mut load: Vec<_> = (0..6).map(|_| call(&a, "slow")).collect();
    a.wait_logged("command started", started + 6);
    let b = Server::start_env(&plugin(MODES), &args, &lease_env);
    assert!(
        b.logs().contains("the UID range is shared"),
        "B must say the range is contended:\n{}",
        b.logs()
    );
    // Both under load at once.
    for _ in 0..6 {
        load.push(call(&a, "slow"));
        load.push(call(&b, "slow"));
    }
    let mut failed = Vec::new();
    for h in load {
        match h.join().expect("thread") {
            Ok(v) => assert_eq!(v["manifests"][0], CM_JSON),
            Err(e) => failed.push(e),
        }
    }
    assert!(
        failed.is_empty(),
        "failed requests: {failed:?}\nA:\n{}\nB:\n{}",
        a.logs(),
        b.logs()
    );
    for s in [&a, &b] {
        s.assert_work_dir_empties();
    }
    // Once both stop (their spare jails too), nothing of either is left in the shared range.
    drop(a);
    drop(b);
    let deadline = Instant::now() + Duration::from_secs(10);
    while !supervisor::processes_in_range(Path::new("/proc"), first, count).is_empty() {
        assert!(Instant::now() < deadline, "processes left in the range");
        std::thread::sleep(Duration::from_millis(50));
    }
}
