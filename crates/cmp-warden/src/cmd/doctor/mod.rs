//! `cmp-warden doctor`: build and probe the sandbox exactly as `serve` does and say, per
//! protection, whether it is available here, whether the policy requires it, and what `serve`
//! would do. The same report is logged once at `serve` start-up. JSON schema
//! `cmp-warden.doctor/v1` (docs/audit.md).

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::Args;
use serde::Serialize;
use supervisor::PrivilegeModel;
use supervisor::{Enforcement, Owner, Plan, StartOptions, Supervisor};

mod checks;
use checks::{NO_PROBE, assemble_as, in_force_check};

/// Schema identifier of the JSON report; bumped on any incompatible change.
pub const SCHEMA: &str = "cmp-warden.doctor/v1";

/// `doctor` flags.
#[derive(Debug, Args)]
pub struct DoctorArgs {
    /// Sandbox policy file, or a policy directory (every policy probed) [default: the embedded
    /// policies/default.yaml].
    #[arg(long, env = "CMP_WARDEN_POLICY")]
    policy: Option<PathBuf>,
    /// Print the report as JSON (schema cmp-warden.doctor/v1).
    #[arg(long)]
    json: bool,
    /// Socket directory whose ownership to check.
    #[arg(
        long,
        env = "ARGOCD_PLUGINSOCKFILEPATH",
        default_value = "/home/argocd/cmp-server/plugins"
    )]
    socket_dir: PathBuf,
    /// Parent of the work directory, as for `serve` [default: $TMPDIR or /tmp].
    #[arg(long, env = "ARGOCD_CMP_WORKDIR")]
    work_dir: Option<PathBuf>,
}

/// One protection's line.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Check {
    /// Stable name (`uniqueUid`, `landlock`, `namespace.pid`, …).
    pub name: String,
    /// Whether this environment provides it.
    pub available: bool,
    /// Whether the policy lists it in `spec.require` (serve refuses to start without it).
    pub required: bool,
    /// Whether and how far it holds.
    pub status: Status,
    /// What was found, in words.
    pub detail: String,
}

/// How far a check holds, as the report writes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    /// In force for every request.
    Enforced,
    /// In force with something missing (the detail says what).
    Partial,
    /// The policy turned it off.
    Disabled,
    /// Not available here.
    Unavailable,
    /// A fact, not a protection.
    Info,
}

impl Status {
    /// The report's word for it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Enforced => "enforced",
            Self::Partial => "partial",
            Self::Disabled => "disabled",
            Self::Unavailable => "unavailable",
            Self::Info => "info",
        }
    }
}

impl std::fmt::Display for Status {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.pad(self.as_str())
    }
}

/// The whole report.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct DoctorReport {
    /// Always [`SCHEMA`].
    pub schema: &'static str,
    /// cmp-warden's version.
    pub version: &'static str,
    /// The commit it was built from (`unknown` for a build without git).
    pub commit: &'static str,
    /// Policy name.
    pub policy: String,
    /// SHA-256 of the policy text.
    pub policy_sha256: String,
    /// Detected privilege model.
    pub privilege_model: PrivilegeModel,
    /// Effective UID of the server.
    pub euid: u32,
    /// Capabilities the process held at start.
    pub capabilities_held: Vec<String>,
    /// Capabilities the supervisor keeps after its start-up drop (all others dropped).
    pub capabilities_kept: Vec<String>,
    /// Per protection.
    pub checks: Vec<Check>,
    /// `start` or `refuse`.
    pub verdict: &'static str,
    /// Why `serve` would refuse to start.
    pub refusal: Option<String>,
    /// What SECURITY.md claims for requests that this node does not give them, and what
    /// would give it back (empty: everything holds).
    pub gaps: Vec<Gap>,
    /// A policy directory's selected policies (`policy` is its default): each was probed
    /// here as `serve` does, and runs the requests its `select` names.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub selected: Vec<SelectedPolicy>,
}

/// One of a policy directory's selected policies.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SelectedPolicy {
    /// `metadata.name`.
    pub name: String,
    /// SHA-256 of its file.
    pub sha256: String,
    /// `spec.select`.
    pub select: policy::Select,
}

/// A protection requests do not get on this node, and what would restore it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Gap {
    /// What requests go without here.
    pub missing: String,
    /// The deploy/ option or node setting that would give it back.
    pub fix: String,
}

impl DoctorReport {
    /// Whether `serve` would start.
    pub fn starts(&self) -> bool {
        self.refusal.is_none()
    }
}

