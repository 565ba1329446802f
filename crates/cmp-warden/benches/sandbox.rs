//! Sandbox cost, A/B in one run (needs root; prints why and exits otherwise):
//! - bare: fork/exec of `/bin/true` (std `Command`);
//! - bwrap: `bwrap --ro-bind / / --unshare-all --die-with-parent /bin/true` (Debian bubblewrap;
//!   the root bind is needed for `/bin/true` to exist inside);
//! - firejail: `firejail --quiet --noprofile /bin/true` (Debian firejail), when it runs here;
//! - request: one confined request exactly as `serve` runs it — take the jail prepared ahead
//!   (UID leased, cgroup joined, confined: credentials, capabilities, namespaces, no_new_privs,
//!   Landlock, seccomp), send the header, extract a one-file archive, run `/bin/true` as
//!   generate, reply, then reclaim (the jail's exit, its cgroup, its directory entry, the UID);
//! - per command: the same request with `/bin/true` as init too; the difference is what one
//!   more command costs inside a request (the filter is inherited, not reinstalled).
//!
//! Two paces: "paced" leaves `BENCH_GAP_MS` (default 25) untimed between iterations, as
//! requests arriving apart do (the spare jail is ready when one comes); "back to back" runs
//! them in a loop, where the CPU per request bounds the rate. Every case also reports its CPU
//! per iteration, which no pacing hides. The CPU comparison the cold-path target judges
//! (bwrap's sandbox against our request, with and without a cgroup, back to back) runs its
//! three cases alternately in `BENCH_CPU_ROUNDS` (default 5) rounds, so that a host whose
//! speed drifts during the run (a shared VM's does, by ±20% here) weighs on each alike.
//!
//! The request trees live on tmpfs (`BENCH_WORKDIR`, default `/dev/shm`), as they do in the
//! memory-backed `emptyDir` of the deploy manifests.
#![allow(clippy::print_stdout, clippy::print_stderr)]

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use supervisor::{CancelToken, Owner, StartOptions, Supervisor};
use vocab::request::Operation;

fn median(mut v: Vec<Duration>) -> f64 {
    v.sort();
    v[v.len() / 2].as_secs_f64() * 1e3
}

fn p90(mut v: Vec<Duration>) -> f64 {
    v.sort();
    v[v.len() * 9 / 10].as_secs_f64() * 1e3
}

/// One case's samples: wall time per iteration, and CPU per iteration over the timed loop.
struct Timed {
    wall: Vec<Duration>,
    /// CPU time (user + system) of this process — every thread, the spare-jail starter
    /// included — plus every child it reaped (jails, their commands, bwrap) or still has
    /// (the jail factory), per iteration.
    /// What a wall-clock median hides when work moves to another core.
    cpu_ms: f64,
}

/// User + system time of this process, of its reaped children, and of its children still
/// running (the jail factory, which forks every jail, lives as long as its runner; a spare
/// jail): `/proc/PID/stat` fields 14–17, in clock ticks — coarse per call, exact enough over
/// hundreds of iterations. A child counted live at the start and reaped by the end is counted
/// once: its earlier part is in the start's sum.
fn cpu_time() -> Duration {
    let me = std::process::id();
    let mut ticks = stat_cpu_ticks(&format!("/proc/{me}/stat")).expect("/proc/self/stat");
    for e in std::fs::read_dir("/proc").expect("/proc").flatten() {
        let name = e.file_name();
        let Some(pid) = name.to_str().and_then(|n| n.parse::<u32>().ok()) else {
            continue;
        };
        let path = format!("/proc/{pid}/stat");
        if pid != me
            && std::fs::read_to_string(&path).is_ok_and(|s| stat_ppid(&s) == Some(me))
            && let Some(t) = stat_cpu_ticks(&path)
        {
            ticks += t;
        }
    }
    let hz = rustix::param::clock_ticks_per_second();
    Duration::from_nanos(ticks * 1_000_000_000 / hz)
}

/// The fields after the parenthesised command name of a `/proc/PID/stat` line.
fn after_comm(stat: &str) -> Option<&str> {
    stat.rfind(')').and_then(|i| stat.get(i + 2..))
}

fn stat_ppid(stat: &str) -> Option<u32> {
    after_comm(stat)?.split_whitespace().nth(1)?.parse().ok()
}

