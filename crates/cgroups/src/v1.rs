//! The legacy hierarchies (v1): for each of `memory`, `pids`, `cpu` the server's cgroup in
//! that hierarchy plus `cmp-warden/<instance>/<request>`. There is no `cgroup.kill`: the
//! UID-wide kill empties a request's cgroups.

use std::path::{Path, PathBuf};

use crate::files::{io_err, keyed, read_u64, write};
use crate::{
    CPU_PERIOD_US, CgroupError, CgroupLimits, CgroupStats, Hierarchy, Layout, OUR_DIR, Readback,
    RequestCgroup, Tenants,
};

/// The v1 controllers we use.
const V1_CONTROLLERS: [&str; 3] = ["memory", "pids", "cpu"];

/// The legacy hierarchies: (controller, the instance directory in its hierarchy).
pub(crate) struct Legacy<'a> {
    /// One entry per mounted controller we use.
    pub controllers: &'a [(String, PathBuf)],
}

/// The layout of the v1 hierarchies mounted under `root` for the server whose
/// `/proc/self/cgroup` is `self_cgroup`.
pub(crate) fn detect(
    root: &Path,
    self_cgroup: &str,
    instance: &str,
) -> Result<Layout, CgroupError> {
    let mut controllers = Vec::new();
    for ctl in V1_CONTROLLERS {
        let own = self_cgroup.lines().find_map(|l| {
            let mut f = l.splitn(3, ':');
            let (_, list, path) = (f.next()?, f.next()?, f.next()?);
            list.split(',').any(|c| c == ctl).then_some(path)
        });
        let Some(own) = own else { continue };
        let mount = root.join(ctl);
        if mount.join("cgroup.procs").exists() {
            // Under our own `cmp-warden` directory, as in v2: a v1 hierarchy's root is 0555 in
            // the kernel, and an instance directory made straight in it could not be removed
            // once the start-up drop has taken CAP_DAC_OVERRIDE (every one-shot run left one).
            controllers.push((
                ctl.to_owned(),
                mount
                    .join(own.trim_start_matches('/'))
                    .join(OUR_DIR)
                    .join(instance),
            ));
        }
    }
    if controllers.is_empty() {
        return Err(CgroupError::Unavailable(format!(
            "no cgroup v2 at {} and no v1 memory/pids/cpu hierarchy",
            root.display()
        )));
    }
    Ok(Layout::V1 { controllers })
}

impl Hierarchy for Legacy<'_> {
    fn prepare(&self, _tenants: Tenants) -> Result<Vec<String>, CgroupError> {
        for (_, dir) in self.controllers {
            std::fs::create_dir_all(dir).map_err(io_err("creating", dir))?;
        }
        Ok(self.controllers.iter().map(|(c, _)| c.clone()).collect())
    }

    fn create(&self, name: &str, limits: &CgroupLimits) -> Result<RequestCgroup, CgroupError> {
        let controllers = self.controllers;
        let mut cg = RequestCgroup {
            v2: false,
            dirs: Vec::new(),
            controllers: Vec::new(),
        };
        for (ctl, base) in controllers {
            let dir = base.join(name);
            if let Err(e) = std::fs::create_dir(&dir) {
                let _ = cg.remove();
                return Err(io_err("creating", &dir)(e));
            }
            cg.dirs.push((ctl.clone(), dir.clone()));
            cg.controllers.push(ctl.clone());
            if let Err(e) = set_limits(ctl, &dir, limits) {
                let _ = cg.remove();
                return Err(e);
            }
        }
        Ok(cg)
    }
}

/// Set controller `ctl`'s limits in the request's directory `dir` of its hierarchy.
fn set_limits(ctl: &str, dir: &Path, limits: &CgroupLimits) -> Result<(), CgroupError> {
    match ctl {
        "memory" => {
            write(
                &dir.join("memory.limit_in_bytes"),
                &limits.memory_bytes.to_string(),
            )?;
            // memory+swap equal to memory: no swap for the request.
            let memsw = dir.join("memory.memsw.limit_in_bytes");
            if memsw.exists() {
                write(&memsw, &limits.memory_bytes.to_string())?;
            }
            Ok(())
        }
        "pids" => write(&dir.join("pids.max"), &limits.pids.to_string()),
        "cpu" => {
            // Each write walks every CPU cgroup of the host in the kernel
            // (`tg_set_cfs_bandwidth`): the period only when it is not already the kernel's
            // default, which a new cgroup has.
            let period = dir.join("cpu.cfs_period_us");
            if read_u64(&period) != CPU_PERIOD_US {
                write(&period, &CPU_PERIOD_US.to_string())?;
            }
            let quota = limits.cpu_millis.saturating_mul(CPU_PERIOD_US) / 1000;
            write(&dir.join("cpu.cfs_quota_us"), &quota.to_string())
        }
        _ => Ok(()),
    }
}

