//! A soak: mixed traffic at a steady rate through the real server (Argo CD's grpc-go client,
//! two policies, the tree cache filling, hitting and evicting), sampling what a slow leak
//! would grow: the server's RSS, descriptors and threads, leased UIDs, request cgroup
//! directories, the tree cache's bytes and the work directory. After the warm-up (the first
//! third), each stays within what the warm-up reached, and RSS does not climb; once the
//! traffic stops, everything is back to the idle spares.
//!
//! CI runs the short form (`CMP_WARDEN_SOAK_SECONDS`, 90 by default, a sample every 10 s);
//! BENCHMARKS.md's 30-minute run and its plot come from `benches/soak --minutes 30`, which
//! runs this test with `CMP_WARDEN_SOAK_SECONDS`, `CMP_WARDEN_SOAK_SAMPLE_SECONDS` and
//! `CMP_WARDEN_SOAK_CSV`; every run (this short one too) plots its samples with
//! `benches/soak --plot`.
#![allow(clippy::print_stderr)] // the samples are the test's report

#[macro_use]
mod common;

use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::*;

const NEEDS_ROOT: &str = "the soak needs root (CI runs as root): leased UIDs, cgroups";

/// `ARGOCD_ENV_MODE`: `hostile` reads a file outside the policy's rules; `slow` sleeps 2 s
/// (its client gives up after 0.5 s); `big` prints 2 MiB (over `outputBytes: 1Mi`);
/// anything else prints the manifest.
const SPEC: &str = "  generate:\n    command: [sh, -c]\n    args:\n      - |\n        case \"$ARGOCD_ENV_MODE\" in\n          hostile) cat /etc/shadow || exit 1 ;;\n          slow) sleep 2 ;;\n          big) head -c 2097152 /dev/zero | tr '\\0' 'a' ;;\n        esac\n        cat cm.yaml\n";

/// What each kind of request must get.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Kind {
    /// The same archive every time: a cache hit.
    Hit,
    /// A new 256 KiB archive every time: a fill (and, past 8 MiB, evictions).
    Fill,
    /// The second policy's project.
    Tenant,
    /// A command that reads outside the file rules.
    Hostile,
    /// A client that gives up mid-command.
    Cancelled,
    /// A command over `spec.limits.outputBytes`.
    OverLimit,
}

const ROTATION: [Kind; 8] = [
    Kind::Hit,
    Kind::Fill,
    Kind::Tenant,
    Kind::Hostile,
    Kind::Hit,
    Kind::Cancelled,
    Kind::Fill,
    Kind::OverLimit,
];

/// One sample of the server's resources.
#[derive(Clone, Debug, Default)]
struct Sample {
    secs: u64,
    requests: usize,
    rss_kib: u64,
    fds: usize,
    threads: usize,
    uids_in_use: u64,
    cgroup_dirs: usize,
    cache_bytes: u64,
    work_entries: usize,
    work_bytes: u64,
}

impl Sample {
    const HEADER: &str = "seconds,requests,rss_kib,fds,threads,uids_in_use,cgroup_dirs,cache_bytes,work_entries,work_bytes";

    fn csv(&self) -> String {
        format!(
            "{},{},{},{},{},{},{},{},{},{}",
            self.secs,
            self.requests,
            self.rss_kib,
            self.fds,
            self.threads,
            self.uids_in_use,
            self.cgroup_dirs,
            self.cache_bytes,
            self.work_entries,
            self.work_bytes
        )
    }
}

fn env_secs(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .map(|v| v.parse().unwrap_or_else(|e| panic!("{name}={v}: {e}")))
        .unwrap_or(default)
}

/// A metric's value in a Prometheus text body (the first series of that name).
fn metric(body: &str, name: &str) -> u64 {
    body.lines()
        .find(|l| l.starts_with(name) && l[name.len()..].starts_with([' ', '{']))
        .and_then(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .map_or(0, |v| v as u64)
}

/// Bytes and entries under `dir` (not following links).
fn du(dir: &Path) -> (usize, u64) {
    let mut entries = 0;
    let mut bytes = 0;
    let mut stack = vec![dir.to_owned()];
    while let Some(d) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in rd.flatten() {
            entries += 1;
            if let Ok(m) = e.path().symlink_metadata() {
                bytes += m.len();
                if m.is_dir() {
                    stack.push(e.path());
                }
            }
        }
    }
    (entries, bytes)
}

fn sample(s: &Server, pid: u32, first: u32, t0: Instant, requests: usize) -> Sample {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let rss_kib = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0);
    let count = |p: String| std::fs::read_dir(p).map_or(0, Iterator::count);
    let metrics = s.metrics();
    let cgroup_dirs = instance_cgroups(first)
        .iter()
        .map(|d| {
            std::fs::read_dir(d).map_or(0, |rd| {
                rd.flatten()
                    .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                    .count()
            })
        })
        .max()
        .unwrap_or(0);
    let (work_entries, work_bytes) = du(&s.work.join("_cmp_server"));
    Sample {
        secs: t0.elapsed().as_secs(),
        requests,
        rss_kib,
        fds: count(format!("/proc/{pid}/fd")),
        threads: count(format!("/proc/{pid}/task")),
        uids_in_use: metric(&metrics, "cmp_warden_uid_pool_in_use"),
        cgroup_dirs,
        cache_bytes: metric(&metrics, "cmp_warden_tree_cache_bytes"),
        work_entries,
        work_bytes,
    }
}