/// utime + stime + cutime + cstime.
fn stat_cpu_ticks(path: &str) -> Option<u64> {
    let stat = std::fs::read_to_string(path).ok()?;
    after_comm(&stat)?
        .split_whitespace()
        .skip(11)
        .take(4)
        .map(|f| f.parse::<u64>().ok())
        .sum()
}

/// `cmd` run to its end, spawned as the runner spawns its own children: tracked, because the
/// supervisor started in this process reaps untracked zombie children once a second, and took
/// a bwrap's exit status before `Command::status` could (ECHILD, a CI run's smoke bench).
fn run_tracked(cmd: &mut Command) -> std::process::Output {
    let child = supervisor::bench::spawn_tracked(cmd).expect("spawn");
    let pid = child.id() as i32;
    let out = child.wait_with_output().expect("wait");
    supervisor::bench::untrack(pid);
    out
}

/// `bwrap ARGS`; a failure is retried once to say why (stderr is not read on the measured
/// path), and fails the run.
fn run_bwrap(args: &[String]) {
    let st = run_tracked(
        Command::new("/usr/bin/bwrap")
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::null()),
    )
    .status;
    if !st.success() {
        let again = run_tracked(
            Command::new("/usr/bin/bwrap")
                .args(args)
                .stdout(Stdio::piped())
                .stderr(Stdio::piped()),
        );
        panic!(
            "bwrap {args:?} failed ({st}); once more: {} {}",
            again.status,
            String::from_utf8_lossy(&again.stderr)
        );
    }
}

/// How iterations follow each other.
#[derive(Debug, Clone, Copy)]
enum Pace {
    /// One after the other.
    BackToBack,
    /// With an untimed pause before each.
    Gap(Duration),
}

impl Timed {
    /// This case's samples followed by `more`'s (the CPU per iteration over both).
    fn merge(self, more: Timed) -> Timed {
        let (a, b) = (self.wall.len() as f64, more.wall.len() as f64);
        let cpu_ms = if a + b > 0.0 {
            (self.cpu_ms * a + more.cpu_ms * b) / (a + b)
        } else {
            0.0
        };
        let mut wall = self.wall;
        wall.extend(more.wall);
        Timed { wall, cpu_ms }
    }

    fn empty() -> Timed {
        Timed {
            wall: Vec::new(),
            cpu_ms: 0.0,
        }
    }
}

/// Let what the last iterations left exit, and reap it, before CPU is read: a zombie's
/// `/proc` entry shows no CPU at all, and bwrap's orphaned namespace init is still exiting
/// when bwrap returns; reaped only later (in the next case's window, by the supervisor's
/// reaper), its CPU was counted against that case. Sleeping costs no CPU.
fn settle() {
    for _ in 0..2 {
        std::thread::sleep(Duration::from_millis(20));
        supervisor::bench::reap_orphans();
    }
}

fn time(n: usize, pace: Pace, mut f: impl FnMut()) -> Timed {
    for _ in 0..n / 10 {
        f(); // warm-up
    }
    settle();
    let cpu0 = cpu_time();
    let wall = (0..n)
        .map(|_| {
            if let Pace::Gap(d) = pace {
                std::thread::sleep(d);
            }
            let t = Instant::now();
            f();
            t.elapsed()
        })
        .collect();
    settle();
    Timed {
        wall,
        cpu_ms: (cpu_time() - cpu0).as_secs_f64() * 1e3 / n as f64,
    }
}