/// Run `doctor`: exit 0 when `serve` would start, 1 when it would refuse, 2 on bad usage.
pub fn run(a: DoctorArgs, log_args: Vec<String>) -> ExitCode {
    let set = match super::flags::load_policies(a.policy.as_deref()) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("error: {e:#}");
            // A reload refused for this very file is what an operator runs doctor for: the
            // set a server here still serves, and since when, are shown all the same.
            let parent = a.work_dir.clone().unwrap_or_else(std::env::temp_dir);
            if let Some(c) = in_force_check(&parent, None) {
                if a.json {
                    if let Ok(s) = serde_json::to_string_pretty(&c) {
                        super::print_out(&format!("{s}\n"));
                    }
                } else {
                    super::print_out(&format!("{}: {}\n", c.name, c.detail));
                }
            }
            return ExitCode::from(2);
        }
    };
    let mut report = diagnose(&set, &a, log_args);
    report.selected = set
        .policies()
        .iter()
        .filter_map(|p| {
            Some(SelectedPolicy {
                name: p.name.clone(),
                sha256: p.sha256.clone(),
                select: p.select.clone()?,
            })
        })
        .collect();
    if a.json {
        match serde_json::to_string_pretty(&report) {
            Ok(s) => super::print_out(&format!("{s}\n")),
            Err(e) => {
                eprintln!("error: {e}");
                return ExitCode::from(2);
            }
        }
    } else {
        super::print_out(&render_text(&report));
    }
    if report.starts() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}

/// Start the supervisor as `serve` would (one-shot, in a scratch work directory) and report
/// from what it found; on refusal, start again with nothing required to show what exists.
fn diagnose(set: &policy::PolicySet, a: &DoctorArgs, log_args: Vec<String>) -> DoctorReport {
    let held = supervisor::privileges_now();
    let parent = a.work_dir.clone().unwrap_or_else(std::env::temp_dir);
    let work = parent.join(format!("cmp-warden-doctor-{}", std::process::id()));
    let start = |p: &policy::PolicySet| {
        let mut opts = StartOptions::new(work.clone(), Owner::OneShot);
        opts.log_args = log_args.clone();
        // Start the tree cache's keeper as `serve` would, to say whether it works here.
        opts.tree_cache = true;
        Supervisor::start_set(p, opts)
    };
    let (started, refusal) = match start(set) {
        Ok(s) => (Some(s), None),
        Err(e) => {
            let relaxed = set.map(|p| p.require.clear());
            match start(&relaxed) {
                Ok(s) => (Some(s), Some(e.to_string())),
                Err(e2) => (None, Some(format!("{e} (and without requirements: {e2})"))),
            }
        }
    };
    // The default policy's plan as serve would translate it (also when nothing started).
    let plan = Plan::new(
        set.default_policy(),
        &supervisor::Overrides::default(),
        std::env::vars(),
    );
    let enforcement = started.map(|(supervisor, enforcement)| {
        // Retires the spare jail and removes the work dir and the cgroup instance.
        supervisor.shutdown();
        enforcement
    });
    assemble_as(
        &plan,
        &held,
        enforcement.as_ref(),
        (&a.socket_dir, &parent),
        refusal,
        std::env::vars().collect(),
    )
}