/// A policy directory: the default (small tree cache, 1 MiB output) and team-a's.
fn policies(dir: &Path) -> (u32, u32) {
    let mut edits = vec![("outputBytes: 64Mi", "outputBytes: 1Mi")];
    if tree_cache_under_test() {
        edits.push((TREE_CACHE_ON, "cache: {enabled: true, bytes: 8Mi}"));
    }
    let (first, count) = write_policy(&dir.join("default.yaml"), &edits);
    let default = std::fs::read_to_string(dir.join("default.yaml")).expect("read");
    let team = selected_policy(&default, "team-a", "team-a");
    std::fs::write(dir.join("team-a.yaml"), team).expect("write");
    (first, count)
}

/// One request of `kind`; `Err` says what was wrong with its answer.
fn request(s: &Server, kind: Kind, n: u64, hit: &Path) -> Result<(), String> {
    let cm = r#"{"kind":"ConfigMap"}"#;
    let fill;
    let (dir, env, timeout): (&Path, &[&str], &str) = match kind {
        Kind::Hit => (hit, &[], "30s"),
        Kind::Fill => {
            fill = repo(&[
                ("cm.yaml", "kind: ConfigMap\n"),
                ("data.txt", &noise(256 << 10, n)),
            ]);
            (fill.path(), &[], "30s")
        }
        Kind::Tenant => (hit, &["-env", "ARGOCD_APP_PROJECT_NAME=team-a"], "30s"),
        Kind::Hostile => (hit, &["-env", "ARGOCD_ENV_MODE=hostile"], "30s"),
        Kind::Cancelled => (hit, &["-env", "ARGOCD_ENV_MODE=slow"], "500ms"),
        Kind::OverLimit => (hit, &["-env", "ARGOCD_ENV_MODE=big"], "30s"),
    };
    let mut args = vec!["-dir", dir.to_str().expect("utf8"), "-timeout", timeout];
    args.extend_from_slice(env);
    let got = go(s, "generate", &args);
    let ok = match (kind, &got) {
        (Kind::Hit | Kind::Fill | Kind::Tenant, Ok(v)) => manifests(v) == vec![cm],
        (Kind::Hostile, Err((_, m))) => m.contains("/etc/shadow"),
        (Kind::Cancelled, Err((code, _))) => *code == DEADLINE_EXCEEDED,
        (Kind::OverLimit, Err((code, m))) => {
            *code == RESOURCE_EXHAUSTED && m.contains("spec.limits.outputBytes")
        }
        _ => false,
    };
    if ok {
        Ok(())
    } else {
        Err(format!("{kind:?} #{n}: {got:?}"))
    }
}