fn main() {
    if !rustix::process::geteuid().is_root() {
        eprintln!("sandbox bench: SKIPPED (needs root to lease UIDs)");
        return;
    }
    // The subreaper of everything below us, before anything is measured: bwrap's monitor
    // exits as soon as its namespace's init reports the command's status, without waiting for
    // that init, which is then reparented — to us, and reaped by the supervisor's reaper, so
    // its CPU (and the command's) is counted; to the host's init otherwise, and lost (bwrap
    // then looked half as costly as it is: 2.4 ms instead of 5.5 here).
    rustix::process::set_child_subreaper(Some(rustix::process::getpid())).expect("subreaper");
    let n: usize = std::env::var("BENCH_ITERATIONS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(300);
    let mut policy = policy::Policy::default_policy().expect("policy");
    // BENCH_NAMESPACES=mount,pid,... (or "none") overrides the default policy's list.
    if let Ok(list) = std::env::var("BENCH_NAMESPACES") {
        let has = |n: &str| list.split(',').any(|x| x == n);
        policy.namespaces = policy::Namespaces {
            mount: has("mount"),
            pid: has("pid"),
            net: has("net"),
            ipc: has("ipc"),
            uts: has("uts"),
            cgroup: has("cgroup"),
        };
    }
    let work_root =
        std::env::var_os("BENCH_WORKDIR").map_or_else(|| PathBuf::from("/dev/shm"), PathBuf::from);
    let work = tempfile::Builder::new()
        .prefix("cmpw-bench")
        .tempdir_in(&work_root)
        .expect("tmp");
    // The work root of a pod is reachable by the leased UIDs; so is this one.
    std::fs::set_permissions(
        work.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .expect("chmod");
    // The supervisor exactly as `serve` starts it, one-shot (no sweep), but keeping this
    // process's capabilities (bwrap and firejail, measured beside it, need them) and, for the
    // first, without cgroups.
    let make_runner_with = |first: u32, cgroups: bool, namespaces: policy::Namespaces| {
        // Its own UID range so that it never meets a running server's.
        let mut p = policy.clone();
        p.namespaces = namespaces;
        p.uid_first = first;
        p.uid_count = 1000;
        let mut opts = StartOptions::new(work.path().join(format!("r{first}")), Owner::OneShot);
        opts.exe = PathBuf::from(env!("CARGO_BIN_EXE_cmp-warden"));
        opts.cgroups = cgroups;
        opts.drop_capabilities = false;
        match Supervisor::start(&p, opts) {
            Ok((s, e)) => Some((s, e)),
            Err(e) if cgroups => {
                eprintln!("sandbox bench: no per-request cgroups here: {e}");
                None
            }
            Err(e) => panic!("supervisor: {e}"),
        }
    };
    let make_runner =
        |first: u32, cgroups: bool| make_runner_with(first, cgroups, policy.namespaces);
    let (runner_sup, _) = make_runner(300_000, false).expect("supervisor");
    // The same with per-request cgroups (v1 here: memory, pids, cpu), for their cost.
    let cg_sup = make_runner(301_000, true).filter(|(_, e)| e.cgroups.is_some());
    let runner = runner_sup.runner();
    let cg_runner = cg_sup.as_ref().map(|(s, _)| s.runner());
    let src = tempfile::tempdir().expect("tmp");
    std::fs::write(src.path().join("a.yaml"), "a: 1\n").expect("write");
    let mut tgz = Vec::new();
    archive::pack_dir(src.path(), &|_| false, &mut tgz).expect("pack");
    let yaml = |init: bool| {
        let init = if init {
            "  init:\n    command: [/bin/true]\n"
        } else {
            ""
        };
        plugin::PluginConfig::parse(&format!(
            "apiVersion: argoproj.io/v1alpha1\nkind: ConfigManagementPlugin\nmetadata:\n  name: b\nspec:\n{init}  generate:\n    command: [/bin/true]\n"
        ))
        .expect("plugin")
        .config
    };
    let mut i = 0u64;
    let mut split: Vec<(Duration, Duration)> = Vec::new();
    let plan = runner_sup.plan();
    let mut request = |runner: &std::sync::Arc<dyn supervisor::Runner>,
                       config: &plugin::PluginConfig,
                       split: &mut Vec<(Duration, Duration)>| {
        i += 1;
        let spec = plan.request(
            Operation::Generate,
            config,
            work.path().join(format!("r{i}")),
            ".",
            &[("PATH".into(), "/usr/bin:/bin".into())],
            (None, vocab::request::TimeLimit::Client),
        );
        let t = Instant::now();
        let r = runner.execute(
            &spec,
            Box::new(std::io::Cursor::new(tgz.clone())),
            &CancelToken::new(),
        );
        let t_exec = t.elapsed();
        runner.reclaim(&spec);
        split.push((t_exec, t.elapsed() - t_exec));
        r.expect("request");
    };

    let gap = Duration::from_millis(
        std::env::var("BENCH_GAP_MS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(25),
    );
    let paced = Pace::Gap(gap);
    let b2b = Pace::BackToBack;
    let rounds: usize = std::env::var("BENCH_CPU_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(5)
        .clamp(1, n.max(1));
    let per_round = (n / rounds).max(1);
    // BENCH_LAYERS=1: what each namespace costs us and what it costs bwrap, one layer at a time,
    // back to back, each of ours alternated with its bwrap counterpart round by round: the
    // analysis behind BENCHMARKS.md's "what is left, by protection".
    if std::env::var_os("BENCH_LAYERS").is_some() {
        let ns = |list: &[&str]| policy::Namespaces {
            mount: list.contains(&"mount"),
            pid: list.contains(&"pid"),
            net: list.contains(&"net"),
            ipc: list.contains(&"ipc"),
            uts: list.contains(&"uts"),
            cgroup: list.contains(&"cgroup"),
        };
        let bw = |extra: &[&str]| {
            let mut a = vec!["--ro-bind", "/", "/"];
            a.extend_from_slice(extra);
            a.push("/bin/true");
            a.into_iter().map(str::to_owned).collect::<Vec<_>>()
        };
        let layers: Vec<(&str, policy::Namespaces, Option<Vec<String>>)> = vec![
            ("no namespaces", ns(&[]), None),
            (
                "mount (user + mount: bwrap's least)",
                ns(&["mount"]),
                Some(bw(&[])),
            ),
            (
                "+ pid (a private /proc)",
                ns(&["mount", "pid"]),
                Some(bw(&["--unshare-pid", "--proc", "/proc"])),
            ),
            (
                "+ net",
                ns(&["mount", "pid", "net"]),
                Some(bw(&["--unshare-pid", "--proc", "/proc", "--unshare-net"])),
            ),
            (
                "+ ipc, uts, cgroup (the default policy; bwrap --unshare-all)",
                policy.namespaces,
                Some(bw(&[
                    "--unshare-all",
                    "--die-with-parent",
                    "--proc",
                    "/proc",
                ])),
            ),
        ];
        let mut j = 0u64;
        let mut rows = Vec::new();
        println!("layer, back to back, {rounds} rounds alternated: ours CPU ms | bwrap CPU ms");
        for (k, (label, namespaces, bwrap_args)) in layers.into_iter().enumerate() {
            let first = 310_000 + 1000 * k as u32;
            let (sup, _) = make_runner_with(first, false, namespaces).expect("supervisor");
            let r = sup.runner();
            let lplan = sup.plan();
            let config = yaml(false);
            let (mut ours, mut theirs) = (Timed::empty(), Timed::empty());
            for _ in 0..rounds {
                ours = ours.merge(time(per_round, b2b, || {
                    j += 1;
                    let spec = lplan.request(
                        Operation::Generate,
                        &config,
                        work.path().join(format!("l{j}")),
                        ".",
                        &[("PATH".into(), "/usr/bin:/bin".into())],
                        (None, vocab::request::TimeLimit::Client),
                    );
                    let out = r.execute(
                        &spec,
                        Box::new(std::io::Cursor::new(tgz.clone())),
                        &CancelToken::new(),
                    );
                    r.reclaim(&spec);
                    out.expect("request");
                }));
                if let Some(a) = &bwrap_args {
                    theirs = theirs.merge(time(per_round, b2b, || run_bwrap(a)));
                }
            }
            let theirs = bwrap_args.map(|_| theirs.cpu_ms);
            let shown = theirs.map_or_else(|| "-".to_owned(), |t| format!("{t:.3}"));
            println!("{label:<62} {:>8.3} | {shown:>8}", ours.cpu_ms);
            rows.push(serde_json::json!({"layer": label, "ours_cpu_ms": ours.cpu_ms, "bwrap_cpu_ms": theirs}));
            sup.shutdown();
        }
        println!(
            "{}",
            serde_json::json!({"layers": rows, "iterations": n, "cpu_rounds": rounds})
        );
        runner_sup.shutdown();
        if let Some((s, _)) = &cg_sup {
            s.shutdown();
        }
        return;
    }
    // BENCH_PROFILE=request|cgroup: only that case, back to back (paced with BENCH_PACED=1),
    // for a profiler attached to this process.
    if let Ok(case) = std::env::var("BENCH_PROFILE") {
        let r = match case.as_str() {
            "cgroup" => cg_runner.as_ref().expect("no cgroup hierarchy here"),
            _ => &runner,
        };
        let pace = match std::env::var_os("BENCH_PACED") {
            Some(_) => paced,
            None => b2b,
        };
        let mut parts = Vec::new();
        let t = time(n, pace, || request(r, &yaml(false), &mut parts));
        let part = |first: bool| {
            median(
                parts
                    .iter()
                    .map(|p| if first { p.0 } else { p.1 })
                    .collect(),
            )
        };
        println!(
            "{case}: median {:.3} ms (until the reply {:.3}, reclaim {:.3}), cpu {:.3} ms per request",
            median(t.wall),
            part(true),
            part(false),
            t.cpu_ms
        );
        runner_sup.shutdown();
        if let Some((s, _)) = &cg_sup {
            s.shutdown();
        }
        return;
    }
    let bare = time(n, b2b, || {
        let st = run_tracked(&mut Command::new("/bin/true")).status;
        assert!(st.success());
    });
    let argv = vec!["/bin/true".to_owned()];
    let env = vec![("PATH".to_owned(), "/usr/bin:/bin".to_owned())];
    let cwd = std::env::temp_dir();
    let runner_cmd = time(n, b2b, || {
        let spec = supervisor::bench::CmdSpec {
            argv: &argv,
            env: &env,
            cwd: &cwd,
            stdout_cap: 1 << 20,
            stderr_cap: 1 << 20,
            stdin: None,
            stderr_lines: None,
        };
        supervisor::bench::run(&spec, None, &CancelToken::new()).expect("run");
    });
    let bwrap_all: Vec<String> = [
        "--ro-bind",
        "/",
        "/",
        "--unshare-all",
        "--die-with-parent",
        "/bin/true",
    ]
    .map(str::to_owned)
    .to_vec();
    let bwrap_once = || run_bwrap(&bwrap_all);
    let have_bwrap = Path::new("/usr/bin/bwrap").exists();
    let bwrap_paced = have_bwrap.then(|| time(n, paced, bwrap_once));
    // firejail is setuid root and refuses some environments; measure it only if it runs.
    let firejail_runs = || {
        let mut cmd = Command::new("firejail");
        cmd.args(["--quiet", "--noprofile", "/bin/true"])
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let Ok(mut child) = supervisor::bench::spawn_tracked(&mut cmd) else {
            return false;
        };
        let ok = child.wait().is_ok_and(|s| s.success());
        supervisor::bench::untrack(child.id() as i32);
        ok
    };
    let firejail = firejail_runs().then(|| {
        time(n, b2b, || {
            assert!(firejail_runs(), "firejail stopped working mid-run");
        })
    });
    let one = yaml(false);
    let two = yaml(true);
    let req1 = time(n, paced, || request(&runner, &one, &mut split));
    let req2 = time(n, paced, || request(&runner, &two, &mut Vec::new()));
    let mut split_cg: Vec<(Duration, Duration)> = Vec::new();
    let req_cg_paced = cg_runner
        .as_ref()
        .map(|r| time(n, paced, || request(r, &one, &mut split_cg)));
    // Back to back, the three cases the CPU target compares, alternated round by round.
    let (mut bwrap_b2b, mut req1_b2b, mut req_cg_b2b) =
        (Timed::empty(), Timed::empty(), Timed::empty());
    for _ in 0..rounds {
        if have_bwrap {
            bwrap_b2b = bwrap_b2b.merge(time(per_round, b2b, bwrap_once));
        }
        req1_b2b = req1_b2b.merge(time(per_round, b2b, || {
            request(&runner, &one, &mut Vec::new())
        }));
        if let Some(r) = &cg_runner {
            req_cg_b2b =
                req_cg_b2b.merge(time(per_round, b2b, || request(r, &one, &mut Vec::new())));
        }
    }
    let bwrap = bwrap_paced.map(|p| (p, bwrap_b2b));
    let req_cg = req_cg_paced.map(|p| (p, req_cg_b2b));

    let col = |s: &[(Duration, Duration)], first: bool| {
        median(s.iter().map(|p| if first { p.0 } else { p.1 }).collect())
    };
    let (exec_ms, reclaim_ms) = (col(&split, true), col(&split, false));
    let b = median(bare.wall.clone());
    let row = |label: &str, t: &Timed| {
        println!(
            "{label:<66} {:>8.3} {:>8.3} {:>8.3}",
            median(t.wall.clone()),
            p90(t.wall.clone()),
            t.cpu_ms
        );
    };
    println!(
        "sandbox cost, {n} iterations each: wall median and p90, CPU per iteration (ms); paced = {} ms untimed between iterations; back to back: bwrap and our requests alternated in {rounds} rounds",
        gap.as_millis()
    );
    println!("{:<66} {:>8} {:>8} {:>8}", "case", "median", "p90", "cpu");
    row("bare fork/exec /bin/true", &bare);
    row(
        "our command runner, unconfined (pipes, caps, group kill)",
        &runner_cmd,
    );
    match &bwrap {
        Some((p, q)) => {
            row("bwrap --unshare-all, paced", p);
            row("bwrap --unshare-all, back to back", q);
        }
        None => println!("bwrap: not installed (scripts/setup installs bubblewrap)"),
    }
    match &firejail {
        Some(v) => row("firejail --quiet --noprofile", v),
        None => {
            println!("firejail: not installed or does not run here (scripts/setup installs it)")
        }
    }
    row("cmp-warden request incl. reclaim, paced", &req1);
    row("cmp-warden request incl. reclaim, back to back", &req1_b2b);
    row("cmp-warden request with 2 commands, paced", &req2);
    if let Some((p, q)) = &req_cg {
        row("cmp-warden request with a per-request cgroup, paced", p);
        row(
            "cmp-warden request with a per-request cgroup, back to back",
            q,
        );
    }
    println!(
        "  of which: until the reply {exec_ms:.3}, reclaim {reclaim_ms:.3} (paced, without cgroup)"
    );
    let cg_split = (!split_cg.is_empty()).then(|| (col(&split_cg, true), col(&split_cg, false)));
    if let Some((e, r)) = cg_split {
        println!("  of which: until the reply {e:.3}, reclaim {r:.3} (paced, with cgroup)");
    }
    let (r1, r2) = (median(req1.wall.clone()), median(req2.wall.clone()));
    let med = |t: &Timed| median(t.wall.clone());
    println!(
        "per-request overhead over bare:  ours {:.3} ms (paced)",
        r1 - b
    );
    if let Some((p, _)) = &bwrap {
        println!(
            "                                 bwrap {:.3} ms (paced)",
            med(p) - b
        );
    }
    println!(
        "per-command cost inside a request: {:.3} ms (bare spawn {b:.3} ms; overhead {:.3} ms)",
        r2 - r1,
        (r2 - r1) - b
    );
    let json = serde_json::json!({
        "iterations": n,
        "cpu_rounds": rounds,
        "gap_ms": gap.as_millis() as u64,
        "namespaces": std::env::var("BENCH_NAMESPACES").unwrap_or_else(|_| "default".into()),
        "bare_ms": b,
        "bare_cpu_ms": bare.cpu_ms,
        "runner_command_ms": med(&runner_cmd),
        "bwrap_ms": bwrap.as_ref().map(|(p, _)| med(p)),
        "bwrap_b2b_ms": bwrap.as_ref().map(|(_, q)| med(q)),
        "bwrap_cpu_ms": bwrap.as_ref().map(|(_, q)| q.cpu_ms),
        "firejail_ms": firejail.as_ref().map(med),
        "firejail_cpu_ms": firejail.as_ref().map(|v| v.cpu_ms),
        "request_ms": r1,
        "request_p90_ms": p90(req1.wall.clone()),
        "request_b2b_ms": med(&req1_b2b),
        "request_cpu_ms": req1_b2b.cpu_ms,
        "jail_ms": exec_ms,
        "reclaim_ms": reclaim_ms,
        "request_two_commands_ms": r2,
        "request_two_commands_cpu_ms": req2.cpu_ms,
        "per_command_ms": r2 - r1,
        "request_with_cgroup_ms": req_cg.as_ref().map(|(p, _)| med(p)),
        "request_with_cgroup_b2b_ms": req_cg.as_ref().map(|(_, q)| med(q)),
        "request_with_cgroup_cpu_ms": req_cg.as_ref().map(|(_, q)| q.cpu_ms),
        "jail_with_cgroup_ms": cg_split.map(|c| c.0),
        "reclaim_with_cgroup_ms": cg_split.map(|c| c.1),
    });
    println!("{json}");
    runner_sup.shutdown();
    if let Some((s, _)) = &cg_sup {
        s.shutdown();
    }
}