/// What the checks say requests lack here, each with its remedy: the node's gaps in the terms
/// operators act on (docs/support-matrix.md's kernel and container tables measured each of them).
fn gaps(checks: &[Check]) -> Vec<Gap> {
    let get = |n: &str| checks.iter().find(|c| c.name == n);
    let unavailable = |n: &str| get(n).is_some_and(|c| c.status == Status::Unavailable);
    let mut gaps = Vec::new();
    let ns: Vec<&str> = ["user", "mount", "pid", "net"]
        .into_iter()
        .filter(|n| unavailable(&format!("namespace.{n}")))
        .collect();
    if !ns.is_empty() {
        let refused = get(&format!("namespace.{}", ns[0])).map_or("", |c| c.detail.as_str());
        let by_seccomp = refused.contains("not permitted") || refused.contains("EPERM");
        gaps.push(Gap {
            missing: format!(
                "their own {} namespace{} (a private tree and /tmp, their own processes, no network but the proxy), the disk limit (spec.limits.diskBytes) and the tree cache",
                ns.join(", "),
                if ns.len() > 1 { "s" } else { "" }
            ),
            fix: if by_seccomp {
                "the container's seccomp profile refuses namespaces (containerd's RuntimeDefault does): run the sidecar under deploy/'s Localhost profile (deploy/components/seccomp-localhost with deploy/seccomp/cmp-warden.json on the nodes; docs/support-matrix.md, Container runtimes)".to_owned()
            } else {
                format!("the node refuses namespaces ({refused}): user namespaces must be allowed to unprivileged processes (user.max_user_namespaces, AppArmor's restrict_unprivileged_userns)")
            },
        });
    }
    if let Some(c) = get("cgroups").filter(|c| c.status == Status::Unavailable) {
        let group_kill = own_memory_oom_group();
        let mut missing = "per-request memory, process and CPU bounds (cgroups): each process is bounded by rlimits, and commands are the OOM killer's first choice within the container's own limit".to_owned();
        if group_kill {
            missing.push_str("; and this container's cgroup has memory.oom.group = 1 (the kubelet sets it on cgroup v2 nodes): one request that reaches the container's memory limit gets the whole container killed, the server and every request in it");
        }
        let mut fix = if c.detail.contains("Read-only file system") {
            "the container's cgroupfs is read-only (Kubernetes mounts it so): containerd 2.1+ with cgroup_writable = true for the runtime handler on cgroup v2 nodes delegates it".to_owned()
        } else {
            format!(
                "{}: run the server in a cgroup of its own with memory, pids and cpu delegated, or point CMP_WARDEN_CGROUP_ROOT at one",
                c.detail
            )
        };
        if group_kill {
            fix.push_str("; until then, the kubelet's singleProcessOOMKill: true kills only the process that ran out, and spec.rlimits.dataBytes below the container's limit keeps one command from reaching it");
        }
        gaps.push(Gap { missing, fix });
    }
    if let Some(c) = get("landlock").filter(|c| c.status == Status::Partial)
        && let Some(missing) = c
            .detail
            .split("NOT in effect here: ")
            .nth(1)
            .and_then(|r| r.split(" (").next())
    {
        gaps.push(Gap {
            missing: format!("Landlock's {missing}"),
            fix: "a kernel with a newer Landlock ABI (6.12 has 6; 6.15 has 7); spec.landlock.features makes any of them mandatory".to_owned(),
        });
    }
    // A protection the policy does not require may be missing without stopping start-up;
    // never silently (the kernel lacks it, or its profile did not install). Without a probe
    // nothing is known either way.
    let missing =
        |n: &str| get(n).filter(|c| c.status == Status::Unavailable && c.detail != NO_PROBE);
    if let Some(c) = missing("landlock") {
        gaps.push(Gap {
            missing: format!("Landlock: commands read and write whatever their UID may ({})", c.detail),
            fix: "a kernel with Landlock enabled (5.13 or later, landlock in the lsm= boot parameter); landlock in spec.require refuses to start without it".to_owned(),
        });
    }
    if let Some(c) = missing("seccomp") {
        gaps.push(Gap {
            missing: format!("the seccomp filter: every system call is open to commands ({})", c.detail),
            fix: "a seccomp profile that compiles and installs here (cmp-warden policy check names the error); seccomp in spec.require refuses to start without it".to_owned(),
        });
    }
    if let Some(c) = get("treeCache").filter(|c| {
        !c.available && !c.detail.contains("spec.cache") && !c.detail.contains("not in")
    }) {
        gaps.push(Gap {
            missing: "the tree cache (every request extracts its archive)".to_owned(),
            fix: c.detail.trim_start_matches("off: ").to_owned(),
        });
    }
    gaps
}

fn yes(b: bool) -> Status {
    if b {
        Status::Enforced
    } else {
        Status::Unavailable
    }
}

/// The report `serve` logs at start-up, from the same [`Enforcement`] and default [`Plan`] it
/// enforces. `env` is the server's environment: the report shows `ARGOCD_EXEC_TIMEOUT` as
/// written (the plan holds it parsed).
pub fn assemble(
    plan: &Plan,
    enforcement: &Enforcement,
    (socket_dir, work_parent): (&Path, &Path),
    refusal: Option<String>,
    env: Vec<(String, String)>,
) -> DoctorReport {
    assemble_as(
        plan,
        &enforcement.privileges,
        Some(enforcement),
        (socket_dir, work_parent),
        refusal,
        env,
    )
}

/// The human-readable report.
pub fn render_text(r: &DoctorReport) -> String {
    use std::fmt::Write;
    let mut s = String::new();
    // Worded for a reader of the report (the log says it shorter).
    let model = match r.privilege_model {
        PrivilegeModel::UserNamespaceRoot => "user-namespaced root",
        PrivilegeModel::MinimalCapsRoot => "minimal-capabilities root",
        PrivilegeModel::FileCapabilities => "file capabilities (non-root)",
        PrivilegeModel::Unprivileged => "unprivileged (shared UID)",
    };
    let _ = writeln!(
        s,
        "cmp-warden {} doctor: policy {:?} (sha256 {})",
        r.version,
        r.policy,
        &r.policy_sha256.get(..16).unwrap_or(&r.policy_sha256)
    );
    let _ = writeln!(s, "privilege model: {model} (euid {})", r.euid);
    let _ = writeln!(
        s,
        "\n{:<24} {:<9} {:<8} {:<11} DETAIL",
        "PROTECTION", "AVAILABLE", "REQUIRED", "STATUS"
    );
    for c in &r.checks {
        let _ = writeln!(
            s,
            "{:<24} {:<9} {:<8} {:<11} {}",
            c.name,
            if c.available { "yes" } else { "no" },
            if c.required { "yes" } else { "no" },
            c.status,
            c.detail
        );
    }
    let _ = writeln!(s);
    match &r.refusal {
        None => {
            let _ = writeln!(s, "verdict: serve would START");
        }
        Some(why) => {
            let _ = writeln!(s, "verdict: serve would REFUSE to start: {why}");
        }
    }
    if !r.selected.is_empty() {
        let _ = writeln!(
            s,
            "policies chosen per request (probed here; the rest run {:?}):",
            r.policy
        );
        for p in &r.selected {
            let _ = writeln!(
                s,
                "  - {:?} (sha256 {}): {}",
                p.name,
                p.sha256.get(..16).unwrap_or(&p.sha256),
                p.select
            );
        }
    }
    if !r.gaps.is_empty() {
        let _ = writeln!(s, "on this node requests do NOT get:");
        for g in &r.gaps {
            let _ = writeln!(s, "  - {}\n    fix: {}", g.missing, g.fix);
        }
    }
    s
}

