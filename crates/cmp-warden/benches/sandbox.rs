//! Sandbox cost, A/B in one run (needs root; prints why and exits otherwise):
//! - bare: fork/exec of `/bin/true` (std `Command`);
//! - bwrap: `bwrap --ro-bind / / --unshare-all --die-with-parent /bin/true` (Debian bubblewrap;
//!   the root bind is needed for `/bin/true` to exist inside);
//! - firejail: `firejail --quiet --noprofile /bin/true` (Debian firejail), when it runs here;
//! - request: one confined request exactly as `serve` runs it — lease a UID, spawn the jail,
//!   confine (credentials, capabilities, no_new_privs, Landlock, seccomp), extract a one-file
//!   archive, run `/bin/true` as generate, reply, then reclaim (kill the UID, remove the tree,
//!   release the lease);
//! - per command: the same request with `/bin/true` as init too; the difference is what one
//!   more command costs inside a request (the filter is inherited, not reinstalled).
#![allow(clippy::print_stdout, clippy::print_stderr)]

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use jail::confine::Sandbox;
use jail::confined::{Confined, ConfinedConfig};
use jail::{CancelToken, Operation, RequestSpec, Runner};

fn median(mut v: Vec<Duration>) -> f64 {
    v.sort();
    v[v.len() / 2].as_secs_f64() * 1e3
}

fn p90(mut v: Vec<Duration>) -> f64 {
    v.sort();
    v[v.len() * 9 / 10].as_secs_f64() * 1e3
}

fn time(n: usize, mut f: impl FnMut()) -> Vec<Duration> {
    for _ in 0..n / 10 {
        f(); // warm-up
    }
    (0..n)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed()
        })
        .collect()
}

