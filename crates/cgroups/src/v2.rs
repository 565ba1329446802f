//! The unified hierarchy (v2): the delegated cgroup is the one the server started in
//! (`/proc/self/cgroup`) or a configured directory; the server's processes move into its leaf
//! [`SUPERVISOR_LEAF`] (the kernel's "no internal processes" rule: a cgroup that enables
//! controllers for its children holds no process; the hierarchy's root is exempt and keeps
//! them), `memory pids cpu` are enabled for its children, and every request cgroup is made in
//! the instance directory `<delegated>/cmp-warden/<instance>`, which is ours alone: the sweep
//! never looks beyond it.

use std::io;
use std::path::{Path, PathBuf};

use crate::files::{io_err, keyed, read_u64, write};
use crate::{
    CPU_PERIOD_US, CgroupError, CgroupLimits, CgroupStats, Hierarchy, Layout, OUR_DIR, Readback,
    RequestCgroup, SUPERVISOR_LEAF, Tenants,
};

/// The v2 controllers we use, in the order they are enabled.
const V2_CONTROLLERS: [&str; 3] = ["memory", "pids", "cpu"];

/// The unified hierarchy, with the instance directory request cgroups are made in.
pub(crate) struct Unified<'a> {
    /// `<delegated>/cmp-warden/<instance>`.
    pub base: &'a Path,
}

/// The layout of a v2 mount at `root` for the server whose `/proc/self/cgroup` is
/// `self_cgroup`.
pub(crate) fn detect(
    root: &Path,
    self_cgroup: &str,
    instance: &str,
) -> Result<Layout, CgroupError> {
    let own = self_cgroup
        .lines()
        .find_map(|l| l.strip_prefix("0::"))
        .ok_or_else(|| CgroupError::Unavailable("no v2 entry in /proc/self/cgroup".into()))?;
    let mut delegated = root.join(own.trim().trim_start_matches('/'));
    // Started in our own leaf (a second start in this process; `kubectl exec`, which runc
    // puts in the cgroup of the container's init once the container's own cgroup delegates
    // controllers): the delegated cgroup is the leaf's parent.
    if delegated.file_name() == Some(std::ffi::OsStr::new(SUPERVISOR_LEAF))
        && let Some(parent) = delegated.parent()
    {
        delegated = parent.to_path_buf();
    }
    Ok(Layout::V2 {
        base: delegated.join(OUR_DIR).join(instance),
    })
}

impl Hierarchy for Unified<'_> {
    fn prepare(&self, tenants: Tenants) -> Result<Vec<String>, CgroupError> {
        prepare(self.base, tenants)
    }

    fn create(&self, name: &str, limits: &CgroupLimits) -> Result<RequestCgroup, CgroupError> {
        let dir = self.base.join(name);
        std::fs::create_dir(&dir).map_err(io_err("creating", &dir))?;
        configure(dir, limits)
    }
}

/// v2 preparation, in order (`base` is `<delegated>/cmp-warden/<instance>`):
/// 1. What the delegated cgroup has to give: memory, pids, cpu among its `cgroup.controllers`.
/// 2. Leave it, unless it is the hierarchy's root (which has no `cgroup.type` and is exempt
///    from the no-internal-process rule): `tenants` move into [`SUPERVISOR_LEAF`].
/// 3. Enable the controllers for its children, one at a time, skipping those already on (a
///    restart, another instance); what cannot be enabled is named.
/// 4. Our directory `cmp-warden`, now: at the root only CAP_DAC_OVERRIDE (dropped at
///    start-up's step 10) makes or removes entries, its directory being 0555 in the kernel;
///    ours is 0755 and the supervisor's own, so instance directories come and go in it later.
/// 5. The instance directory, each with the controllers enabled for the request cgroups.
fn prepare(base: &Path, tenants: Tenants) -> Result<Vec<String>, CgroupError> {
    let ours = base
        .parent()
        .ok_or_else(|| CgroupError::Unavailable(format!("{} has no parent", base.display())))?;
    let delegated = ours
        .parent()
        .ok_or_else(|| CgroupError::Unavailable(format!("{} has no parent", ours.display())))?;

    // 1. What is delegated to us.
    let available = std::fs::read_to_string(delegated.join("cgroup.controllers"))
        .map_err(io_err("reading", &delegated.join("cgroup.controllers")))?;
    let wanted: Vec<&str> = V2_CONTROLLERS
        .into_iter()
        .filter(|c| available.split_whitespace().any(|a| a == *c))
        .collect();
    if wanted.is_empty() {
        return Err(CgroupError::Unavailable(format!(
            "{} delegates none of memory, pids, cpu (has {:?})",
            delegated.display(),
            available.trim()
        )));
    }

    // 2. Out of the delegated cgroup, into our leaf (not at the root).
    if delegated.join("cgroup.type").exists() {
        let leaf = delegated.join(SUPERVISOR_LEAF);
        create_dir_existing(&leaf)?;
        move_into(delegated, &leaf, tenants)?;
    }

    // 3. The controllers for the delegated cgroup's children.
    let enabled = enable(delegated, &wanted)?;

    // 4. Our directory.
    create_dir_existing(ours)?;
    let enabled = enable(ours, &enabled)?;

    // 5. The instance directory.
    create_dir_existing(base)?;
    enable(base, &enabled)
}