/// Whether the server's own (cgroup v2) cgroup kills as a group on OOM: what a kubelet on a
/// cgroup v2 node sets for each container (tests/system/kubelet-test saw the sidecar restart).
fn own_memory_oom_group() -> bool {
    std::fs::read_to_string("/proc/self/cgroup")
        .is_ok_and(|own| memory_oom_group(Path::new("/sys/fs/cgroup"), &own))
}

/// `memory.oom.group` of the v2 cgroup that `proc_self_cgroup` (the text of /proc/self/cgroup)
/// names, under the cgroup2 mount `root`.
fn memory_oom_group(root: &Path, proc_self_cgroup: &str) -> bool {
    proc_self_cgroup
        .lines()
        .find_map(|l| l.strip_prefix("0::"))
        .map(|path| {
            root.join(path.trim_start_matches('/'))
                .join("memory.oom.group")
        })
        .and_then(|f| std::fs::read_to_string(f).ok())
        .is_some_and(|v| v.trim() == "1")
}

#[cfg(test)]
mod tests {
    use cgroups::Layout;
    use checks::limits_check;
    use jail_wire::protocol::{LandlockStatus, Report};
    use policy::LandlockFeature;
    use policy::Namespace;
    use supervisor::{DenialLog, Privileges};

    #[test]
    fn memory_oom_group_is_read_from_the_servers_own_v2_cgroup() {
        let root = tempfile::tempdir().expect("tempdir");
        let pod = root.path().join("kubepods/pod1/ctr");
        std::fs::create_dir_all(&pod).expect("mkdir");
        std::fs::write(pod.join("memory.oom.group"), "1\n").expect("write");
        std::fs::write(root.path().join("memory.oom.group"), "0\n").expect("write");
        // A container's own cgroup (the kubelet's setting), the namespace root, a v1-only host.
        assert!(memory_oom_group(root.path(), "0::/kubepods/pod1/ctr\n"));
        assert!(!memory_oom_group(root.path(), "0::/\n"));
        assert!(!memory_oom_group(
            root.path(),
            "4:memory:/kubepods/pod1/ctr\n"
        ));
        assert!(!memory_oom_group(root.path(), "0::/gone\n"));
    }

    use std::path::PathBuf;

    use jail_wire::protocol::NamespaceReport;

    use super::*;

