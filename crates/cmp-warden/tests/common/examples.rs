//! The examples under examples/ as the tests run them: their fixture services, their policies
//! with a UID range of the test's own, a server for one, its request through Argo CD's client.

use super::{CallResult, Server, examples_dir, go, private_uid_range};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

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

/// An example's directory: `example` names one under examples/, or is a copy's path
/// (`Placed::name`; joining an absolute path yields it).
pub fn example_dir(example: &str) -> PathBuf {
    examples_dir().join(example)
}

/// `python3 fixtures/SCRIPT 0` in the example's directory: on a port the kernel chose, which
/// the script prints first (`… https://NAME:PORT/…`); the fixture and that port.
pub fn fixture_on_any_port(example: &str, script: &str) -> (Fixture, u16) {
    let child = Command::new("python3")
        .arg(example_dir(example).join("fixtures").join(script))
        .arg("0")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("start fixture");
    Fixture::announced(child, script)
}

/// A copy of an example in a temporary directory with the port its files name for its fixture
/// (`from`) replaced by the port the fixture listens on (`to`, the kernel's choice: tests never
/// bind fixed ports). Where `repo/Chart.lock` pins chart dependencies, its digest is
/// recomputed as Helm computes it, or `helm dependency build` refuses the changed repository URL.
pub struct Placed {
    _tmp: tempfile::TempDir,
    path: String,
}

/// The fixture's port the example's files name: the first port its policy allows
/// (`ports: [N]`).
pub fn written_port(example: &str) -> u16 {
    let policy = std::fs::read_to_string(example_dir(example).join("policy.yaml")).expect("policy");
    policy
        .split("ports: [")
        .nth(1)
        .and_then(|r| r.split(|c: char| !c.is_ascii_digit()).next())
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("{example}/policy.yaml allows no port"))
}

impl Placed {
    /// The copy of `example` naming port `to` wherever its files name [`written_port`].
    pub fn new(example: &str, to: u16) -> Placed {
        let from = written_port(example);
        let tmp = tempfile::Builder::new()
            .prefix("cmpw-example")
            .tempdir()
            .expect("tmp");
        // Jails (leased UIDs) read the copy's files, as they do the checkout's.
        std::fs::set_permissions(
            tmp.path(),
            std::os::unix::fs::PermissionsExt::from_mode(0o755),
        )
        .expect("chmod");
        let dest = tmp.path().join(example);
        copy_with_port(&example_dir(example), &dest, from, to);
        let lock = dest.join("repo/Chart.lock");
        if lock.exists() {
            relock(&example_dir(example).join("repo/Chart.lock"), &lock);
        }
        let path = dest.to_str().expect("utf8").to_owned();
        Placed { _tmp: tmp, path }
    }

    /// What the helpers take as `example`.
    pub fn name(&self) -> &str {
        &self.path
    }
}

/// `text` with each mention of port `from` as a port (after `:`, `[` or a space, before a
/// non-digit) replaced by `to`: not the same digits inside a digest or a certificate.
pub fn with_port(text: &str, from: u16, to: u16) -> String {
    let (from, to) = (from.to_string(), to.to_string());
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(i) = rest.find(&from) {
        out.push_str(&rest[..i]);
        let after = rest[i + from.len()..].chars().next();
        let is_port = matches!(out.chars().last(), Some(':' | '[' | ' '))
            && !after.is_some_and(|c| c.is_ascii_alphanumeric());
        out.push_str(if is_port { &to } else { &from });
        rest = &rest[i + from.len()..];
    }
    out.push_str(rest);
    out
}

fn copy_with_port(src: &Path, dest: &Path, from: u16, to: u16) {
    std::fs::create_dir_all(dest).expect("mkdir");
    for entry in std::fs::read_dir(src).expect("read_dir") {
        let entry = entry.expect("entry");
        let (s, d) = (entry.path(), dest.join(entry.file_name()));
        if entry.file_type().expect("type").is_dir() {
            copy_with_port(&s, &d, from, to);
            continue;
        }
        let bytes = std::fs::read(&s).expect("read");
        match String::from_utf8(bytes) {
            Ok(text) => std::fs::write(&d, with_port(&text, from, to)).expect("write"),
            Err(e) => std::fs::write(&d, e.into_bytes()).expect("write"),
        }
        let mode = std::fs::metadata(&s).expect("stat").permissions();
        std::fs::set_permissions(&d, mode).expect("chmod");
    }
}