fn create_dir_existing(dir: &Path) -> Result<(), CgroupError> {
    match std::fs::create_dir(dir) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(io_err("creating", dir)(e)),
    }
}

fn procs(dir: &Path) -> Vec<String> {
    std::fs::read_to_string(dir.join("cgroup.procs"))
        .unwrap_or_default()
        .split_whitespace()
        .map(str::to_owned)
        .collect()
}

/// Move `tenants` of `from` into `leaf`. A process that exits meanwhile is no error; one that
/// forks meanwhile is caught by the next round.
fn move_into(from: &Path, leaf: &Path, tenants: Tenants) -> Result<(), CgroupError> {
    let target = leaf.join("cgroup.procs");
    if tenants == Tenants::OnlySelf {
        return write(&target, &std::process::id().to_string());
    }
    for _ in 0..10 {
        let left = procs(from);
        if left.is_empty() {
            return Ok(());
        }
        for pid in left {
            match std::fs::write(&target, &pid) {
                Ok(()) => {}
                Err(e) if e.raw_os_error() == Some(3) => {} // ESRCH: it exited
                Err(e) => return Err(io_err("writing", &target)(e)),
            }
        }
    }
    Ok(())
}

/// Enable `wanted` in `dir/cgroup.subtree_control` (those not on yet), one at a time. Returns
/// those on afterwards; none on is an error that says why.
fn enable(dir: &Path, wanted: &[impl AsRef<str>]) -> Result<Vec<String>, CgroupError> {
    let control = dir.join("cgroup.subtree_control");
    let on = std::fs::read_to_string(&control).map_err(io_err("reading", &control))?;
    let mut enabled = Vec::new();
    let mut refused = Vec::new();
    for c in wanted.iter().map(AsRef::as_ref) {
        if on.split_whitespace().any(|x| x == c) {
            enabled.push(c.to_owned());
            continue;
        }
        match std::fs::write(&control, format!("+{c}")) {
            Ok(()) => enabled.push(c.to_owned()),
            Err(e) => refused.push(explain_enable(dir, c, &e)),
        }
    }
    for why in &refused {
        tracing::warn!(why = %why, "cgroup controller not enabled for the requests");
    }
    if enabled.is_empty() {
        return Err(CgroupError::Unavailable(refused.join("; ")));
    }
    Ok(enabled)
}

fn explain_enable(dir: &Path, c: &str, e: &io::Error) -> String {
    let held = procs(dir).len();
    if e.raw_os_error() == Some(16) && held > 0 {
        // EBUSY: the no-internal-process rule.
        format!(
            "enabling {c} in {}: {e}: it still holds {held} process(es), and a cgroup that \
             delegates controllers may hold none (run the server in a cgroup of its own — a \
             container, a systemd service with Delegate=yes — or set CMP_WARDEN_CGROUP_ROOT)",
            dir.join("cgroup.subtree_control").display()
        )
    } else {
        format!(
            "enabling {c} in {}: {e}",
            dir.join("cgroup.subtree_control").display()
        )
    }
}

