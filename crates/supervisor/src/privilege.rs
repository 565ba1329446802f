//! Which privilege model the server runs under (docs/design.md, privilege models), and the
//! supervisor's own capability drop at start-up.

use rustix::thread::{CapabilitySet, CapabilitySets};
use serde::Serialize;

/// How the sidecar runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum PrivilegeModel {
    /// Root inside a user namespace (`hostUsers: false`): capabilities only over the pod's IDs.
    UserNamespaceRoot,
    /// UID 0 in the initial user namespace with a minimal capability set.
    MinimalCapsRoot,
    /// A non-root UID holding CAP_SETUID/CAP_SETGID through file capabilities.
    FileCapabilities,
    /// No way to switch UIDs: every request shares the server's UID.
    Unprivileged,
}

/// What start-up found.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Privileges {
    /// The model.
    pub model: PrivilegeModel,
    /// Effective UID.
    pub euid: u32,
    /// Effective capabilities (names).
    pub effective: Vec<String>,
    /// Whether we run inside a (non-initial) user namespace.
    pub in_user_namespace: bool,
    /// `/proc/self/uid_map`, one line per extent.
    pub uid_map: Vec<String>,
}

/// The capabilities the supervisor keeps: switching jails to leased IDs, and (only to empty
/// each jail's bounding set) CAP_SETPCAP.
pub const SUPERVISOR_CAPS: CapabilitySet = CapabilitySet::SETUID
    .union(CapabilitySet::SETGID)
    .union(CapabilitySet::SETPCAP);

fn cap_names(set: CapabilitySet) -> Vec<String> {
    set.iter_names().map(|(n, _)| format!("CAP_{n}")).collect()
}

/// Inspect the current process.
pub fn detect() -> Privileges {
    let euid = rustix::process::geteuid().as_raw();
    let caps = rustix::thread::capabilities(None).unwrap_or(CapabilitySets {
        effective: CapabilitySet::empty(),
        permitted: CapabilitySet::empty(),
        inheritable: CapabilitySet::empty(),
    });
    let uid_map: Vec<String> = std::fs::read_to_string("/proc/self/uid_map")
        .unwrap_or_default()
        .lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
        .collect();
    let in_user_namespace = uid_map != ["0 0 4294967295"];
    let can_switch = caps
        .effective
        .contains(CapabilitySet::SETUID | CapabilitySet::SETGID);
    let model = match (can_switch, euid == 0, in_user_namespace) {
        (false, _, _) => PrivilegeModel::Unprivileged,
        (true, true, true) => PrivilegeModel::UserNamespaceRoot,
        (true, true, false) => PrivilegeModel::MinimalCapsRoot,
        (true, false, _) => PrivilegeModel::FileCapabilities,
    };
    Privileges {
        model,
        euid,
        effective: cap_names(caps.effective),
        in_user_namespace,
        uid_map,
    }
}

impl PrivilegeModel {
    /// In words, for logs and reports.
    pub fn describe(self) -> &'static str {
        match self {
            PrivilegeModel::UserNamespaceRoot => "user-namespaced root",
            PrivilegeModel::MinimalCapsRoot => "minimal-caps root",
            PrivilegeModel::FileCapabilities => "file capabilities",
            PrivilegeModel::Unprivileged => "unprivileged (shared UID)",
        }
    }
}

impl Privileges {
    /// Whether there is anything to drop: root, or capabilities to switch UIDs.
    pub fn holds_any(&self) -> bool {
        self.euid == 0 || self.can_switch_uids()
    }

    /// Whether unique UIDs can be used.
    pub fn can_switch_uids(&self) -> bool {
        self.model != PrivilegeModel::Unprivileged
    }

    /// Whether every UID of `first..first+count` is mapped in our user namespace.
    pub fn range_mapped(&self, first: u32, count: u32) -> bool {
        let (lo, hi) = (u64::from(first), u64::from(first) + u64::from(count));
        self.uid_map.iter().any(|l| {
            let f: Vec<u64> = l.split(' ').filter_map(|v| v.parse().ok()).collect();
            f.len() == 3 && f[0] <= lo && hi <= f[0] + f[2]
        })
    }
}