    /// What a start-up on a root node with cgroup v1 and every namespace finds.
    fn found() -> Enforcement {
        Enforcement {
            policy_name: "default".into(),
            policy_sha256: "00".into(),
            privileges: Privileges {
                model: PrivilegeModel::MinimalCapsRoot,
                euid: 0,
                effective: vec!["CAP_SETGID".into(), "CAP_SETUID".into()],
                in_user_namespace: false,
                uid_map: vec!["0 0 4294967295".into()],
            },
            capabilities_kept: vec!["CAP_SETGID".into(), "CAP_SETUID".into()],
            unique_uid: true,
            seccomp_instructions: 321,
            cgroups: Some(Layout::V1 {
                controllers: vec![("memory".into(), PathBuf::from("/sys/fs/cgroup/memory/x"))],
            }),
            cgroup_controllers: vec!["memory".into()],
            cgroup_probe: Some(cgroups::Readback {
                version: 1,
                memory_max: Some(1 << 30),
                swap_max: Some(0),
                oom_group: None,
                pids_max: None,
                cpu_max: None,
                ran: true,
            }),
            cgroup_limits: cgroups::CgroupLimits {
                memory_bytes: 1 << 30,
                pids: 512,
                cpu_millis: 2000,
            },
            unavailable: Vec::new(),
            denial_log: DenialLog::Unavailable("not in tests".into()),
            tree_cache: Err("not in tests".into()),
            probe: Report {
                uid: 20001,
                gid: 20001,
                unique_uid: true,
                bounding_cleared: true,
                capabilities_cleared: true,
                no_new_privs: true,
                landlock: LandlockStatus::Full,
                landlock_abi: Some(7),
                landlock_tcp_denied: true,
                missing_paths: Vec::new(),
                seccomp_filters: 2,
                degraded: Vec::new(),
                status: [
                    "CapInh: 0000000000000000",
                    "CapPrm: 0000000000000000",
                    "CapEff: 0000000000000000",
                    "CapBnd: 0000000000000000",
                    "CapAmb: 0000000000000000",
                    "NoNewPrivs: 1",
                    "Seccomp: 2",
                    "Seccomp_filters: 2",
                ]
                .map(String::from)
                .to_vec(),
                namespaces: NamespaceReport {
                    created: vec![
                        Namespace::User,
                        Namespace::Mount,
                        Namespace::Pid,
                        Namespace::Net,
                        Namespace::Ipc,
                        Namespace::Uts,
                        Namespace::Cgroup,
                    ],
                    failed: Vec::new(),
                    private_proc: true,
                    private_tmp: true,
                    disk_bytes: Some(2 << 30),
                    notes: vec![jail_wire::protocol::NsNote::of(
                        Namespace::Uts,
                        "sethostname: EPERM",
                    )],
                },
                request_dir: PathBuf::from("/w/j"),
                rlimits: vec![("NOFILE".into(), 4096), ("AS".into(), u64::MAX)],
                landlock_rights: vec!["fs:Execute".into()],
                landlock_features: LandlockFeature::ALL.to_vec(),
                self_test: Vec::new(),
                egress_port: None,
                loopback_sockets: false,
            },
        }
    }