/// Set a new v2 request cgroup's limits, for the controllers delegated to it.
pub(crate) fn configure(dir: PathBuf, limits: &CgroupLimits) -> Result<RequestCgroup, CgroupError> {
    let quota = limits.cpu_millis.saturating_mul(CPU_PERIOD_US) / 1000;
    // The controllers delegated to the new cgroup show as their interface files.
    let controllers: Vec<String> = [
        ("memory", "memory.max"),
        ("pids", "pids.max"),
        ("cpu", "cpu.max"),
    ]
    .into_iter()
    .filter(|(_, f)| dir.join(f).exists())
    .map(|(c, _)| c.to_owned())
    .collect();
    let cg = RequestCgroup {
        v2: true,
        dirs: vec![("unified".into(), dir.clone())],
        controllers,
    };
    let set = || -> Result<(), CgroupError> {
        if cg.has("memory") {
            write(&dir.join("memory.max"), &limits.memory_bytes.to_string())?;
            // Swap off for the request where the kernel has swap accounting.
            if dir.join("memory.swap.max").exists() {
                write(&dir.join("memory.swap.max"), "0")?;
            }
            // An OOM kill takes the whole request, not one random process of it.
            if dir.join("memory.oom.group").exists() {
                write(&dir.join("memory.oom.group"), "1")?;
            }
        }
        if cg.has("pids") {
            write(&dir.join("pids.max"), &limits.pids.to_string())?;
        }
        if cg.has("cpu") {
            write(&dir.join("cpu.max"), &format!("{quota} {CPU_PERIOD_US}"))?;
        }
        Ok(())
    };
    if let Err(e) = set() {
        let _ = cg.remove();
        return Err(e);
    }
    Ok(cg)
}

/// Peak memory and OOM kills from a v2 memory controller's files.
pub(crate) fn memory_stats(d: &Path, s: &mut CgroupStats) {
    s.peak_memory_bytes = read_u64(&d.join("memory.peak"));
    s.oom_kills = keyed(&d.join("memory.events"), "oom_kill");
}

/// The memory limits as a v2 cgroup holds them, and whether a process ran in it.
pub(crate) fn read_back_memory(d: &Path, r: &mut Readback, max: impl Fn(PathBuf) -> Option<u64>) {
    r.memory_max = max(d.join("memory.max"));
    r.swap_max = max(d.join("memory.swap.max"));
    r.oom_group = max(d.join("memory.oom.group")).map(|v| v == 1);
    r.ran = ran(d);
}

/// `cpu.max` as (quota, period); `max` is `u64::MAX`.
pub(crate) fn cpu_max(d: &Path) -> Option<(u64, u64)> {
    std::fs::read_to_string(d.join("cpu.max"))
        .ok()
        .and_then(|s| {
            let mut f = s.split_whitespace();
            let quota = match f.next()? {
                "max" => u64::MAX,
                q => q.parse().ok()?,
            };
            Some((quota, f.next()?.parse().ok()?))
        })
}

/// Whether a process ran in the cgroup: the core `cpu.stat` every v2 cgroup has.
pub(crate) fn ran(d: &Path) -> bool {
    keyed(&d.join("cpu.stat"), "usage_usec") > 0
}

/// `cgroup.kill`: every process of the cgroup, atomically (where the kernel has it).
pub(crate) fn kill(d: &Path) -> Result<(), CgroupError> {
    let f = d.join("cgroup.kill");
    if f.exists() {
        write(&f, "1")?;
    }
    Ok(())
}

#[cfg(test)]
#[allow(clippy::print_stderr)] // a skip must say why
mod tests {
    use super::*;
    use crate::testing::{LIMITS, create_with_kernel_files, fake_v2, join};
    use crate::{
        detect, holds_processes, prepare, remove_instance, remove_instance_if_unused, sweep,
    };