/// Peak memory and OOM kills from a v1 memory hierarchy's files.
pub(crate) fn memory_stats(d: &Path, s: &mut CgroupStats) {
    s.peak_memory_bytes = read_u64(&d.join("memory.max_usage_in_bytes"));
    s.oom_kills = keyed(&d.join("memory.oom_control"), "oom_kill");
}

/// The memory limits as a v1 cgroup holds them (swap: memsw minus memory), and whether a
/// process ran in it.
pub(crate) fn read_back_memory(d: &Path, r: &mut Readback, max: impl Fn(PathBuf) -> Option<u64>) {
    r.memory_max = max(d.join("memory.limit_in_bytes"));
    r.swap_max = max(d.join("memory.memsw.limit_in_bytes"))
        .zip(r.memory_max)
        .map(|(memsw, mem)| memsw.saturating_sub(mem));
    r.ran = read_u64(&d.join("memory.max_usage_in_bytes")) > 0;
}

/// The CFS quota and period.
pub(crate) fn cpu_max(d: &Path, max: impl Fn(PathBuf) -> Option<u64>) -> Option<(u64, u64)> {
    max(d.join("cpu.cfs_quota_us")).zip(max(d.join("cpu.cfs_period_us")))
}

#[cfg(test)]
#[allow(clippy::print_stderr)] // a skip must say why
mod tests {
    use crate::testing::LIMITS;
    use crate::{CPU_PERIOD_US, Layout, Tenants, create, detect, prepare, remove_instance};
    use std::path::Path;

    #[test]
    fn v1_on_this_machine_for_real() {
        // Real cgroup v1 (this project's machines are hybrid); needs root.
        if !rustix::process::geteuid().is_root()
            || !Path::new("/sys/fs/cgroup/memory/cgroup.procs").exists()
        {
            let why = "v1 cgroup test needs root and a v1 memory hierarchy";
            assert!(
                std::env::var_os("CMP_WARDEN_TESTS_MUST_RUN").is_none(),
                "this test must run here (CMP_WARDEN_TESTS_MUST_RUN): {why}"
            );
            eprintln!("SKIP: {why}");
            return;
        }
        let own = std::fs::read_to_string("/proc/self/cgroup").expect("cgroup");
        let layout =
            detect(Path::new("/sys/fs/cgroup"), &own, None, "cmp-warden-unit").expect("detect");
        let Layout::V1 { controllers } = &layout else {
            panic!("expected v1 here: {layout:?}");
        };
        assert!(controllers.iter().any(|(c, _)| c == "memory"));
        assert_eq!(
            prepare(&layout, Tenants::OnlySelf).expect("prepare"),
            controllers
                .iter()
                .map(|(c, _)| c.clone())
                .collect::<Vec<_>>(),
            "every mounted controller is a request's"
        );
        let name = format!("unit-{}", std::process::id());
        let cg = create(&layout, &name, &LIMITS).expect("create");
        let mem = cg.dir("memory").expect("memory dir");
        assert_eq!(
            std::fs::read_to_string(mem.join("memory.limit_in_bytes"))
                .expect("r")
                .trim(),
            "1073741824"
        );
        // What the kernel holds, read back as the audit event reports it; nothing ran yet.
        let before = cg.read_back();
        assert_eq!(before.memory_max, Some(LIMITS.memory_bytes));
        if cg.has("pids") {
            assert_eq!(before.pids_max, Some(LIMITS.pids));
        }
        if cg.has("cpu") {
            let quota = LIMITS.cpu_millis * CPU_PERIOD_US / 1000;
            assert_eq!(before.cpu_max, Some((quota, CPU_PERIOD_US)));
        }
        if mem.join("memory.memsw.limit_in_bytes").exists() {
            assert_eq!(before.swap_max, Some(0), "no swap");
        }
        assert!(!before.ran, "no process ran yet");
        // The CPU limit: the kernel's default period (not written again), the quota for it.
        if let Some(cpu) = cg.dir("cpu") {
            let r = |f: &str| std::fs::read_to_string(cpu.join(f)).expect("r");
            assert_eq!(r("cpu.cfs_period_us").trim(), CPU_PERIOD_US.to_string());
            let quota = LIMITS.cpu_millis * CPU_PERIOD_US / 1000;
            assert_eq!(r("cpu.cfs_quota_us").trim(), quota.to_string());
        }
        // A child joins, allocates, and exits; its peak is read back.
        let procs = cg.procs_files();
        let script = format!(
            "for f in {}; do echo 0 > $f; done; head -c 8000000 /dev/zero | tail -c 1 >/dev/null",
            procs
                .iter()
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>()
                .join(" ")
        );
        let st = std::process::Command::new("sh")
            .args(["-c", &script])
            .status()
            .expect("sh");
        assert!(st.success());
        assert!(cg.is_empty());
        assert!(cg.stats().peak_memory_bytes > 0);
        assert!(cg.read_back().ran, "a process ran");
        assert!(cg.read_back().mismatches(&LIMITS).is_empty());
        cg.remove().expect("remove");
        assert!(!mem.exists());
        // Not asserted: a v1 memory cgroup just removed keeps its parent busy while the kernel
        // offlines it, which under load outlasts remove_instance's retries (the next start-up's
        // sweep takes the directory then).
        let _ = remove_instance(&layout);
    }