fn main() {
    if !rustix::process::geteuid().is_root() {
        eprintln!("sandbox bench: SKIPPED (needs root to lease UIDs)");
        return;
    }
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
    let filter = jail::seccomp::compile(&policy.seccomp, policy.seccomp_mode, policy.network)
        .expect("seccomp");
    let work = tempfile::Builder::new()
        .prefix("cmpw-bench")
        .tempdir()
        .expect("tmp");
    std::fs::set_permissions(
        work.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o1733),
    )
    .expect("chmod");
    let make_runner = |first: u32, cgroups| {
        // Its own UID range so that it never meets a running server's.
        let pool = jail::uid::UidPool::from_image(first, 1000, Path::new("/")).expect("pool");
        Confined::new(ConfinedConfig {
            exe: PathBuf::from(env!("CARGO_BIN_EXE_cmp-warden")),
            work_root: work.path().to_path_buf(),
            pool: Some(pool),
            sandbox: Sandbox::from_policy(&policy, Some(filter.clone())),
            log_args: Vec::new(),
            cgroups,
        })
    };
    let runner = make_runner(300_000, None);
    // The same with per-request cgroups (v1 here: memory, pids, cpu), for their cost.
    let own = std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
    let cg_runner =
        jail::cgroup::detect(Path::new("/sys/fs/cgroup"), &own, None, "cmp-warden-bench")
            .and_then(|l| jail::cgroup::prepare(&l, std::process::id()).map(|_| l))
            .ok()
            .map(|layout| {
                let limits = jail::cgroup::CgroupLimits {
                    memory_bytes: policy.limits.memory_bytes,
                    pids: policy.limits.pids,
                    cpu_millis: policy.limits.cpu_millis,
                };
                make_runner(301_000, Some((layout, limits)))
            });
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
    let mut request = |runner: &Confined,
                       config: &plugin::PluginConfig,
                       split: &mut Vec<(Duration, Duration)>| {
        i += 1;
        let spec = RequestSpec {
            op: Operation::Generate,
            config: config.clone(),
            tree: work.path().join(format!("r{i}")),
            app_rel_path: ".".into(),
            env: vec![("PATH".into(), "/usr/bin:/bin".into())],
            archive: archive::Options::default(),
            output_bytes: 1 << 20,
            deadline: None,
            deadline_limit: jail::TimeLimit::Client,
            command_timeout: None,
            record: Default::default(),
        };
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

    let bare = time(n, || {
        let st = Command::new("/bin/true").status().expect("true");
        assert!(st.success());
    });
    let argv = vec!["/bin/true".to_owned()];
    let env = vec![("PATH".to_owned(), "/usr/bin:/bin".to_owned())];
    let cwd = std::env::temp_dir();
    let runner_cmd = time(n, || {
        let spec = jail::CmdSpec {
            argv: &argv,
            env: &env,
            cwd: &cwd,
            stdout_cap: 1 << 20,
            stderr_cap: 1 << 20,
            stdin: None,
        };
        jail::run::run(&spec, None, &CancelToken::new()).expect("run");
    });
    let have_bwrap = Path::new("/usr/bin/bwrap").exists();
    let bwrap = have_bwrap.then(|| {
        time(n, || {
            let st = Command::new("/usr/bin/bwrap")
                .args([
                    "--ro-bind",
                    "/",
                    "/",
                    "--unshare-all",
                    "--die-with-parent",
                    "/bin/true",
                ])
                .stderr(Stdio::null())
                .status()
                .expect("bwrap");
            assert!(st.success());
        })
    });
    // firejail is setuid root and refuses some environments; measure it only if it runs.
    let firejail_runs = || {
        Command::new("firejail")
            .args(["--quiet", "--noprofile", "/bin/true"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    };
    let firejail = firejail_runs().then(|| {
        time(n, || {
            assert!(firejail_runs(), "firejail stopped working mid-run");
        })
    });
    let one = yaml(false);
    let two = yaml(true);
    let req1 = time(n, || request(&runner, &one, &mut split));
    let req2 = time(n, || request(&runner, &two, &mut Vec::new()));
    let req_cg = cg_runner
        .as_ref()
        .map(|r| time(n, || request(r, &one, &mut Vec::new())));

    let exec_ms = median(split.iter().map(|s| s.0).collect());
    let reclaim_ms = median(split.iter().map(|s| s.1).collect());
    let p90_req1 = p90(req1.clone());
    let (b, r1, r2) = (
        median(bare.clone()),
        median(req1.clone()),
        median(req2.clone()),
    );
    println!("sandbox cost, {n} iterations each, median (p90) in ms");
    println!("{:<58} {:>8} {:>8}", "case", "median", "p90");
    println!(
        "{:<58} {:>8.3} {:>8.3}",
        "bare fork/exec /bin/true",
        b,
        p90(bare)
    );
    let mut bw = None;
    let rc = median(runner_cmd.clone());
    println!(
        "{:<58} {:>8.3} {:>8.3}",
        "our command runner, unconfined (pipes, caps, group kill)",
        rc,
        p90(runner_cmd)
    );
    if let Some(v) = bwrap {
        let m = median(v.clone());
        bw = Some(m);
        println!(
            "{:<58} {:>8.3} {:>8.3}",
            "bwrap --ro-bind / / --unshare-all --die-with-parent",
            m,
            p90(v)
        );
    } else {
        println!("bwrap: not installed (scripts/setup installs bubblewrap)");
    }
    let fj = firejail.map(|v| {
        let m = median(v.clone());
        println!(
            "{:<58} {:>8.3} {:>8.3}",
            "firejail --quiet --noprofile",
            m,
            p90(v)
        );
        m
    });
    if fj.is_none() {
        println!("firejail: not installed or does not run here (scripts/setup installs it)");
    }
    println!(
        "{:<58} {:>8.3} {:>8.3}",
        "cmp-warden request (jail + confine + extract + true + reclaim)",
        r1,
        p90(req1)
    );
    println!(
        "{:<58} {:>8.3} {:>8.3}",
        "cmp-warden request with 2 commands",
        r2,
        p90(req2)
    );
    let cg_ms = req_cg.map(|v| (median(v.clone()), p90(v)));
    if let Some((m, p)) = cg_ms {
        println!(
            "{:<58} {:>8.3} {:>8.3}",
            "cmp-warden request with a per-request cgroup (v1)", m, p
        );
    }
    println!(
        "{:<58} {:>8.3}",
        "  of which: jail (spawn, confine, extract, run, reply)", exec_ms
    );
    println!(
        "{:<58} {:>8.3}",
        "  of which: reclaim (helper, kill, remove, release)", reclaim_ms
    );
    println!();
    if let Some((m, _)) = cg_ms {
        println!(
            "per-request cgroup cost (create, join, read back, remove): {:.3} ms",
            m - r1
        );
    }
    println!("per-request overhead over bare:  ours {:.3} ms", r1 - b);
    if let Some(m) = bw {
        println!("                                 bwrap {:.3} ms", m - b);
    }
    println!(
        "per-command cost inside a request: {:.3} ms (bare spawn {:.3} ms; overhead {:.3} ms)",
        r2 - r1,
        b,
        (r2 - r1) - b
    );
    let json = serde_json::json!({
        "iterations": n,
        "bare_ms": b,
        "bwrap_ms": bw,
        "firejail_ms": fj,
        "namespaces": std::env::var("BENCH_NAMESPACES").unwrap_or_else(|_| "default".into()),
        "request_ms": r1,
        "request_p90_ms": p90_req1,
        "request_two_commands_ms": r2,
        "per_command_ms": r2 - r1,
        "runner_command_ms": rc,
        "jail_ms": exec_ms,
        "request_with_cgroup_ms": cg_ms.map(|c| c.0),
        "reclaim_ms": reclaim_ms,
    });
    println!("{json}");
}