    #[test]
    fn v2_detect_prepare_create_stats_kill_remove_on_a_fake_cgroupfs() {
        let t = fake_v2("cpu memory pids");
        let ctr = t.path().join("kubepods/pod1/ctr");
        let layout = detect(t.path(), "0::/kubepods/pod1/ctr\n", None, "i1").expect("detect");
        let base = ctr.join("cmp-warden/i1");
        assert_eq!(layout, Layout::V2 { base: base.clone() });
        // Started in our own leaf (a second start, `kubectl exec` beside the server): the same.
        let again = detect(
            t.path(),
            "0::/kubepods/pod1/ctr/cmp-warden-supervisor\n",
            None,
            "i1",
        )
        .expect("detect");
        assert_eq!(again, layout);
        let ctls = prepare(&layout, Tenants::OnlySelf).expect("prepare");
        assert_eq!(ctls, ["memory", "pids", "cpu"]);
        assert_eq!(
            std::fs::read_to_string(ctr.join(SUPERVISOR_LEAF).join("cgroup.procs")).expect("r"),
            std::process::id().to_string()
        );
        // One controller per write (a fake file keeps the last), at each level.
        for dir in [ctr.clone(), ctr.join("cmp-warden"), base.clone()] {
            assert_eq!(
                std::fs::read_to_string(dir.join("cgroup.subtree_control")).expect("r"),
                "+cpu"
            );
        }
        // The kernel fills a new cgroup with the interface files of the delegated controllers
        // (memory.swap.max only with swap accounting); a fake cgroupfs cannot, so the test
        // creates them where the kernel would, just before `create` writes them.
        let cg = create_with_kernel_files(
            &layout,
            "r1",
            &[
                "memory.max",
                "memory.swap.max",
                "memory.oom.group",
                "pids.max",
                "cpu.max",
            ],
        );
        assert_eq!(cg.controllers, ["memory", "pids", "cpu"]);
        let r = |f: &str| std::fs::read_to_string(base.join("r1").join(f)).expect(f);
        assert_eq!(r("memory.max"), "1073741824");
        assert_eq!(r("memory.swap.max"), "0");
        assert_eq!(r("memory.oom.group"), "1");
        assert_eq!(r("pids.max"), "512");
        assert_eq!(r("cpu.max"), "200000 100000");
        assert_eq!(cg.procs_files(), [base.join("r1/cgroup.procs")]);
        // A cgroup with only some controllers delegated has only those; v2 kills through
        // `cgroup.kill`.
        let only = create_with_kernel_files(&layout, "r2", &["pids.max", "cgroup.kill"]);
        assert!(only.has("pids") && !only.has("memory") && !only.has("cpu"));
        assert!(std::fs::read_to_string(base.join("r2/memory.max")).is_err());
        only.kill().expect("kill");
        assert_eq!(
            std::fs::read_to_string(base.join("r2/cgroup.kill")).expect("kill file"),
            "1"
        );
        join(&cg);
        assert_eq!(r("cgroup.procs"), "0");
        std::fs::write(base.join("r1/memory.peak"), "123456\n").expect("w");
        std::fs::write(
            base.join("r1/memory.events"),
            "low 0\nhigh 0\nmax 7\noom 2\noom_kill 1\n",
        )
        .expect("w");
        std::fs::write(base.join("r1/pids.events"), "max 3\n").expect("w");
        assert_eq!(
            cg.stats(),
            CgroupStats {
                peak_memory_bytes: 123456,
                oom_kills: 1,
                pids_refused: 3,
                pids_peak: 0,
            }
        );
        std::fs::write(base.join("r1/cgroup.kill"), "").expect("w");
        cg.kill().expect("kill");
        assert_eq!(r("cgroup.kill"), "1");
        // The real cgroupfs lets rmdir succeed with its control files present; a fake needs
        // them gone first.
        for e in std::fs::read_dir(base.join("r1")).expect("ls").flatten() {
            std::fs::remove_file(e.path()).expect("rm");
        }
        cg.remove().expect("remove");
        assert!(!base.join("r1").exists());
    }

    #[test]
    fn the_sweep_leaves_another_live_instances_request_cgroups_alone() {
        let t = tempfile::tempdir().expect("tmp");
        let base = t.path().to_path_buf();
        for d in ["j20001-10-0", "j20002-11-0"] {
            std::fs::create_dir(base.join(d)).expect("mkdir");
        }
        let layout = Layout::V2 { base: base.clone() };
        let removed = sweep(&layout, |name| name.starts_with("j20002-"));
        assert_eq!(removed, 1);
        assert!(!base.join("j20001-10-0").exists(), "ours: removed");
        assert!(
            base.join("j20002-11-0").exists(),
            "another instance's: kept"
        );
    }

