//! Faults, not attacks.
//! - The node's disk under the work directory fills up while a request extracts, or while its
//!   command writes: the request fails with a message that names that disk (not the request's
//!   own limit, which was not reached), the server keeps serving, nothing of the request is
//!   left, and the next request succeeds once there is room again.
//! - A request's jail process is killed (SIGKILL) mid-command: its client hears which signal,
//!   and that no policy limit did it, at once; nothing of the request is left.
//! - The server is killed (SIGKILL) at each step of a request (its archive arriving, being
//!   extracted into its tree or the tree cache's, its command running, right after its
//!   answer): the client gets an error at once, not at its deadline (or its answer, and the
//!   answer's audit event is written); the restarted server (same directories, policy and
//!   UID range) finds and removes everything of the dead one's request, serves a whole tree,
//!   and stops clean.
//! - Kubernetes stops the container under load (SIGTERM): health watchers hear NOT_SERVING,
//!   the socket is gone at once (Argo CD's repo-server, which lists the socket directory per
//!   request, stops offering the plugin), the requests in flight finish within the grace
//!   period, and the server exits 0 with nothing left.
#![allow(clippy::print_stderr)] // a skip must say why

#[macro_use]
mod common;

use std::path::Path;
use std::process::Command;

use common::*;

const NEEDS_ROOT: &str = "fault tests need root (CI runs as root): a tmpfs mount, leased UIDs";

/// `ARGOCD_ENV_MODE=fill`: write until the disk is full (`dd` fails), then print the manifest
/// (the failure is hidden from the exit code, as a careless script's would be); `slow`: take
/// two seconds first; `hang`: sleep for a minute; `daemon`: also leave a daemon in a new
/// session that ignores SIGTERM (it outlives its jail where there is no PID namespace).
const SPEC: &str = "  generate:\n    command: [sh, -c]\n    args:\n      - |\n        if [ \"$ARGOCD_ENV_MODE\" = fill ]; then dd if=/dev/zero of=fill bs=1M count=64 2>/dev/null; fi\n        if [ \"$ARGOCD_ENV_MODE\" = slow ]; then sleep 2; fi\n        if [ \"$ARGOCD_ENV_MODE\" = daemon ]; then setsid sh -c \"trap '' TERM; exec sleep 300\" </dev/null >/dev/null 2>&1 & fi\n        if [ \"$ARGOCD_ENV_MODE\" = hang ] || [ \"$ARGOCD_ENV_MODE\" = daemon ]; then sleep 60; fi\n        if [ \"$ARGOCD_ENV_MODE\" = big ]; then printf '{\"kind\":\"ConfigMap\",\"data\":{\"x\":\"'; head -c 1048576 /dev/zero | tr '\\0' a; printf '\"}}\\n'; exit 0; fi\n        if [ -f big.txt ] && [ \"$(wc -c < big.txt)\" != 33554432 ]; then echo \"big.txt is not whole\" >&2; exit 1; fi\n        cat cm.yaml\n";

/// A tmpfs of `size` at `at`, unmounted (lazily) when dropped.
struct Tmpfs(std::path::PathBuf);