#[test]
fn mixed_traffic_leaves_every_resource_flat() {
    needs_root!(NEEDS_ROOT);
    let seconds = env_secs("CMP_WARDEN_SOAK_SECONDS", 90);
    let every = env_secs("CMP_WARDEN_SOAK_SAMPLE_SECONDS", 10);
    let pol = tempfile::tempdir().expect("tmp");
    let (first, _) = policies(pol.path());
    let s = Server::start(
        &plugin(SPEC),
        &[
            "--policy",
            pol.path().to_str().expect("utf8"),
            "--metrics-address",
            "127.0.0.1:0",
        ],
    );
    let pid = s.child.as_ref().expect("server").id();
    let hit = repo(&[("cm.yaml", "kind: ConfigMap\n")]);
    go_client();
    let s = Arc::new(s);
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicUsize::new(0));
    let wrong = Arc::new(Mutex::new(Vec::<String>::new()));
    let next = Arc::new(AtomicUsize::new(0));
    // Two clients, each paced to a request every 400 ms at most: a steady rate, not a burst.
    let workers: Vec<_> = (0..2)
        .map(|_| {
            let (s, stop, done, wrong, next) = (
                s.clone(),
                stop.clone(),
                done.clone(),
                wrong.clone(),
                next.clone(),
            );
            let hit = hit.path().to_owned();
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    let started = Instant::now();
                    let n = next.fetch_add(1, Ordering::Relaxed);
                    if let Err(e) = request(&s, ROTATION[n % ROTATION.len()], n as u64, &hit) {
                        wrong.lock().expect("lock").push(e);
                    }
                    done.fetch_add(1, Ordering::Relaxed);
                    if let Some(rest) = Duration::from_millis(400).checked_sub(started.elapsed()) {
                        std::thread::sleep(rest);
                    }
                }
            })
        })
        .collect();
    let t0 = Instant::now();
    let mut samples = Vec::new();
    eprintln!("{}", Sample::HEADER);
    while t0.elapsed() < Duration::from_secs(seconds) {
        std::thread::sleep(Duration::from_secs(every));
        let x = sample(&s, pid, first, t0, done.load(Ordering::Relaxed));
        eprintln!("{}", x.csv());
        samples.push(x);
    }
    stop.store(true, Ordering::Relaxed);
    for w in workers {
        w.join().expect("worker");
    }
    let requests = done.load(Ordering::Relaxed);
    let wrong = wrong.lock().expect("lock").clone();
    assert!(
        wrong.is_empty(),
        "{} of {requests} requests got the wrong answer: {:#?}",
        wrong.len(),
        &wrong[..wrong.len().min(10)]
    );
    // Settled: every answered request's audit event written, the spares ready.
    s.wait_settled(requests);
    std::thread::sleep(Duration::from_secs(2));
    let idle = sample(&s, pid, first, t0, requests);
    eprintln!("{} (idle)", idle.csv());
    // The samples as benches/soak reads them, and its plot of them (the long run's figure).
    let scratch = tempfile::tempdir().expect("tmp");
    let csv = std::env::var("CMP_WARDEN_SOAK_CSV").map_or_else(
        |_| scratch.path().join("soak.csv"),
        std::path::PathBuf::from,
    );
    let mut text = format!("{}\n", Sample::HEADER);
    for x in samples.iter().chain(std::iter::once(&idle)) {
        text.push_str(&x.csv());
        text.push('\n');
    }
    std::fs::write(&csv, text).expect("write the samples");
    let png = scratch.path().join("soak.png");
    let plotted = std::process::Command::new(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../benches/soak"),
    )
    .arg("--plot")
    .arg(&csv)
    .arg("--png")
    .arg(&png)
    .status()
    .expect("benches/soak");
    assert!(
        plotted.success() && std::fs::metadata(&png).is_ok_and(|m| m.len() > 1000),
        "benches/soak --plot made no picture"
    );
    assert!(samples.len() >= 6, "too few samples: {}", samples.len());
    let warm = samples.len() / 3;
    let (warmup, steady) = samples.split_at(warm);
    let peak = |f: &dyn Fn(&Sample) -> u64, xs: &[Sample]| xs.iter().map(f).max().unwrap_or(0);
    // Counts bounded by the warm-up's peak (plus a little jitter of requests in flight).
    let bounded: [(&str, Figure, u64); 5] = [
        ("descriptors", &|x| x.fds as u64, 16),
        ("threads", &|x| x.threads as u64, 4),
        ("leased UIDs", &|x| x.uids_in_use, 2),
        ("request cgroup directories", &|x| x.cgroup_dirs as u64, 2),
        ("work directory entries", &|x| x.work_entries as u64, 4),
    ];
    for (what, f, slack) in bounded {
        assert!(
            peak(f, steady) <= peak(f, warmup) + slack,
            "{what} grew after the warm-up: {} then {} (samples {samples:#?})",
            peak(f, warmup),
            peak(f, steady)
        );
    }
    // The tree cache stays within its 8 MiB (it filled and evicted).
    assert!(
        peak(&|x| x.cache_bytes, &samples) <= 8 << 20,
        "tree cache over its bytes"
    );
    // RSS: the slope over the steady part, and its last third against its first.
    let slope = slope_kib_per_min(steady);
    let third = steady.len() / 3;
    let early = peak(&|x| x.rss_kib, &steady[..third.max(1)]);
    let late = peak(&|x| x.rss_kib, &steady[steady.len() - third.max(1)..]);
    eprintln!(
        "soak: {requests} requests in {seconds} s; steady RSS slope {slope:.0} KiB/min, peak {early} KiB early, {late} KiB late"
    );
    assert!(
        late <= early + 8 * 1024,
        "RSS climbs: {early} KiB then {late} KiB ({slope:.0} KiB/min)"
    );
    // Idle: no UID leased for a request (the metric leaves the spares out; a quarantined
    // one, whose reclaim left something, stays counted), and only the spares (one per
    // policy) hold a cgroup and a directory.
    assert_eq!(idle.uids_in_use, 0, "{idle:?}");
    assert!(idle.cgroup_dirs <= 2, "{idle:?}");
    wait_until(Duration::from_secs(10), || {
        s.leftover_work_entries().is_empty()
    });
    assert!(
        s.leftover_work_entries().is_empty(),
        "request trees left: {:?}",
        s.leftover_work_entries()
    );
    let idle_jails = s.idle_jails();
    assert!(idle_jails.len() <= 2, "{idle_jails:?}");
}

/// One figure of a sample.
type Figure = &'static dyn Fn(&Sample) -> u64;

/// Least-squares slope of RSS over time, KiB per minute.
fn slope_kib_per_min(xs: &[Sample]) -> f64 {
    let n = xs.len() as f64;
    let (mx, my) = xs.iter().fold((0.0, 0.0), |(a, b), x| {
        (a + x.secs as f64 / n, b + x.rss_kib as f64 / n)
    });
    let (num, den) = xs.iter().fold((0.0, 0.0), |(a, b), x| {
        let dx = x.secs as f64 - mx;
        (a + dx * (x.rss_kib as f64 - my), b + dx * dx)
    });
    if den == 0.0 { 0.0 } else { num / den * 60.0 }
}