    /// Each controller's directory is the server's own cgroup in that hierarchy (they differ
    /// per hierarchy: here pids is elsewhere), under our directory and the instance's.
    #[test]
    fn each_hierarchy_has_the_servers_own_path() {
        let t = tempfile::tempdir().expect("tmp");
        for ctl in ["memory", "pids", "cpu"] {
            std::fs::create_dir(t.path().join(ctl)).expect("mkdir");
            std::fs::write(t.path().join(ctl).join("cgroup.procs"), "").expect("w");
        }
        let own = "12:pids:/system.slice/argocd.service\n9:memory:/pod1\n4:cpu,cpuacct:/pod1/c\n1:name=systemd:/x\n";
        let layout = detect(t.path(), own, None, "i1").expect("detect");
        let at = |ctl: &str, path: &str| {
            (
                ctl.to_owned(),
                t.path().join(ctl).join(path).join("cmp-warden/i1"),
            )
        };
        assert_eq!(
            layout,
            Layout::V1 {
                controllers: vec![
                    at("memory", "pod1"),
                    at("pids", "system.slice/argocd.service"),
                    at("cpu", "pod1/c")
                ]
            }
        );
    }

    /// The limits as written: no swap where memsw is there, the task limit, and the CFS quota
    /// for the kernel's default period, which is written only when not already in force.
    #[test]
    fn each_controllers_limits_are_written() {
        let t = tempfile::tempdir().expect("tmp");
        let d = t.path();
        let r = |f: &str| std::fs::read_to_string(d.join(f)).expect("r");
        for f in [
            "memory.limit_in_bytes",
            "memory.memsw.limit_in_bytes",
            "pids.max",
            "cpu.cfs_quota_us",
        ] {
            std::fs::write(d.join(f), "-1").expect("w");
        }
        std::fs::write(d.join("cpu.cfs_period_us"), "50000").expect("w");
        for ctl in ["memory", "pids", "cpu"] {
            super::set_limits(ctl, d, &LIMITS).expect("set");
        }
        assert_eq!(r("memory.limit_in_bytes"), LIMITS.memory_bytes.to_string());
        assert_eq!(
            r("memory.memsw.limit_in_bytes"),
            LIMITS.memory_bytes.to_string()
        );
        assert_eq!(r("pids.max"), LIMITS.pids.to_string());
        assert_eq!(r("cpu.cfs_period_us"), CPU_PERIOD_US.to_string());
        assert_eq!(
            r("cpu.cfs_quota_us"),
            (LIMITS.cpu_millis * CPU_PERIOD_US / 1000).to_string()
        );
    }
}