    /// The embedded default policy's plan, the server's environment being `env`.
    fn default_plan(env: &[(&str, &str)]) -> Plan {
        let set = crate::cmd::flags::load_policies(None).expect("the embedded policy");
        Plan::new(
            set.default_policy(),
            &supervisor::Overrides::default(),
            env.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())),
        )
    }

    /// `spec.network.loopback: true`: Landlock is not asked to deny TCP (the jail's network
    /// namespace fences it), so doctor neither calls TCP missing nor blames the kernel's ABI
    /// (it said "kernel Landlock ABI < 4" on ABI 7) and no gap is reported for it.
    #[test]
    fn loopback_tcp_is_the_policys_choice_not_a_missing_protection() {
        let d = tempfile::tempdir().expect("tmp");
        let text = include_str!("../../../../../policies/default.yaml").replacen(
            "network: {mode: none}",
            "network: {mode: none, loopback: true}",
            1,
        );
        assert!(text.contains("loopback: true"), "fixture");
        std::fs::create_dir(d.path().join("seccomp")).expect("mkdir");
        std::fs::write(d.path().join("policy.yaml"), text).expect("write");
        std::fs::write(
            d.path().join("seccomp/default.json"),
            include_str!("../../../../../policies/seccomp/default.json"),
        )
        .expect("write");
        let set =
            crate::cmd::flags::load_policies(Some(&d.path().join("policy.yaml"))).expect("policy");
        let plan = Plan::new(
            set.default_policy(),
            &supervisor::Overrides::default(),
            std::iter::empty(),
        );
        assert!(plan.loopback());
        // What the probe reports under it: TCP not denied, so not among the features in effect.
        let mut e = found();
        e.probe.landlock_tcp_denied = false;
        e.probe
            .landlock_features
            .retain(|f| *f != LandlockFeature::Tcp);
        let r = assemble(
            &plan,
            &e,
            (Path::new("/nonexistent/p"), Path::new("/nonexistent/w")),
            None,
            Vec::new(),
        );
        let get = |n: &str| r.checks.iter().find(|c| c.name == n).expect(n).clone();
        let net = get("landlockNetwork");
        assert_eq!(net.status, Status::Info, "{net:?}");
        assert!(
            net.detail.contains("spec.network.loopback: true") && !net.detail.contains("ABI < 4"),
            "{net:?}"
        );
        let ll = get("landlock");
        assert_eq!(ll.status, Status::Enforced, "{ll:?}");
        assert!(!ll.detail.contains("NOT in effect"), "{ll:?}");
        assert!(
            gaps(&r.checks).iter().all(|g| !g.missing.contains("tcp")),
            "{:?}",
            gaps(&r.checks)
        );
    }

    /// `ARGOCD_EXEC_TIMEOUT` as serve applies it: a value Go cannot parse, or zero, is shown
    /// as not applied (mutant: the raw value shown -> "(abc)").
    #[test]
    fn the_exec_timeout_is_shown_as_serve_applies_it() {
        let p = default_plan(&[]);
        let detail = |v: Option<&str>| limits_check(&p, &v.map(str::to_owned)).detail;
        assert!(detail(None).contains("ARGOCD_EXEC_TIMEOUT (unset)"));
        assert!(detail(Some("90s")).contains("ARGOCD_EXEC_TIMEOUT (90s)"));
        assert!(detail(Some("abc")).contains("(abc: not a Go duration, not applied)"));
        assert!(detail(Some("0s")).contains("(0s: zero, none applied)"));
    }

    /// The report operators and `doctor --json` consumers read: every check's name, status and
    /// detail for a known start-up (the root filesystem's line depends on this machine and is
    /// left out). A change here is a schema change (bump `SCHEMA`).
    #[test]
    fn the_report_format_is_pinned() {
        let env = [
            ("PATH", "/usr/bin"),
            ("VAULT_ADDR", "http://vault:8200"),
            ("HOME", "/root"),
        ];
        let mut r = assemble(
            &default_plan(&env),
            &found(),
            (
                Path::new("/nonexistent/plugins"),
                Path::new("/nonexistent/work"),
            ),
            None,
            env.map(|(k, v)| (k.to_owned(), v.to_owned())).to_vec(),
        );
        r.policy_sha256 = "00".into();
        r.version = "0.0.0";
        r.commit = "0123456789ab";
        r.checks.retain(|c| c.name != "readOnlyRootFilesystem");
        assert_eq!(
            serde_json::to_string(&r).expect("json"),
            PINNED_JSON,
            "the doctor report's JSON changed"
        );
        assert_eq!(
            render_text(&r),
            PINNED_TEXT,
            "the doctor report's text changed"
        );
    }

    /// On a containerd node under RuntimeDefault: what requests miss, and the deploy/ option
    /// or node setting named as the fix (the text operators act on; `containerd-test` checks
    /// the same report from a real containerd).
    #[test]
    fn gaps_name_what_is_missing_and_what_restores_it() {
        let c = |name: &str, status: Status, detail: &str| Check {
            name: name.into(),
            available: matches!(status, Status::Enforced | Status::Partial),
            required: false,
            status,
            detail: detail.into(),
        };
        let checks = [
            c(
                "namespace.user",
                Status::Unavailable,
                "unavailable — Operation not permitted",
            ),
            c(
                "namespace.mount",
                Status::Unavailable,
                "unavailable — Operation not permitted",
            ),
            c(
                "namespace.pid",
                Status::Unavailable,
                "unavailable — Operation not permitted",
            ),
            c(
                "namespace.net",
                Status::Unavailable,
                "unavailable — Operation not permitted",
            ),
            c(
                "cgroups",
                Status::Unavailable,
                "cgroups: creating /sys/fs/cgroup/x: Read-only file system (os error 30)",
            ),
            c(
                "landlock",
                Status::Partial,
                "kernel ABI 2 (this build asks for ABI 7); features in effect: filesystem, refer; NOT in effect here: truncate, tcp (require them with spec.landlock.features)",
            ),
            c(
                "treeCache",
                Status::Info,
                "off: the jails have no mount or PID namespace here",
            ),
        ];
        let g = gaps(&checks);
        assert_eq!(g.len(), 4, "{g:#?}");
        assert!(
            g[0].missing.contains("user, mount, pid, net namespaces"),
            "{g:#?}"
        );
        assert!(
            g[0].fix.contains("deploy/components/seccomp-localhost"),
            "{g:#?}"
        );
        assert!(g[1].fix.contains("cgroup_writable"), "{g:#?}");
        assert_eq!(g[2].missing, "Landlock's truncate, tcp");
        assert!(g[3].fix.contains("no mount or PID namespace"), "{g:#?}");
        // Everything there: nothing to say.
        assert!(gaps(&[c("namespace.user", Status::Enforced, "")]).is_empty());
        // Without a probe, nothing is known to be missing.
        assert!(gaps(&[c("seccomp", Status::Unavailable, NO_PROBE)]).is_empty());
        // A protection the policy does not require, missing: said, with what restores it.
        let g = gaps(&[
            c(
                "landlock",
                Status::Unavailable,
                "not enforced by this kernel",
            ),
            c("seccomp", Status::Unavailable, "no filter"),
        ]);
        assert_eq!(g.len(), 2, "{g:#?}");
        assert!(
            g[0].missing
                .starts_with("Landlock: commands read and write")
                && g[0].fix.contains("landlock in spec.require"),
            "{g:#?}"
        );
        assert!(
            g[1].missing.contains("(no filter)") && g[1].fix.contains("seccomp in spec.require"),
            "{g:#?}"
        );
    }

    const PINNED_JSON: &str = r#"{"schema":"cmp-warden.doctor/v1","version":"0.0.0","commit":"0123456789ab","policy":"default","policySha256":"00","privilegeModel":"minimalCapsRoot","euid":0,"capabilitiesHeld":["CAP_SETGID","CAP_SETUID"],"capabilitiesKept":["CAP_SETGID","CAP_SETUID"],"checks":[{"name":"uniqueUid","available":true,"required":true,"status":"enforced","detail":"each request runs as its own UID/GID from 20000+40000 (probe ran as 20001)"},{"name":"environment","available":true,"required":false,"status":"info","detail":"passed to commands (spec.env.pass): PATH; withheld: VAULT_ADDR"},{"name":"network","available":true,"required":false,"status":"info","detail":"spec.network.mode: none: commands get no network (no inet socket; loopback only)"},{"name":"filesystem","available":true,"required":false,"status":"info","detail":"besides the request's own tree, HOME and /tmp, commands read spec.filesystem.readOnly: /usr, /lib, /lib32, /lib64, /bin, /sbin, /opt, /etc/ssl, /etc/ca-certificates, /etc/alternatives, /etc/passwd, /etc/group, /etc/nsswitch.conf, /etc/hosts, /etc/resolv.conf, /etc/localtime, /etc/ld.so.cache, /etc/ld.so.conf, /etc/ld.so.conf.d, /etc/mime.types, /etc/os-release, /etc/gitconfig, /dev/urandom, /dev/random, /proc; and write spec.filesystem.readWrite: /dev/null, /dev/zero, /dev/full"},{"name":"limits","available":true,"required":false,"status":"info","detail":"spec.limits: addressSpaceBytes=68719476736, cpuMillis=2000, dataBytes=1073741824, diskBytes=2147483648, fileSizeBytes=1073741824, memoryBytes=1073741824, openFiles=4096, outputBytes=67108864, pids=512, wallSeconds=300; each command also ends at ARGOCD_EXEC_TIMEOUT (unset), and a request at the client's deadline (Argo CD's controller.repo.server.timeout.seconds) when that comes first"},{"name":"capabilities","available":true,"required":true,"status":"enforced","detail":"commands hold none (effective, permitted, inheritable, ambient empty; bounding set empty); probe /proc status: CapInh: 0000000000000000, CapPrm: 0000000000000000, CapEff: 0000000000000000, CapBnd: 0000000000000000, CapAmb: 0000000000000000"},{"name":"supervisorCapabilities","available":true,"required":false,"status":"info","detail":"held at start: CAP_SETGID, CAP_SETUID; kept after the start-up drop: CAP_SETGID, CAP_SETUID"},{"name":"noNewPrivs","available":true,"required":true,"status":"enforced","detail":"set before exec: setuid/file-capability binaries gain nothing"},{"name":"landlock","available":true,"required":true,"status":"enforced","detail":"kernel ABI 7 (this build asks for ABI 7); features in effect: filesystem, refer, truncate, tcp, ioctlDev, abstractUnixSocketScope, signalScope; enforced rights: fs:Execute"},{"name":"landlockDenialLog","available":false,"required":false,"status":"info","detail":"not available: not in tests"},{"name":"landlockNetwork","available":true,"required":false,"status":"enforced","detail":"TCP bind and connect denied (network.mode: none)"},{"name":"seccomp","available":true,"required":true,"status":"enforced","detail":"2 filter(s), 321 BPF instructions from policies/seccomp/default.json in enforce mode"},{"name":"cgroups","available":true,"required":false,"status":"partial","detail":"cgroup v1 (memory at /sys/fs/cgroup/memory/x); controllers memory; the probe's own cgroup read back: memory.limit_in_bytes=1073741824 (spec.limits.memoryBytes), swap=0; but no pids controller, no cpu controller"},{"name":"rlimits","available":true,"required":true,"status":"enforced","detail":"NOFILE=4096 (spec.limits.openFiles) AS=unlimited (spec.limits.addressSpaceBytes)"},{"name":"namespace.user","available":true,"required":false,"status":"enforced","detail":"the request's UID/GID is mapped to itself; the jail holds no capability over the host"},{"name":"namespace.mount","available":true,"required":false,"status":"enforced","detail":"private mounts (/ made private); the request tree and /tmp on the request's tmpfs"},{"name":"namespace.pid","available":true,"required":false,"status":"enforced","detail":"commands see only their own processes; private /proc"},{"name":"namespace.net","available":true,"required":false,"status":"enforced","detail":"empty network namespace: loopback only"},{"name":"namespace.ipc","available":true,"required":false,"status":"enforced","detail":"private System V IPC and POSIX message queues"},{"name":"namespace.uts","available":true,"required":false,"status":"partial","detail":"private UTS namespace (hostname cmp-warden); but uts: sethostname: EPERM"},{"name":"namespace.cgroup","available":true,"required":false,"status":"enforced","detail":"commands see their own cgroup as the root"},{"name":"diskLimit","available":true,"required":false,"status":"enforced","detail":"the request tree and /tmp live on a private tmpfs of 2147483648 bytes (spec.limits.diskBytes)"},{"name":"treeCache","available":false,"required":false,"status":"info","detail":"off: not in tests"},{"name":"socketDirectory","available":false,"required":false,"status":"unavailable","detail":"/nonexistent/plugins: No such file or directory (os error 2) (serve creates the socket there; pass --socket-dir)"},{"name":"workDirectory","available":true,"required":false,"status":"info","detail":"/nonexistent/work: No such file or directory (os error 2)"}],"verdict":"start","refusal":null,"gaps":[]}"#;
    const PINNED_TEXT: &str = r#"cmp-warden 0.0.0 doctor: policy "default" (sha256 00)