/// The effective capabilities of the calling thread, as the kernel reports them in
/// `/proc/thread-self/status` (`CapEff`): what the supervisor really holds, not what it asked
/// for.
pub fn effective_now() -> Vec<String> {
    let status = std::fs::read_to_string("/proc/thread-self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        .map(|bits| cap_names(CapabilitySet::from_bits_retain(bits)))
        .unwrap_or_default()
}

/// Drop every capability but [`SUPERVISOR_CAPS`] from all sets, bounding included (where
/// CAP_SETPCAP allows). Must run while the process has a single thread: capabilities are
/// per thread. Returns the capabilities kept.
pub fn drop_supervisor_capabilities() -> std::io::Result<Vec<String>> {
    let caps = rustix::thread::capabilities(None)?;
    let keep = caps.permitted & SUPERVISOR_CAPS;
    if caps.effective.contains(CapabilitySet::SETPCAP) {
        let last = std::fs::read_to_string("/proc/sys/kernel/cap_last_cap")
            .ok()
            .and_then(|s| s.trim().parse::<u32>().ok())
            .unwrap_or(40)
            .min(63);
        for n in 0..=last {
            let c = CapabilitySet::from_bits_retain(1u64 << n);
            if !keep.contains(c) {
                rustix::thread::remove_capability_from_bounding_set(c)?;
            }
        }
    }
    match rustix::thread::clear_ambient_capability_set() {
        Ok(()) | Err(rustix::io::Errno::INVAL) => {}
        Err(e) => return Err(e.into()),
    }
    rustix::thread::set_capabilities(
        None,
        CapabilitySets {
            effective: keep,
            permitted: keep,
            inheritable: CapabilitySet::empty(),
        },
    )?;
    Ok(cap_names(keep))
}

#[cfg(test)]
#[allow(clippy::print_stderr)] // a skip must say why
mod tests {
    use super::*;
    use rustix::thread::CapabilitySet;
    use std::path::{Path, PathBuf};

    const LIMITS: cgroups::CgroupLimits = cgroups::CgroupLimits {
        memory_bytes: 1 << 30,
        pids: 512,
        cpu_millis: 2000,
    };

    #[test]
    fn uid_map_coverage() {
        let p = Privileges {
            model: PrivilegeModel::UserNamespaceRoot,
            euid: 0,
            effective: vec![],
            in_user_namespace: true,
            uid_map: vec!["0 100000 65536".into()],
        };
        assert!(p.range_mapped(20000, 40000));
        assert!(!p.range_mapped(60000, 10000));
        let host = Privileges {
            uid_map: vec!["0 0 4294967295".into()],
            ..p
        };
        assert!(host.range_mapped(20000, 40000));
    }

    #[test]
    fn v1_instance_directories_go_after_the_supervisors_capability_drop() {
        // What `render` and `serve` do on the way out, with only the capabilities the
        // supervisor keeps (capabilities are per thread: dropped in this test's own thread).
        // Made straight in a hierarchy's root (0555 here), an instance directory outlived
        // every one-shot run.
        if !rustix::process::geteuid().is_root()
            || !Path::new("/sys/fs/cgroup/pids/cgroup.procs").exists()
        {
            let why = "v1 cgroup test needs root and a v1 pids hierarchy";
            assert!(
                std::env::var_os("CMP_WARDEN_TESTS_MUST_RUN").is_none(),
                "this test must run here (CMP_WARDEN_TESTS_MUST_RUN): {why}"
            );
            eprintln!("SKIP: {why}");
            return;
        }
        std::thread::spawn(|| {
            let own = std::fs::read_to_string("/proc/self/cgroup").expect("cgroup");
            let instance = format!("cmp-warden-unit-drop-{}", std::process::id());
            let layout = cgroups::detect(Path::new("/sys/fs/cgroup"), &own, None, &instance)
                .expect("detect");
            let dirs: Vec<PathBuf> = layout
                .instance_dirs()
                .into_iter()
                .map(Path::to_path_buf)
                .collect();
            assert!(
                dirs.iter()
                    .all(|d| d.parent().is_some_and(|p| p.ends_with(cgroups::OUR_DIR)))
            );
            cgroups::prepare(&layout, cgroups::Tenants::OnlySelf).expect("prepare");
            let cg = cgroups::create(&layout, "req", &LIMITS).expect("create");
            drop_supervisor_capabilities().expect("drop");
            let caps = rustix::thread::capabilities(None).expect("caps");
            assert!(!caps.effective.contains(CapabilitySet::DAC_OVERRIDE));
            // A request cgroup with a process in it (another instance's): the directory stays.
            let mut holder = std::process::Command::new("sleep")
                .arg("30")
                .spawn()
                .expect("sleep");
            for f in cg.procs_files() {
                std::fs::write(f, holder.id().to_string()).expect("join");
            }
            cgroups::remove_instance_if_unused(&layout, std::time::Duration::from_millis(200));
            assert!(dirs.iter().all(|d| d.exists()));
            // The request being reclaimed as the server stops (its process killed, then its
            // cgroup removed, after the check began): waited for (mutant: no wait -> the
            // directories stay, as a VM's stop right after an OOM kill once showed).
            let later = cg.clone();
            let reclaim = std::thread::spawn(move || {
                std::thread::sleep(std::time::Duration::from_millis(300));
                holder.kill().expect("kill");
                holder.wait().expect("wait");
                later.remove().expect("remove the request cgroup");
            });
            cgroups::remove_instance_if_unused(&layout, std::time::Duration::from_secs(10));
            reclaim.join().expect("reclaim");
            for d in &dirs {
                assert!(!d.exists(), "{} left behind", d.display());
            }
        })
        .join()
        .expect("test thread");
    }
}