    /// On the way out: an instance directory whose request cgroups hold no process goes; one
    /// whose request cgroup still holds one is kept (the next start-up sweeps it); one already
    /// gone is no error.
    #[test]
    fn the_instance_directory_goes_on_the_way_out_unless_a_request_still_runs() {
        let t = tempfile::tempdir().expect("tmp");
        let unused = t.path().join("cmp-warden-20000");
        std::fs::create_dir(&unused).expect("mkdir");
        let layout = Layout::V2 {
            base: unused.clone(),
        };
        remove_instance_if_unused(&layout, std::time::Duration::from_millis(50));
        assert!(!unused.exists(), "unused: removed");
        remove_instance(&layout).expect("already gone: no error");
        assert!(!unused.exists(), "already gone: nothing made");

        let busy = t.path().join("cmp-warden-30000");
        std::fs::create_dir_all(busy.join("j30001-7-0")).expect("mkdir");
        std::fs::write(busy.join("j30001-7-0/cgroup.procs"), "4242\n").expect("w");
        let layout = Layout::V2 { base: busy.clone() };
        remove_instance_if_unused(&layout, std::time::Duration::from_millis(50));
        assert!(
            busy.join("j30001-7-0").exists(),
            "a request still runs: kept"
        );
        // Once its process is gone (and the kernel removed its cgroup), the directory goes.
        std::fs::remove_dir_all(busy.join("j30001-7-0")).expect("rm");
        remove_instance_if_unused(&layout, std::time::Duration::from_millis(50));
        assert!(!busy.exists(), "then removed");

        // A request whose reclaim ends while the server stops is waited for.
        let late = t.path().join("cmp-warden-40000");
        std::fs::create_dir_all(late.join("j40001-8-0")).expect("mkdir");
        std::fs::write(late.join("j40001-8-0/cgroup.procs"), "4343\n").expect("w");
        let request = late.join("j40001-8-0");
        let reclaim = std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_millis(100));
            std::fs::remove_dir_all(request).expect("rm");
        });
        let layout = Layout::V2 { base: late.clone() };
        remove_instance_if_unused(&layout, std::time::Duration::from_secs(30));
        reclaim.join().expect("reclaim");
        assert!(!late.exists(), "waited for, then removed");
    }

    #[test]
    fn v2_without_delegated_controllers_is_unavailable() {
        let t = fake_v2("io");
        let layout = detect(t.path(), "0::/kubepods/pod1/ctr\n", None, "i1").expect("detect");
        let e = prepare(&layout, Tenants::All).expect_err("nothing delegated");
        assert!(e.to_string().contains("delegates none"), "{e}");
        let e =
            detect(t.path(), "1:name=systemd:/\n", None, "cmp-warden").expect_err("no 0:: line");
        assert!(e.to_string().contains("no v2 entry"), "{e}");
        let e = detect(&t.path().join("nowhere"), "", None, "cmp-warden").expect_err("nothing");
        assert!(e.to_string().contains("no cgroup v2"), "{e}");
    }

    /// At the hierarchy's root (no `cgroup.type`: exempt from the no-internal-process rule)
    /// nothing moves; the requests still go into our instance directory, never beside the
    /// host's own cgroups.
    #[test]
    fn at_the_root_nothing_moves_and_requests_stay_in_our_directory() {
        let t = fake_v2("cpu memory pids");
        let root = t.path();
        std::fs::write(root.join("cgroup.subtree_control"), "memory").expect("w");
        let base = root.join("cmp-warden/cmp-warden-20000");
        std::fs::create_dir_all(&base).expect("mkdir");
        for dir in [root.join("cmp-warden"), base.clone()] {
            std::fs::write(dir.join("cgroup.controllers"), "cpu memory pids").expect("w");
            std::fs::write(dir.join("cgroup.subtree_control"), "").expect("w");
        }
        let layout = detect(root, "0::/\n", None, "cmp-warden-20000").expect("detect");
        assert_eq!(layout, Layout::V2 { base: base.clone() });
        prepare(&layout, Tenants::All).expect("prepare");
        assert!(
            !root.join(SUPERVISOR_LEAF).exists(),
            "nothing moved at the root"
        );
        // memory was on already: only pids and cpu were written.
        assert_eq!(
            std::fs::read_to_string(root.join("cgroup.subtree_control")).expect("r"),
            "+cpu"
        );
        // The host's own cgroups beside ours are never swept.
        std::fs::create_dir(root.join("system.slice")).expect("mkdir");
        std::fs::create_dir(base.join("j20001-5-0")).expect("mkdir");
        assert_eq!(sweep(&layout, |_| false), 1);
        assert!(root.join("system.slice").exists());
    }

    #[test]
    fn a_configured_delegated_directory_wins() {
        let t = fake_v2("memory pids");
        let dir = t.path().join("kubepods/pod1/ctr");
        let layout = detect(Path::new("/nonexistent"), "", Some(&dir), "i1").expect("detect");
        assert_eq!(
            layout,
            Layout::V2 {
                base: dir.join("cmp-warden/i1")
            }
        );
        assert_eq!(
            prepare(&layout, Tenants::All).expect("prepare"),
            ["memory", "pids"]
        );
    }

    /// What doctor reports comes from the kernel's files: each limit read back and compared.
    #[test]
    fn read_back_reports_what_the_kernel_holds_and_each_difference() {
        let t = tempfile::tempdir().expect("tmp");
        let dir = t.path().join("j1");
        std::fs::create_dir(&dir).expect("mkdir");
        let put = |f: &str, v: &str| std::fs::write(dir.join(f), v).expect("w");
        put("memory.max", "1073741824\n");
        put("memory.swap.max", "0\n");
        put("memory.oom.group", "1\n");
        put("pids.max", "512\n");
        put("cpu.max", "200000 100000\n");
        put("cpu.stat", "usage_usec 1234\nuser_usec 1000\n");
        let cg = RequestCgroup {
            v2: true,
            dirs: vec![("unified".into(), dir.clone())],
            controllers: vec!["memory".into(), "pids".into(), "cpu".into()],
        };
        let rb = cg.read_back();
        assert!(rb.ran);
        assert_eq!(rb.mismatches(&LIMITS), Vec::<String>::new());
        assert_eq!(
            rb.describe(),
            "memory.max=1073741824 (spec.limits.memoryBytes), memory.swap.max=0, memory.oom.group=1, pids.max=512 (spec.limits.pids), cpu.max=200000 100000 (spec.limits.cpuMillis)"
        );
        put("memory.max", "max\n");
        put("pids.max", "max\n");
        put("memory.oom.group", "0\n");
        put("cpu.stat", "usage_usec 0\n");
        let wrong = cg.read_back().mismatches(&LIMITS);
        assert_eq!(
            wrong,
            [
                format!("memory.max is {}, not 1073741824", u64::MAX),
                "memory.oom.group is 0".to_owned(),
                format!("pids.max is {}, not 512", u64::MAX),
                "no process ran in it".to_owned(),
            ]
        );
    }

    /// `cgroup.kill` and removal on a real cgroup v2 hierarchy (this CI host mounts an empty
    /// one at /sys/fs/cgroup/unified: no memory or pids controller there, so `memory.oom.group`
    /// is only tested on the fake cgroupfs): a process moved into a request cgroup dies with
    /// the kill, the cgroup is then empty and is removed.
    #[test]
    fn v2_kill_on_this_machine_for_real() {
        let root = Path::new("/sys/fs/cgroup/unified");
        if !rustix::process::geteuid().is_root() || !root.join("cgroup.procs").exists() {
            let why = "v2 cgroup test needs root and a cgroup2 mount at /sys/fs/cgroup/unified";
            assert!(
                std::env::var_os("CMP_WARDEN_TESTS_MUST_RUN").is_none(),
                "this test must run here (CMP_WARDEN_TESTS_MUST_RUN): {why}"
            );
            eprintln!("SKIP: {why}");
            return;
        }
        let dir = root.join(format!("cmp-warden-unit-{}", std::process::id()));
        std::fs::create_dir(&dir).expect("mkdir");
        let cg = RequestCgroup {
            v2: true,
            dirs: vec![("unified".into(), dir.clone())],
            controllers: Vec::new(),
        };
        let mut child = std::process::Command::new("sleep")
            .arg("60")
            .spawn()
            .expect("sleep");
        std::fs::write(dir.join("cgroup.procs"), child.id().to_string()).expect("join");
        assert!(!cg.is_empty());
        cg.kill().expect("cgroup.kill");
        let status = child.wait().expect("wait");
        assert_eq!(
            std::os::unix::process::ExitStatusExt::signal(&status),
            Some(9),
            "killed by cgroup.kill"
        );
        assert!(cg.is_empty());
        cg.remove().expect("rmdir");
        assert!(!dir.exists());
    }

    #[test]
    fn an_existing_directory_is_made_again_without_error_a_missing_parent_is_one() {
        let t = tempfile::tempdir().expect("tmp");
        let d = t.path().join("cmp-warden");
        create_dir_existing(&d).expect("new");
        create_dir_existing(&d).expect("existing");
        assert!(create_dir_existing(&t.path().join("no/such")).is_err());
    }

    /// Every process of the delegated cgroup is written into the leaf (the fake keeps the last
    /// write), or only this one; a leaf that cannot be written is the error.
    #[test]
    fn tenants_move_into_the_leaf() {
        let t = tempfile::tempdir().expect("tmp");
        let (from, leaf) = (t.path().join("ctr"), t.path().join("leaf"));
        for d in [&from, &leaf] {
            std::fs::create_dir(d).expect("mkdir");
            std::fs::write(d.join("cgroup.procs"), "").expect("w");
        }
        std::fs::write(from.join("cgroup.procs"), "11\n12\n").expect("w");
        move_into(&from, &leaf, Tenants::All).expect("move");
        let moved = || std::fs::read_to_string(leaf.join("cgroup.procs")).expect("r");
        assert_eq!(moved(), "12");
        move_into(&from, &leaf, Tenants::OnlySelf).expect("move self");
        assert_eq!(moved(), std::process::id().to_string());
        assert!(move_into(&from, &t.path().join("gone"), Tenants::All).is_err());
    }

    /// The no-internal-process rule is named (with what to do) only when it is the cause:
    /// EBUSY while the cgroup holds a process.
    #[test]
    fn a_refused_controller_is_explained_by_its_cause() {
        let t = tempfile::tempdir().expect("tmp");
        let busy = io::Error::from_raw_os_error(16); // EBUSY
        let denied = io::Error::from_raw_os_error(13);
        std::fs::write(t.path().join("cgroup.procs"), "7\n").expect("w");
        let held = explain_enable(t.path(), "memory", &busy);
        assert!(held.starts_with("enabling memory in "), "{held}");
        assert!(
            held.contains("holds 1 process(es)") && held.contains("CMP_WARDEN_CGROUP_ROOT"),
            "{held}"
        );
        let other = explain_enable(t.path(), "memory", &denied);
        assert!(
            other.starts_with("enabling memory in ") && !other.contains("holds"),
            "{other}"
        );
        std::fs::write(t.path().join("cgroup.procs"), "").expect("w");
        let empty = explain_enable(t.path(), "memory", &busy);
        assert!(
            empty.starts_with("enabling memory in ") && !empty.contains("holds"),
            "{empty}"
        );
    }

    /// On the way out: a request cgroup holds a process only when its `cgroup.procs` names one.
    #[test]
    fn an_instance_is_in_use_while_a_request_cgroup_holds_a_process() {
        let t = tempfile::tempdir().expect("tmp");
        let layout = Layout::V2 {
            base: t.path().to_path_buf(),
        };
        assert!(!holds_processes(&layout), "no request cgroup");
        std::fs::create_dir(t.path().join("j1")).expect("mkdir");
        std::fs::write(t.path().join("j1/cgroup.procs"), "\n").expect("w");
        assert!(!holds_processes(&layout), "an empty one");
        std::fs::write(t.path().join("j1/cgroup.procs"), "4242\n").expect("w");
        assert!(holds_processes(&layout), "one with a process");
    }

    /// A request cgroup still going in the kernel keeps its parent a moment longer: retried
    /// until it can go.
    #[test]
    fn the_instance_directory_is_retried_until_it_can_go() {
        let t = tempfile::tempdir().expect("tmp");
        let base = t.path().join("cmp-warden-20000");
        std::fs::create_dir_all(base.join("j1")).expect("mkdir");
        let going = base.join("j1");
        let kernel = std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_millis(50));
            std::fs::remove_dir(going).expect("rm");
        });
        remove_instance(&Layout::V2 { base: base.clone() }).expect("removed once it could go");
        kernel.join().expect("join");
        assert!(!base.exists());
        let stays = t.path().join("cmp-warden-30000");
        std::fs::create_dir_all(stays.join("j1")).expect("mkdir");
        assert!(
            remove_instance(&Layout::V2 { base: stays }).is_err(),
            "one that stays is named"
        );
    }

    /// Real v2 (the empty hierarchy this host mounts at /sys/fs/cgroup/unified), where the
    /// kernel decides what a fake cannot: a process that exits before it is moved (ESRCH) is
    /// no error, and the one alive is moved.
    #[test]
    fn a_tenant_that_exits_before_its_move_is_no_error_for_real() {
        let Some(root) = real_v2("moving tenants") else {
            return;
        };
        let leaf = root.join(format!("cmp-warden-unit-move-{}", std::process::id()));
        std::fs::create_dir(&leaf).expect("mkdir");
        let mut gone = std::process::Command::new("true").spawn().expect("true");
        let gone_pid = gone.id();
        gone.wait().expect("wait");
        let mut alive = std::process::Command::new("sleep")
            .arg("60")
            .spawn()
            .expect("sleep");
        let t = tempfile::tempdir().expect("tmp");
        std::fs::write(
            t.path().join("cgroup.procs"),
            format!("{gone_pid}\n{}\n", alive.id()),
        )
        .expect("w");
        let moved = move_into(t.path(), &leaf, Tenants::All);
        let held = procs(&leaf);
        let _ = alive.kill();
        let _ = alive.wait();
        let _ = std::fs::remove_dir(&leaf);
        moved.expect("ESRCH for the exited one is no error");
        assert_eq!(held, [alive.id().to_string()]);
    }

    /// The start-up sweep on real v2: a request cgroup a previous run left with a process in it
    /// (one no UID sweep would find) is emptied by `cgroup.kill` and removed once the kernel
    /// lets it go (EBUSY until the killed process is gone).
    #[test]
    fn the_sweep_kills_and_removes_a_left_request_cgroup_for_real() {
        let Some(root) = real_v2("the sweep's cgroup.kill") else {
            return;
        };
        let base = root.join(format!("cmp-warden-unit-sweep-{}", std::process::id()));
        let request = base.join("j20001-1-0");
        std::fs::create_dir_all(&request).expect("mkdir");
        let mut left = std::process::Command::new("sleep")
            .arg("60")
            .spawn()
            .expect("sleep");
        std::fs::write(request.join("cgroup.procs"), left.id().to_string()).expect("join");
        let removed = sweep(&Layout::V2 { base: base.clone() }, |_| false);
        let status = left.wait().expect("wait");
        let _ = std::fs::remove_dir(&request);
        let _ = std::fs::remove_dir(&base);
        assert_eq!(
            std::os::unix::process::ExitStatusExt::signal(&status),
            Some(9),
            "killed by cgroup.kill"
        );
        assert_eq!(removed, 1, "removed once its process was gone");
    }

    /// The cgroup2 mount this host has at /sys/fs/cgroup/unified, where tests must run.
    fn real_v2(what: &str) -> Option<&'static Path> {
        let root = Path::new("/sys/fs/cgroup/unified");
        if rustix::process::geteuid().is_root() && root.join("cgroup.procs").exists() {
            return Some(root);
        }
        let why = format!("{what} needs root and a cgroup2 mount at /sys/fs/cgroup/unified");
        assert!(
            std::env::var_os("CMP_WARDEN_TESTS_MUST_RUN").is_none(),
            "this test must run here (CMP_WARDEN_TESTS_MUST_RUN): {why}"
        );
        eprintln!("SKIP: {why}");
        None
    }
}