/// Helm's digest of a chart's dependencies (`resolver.HashReq`): sha256 of the JSON of
/// `[Chart.yaml's dependencies, Chart.lock's]`, which are the same list here. Checked first
/// against the shipped lock file, so a dependency with more fields than name, version and
/// repository fails here by name rather than in helm.
fn relock(shipped: &Path, copy: &Path) {
    fn digest(lock: &str) -> String {
        let mut deps = Vec::new();
        let mut dep: Vec<(String, String)> = Vec::new();
        for l in lock.lines() {
            if l.starts_with("digest:") || l.starts_with("generated:") {
                continue;
            }
            if let Some(first) = l.strip_prefix("- ") {
                if !dep.is_empty() {
                    deps.push(std::mem::take(&mut dep));
                }
                dep.push(split(first));
            } else if l.starts_with("  ") {
                dep.push(split(l.trim()));
            }
        }
        deps.push(dep);
        let json: Vec<String> = deps
            .iter()
            .map(|d| {
                let field = |k: &str| {
                    let v = d.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
                    serde_json::to_string(v.unwrap_or_else(|| panic!("{k} in {d:?}")))
                        .expect("json")
                };
                format!(
                    "{{\"name\":{},\"version\":{},\"repository\":{}}}",
                    field("name"),
                    field("version"),
                    field("repository")
                )
            })
            .collect();
        let list = format!("[{}]", json.join(","));
        let sum = <sha2::Sha256 as sha2::Digest>::digest(format!("[{list},{list}]"));
        format!("sha256:{}", hex::encode(sum))
    }
    fn split(kv: &str) -> (String, String) {
        let (k, v) = kv.split_once(": ").unwrap_or_else(|| panic!("{kv:?}"));
        (k.to_owned(), v.trim_matches('"').to_owned())
    }
    fn written(lock: &str) -> &str {
        lock.lines()
            .find_map(|l| l.strip_prefix("digest: "))
            .expect("digest:")
    }
    let shipped = std::fs::read_to_string(shipped).expect("Chart.lock");
    assert_eq!(
        digest(&shipped),
        written(&shipped),
        "the shipped Chart.lock's digest is not Helm's HashReq of name, version, repository"
    );
    let text = std::fs::read_to_string(copy).expect("Chart.lock");
    let fresh = text.replace(written(&text), &digest(&text));
    std::fs::write(copy, fresh).expect("write");
}

impl Fixture {
    /// `child` (stdout piped), once it printed its first line, which ends in the URL it
    /// serves (`…:PORT/…`), and accepts connections on that port.
    pub fn announced(mut child: Child, what: &str) -> (Fixture, u16) {
        let mut line = String::new();
        std::io::BufRead::read_line(
            &mut std::io::BufReader::new(child.stdout.take().expect("stdout")),
            &mut line,
        )
        .expect("the fixture's first line");
        let port: u16 = line
            .rsplit(':')
            .next()
            .and_then(|r| r.split(|c: char| !c.is_ascii_digit()).next())
            .and_then(|p| p.parse().ok())
            .unwrap_or_else(|| panic!("{what} printed no port: {line:?}"));
        (Fixture::listening(child, port, what), port)
    }

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
    let dir = example_dir(example);
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
    let plugin =
        std::fs::read_to_string(example_dir(example).join("plugin.yaml")).expect("plugin.yaml");
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
    let dir = example_dir(example);
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
    std::fs::read_to_string(example_dir(example).join("expected.jsonl"))
        .expect("expected.jsonl")
        .lines()
        .map(str::to_owned)
        .collect()
}
