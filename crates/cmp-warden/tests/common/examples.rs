//! The examples under examples/ as the tests run them: their fixture services, their policies
//! with a UID range of the test's own, a server for one, its request through Argo CD's client.

use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::*;

/// Where scripts/setup installs the tools the examples run (helm, kustomize, …).
pub const TOOLS: &str = "/opt/cmp-warden-tools";

/// A fixture service (a chart repository, a Vault-like API), killed when dropped.
pub struct Fixture(pub Child);

impl Drop for Fixture {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `python3 fixtures/SCRIPT PORT` in the example's directory, once it accepts connections.
pub fn fixture(example: &str, script: &str, port: u16) -> Fixture {
    let dir = examples_dir().join(example);
    let child = Command::new("python3")
        .arg(dir.join("fixtures").join(script))
        .arg(port.to_string())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start fixture");
    Fixture::listening(child, port, script)
}

/// `python3 fixtures/SCRIPT 0` in the example's directory: on a port the kernel chose, which
/// the script prints first (`… http://127.0.0.1:PORT/`); the fixture and that port.
pub fn fixture_on_any_port(example: &str, script: &str) -> (Fixture, u16) {
    let dir = examples_dir().join(example);
    let mut child = Command::new("python3")
        .arg(dir.join("fixtures").join(script))
        .arg("0")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("start fixture");
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(child.stdout.take().expect("stdout")),
        &mut line,
    )
    .expect("the fixture's first line");
    let port: u16 = line
        .split("127.0.0.1:")
        .nth(1)
        .and_then(|r| r.split(|c: char| !c.is_ascii_digit()).next())
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("{script} printed no port: {line:?}"));
    (Fixture::listening(child, port, script), port)
}

impl Fixture {
    /// `child`, once something accepts connections on `port` (at most 10 s; `what` names it
    /// if nothing does).
    pub fn listening(child: Child, port: u16, what: &str) -> Fixture {
        let f = Fixture(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "{what} never listened on {port}");
            std::thread::sleep(Duration::from_millis(50));
        }
        f
    }
}

/// The example's policy file, copied with a UID range of this test's own (servers of one test
/// run share the host; each sweeps its range at start-up), and its seccomp profile beside it.
pub fn example_policy(example: &str, into: &Path) -> PathBuf {
    let dir = examples_dir().join(example);
    let (first, count) = private_uid_range();
    let text = std::fs::read_to_string(dir.join("policy.yaml"))
        .expect("policy.yaml")
        .replacen(
            "uidRange: {first: 20000, count: 40000}",
            &format!("uidRange: {{first: {first}, count: {count}}}"),
            1,
        );
    std::fs::create_dir_all(into.join("seccomp")).expect("mkdir");
    std::fs::write(into.join("policy.yaml"), text).expect("write");
    std::fs::copy(
        dir.join("seccomp/default.json"),
        into.join("seccomp/default.json"),
    )
    .expect("profile");
    into.join("policy.yaml")
}

pub fn path_with_tools() -> String {
    format!(
        "{TOOLS}/bin:{}",
        std::env::var("PATH").unwrap_or_else(|_| "/usr/bin:/bin".into())
    )
}

/// A server for `example`: its plugin.yaml, its policy (or the default one), `env` added.
pub fn example_server(example: &str, own_policy: bool, env: &[(&str, &str)], pol: &Path) -> Server {
    let plugin = std::fs::read_to_string(examples_dir().join(example).join("plugin.yaml"))
        .expect("plugin.yaml");
    let path = path_with_tools();
    let mut all = vec![("PATH", path.as_str())];
    all.extend_from_slice(env);
    if own_policy {
        let p = example_policy(example, pol);
        Server::start_env(
            &plugin,
            &[
                "--policy",
                p.to_str().expect("utf8"),
                "--allowed-uids",
                "any",
            ],
            &all,
        )
    } else {
        Server::start_env(&plugin, &["--allowed-uids", "any"], &all)
    }
}

/// The example's request through the grpc-go client (Argo CD's own client stack).
pub fn generate(s: &Server, example: &str) -> CallResult {
    let dir = examples_dir().join(example);
    let mut args = vec![
        "-dir".to_owned(),
        dir.join("repo").to_str().expect("utf8").to_owned(),
    ];
    let text = std::fs::read_to_string(dir.join("args")).unwrap_or_default();
    for l in text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
    {
        match l.split_once(' ') {
            Some((f, v)) => args.extend([f.to_owned(), v.to_owned()]),
            None => args.push(l.to_owned()),
        }
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    go(s, "generate", &args)
}

pub fn expected(example: &str) -> Vec<String> {
    std::fs::read_to_string(examples_dir().join(example).join("expected.jsonl"))
        .expect("expected.jsonl")
        .lines()
        .map(str::to_owned)
        .collect()
}