privilege model: minimal-capabilities root (euid 0)

PROTECTION               AVAILABLE REQUIRED STATUS      DETAIL
uniqueUid                yes       yes      enforced    each request runs as its own UID/GID from 20000+40000 (probe ran as 20001)
environment              yes       no       info        passed to commands (spec.env.pass): PATH; withheld: VAULT_ADDR
network                  yes       no       info        spec.network.mode: none: commands get no network (no inet socket; loopback only)
filesystem               yes       no       info        besides the request's own tree, HOME and /tmp, commands read spec.filesystem.readOnly: /usr, /lib, /lib32, /lib64, /bin, /sbin, /opt, /etc/ssl, /etc/ca-certificates, /etc/alternatives, /etc/passwd, /etc/group, /etc/nsswitch.conf, /etc/hosts, /etc/resolv.conf, /etc/localtime, /etc/ld.so.cache, /etc/ld.so.conf, /etc/ld.so.conf.d, /etc/mime.types, /etc/os-release, /etc/gitconfig, /dev/urandom, /dev/random, /proc; and write spec.filesystem.readWrite: /dev/null, /dev/zero, /dev/full
limits                   yes       no       info        spec.limits: addressSpaceBytes=68719476736, cpuMillis=2000, dataBytes=1073741824, diskBytes=2147483648, fileSizeBytes=1073741824, memoryBytes=1073741824, openFiles=4096, outputBytes=67108864, pids=512, wallSeconds=300; each command also ends at ARGOCD_EXEC_TIMEOUT (unset), and a request at the client's deadline (Argo CD's controller.repo.server.timeout.seconds) when that comes first
capabilities             yes       yes      enforced    commands hold none (effective, permitted, inheritable, ambient empty; bounding set empty); probe /proc status: CapInh: 0000000000000000, CapPrm: 0000000000000000, CapEff: 0000000000000000, CapBnd: 0000000000000000, CapAmb: 0000000000000000
supervisorCapabilities   yes       no       info        held at start: CAP_SETGID, CAP_SETUID; kept after the start-up drop: CAP_SETGID, CAP_SETUID
noNewPrivs               yes       yes      enforced    set before exec: setuid/file-capability binaries gain nothing
landlock                 yes       yes      enforced    kernel ABI 7 (this build asks for ABI 7); features in effect: filesystem, refer, truncate, tcp, ioctlDev, abstractUnixSocketScope, signalScope; enforced rights: fs:Execute
landlockDenialLog        no        no       info        not available: not in tests
landlockNetwork          yes       no       enforced    TCP bind and connect denied (network.mode: none)
seccomp                  yes       yes      enforced    2 filter(s), 321 BPF instructions from policies/seccomp/default.json in enforce mode
cgroups                  yes       no       partial     cgroup v1 (memory at /sys/fs/cgroup/memory/x); controllers memory; the probe's own cgroup read back: memory.limit_in_bytes=1073741824 (spec.limits.memoryBytes), swap=0; but no pids controller, no cpu controller
rlimits                  yes       yes      enforced    NOFILE=4096 (spec.limits.openFiles) AS=unlimited (spec.limits.addressSpaceBytes)
namespace.user           yes       no       enforced    the request's UID/GID is mapped to itself; the jail holds no capability over the host
namespace.mount          yes       no       enforced    private mounts (/ made private); the request tree and /tmp on the request's tmpfs
namespace.pid            yes       no       enforced    commands see only their own processes; private /proc
namespace.net            yes       no       enforced    empty network namespace: loopback only
namespace.ipc            yes       no       enforced    private System V IPC and POSIX message queues
namespace.uts            yes       no       partial     private UTS namespace (hostname cmp-warden); but uts: sethostname: EPERM
namespace.cgroup         yes       no       enforced    commands see their own cgroup as the root
diskLimit                yes       no       enforced    the request tree and /tmp live on a private tmpfs of 2147483648 bytes (spec.limits.diskBytes)
treeCache                no        no       info        off: not in tests
socketDirectory          no        no       unavailable /nonexistent/plugins: No such file or directory (os error 2) (serve creates the socket there; pass --socket-dir)
workDirectory            yes       no       info        /nonexistent/work: No such file or directory (os error 2)

verdict: serve would START
"#;
}