impl Tmpfs {
    fn mount(at: &Path, size: &str) -> Tmpfs {
        std::fs::create_dir_all(at).expect("mkdir");
        let st = Command::new("mount")
            .args([
                "-t",
                "tmpfs",
                "-o",
                &format!("size={size},mode=0755"),
                "tmpfs",
            ])
            .arg(at)
            .status()
            .expect("mount");
        assert!(st.success(), "mount tmpfs at {}", at.display());
        Tmpfs(at.to_owned())
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

#[test]
fn a_full_work_disk_fails_the_request_naming_the_disk_and_the_next_one_succeeds() {
    needs_root!(NEEDS_ROOT);
    let base = tempfile::Builder::new()
        .prefix("cmpw-disk")
        .tempdir()
        .expect("tmp");
    let work = base.path().join("work");
    let _disk = Tmpfs::mount(&work, "4m");
    // No mount namespace: the request's tree is extracted into the work directory itself (as
    // under containerd's RuntimeDefault profile), on the disk that fills.
    let pol = base.path().join("policy/policy.yaml");
    write_policy(
        &pol,
        &[(
            "namespaces: [mount, pid, net, ipc, uts, cgroup]",
            "namespaces: [pid, net, ipc, uts, cgroup]",
        )],
    );
    let s = Server::start_env(
        &plugin(SPEC),
        &["--policy", pol.to_str().expect("utf8")],
        &[("ARGOCD_CMP_WORKDIR", work.to_str().expect("utf8"))],
    );
    let big = noise(6 << 20, 1);
    let full = repo(&[("cm.yaml", "a: 1\n"), ("big.txt", &big)]);
    let small = repo(&[("cm.yaml", "kind: ConfigMap\n")]);
    let (code, msg) = go(
        &s,
        "generate",
        &["-dir", full.path().to_str().expect("utf8")],
    )
    .expect_err("a tree larger than the work disk");
    // The disk that filled, and what changes it; not the request's own disk limit, which
    // does not apply here (mutant: the jail's WorkDisk branch removed -> no such text).
    assert_eq!(code, RESOURCE_EXHAUSTED, "{msg}");
    assert!(
        msg.contains("the work directory's disk is full")
            && msg.contains("spec.namespaces")
            && msg.contains("No space left on device")
            && !msg.contains("disk limit reached"),
        "{msg}"
    );
    s.wait_settled(1);
    let ev = s.audit_events();
    assert_eq!(ev[0].limit, Some(Limit::WorkDisk), "{ev:?}");
    // Nothing of the request is left, so the disk has its room back ...
    s.assert_work_dir_empties();
    let free = rustix::fs::statvfs(&work).expect("statvfs");
    assert!(
        free.f_bavail * free.f_bsize > 3 << 20,
        "the failed request's bytes stay on the work disk: {} bytes free",
        free.f_bavail * free.f_bsize
    );
    // ... and the server, still serving, answers the next request.
    let small_dir = small.path().to_str().expect("utf8");
    let v = go(&s, "generate", &["-dir", small_dir]).expect("the next request, with room again");
    assert_eq!(manifests(&v), vec![r#"{"kind":"ConfigMap"}"#]);
    // Mid-command: a command that fills the disk and hides it (its script exits 0) is not
    // served as a success with whatever it printed; the disk is named.
    let (code, msg) = go(
        &s,
        "generate",
        &["-dir", small_dir, "-env", "ARGOCD_ENV_MODE=fill"],
    )
    .expect_err("a command that filled the work disk");
    assert_eq!(code, RESOURCE_EXHAUSTED, "{msg}");
    assert!(msg.contains("the work directory's disk is full"), "{msg}");
    s.wait_settled(3);
    assert_eq!(s.audit_events()[2].limit, Some(Limit::WorkDisk));
    s.assert_work_dir_empties();
    go(&s, "generate", &["-dir", small_dir]).expect("served again once the tree is gone");
    checked(
        "a full work disk: mid-extraction and mid-command, the request fails naming the work directory's disk (limit workDisk), its output withheld; the server serves the next request once there is room; nothing of either left",
    );
}

/// A gRPC health Watch on the unix socket (grpcio, as a load balancer or mesh would hold one):
/// prints each status as hex (0801 SERVING, 0802 NOT_SERVING) and ends after NOT_SERVING.
const WATCH: &str = r#"
import sys, grpc
ch = grpc.insecure_channel('unix:' + sys.argv[1])
watch = ch.unary_stream('/grpc.health.v1.Health/Watch', request_serializer=lambda x: x, response_deserializer=lambda x: x)
for r in watch(b'', timeout=60):
    print(r.hex(), flush=True)
    if r.hex() == '0802':
        break
"#;

#[test]
fn sigterm_under_load_refuses_new_requests_and_finishes_the_ones_in_flight() {
    needs_root!(NEEDS_ROOT);
    let pol = tempfile::tempdir().expect("tmp");
    let pol_file = pol.path().join("policy.yaml");
    let (first, count) = write_policy(&pol_file, &[]);
    let mut s = Server::start(
        &plugin(SPEC),
        &[
            "--policy",
            pol_file.to_str().expect("utf8"),
            "--shutdown-grace",
            "20",
        ],
    );
    let r = repo(&[("cm.yaml", "kind: ConfigMap\n")]);
    let dir = r.path().to_str().expect("utf8").to_owned();
    let mut watcher = Command::new("/usr/bin/python3")
        .args(["-c", WATCH])
        .arg(&s.sock)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("python3 (python3-grpcio: scripts/setup)");
    let mut lines = std::io::BufRead::lines(std::io::BufReader::new(
        watcher.stdout.take().expect("stdout"),
    ));
    assert_eq!(lines.next().and_then(Result::ok).as_deref(), Some("0801"));
    let started = s.logs().matches("command started").count();
    go_client();
    let in_flight: Vec<_> = (0..2)
        .map(|_| generate_in_background(&s, &dir, "slow"))
        .collect();
    s.wait_logged("command started", started + 2);
    let mut child = s.child.take().expect("running");
    rustix::process::kill_process(
        rustix::process::Pid::from_child(&child),
        rustix::process::Signal::TERM,
    )
    .expect("SIGTERM");
    // The watcher hears NOT_SERVING (mutant: the listener's NotServing update removed -> it
    // never does, and its stream ends with the connection instead).
    assert_eq!(lines.next().and_then(Result::ok).as_deref(), Some("0802"));
    watcher.wait().expect("watcher");
    // A new request finds no socket (Argo CD's repo-server lists the socket directory for
    // each request, so it no longer offers the plugin), and a client that still dials the
    // path is refused at once (no such file), not at its deadline.
    s.wait_logged("shutting down: socket removed, draining", 1);
    assert!(!s.sock.exists(), "the socket outlived SIGTERM");
    let out = Command::new(bin())
        .args(["client", "--socket"])
        .arg(&s.sock)
        .arg("check")
        .output()
        .expect("cmp-warden client");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success()
            && err.contains("connecting to the plugin socket")
            && err.contains("No such file or directory"),
        "{err}"
    );
    // The ones in flight are answered in full.
    for h in in_flight {
        let v = h
            .join()
            .expect("thread")
            .unwrap_or_else(|e| panic!("an in-flight request was not drained: {e:?}"));
        assert_eq!(manifests(&v), vec![r#"{"kind":"ConfigMap"}"#]);
    }
    let status = child.wait().expect("wait");
    assert_eq!(status.code(), Some(0), "{}", s.logs());
    s.assert_work_dir_empties();
    assert!(
        supervisor::processes_in_range(Path::new("/proc"), first, count).is_empty(),
        "processes survived the server"
    );
    assert_eq!(s.audit_events().len(), 2, "one event per answered request");
    checked(
        "SIGTERM under load: health NOT_SERVING, the socket gone at once (a client that still dials it refused at once), the requests in flight answered in full; exit 0; no process or work-dir entry left; one audit event per answered request",
    );
}

#[test]
fn a_server_killed_mid_command_leaves_nothing_once_restarted() {
    needs_root!(NEEDS_ROOT);
    crash_mid_command(&[], "hang");
}

/// The same, with the crash while the request's archive is still arriving (the header and
/// half of it came; the rest never comes).
#[test]
fn a_server_killed_while_receiving_leaves_nothing_once_restarted() {
    needs_root!(NEEDS_ROOT);
    crash_mid_command(&[], "receiving");
}

/// The same, with the crash while the request's jail extracts a large file (the tree cache
/// off: the archive is extracted as it arrives, here slowly).
#[test]
fn a_server_killed_while_extracting_leaves_nothing_once_restarted() {
    needs_root!(NEEDS_ROOT);
    crash_mid_command(&cache_edits(false), "extracting");
}

/// The same, with the crash while the tree cache's keeper fills an entry from the archive: no
/// half-filled entry is served after the restart (the next request's tree is whole).
#[test]
fn a_server_killed_while_filling_the_cache_leaves_nothing_once_restarted() {
    needs_root!(NEEDS_ROOT);
    crash_mid_command(&cache_edits(true), "filling");
}

/// The same, with the crash right after a request was answered, while its jail is reclaimed
/// and a spare prepared: the answered request's audit event was written before its answer
/// (mutant: the event emitted after the response -> lost with the server).
#[test]
fn a_server_killed_after_answering_leaves_nothing_once_restarted() {
    needs_root!(NEEDS_ROOT);
    crash_mid_command(&[], "answered");
}

/// The same, with the crash while the server streams a large answer to a client that reads
/// only its first 16 KiB (its flow-control window never reopened): the answer's audit event
/// was written before it, and nothing of the request is left after the restart.
#[test]
fn a_server_killed_while_answering_leaves_nothing_once_restarted() {
    needs_root!(NEEDS_ROOT);
    crash_mid_command(&[], "answering");
}

/// Policy edits that turn the tree cache on (every archive cached) or off, whatever this
/// run's default (`CMP_WARDEN_TEST_TREE_CACHE`).
fn cache_edits(on: bool) -> Vec<(&'static str, &'static str)> {
    match (tree_cache_under_test(), on) {
        (true, false) => vec![(TREE_CACHE_ON, "cache: {enabled: false, bytes: 512Mi}")],
        (false, true) => vec![("cache: {enabled: false, bytes: 512Mi}", TREE_CACHE_ON)],
        _ => Vec::new(),
    }
}

/// Whether a process has a file named `name` open under `work` (the server's work
/// directory: the jail extracting it, the keeper filling the cache with it; another test's
/// server has its own).
fn file_open_under(name: &str, work: &Path) -> bool {
    let work = work.to_string_lossy().into_owned();
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return false;
    };
    procs
        .flatten()
        .filter(|p| p.file_name().to_string_lossy().parse::<u32>().is_ok())
        .any(|p| {
            std::fs::read_dir(p.path().join("fd")).is_ok_and(|fds| {
                fds.flatten().any(|fd| {
                    std::fs::read_link(fd.path()).is_ok_and(|l| {
                        let l = l.to_string_lossy();
                        l.ends_with(&format!("/{name}")) && l.starts_with(&work)
                    })
                })
            })
        })
}

/// Without a PID namespace (containerd's RuntimeDefault profile) a request's daemon outlives
/// its jail when the crash takes the jails too (a jail that survives the server kills its UID
/// itself): the restart's sweep kills what is left by UID (mutant: the reclaim helper's kill
/// skipped -> the daemon survives the restart).
#[test]
fn a_daemon_that_outlived_a_killed_server_is_swept_by_the_restart() {
    needs_root!(NEEDS_ROOT);
    crash_mid_command(
        &[(
            "namespaces: [mount, pid, net, ipc, uts, cgroup]",
            "namespaces: [mount, net, ipc, uts, cgroup]",
        )],
        "daemon",
    );
}

/// The request's jail process (its supervisor inside the sandbox, which runs the commands)
/// is killed mid-command, as the OOM killer might pick it: the client gets a clear error at
/// once (not at its deadline), the command it ran is gone, the request's tree and cgroup
/// are reclaimed, its audit event is written, and the server serves the next request.
#[test]
fn a_jail_killed_mid_command_fails_its_request_and_leaves_nothing() {
    needs_root!(NEEDS_ROOT);
    let pol = tempfile::tempdir().expect("tmp");
    let pol_file = pol.path().join("policy.yaml");
    let (first, count) = write_policy(&pol_file, &[]);
    let s = Server::start(
        &plugin(SPEC),
        &["--policy", pol_file.to_str().expect("utf8")],
    );
    let r = repo(&[("cm.yaml", "kind: ConfigMap\n")]);
    let dir = r.path().to_str().expect("utf8").to_owned();
    let started = s.logs().matches("command started").count();
    go_client();
    let t0 = std::time::Instant::now();
    let in_flight = generate_in_background(&s, &dir, "hang");
    s.wait_logged("command started", started + 1);
    let busy = s.busy_uids(first, count);
    assert_eq!(busy.len(), 1, "one request runs: {busy:?}");
    let uid = *busy.first().expect("uid");
    let of_request: Vec<i32> = supervisor::processes_in_range(Path::new("/proc"), uid, 1);
    let jail_pid = of_request
        .iter()
        .copied()
        .find(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|c| c.starts_with(b"/proc/self/exe\0"))
        })
        .unwrap_or_else(|| {
            panic!(
                "no jail process among the request's: {:#?}",
                of_request.iter().map(|p| describe(*p)).collect::<Vec<_>>()
            )
        });
    let pid = rustix::process::Pid::from_raw(jail_pid).expect("pid");
    rustix::process::kill_process(pid, rustix::process::Signal::KILL).expect("SIGKILL");
    let (code, msg) = in_flight
        .join()
        .expect("thread")
        .expect_err("a request whose jail was killed");
    // At once: the command would have slept for a minute.
    assert!(
        t0.elapsed() < std::time::Duration::from_secs(30),
        "answered after {:?}",
        t0.elapsed()
    );
    // What happened, and that no limit of the policy did it (mutant: the jail's signal left
    // out of the message -> "the jail exited without a reply" alone).
    assert_eq!(code, INTERNAL, "{msg}");
    assert!(
        msg.contains("the jail exited without a reply")
            && msg.contains("killed by signal 9 (SIGKILL)")
            && msg.contains("no limit of the policy"),
        "{msg}"
    );
    // Its command (`sleep 60`) is gone with it, and its tree.
    wait_until(std::time::Duration::from_secs(10), || {
        supervisor::processes_in_range(Path::new("/proc"), uid, 1).is_empty()
    });
    let left: Vec<String> = supervisor::processes_in_range(Path::new("/proc"), uid, 1)
        .iter()
        .map(|p| describe(*p))
        .collect();
    assert!(
        left.is_empty(),
        "the killed jail's processes stay: {left:#?}"
    );
    s.assert_work_dir_empties();
    s.wait_settled(1);
    let ev = s.audit_events();
    assert_eq!(ev[0].outcome, "error", "{ev:?}");
    assert!(
        ev[0]
            .error
            .as_deref()
            .is_some_and(|e| e.contains("SIGKILL")),
        "{ev:?}"
    );
    let v = go(&s, "generate", &["-dir", &dir]).expect("served after the jail's death");
    assert_eq!(manifests(&v), vec![r#"{"kind":"ConfigMap"}"#]);
    checked(
        "a jail SIGKILLed mid-command: its client told the signal and that no policy limit did it, at once; its command gone, its tree and cgroup reclaimed, its audit event written; the next request served",
    );
}

/// SIGTERM right after an answer, with two policies' spare jails prepared (one taken by the
/// request and being replaced): once the server has exited, nothing of either is left, without
/// waiting (8 rounds: a stop that races the replacement shows in some).
#[test]
fn a_stop_while_a_spare_is_prepared_leaves_nothing() {
    needs_root!(NEEDS_ROOT);
    let pol = tempfile::tempdir().expect("tmp");
    let (first, count) = write_policy(&pol.path().join("default.yaml"), &[]);
    let default = std::fs::read_to_string(pol.path().join("default.yaml")).expect("read");
    // The default's file with what is node-wide left out, selecting one project.
    let team = selected_policy(&default, "team-a", "team-a");
    std::fs::write(pol.path().join("team-a.yaml"), team).expect("write");
    let r = repo(&[("cm.yaml", "kind: ConfigMap\n")]);
    let dir = r.path().to_str().expect("utf8").to_owned();
    let mut leaks = Vec::new();
    for round in 0..8 {
        let mut s = Server::start(
            &plugin(SPEC),
            &["--policy", pol.path().to_str().expect("utf8")],
        );
        go(
            &s,
            "generate",
            &["-dir", &dir, "-env", "ARGOCD_APP_PROJECT_NAME=team-a"],
        )
        .expect("served");
        let status = s.stop();
        assert_eq!(status.code(), Some(0), "{}", s.logs());
        // Nothing may be left once the server has exited: no waiting here.
        let procs: Vec<String> = supervisor::processes_in_range(Path::new("/proc"), first, count)
            .iter()
            .map(|pid| describe(*pid))
            .collect();
        let entries = s.work_entries();
        if !procs.is_empty() || !entries.is_empty() {
            leaks.push(format!(
                "round {round}: processes {procs:#?}, work dir {entries:?}"
            ));
            // The next round starts from a clean range.
            wait_until(std::time::Duration::from_secs(10), || {
                supervisor::processes_in_range(Path::new("/proc"), first, count).is_empty()
            });
        }
    }
    assert!(leaks.is_empty(), "left after a clean stop: {leaks:#?}");
    checked(
        "a stop while spare jails of two policies are prepared (8 rounds): nothing of either left once the server exited",
    );
}

/// Then the restarted server's own graceful stop leaves nothing either.
fn crash_mid_command(edits: &[(&str, &str)], mode: &'static str) {
    let pol = tempfile::tempdir().expect("tmp");
    let pol_file = pol.path().join("policy.yaml");
    let (first, count) = write_policy(&pol_file, edits);
    let mut s = Server::start(
        &plugin(SPEC),
        &["--policy", pol_file.to_str().expect("utf8")],
    );
    // A large file to extract (incompressible, so that it takes a while); the plugin checks
    // it arrived whole.
    const BIG: usize = 32 << 20;
    let big = noise(BIG, 47);
    let r = if matches!(mode, "extracting" | "filling") {
        repo(&[("cm.yaml", "kind: ConfigMap\n"), ("big.txt", &big)])
    } else {
        repo(&[("cm.yaml", "kind: ConfigMap\n")])
    };
    let dir = r.path().to_str().expect("utf8").to_owned();
    // The step the crash comes at: mid-command, while the archive is still arriving, while
    // it is extracted into the request's tree or the cache's, or once a request is answered.
    let step = match mode {
        "receiving" => "request received",
        // (Not waited for: the client's answer, or its first part, is the step.)
        "answered" | "answering" => "",
        "extracting" | "filling" => "request received",
        _ => "command started",
    };
    go_client();
    // Load: another request mid-command when the crash comes; it too hears of it at once.
    let commands = s.logs().matches("command started").count();
    let small = repo(&[("cm.yaml", "kind: ConfigMap\n")]);
    let load = generate_in_background(&s, small.path().to_str().expect("utf8"), "hang");
    s.wait_logged("command started", commands + 1);
    let started = s.logs().matches(step).count();
    let (answer_started, started_rx) = std::sync::mpsc::channel();
    let in_flight = match mode {
        "receiving" => receiving_in_background(&s),
        "answering" => answering_in_background(&s, answer_started),
        // 64 KiB chunks 20 ms apart: some ten seconds of arriving archive.
        "extracting" => generate_in_background_with(
            &s,
            &dir,
            "plain",
            &["-chunk", "65536", "-chunk-delay", "20ms"],
        ),
        _ => generate_in_background(&s, &dir, mode),
    };
    if !step.is_empty() {
        s.wait_logged(step, started + 1);
    }
    if mode == "answering" {
        started_rx
            .recv_timeout(std::time::Duration::from_secs(60))
            .expect("the first part of the answer never came");
    }
    if matches!(mode, "extracting" | "filling") {
        assert!(
            wait_until(std::time::Duration::from_secs(30), || {
                file_open_under("big.txt", &s.work)
            }),
            "big.txt was never written under the work directory ({mode}): {}",
            s.logs()
        );
    }
    let answered = if mode == "answered" {
        let v = in_flight
            .join()
            .expect("thread")
            .unwrap_or_else(|e| panic!("{e:?}"));
        assert_eq!(manifests(&v), vec![r#"{"kind":"ConfigMap"}"#]);
        None
    } else {
        Some(in_flight)
    };
    if mode == "daemon" {
        assert!(
            wait_until(std::time::Duration::from_secs(10), || {
                supervisor::processes_in_range(Path::new("/proc"), first, count)
                    .iter()
                    .any(|p| {
                        std::fs::read(format!("/proc/{p}/cmdline"))
                            .is_ok_and(|c| c == b"sleep\x00300\x00")
                    })
            }),
            "the request's daemon never started"
        );
    }
    // Every process in the range now (the request's, the spare jail's), by PID and start
    // time: the restarted server leases the same UIDs again, so a UID says nothing.
    let before: Vec<(i32, String)> =
        supervisor::processes_in_range(Path::new("/proc"), first, count)
            .into_iter()
            .filter_map(|pid| Some((pid, start_time(pid)?)))
            .collect();
    // (While receiving, a request may hold no jail yet: with the tree cache on, the archive
    // is hashed whole before a tree is chosen.)
    assert!(
        matches!(mode, "receiving" | "filling" | "answered" | "answering")
            || !s.busy_uids(first, count).is_empty(),
        "no process of the request in the range: {before:?}"
    );
    // In `daemon` mode the crash takes the jails with the server (as an OOM kill of the
    // sidecar's processes might): stopped first, so that none reacts to the server's death by
    // killing its UID itself, then killed after it. The request's commands are left for the
    // restart to find.
    let jails: Vec<i32> = if mode == "daemon" {
        before
            .iter()
            .map(|(pid, _)| *pid)
            .filter(|pid| {
                std::fs::read(format!("/proc/{pid}/cmdline"))
                    .is_ok_and(|c| c.starts_with(b"/proc/self/exe\0"))
            })
            .collect()
    } else {
        Vec::new()
    };
    let signal = |pid: i32, sig| {
        if let Some(p) = rustix::process::Pid::from_raw(pid) {
            let _ = rustix::process::kill_process(p, sig);
        }
    };
    for pid in &jails {
        signal(*pid, rustix::process::Signal::STOP);
    }
    let mut child = s.child.take().expect("running");
    // The server's own helpers (the jail factory, the cache keeper): they end on their own
    // when the server dies, as the restart's sweep requires (a live one still parents jails
    // and would count as another instance).
    let helpers: Vec<(i32, String)> = children_of(child.id() as i32)
        .into_iter()
        .filter_map(|pid| Some((pid, start_time(pid)?)))
        .collect();
    child.kill().expect("SIGKILL");
    child.wait().expect("wait");
    for pid in &jails {
        signal(*pid, rustix::process::Signal::KILL);
    }
    let stayed = still_running(&helpers, 10);
    assert!(
        stayed.is_empty(),
        "the killed server's helpers outlived it: {stayed:#?}"
    );
    if let Some(in_flight) = answered {
        // The client hears of it at once (the connection closed), not at its deadline.
        let (code, msg) = in_flight
            .join()
            .expect("thread")
            .expect_err("a request whose server died");
        // (grpc-go, as the repo-server, calls a broken connection Unavailable; tonic, the
        // receiving client here, Unknown "transport error".)
        let broken = match mode {
            "receiving" => code == UNKNOWN && msg.contains("transport error"),
            // (The raw HTTP/2 client: the connection closed under its response body.)
            "answering" => code == UNAVAILABLE && msg.contains("answer broken off"),
            _ => code == UNAVAILABLE,
        };
        assert!(broken, "{mode}: {code}: {msg}");
    }
    if matches!(mode, "answered" | "answering") {
        // The answered request's event was written before its answer left.
        let events = s.audit_events();
        assert!(
            events.last().is_some_and(|e| e.outcome == "ok"),
            "the answered request's audit event is lost: {events:?}"
        );
    }
    let (code, msg) = load
        .join()
        .expect("thread")
        .expect_err("the load's request, whose server died");
    assert_eq!(code, UNAVAILABLE, "{mode}: the load's request: {msg}");
    s.restart();
    // The restarted server swept what the dead one left: the request's processes (its UID),
    // its tree, its request cgroup.
    // (Killed by the sweep, they may take a moment to be gone.)
    let survivors = still_running(&before, 5);
    assert!(
        survivors.is_empty(),
        "processes of the dead server survived its restart: {survivors:#?}"
    );
    s.assert_work_dir_empties();
    let v = go(&s, "generate", &["-dir", &dir]).expect("served after the restart");
    assert_eq!(manifests(&v), vec![r#"{"kind":"ConfigMap"}"#]);
    let status = s.stop();
    assert_eq!(status.code(), Some(0), "{}", s.logs());
    // (A retired spare jail may take a moment to be gone.)
    wait_until(std::time::Duration::from_secs(10), || {
        supervisor::processes_in_range(Path::new("/proc"), first, count).is_empty()
    });
    let left: Vec<String> = supervisor::processes_in_range(Path::new("/proc"), first, count)
        .iter()
        .map(|pid| describe(*pid))
        .collect();
    assert!(
        left.is_empty(),
        "processes left after the restarted server stopped: {left:#?}\n{}",
        s.logs()
    );
    s.assert_work_dir_empties();
    let left: Vec<_> = instance_cgroups(first)
        .into_iter()
        .filter(|d| d.exists())
        .collect();
    assert!(left.is_empty(), "instance cgroups left: {left:?}");
    checked(&format!(
        "the server SIGKILLed {}, with a second request mid-command: both clients told at once; after the restart (same dirs, UID range): no process of the dead server, no work-dir entry; a whole tree served; after its stop: no process in the range, no instance cgroup{}",
        step_of(mode),
        if matches!(mode, "answered" | "answering") {
            "; the answered request's audit event was written before its answer"
        } else {
            ""
        }
    ));
}

/// What a test checked, in CI's log: written past the test harness's capture of `eprintln!`
/// (as the soak's table is), so a passing run says what it proved.
fn checked(what: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "faults: {what}");
}

/// The step of a request a crash test's `mode` kills the server at, in words.
fn step_of(mode: &str) -> &'static str {
    match mode {
        "receiving" => "while the archive arrived",
        "extracting" => "while its jail extracted the archive",
        "filling" => "while the keeper filled the tree cache",
        "answering" => "while it streamed the answer",
        "answered" => "right after answering",
        "daemon" => "mid-command (no PID namespace, a daemon left behind, the jails killed too)",
        _ => "mid-command",
    }
}

/// Of `procs` (PID and start time), those still running after up to `secs` seconds, as a
/// failure message shows them.
fn still_running(procs: &[(i32, String)], secs: u64) -> Vec<String> {
    let alive = |(pid, started): &(i32, String)| start_time(*pid).as_ref() == Some(started);
    wait_until(std::time::Duration::from_secs(secs), || {
        !procs.iter().any(alive)
    });
    procs
        .iter()
        .filter(|p| alive(p))
        .map(|(pid, _)| describe(*pid))
        .collect()
}

/// A process's start time (field 22 of /proc/PID/stat), which tells a PID's reuse apart.
fn start_time(pid: i32) -> Option<String> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (_, rest) = stat.rsplit_once(')')?;
    rest.split_whitespace().nth(19).map(str::to_owned)
}

/// The processes whose parent is `pid`.
fn children_of(pid: i32) -> Vec<i32> {
    let Ok(rd) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    rd.flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|p| {
            std::fs::read_to_string(format!("/proc/{p}/stat")).is_ok_and(|st| {
                st.rsplit_once(')')
                    .and_then(|(_, rest)| rest.split_whitespace().nth(1)?.parse::<i32>().ok())
                    == Some(pid)
            })
        })
        .collect()
}

/// A process as a failure message shows it: its stat line and command line.
fn describe(pid: i32) -> String {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let cmd = std::fs::read_to_string(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    format!("{stat} [{}]", cmd.replace('\0', " "))
}

/// A generate call (tonic) that sends the header and half the archive, then waits with its
/// stream open: the server is receiving when something happens to it.
fn receiving_in_background(s: &Server) -> std::thread::JoinHandle<CallResult> {
    use common::grpc::{client_at, file, good_tgz, meta, rt, sha};
    let tgz = good_tgz();
    let sock = s.sock.clone();
    std::thread::spawn(move || {
        rt().block_on(async {
            let (tx, rx) = tokio::sync::mpsc::channel(4);
            tx.send(meta(&sha(&tgz), ".")).await.expect("send");
            tx.send(file(&tgz[..tgz.len() / 2])).await.expect("send");
            let mut c = client_at(sock).await;
            let got = c
                .generate_manifest(tokio_stream::wrappers::ReceiverStream::new(rx))
                .await;
            drop(tx);
            got.map(|r| serde_json::json!({"manifests": r.into_inner().manifests}))
                .map_err(|e| (e.code() as i64, e.message().to_owned()))
        })
    })
}

/// A generate call with `ARGOCD_ENV_MODE=big` (a 1 MiB answer) by an HTTP/2 client whose
/// windows are 16 KiB and never reopened: once the answer's first bytes came (said on
/// `started`), the server is blocked mid-answer. Ends when the connection does.
fn answering_in_background(
    s: &Server,
    started: std::sync::mpsc::Sender<()>,
) -> std::thread::JoinHandle<CallResult> {
    use common::grpc::{file, good_tgz, rt, sha};
    use prost::Message;
    let sock = s.sock.clone();
    std::thread::spawn(move || {
        rt().block_on(async move {
            let io = tokio::net::UnixStream::connect(&sock)
                .await
                .expect("connect");
            let (mut client, conn) = h2::client::Builder::new()
                .initial_window_size(16 << 10)
                .initial_connection_window_size(16 << 10)
                .handshake::<_, bytes::Bytes>(io)
                .await
                .expect("HTTP/2 handshake");
            tokio::spawn(conn);
            let req = http::Request::post(
                "http://localhost/plugin.ConfigManagementPluginService/GenerateManifest",
            )
            .header("content-type", "application/grpc")
            .header("te", "trailers")
            .body(())
            .expect("request");
            let (response, mut send) = client.send_request(req, false).expect("send");
            let tgz = good_tgz();
            let header = proto::plugin::AppStreamRequest {
                request: Some(proto::plugin::app_stream_request::Request::Metadata(
                    proto::plugin::ManifestRequestMetadata {
                        app_name: "app".into(),
                        app_rel_path: ".".into(),
                        checksum: sha(&tgz),
                        size: 0,
                        env: vec![proto::plugin::EnvEntry {
                            name: "ARGOCD_ENV_MODE".into(),
                            value: "big".into(),
                        }],
                    },
                )),
            };
            let mut body = Vec::new();
            for m in [header, file(&tgz)] {
                let b = m.encode_to_vec();
                body.push(0);
                body.extend_from_slice(&(b.len() as u32).to_be_bytes());
                body.extend_from_slice(&b);
            }
            send.send_data(body.into(), true)
                .expect("the request's messages");
            let broken = |e: String| (UNAVAILABLE, format!("answer broken off: {e}"));
            let mut answer = response
                .await
                .map_err(|e| broken(e.to_string()))?
                .into_body();
            match answer.data().await {
                Some(Ok(_)) => {
                    let _ = started.send(());
                }
                other => return Err((UNKNOWN, format!("no answer: {other:?}"))),
            }
            // Its capacity never released: the server's window stays shut.
            loop {
                match answer.data().await {
                    Some(Ok(_)) => {}
                    Some(Err(e)) => return Err(broken(e.to_string())),
                    None => return Err((UNKNOWN, "the answer ended in a 16 KiB window".into())),
                }
            }
        })
    })
}

/// A generate call with `ARGOCD_ENV_MODE=mode` (grpc-go, as the repo-server dials), on a thread.
fn generate_in_background(
    s: &Server,
    dir: &str,
    mode: &str,
) -> std::thread::JoinHandle<CallResult> {
    generate_in_background_with(s, dir, mode, &[])
}

/// [`generate_in_background`] with more of the client's flags (`-chunk`, `-chunk-delay`).
fn generate_in_background_with(
    s: &Server,
    dir: &str,
    mode: &str,
    flags: &[&str],
) -> std::thread::JoinHandle<CallResult> {
    let (sock, dir, env) = (
        s.sock.clone(),
        dir.to_owned(),
        format!("ARGOCD_ENV_MODE={mode}"),
    );
    let flags: Vec<String> = flags.iter().map(|f| (*f).to_owned()).collect();
    std::thread::spawn(move || {
        let out = Command::new(go_client())
            .arg("-socket")
            .arg(&sock)
            .args([
                "-rpc", "generate", "-dir", &dir, "-env", &env, "-timeout", "60s",
            ])
            .args(&flags)
            .output()
            .expect("go client");
        parse_client_output(&out)
    })
}
