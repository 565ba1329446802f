//! Each check of the report: what the probe's jail, the policy's plan and this environment say
//! about one protection. The policy is read through its [`Plan`], the one translation.

use super::{Check, DoctorReport, SCHEMA, Status, gaps, yes};
use cgroups::Layout;
use jail_wire::protocol::{LandlockStatus, Report};
use policy::Namespace;
use policy::{LandlockFeature, NetworkMode, Protection, SeccompMode};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use supervisor::{DenialLog, Privileges};
use supervisor::{Enforcement, Plan};

/// What one check needs: the policy's plan, what start-up found (if it got that far) and the
/// probe.
pub(super) struct Found<'a> {
    plan: &'a Plan,
    enforcement: Option<&'a Enforcement>,
    report: Option<&'a Report>,
}

impl Found<'_> {
    fn required(&self, p: Protection) -> bool {
        self.plan.requires(p)
    }

    /// Why `p` is unavailable, else that the probe did not run.
    fn why_not(&self, p: Protection) -> String {
        self.enforcement
            .and_then(|e| e.unavailable(p))
            .map_or_else(|| NO_PROBE.to_owned(), str::to_owned)
    }
}

pub(super) const NO_PROBE: &str = "the sandbox probe did not run";

pub(super) fn check(
    name: &str,
    available: bool,
    required: bool,
    status: Status,
    detail: String,
) -> Check {
    Check {
        name: name.to_owned(),
        available,
        required,
        status,
        detail,
    }
}

/// The report, one function per check, in the order the report lists them.
pub(super) fn assemble_as(
    plan: &Plan,
    held: &Privileges,
    enforcement: Option<&Enforcement>,
    (socket_dir, work_parent): (&Path, &Path),
    refusal: Option<String>,
    env: Vec<(String, String)>,
) -> DoctorReport {
    let f = Found {
        plan,
        enforcement,
        report: enforcement.map(|e| &e.probe),
    };
    let kept = enforcement
        .map(|e| e.capabilities_kept.clone())
        .unwrap_or_default();
    let mut checks = vec![unique_uid_check(&f)];
    checks.extend(shared_uid_check(&f));
    let env_timeout = env
        .iter()
        .find(|(k, _)| k == "ARGOCD_EXEC_TIMEOUT")
        .map(|(_, v)| v.clone())
        .filter(|v| !v.is_empty());
    checks.push(environment_check(plan));
    checks.push(network_check(plan));
    checks.push(filesystem_check(plan));
    checks.push(limits_check(plan, &env_timeout));
    checks.extend([
        capabilities_check(&f),
        supervisor_capabilities_check(held, &kept),
        no_new_privs_check(&f),
        landlock_check(&f),
    ]);
    checks.extend(denial_log_check(&f));
    checks.extend(landlock_network_check(&f));
    checks.push(seccomp_check(&f));
    checks.push(cgroups_check(&f));
    checks.push(rlimits_check(&f));
    checks.extend(namespace_checks(&f));
    checks.push(disk_check(&f));
    checks.extend(tree_cache_check(&f));
    checks.push(read_only_root_check());
    checks.push(socket_dir_check(socket_dir, held.euid));
    checks.push(work_dir_check(work_parent));
    checks.extend(in_force_check(work_parent, Some(&plan.policy_sha256)));
    let gaps = gaps(&checks);
    DoctorReport {
        schema: SCHEMA,
        version: env!("CARGO_PKG_VERSION"),
        commit: env!("CMP_WARDEN_COMMIT"),
        selected: Vec::new(),
        policy: plan.policy_name.clone(),
        policy_sha256: plan.policy_sha256.clone(),
        privilege_model: held.model,
        euid: held.euid,
        capabilities_held: held.effective.clone(),
        capabilities_kept: kept,
        checks,
        verdict: if refusal.is_none() { "start" } else { "refuse" },
        refusal,
        gaps,
    }
}

pub(super) fn unique_uid_check(f: &Found<'_>) -> Check {
    let unique = f.report.is_some_and(|r| r.unique_uid);
    check(
        "uniqueUid",
        unique,
        f.required(Protection::UniqueUid),
        yes(unique),
        if unique {
            format!(
                "each request runs as its own UID/GID from {}+{} (probe ran as {})",
                f.plan.uid_range.0,
                f.plan.uid_range.1,
                f.report.map_or(0, |r| r.uid)
            )
        } else {
            f.why_not(Protection::UniqueUid)
        },
    )
}

/// Whether a failed request can be told what Landlock refused it (the kernel's audit records,
/// ABI 7): informational, nothing depends on it.
pub(super) fn denial_log_check(f: &Found<'_>) -> Option<Check> {
    let e = f.enforcement?;
    let reading = matches!(
        e.denial_log,
        DenialLog::Reading {
            audit_enabled: Some(true) | None
        }
    );
    Some(check(
        "landlockDenialLog",
        reading,
        false,
        Status::Info,
        e.denial_log.describe(),
    ))
}

/// Whether the tree cache (`spec.cache`) runs: a request whose archive was extracted before
/// then skips extraction. Not a protection (without it every request extracts in its own
/// jail), so informational; the detail says why not and which field or namespace changes it.
pub(super) fn tree_cache_check(f: &Found<'_>) -> Option<Check> {
    let e = f.enforcement?;
    let on = e.tree_cache.is_ok();
    let detail = if f.plan.cache_enabled() {
        e.tree_cache_phrase()
    } else {
        "off in the policy (spec.cache.enabled: false)".to_owned()
    };
    Some(check("treeCache", on, false, Status::Info, detail))
}

/// Which of the server's variables commands get (`spec.env.pass`) and which they do not
/// (names only): a plugin configured by the server's environment shows up here first.
pub(super) fn environment_check(plan: &Plan) -> Check {
    let passed: Vec<&str> = plan.passed_env_names().collect();
    let withheld = &plan.withheld_env;
    check(
        "environment",
        true,
        false,
        Status::Info,
        format!(
            "passed to commands (spec.env.pass): {}; withheld: {}",
            if passed.is_empty() {
                "none".to_owned()
            } else {
                passed.join(", ")
            },
            if withheld.is_empty() {
                "none".to_owned()
            } else {
                withheld.join(", ")
            }
        ),
    )
}

/// Every `spec.limits` field as the policy sets it (the cgroup and rlimit checks below say
/// which of them the kernel enforces here), and the two deadlines that are not the policy's.
pub(super) fn limits_check(plan: &Plan, exec_timeout: &Option<String>) -> Check {
    let fields = match serde_json::to_value(plan.limits()) {
        Ok(serde_json::Value::Object(m)) => m
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(", "),
        _ => "unreadable".to_owned(),
    };
    check(
        "limits",
        true,
        false,
        Status::Info,
        format!(
            "spec.limits: {fields}; each command also ends at ARGOCD_EXEC_TIMEOUT ({}), and a request at the client's deadline (Argo CD's controller.repo.server.timeout.seconds) when that comes first",
            match exec_timeout.as_deref() {
                None => "unset".to_owned(),
                // As serve reads it: a value Go cannot parse, or zero, applies no timeout.
                Some(v) => match plugin::duration::parse_go_duration(v) {
                    Ok(d) if !d.is_zero() => v.to_owned(),
                    Ok(_) => format!("{v}: zero, none applied"),
                    Err(_) => format!("{v}: not a Go duration, not applied"),
                },
            }
        ),
    )
}

/// The paths outside the request's own tree that commands may read or write, by the fields
/// that list them: a file a plugin needs from the image (shared values, a tool's config) is
/// readable only under one of them.
pub(super) fn filesystem_check(plan: &Plan) -> Check {
    let list = |paths: &[PathBuf]| {
        if paths.is_empty() {
            "none".to_owned()
        } else {
            paths
                .iter()
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        }
    };
    check(
        "filesystem",
        true,
        false,
        Status::Info,
        format!(
            "besides the request's own tree, HOME and /tmp, commands read spec.filesystem.readOnly: {}; and write spec.filesystem.readWrite: {}",
            list(plan.read_only()),
            list(plan.read_write())
        ),
    )
}

/// What the policy lets commands reach, with the fields that say it: the mode, and under
/// `allowList` each destination, the pinned names and whether audit mode lets all through.
pub(super) fn network_check(plan: &Plan) -> Check {
    let mut detail = match plan.network() {
        NetworkMode::None if plan.loopback() => "spec.network.mode: none: commands get no network beyond the jail's own loopback".to_owned(),
        NetworkMode::None => {
            "spec.network.mode: none: commands get no network (no inet socket; loopback only)"
                .to_owned()
        }
        NetworkMode::Egress => "spec.network.mode: egress: commands share the pod's network (every destination the pod reaches)".to_owned(),
        NetworkMode::AllowList => {
            let empty = vocab::egress::AllowList::default();
            let l = plan.egress.as_ref().map_or(&empty, |(l, _)| l);
            let allow: Vec<String> = l
                .rules
                .iter()
                .map(|r| {
                    let target = match &r.target {
                        vocab::egress::Target::Host(h) => h.to_string(),
                        vocab::egress::Target::Cidr(c) => c.to_string(),
                    };
                    let ports: Vec<String> = r.ports.iter().map(u16::to_string).collect();
                    format!(
                        "{target}:{}{}",
                        ports.join("|"),
                        if r.internal { " (internal)" } else { "" }
                    )
                })
                .collect();
            let hosts: Vec<String> = l
                .hosts
                .iter()
                .map(|(n, a)| {
                    let a: Vec<String> = a.iter().map(ToString::to_string).collect();
                    format!("{n} -> {}", a.join(", "))
                })
                .collect();
            format!(
                "spec.network.mode: allowList, through the egress proxy; spec.network.allow: {}; spec.network.hosts: {}{}",
                if allow.is_empty() { "none".to_owned() } else { allow.join(", ") },
                if hosts.is_empty() { "none".to_owned() } else { hosts.join("; ") },
                if l.audit {
                    "; spec.network.audit: true: every destination is let through and recorded, the list is not enforced"
                } else {
                    ""
                }
            )
        }
    };
    if plan.loopback() {
        detail.push_str("; spec.network.loopback: true: inet sockets on the jail's own loopback (its network namespace, required, has no other device)");
    }
    check("network", true, false, Status::Info, detail)
}

/// Only in the shared-UID model: what it cannot give on this node.
pub(super) fn shared_uid_check(f: &Found<'_>) -> Option<Check> {
    let e = f.enforcement.filter(|e| !e.unique_uid)?;
    let gaps = e.shared_uid_gaps();
    Some(check(
        "sharedUid",
        true,
        false,
        if gaps.is_empty() {
            Status::Info
        } else {
            Status::Partial
        },
        if gaps.is_empty() {
            "commands share the server's UID; on this node the PID namespace, cgroups and Landlock scoping still give each request its own processes and bounds".to_owned()
        } else {
            format!(
                "commands share the server's UID; on this node: {}",
                gaps.join("; ")
            )
        },
    ))
}

pub(super) fn capabilities_check(f: &Found<'_>) -> Check {
    // Read back from the probe jail's own /proc status, not from what it meant to do.
    let zero = |set: &str| {
        f.report
            .and_then(|r| status_value(&r.status, set))
            .is_some_and(|v| v.trim_start_matches('0').is_empty())
    };
    let cleared = ["CapInh", "CapPrm", "CapEff", "CapAmb"]
        .iter()
        .all(|c| zero(c));
    let bounding = zero("CapBnd");
    check(
        "capabilities",
        cleared,
        true,
        match (cleared, bounding) {
            (true, true) => Status::Enforced,
            (true, false) => Status::Partial,
            _ => Status::Unavailable,
        },
        match f.report {
            Some(r) => format!(
                "commands hold none (effective, permitted, inheritable, ambient empty; bounding set {}); {}",
                if bounding {
                    "empty"
                } else {
                    "NOT empty: no CAP_SETPCAP"
                },
                status_caps(&r.status)
            ),
            None => NO_PROBE.to_owned(),
        },
    )
}

pub(super) fn supervisor_capabilities_check(held: &Privileges, kept: &[String]) -> Check {
    check(
        "supervisorCapabilities",
        true,
        false,
        Status::Info,
        format!(
            "held at start: {}; kept after the start-up drop: {}",
            list(&held.effective),
            list(kept)
        ),
    )
}

pub(super) fn no_new_privs_check(f: &Found<'_>) -> Check {
    let nnp = f
        .report
        .is_some_and(|r| r.no_new_privs && status_value(&r.status, "NoNewPrivs") == Some("1"));
    check(
        "noNewPrivs",
        nnp,
        f.required(Protection::NoNewPrivs),
        yes(nnp),
        if nnp {
            "set before exec: setuid/file-capability binaries gain nothing".into()
        } else {
            NO_PROBE.to_owned()
        },
    )
}

pub(super) fn landlock_check(f: &Found<'_>) -> Check {
    let (status, detail) = match f.report {
        Some(r) => {
            // Every feature this build asks for (TCP unless `network: egress` or
            // `network.loopback`, whose TCP the jail's network namespace fences) that the
            // kernel does not put in effect here.
            let tcp_asked = f.plan.network() != NetworkMode::Egress && !f.plan.loopback();
            let missing: Vec<&str> = LandlockFeature::ALL
                .into_iter()
                .filter(|x| *x != LandlockFeature::Tcp || tcp_asked)
                .filter(|x| !r.landlock_features.contains(x))
                .map(LandlockFeature::as_str)
                .collect();
            let in_effect: Vec<&str> = r.landlock_features.iter().map(|x| x.as_str()).collect();
            (
                match r.landlock {
                    LandlockStatus::None => Status::Unavailable,
                    _ if !missing.is_empty() => Status::Partial,
                    LandlockStatus::Full => Status::Enforced,
                    LandlockStatus::Partial => Status::Partial,
                },
                format!(
                    "kernel ABI {} (this build asks for ABI {}); features in effect: {}{}; enforced rights: {}{}",
                    r.landlock_abi.map_or("none".into(), |a| a.to_string()),
                    jail_wire::protocol::TESTED_LANDLOCK_ABI as i32,
                    if in_effect.is_empty() {
                        "none".to_owned()
                    } else {
                        in_effect.join(", ")
                    },
                    if missing.is_empty() {
                        String::new()
                    } else {
                        format!(
                            "; NOT in effect here: {} (require them with spec.landlock.features to refuse such a node)",
                            missing.join(", ")
                        )
                    },
                    list(&r.landlock_rights),
                    if r.missing_paths.is_empty() {
                        String::new()
                    } else {
                        format!("; policy paths missing here: {:?}", r.missing_paths)
                    }
                ),
            )
        }
        None => (Status::Unavailable, NO_PROBE.to_owned()),
    };
    check(
        "landlock",
        status != Status::Unavailable,
        f.required(Protection::Landlock),
        status,
        detail,
    )
}

/// Unless `network: egress`.
pub(super) fn landlock_network_check(f: &Found<'_>) -> Option<Check> {
    if f.plan.network() == NetworkMode::Egress {
        return None;
    }
    let tcp = f.report.is_some_and(|r| r.landlock_tcp_denied);
    if f.report.is_some() && f.plan.loopback() {
        // Not a missing protection: the policy lets commands use TCP on their own loopback.
        return Some(check(
            "landlockNetwork",
            false,
            false,
            Status::Info,
            format!(
                "TCP not asked of Landlock: spec.network.loopback: true lets commands bind and connect on the jail's own loopback; the jail's network namespace (namespace.net), which has no other device, is the fence{}",
                if f.plan.network() == NetworkMode::AllowList {
                    ", and the egress proxy's listener in it the only way out (network.mode: allowList)"
                } else {
                    ""
                }
            ),
        ));
    }
    Some(check(
        "landlockNetwork",
        tcp,
        false,
        yes(tcp),
        match f.report {
            None => NO_PROBE.to_owned(),
            Some(r) if f.plan.network() == NetworkMode::AllowList => {
                let fence = if r.namespaces.has(Namespace::Net) {
                    "the jail's own network namespace holds only the proxy's listener"
                } else {
                    "no network namespace of the jail's own"
                };
                let sockets = if r.loopback_sockets {
                    "every inet socket bound to the loopback device by the seccomp listener (commands cannot unbind it)"
                } else {
                    "inet sockets not bound to the loopback"
                };
                format!(
                    "TCP bind denied and connect to the egress proxy's port only{}; {sockets}; {fence}: only the proxy is reachable (network.mode: allowList)",
                    if tcp { "" } else { " (not enforced: kernel Landlock ABI < 4)" }
                )
            }
            Some(_) if tcp => "TCP bind and connect denied (network.mode: none)".into(),
            Some(_) => "kernel Landlock ABI < 4: TCP is denied by seccomp (socket families) and the empty network namespace only".into(),
        },
    ))
}

pub(super) fn seccomp_check(f: &Found<'_>) -> Check {
    // What the kernel says is installed (the probe's /proc status), not what was meant.
    let filters = f.report.map_or(0, |r| {
        let installed = status_value(&r.status, "Seccomp_filters")
            .and_then(|v| v.parse::<usize>().ok())
            .unwrap_or(0);
        let filtering = status_value(&r.status, "Seccomp") == Some("2");
        if filtering {
            installed.min(r.seccomp_filters)
        } else {
            0
        }
    });
    let mode = f.plan.seccomp_mode();
    check(
        "seccomp",
        filters > 0,
        f.required(Protection::Seccomp),
        match (filters > 0, mode) {
            (false, _) => Status::Unavailable,
            (true, SeccompMode::Enforce) => Status::Enforced,
            (true, SeccompMode::Audit) => Status::Partial,
        },
        if filters > 0 {
            format!(
                "{filters} filter(s), {} BPF instructions from {} in {} mode{}",
                f.enforcement.map_or(0, |e| e.seccomp_instructions),
                f.plan.seccomp_profile().display(),
                match mode {
                    SeccompMode::Enforce => "enforce",
                    SeccompMode::Audit => "audit",
                },
                if mode == SeccompMode::Audit {
                    " (AUDIT: nothing is denied, would-be denials are recorded)"
                } else {
                    ""
                }
            )
        } else {
            // The probe ran and its jail installed nothing: its own reason, not "no probe".
            f.report
                .and_then(|r| {
                    r.degraded
                        .iter()
                        .find(|d| d.what == jail_wire::protocol::Reduced::Seccomp)
                })
                .map_or_else(
                    || f.why_not(Protection::Seccomp),
                    |d| format!("the probe's jail installed none: {}", d.why),
                )
        },
    )
}

/// From the probe's own request cgroup, read back after its jail ran in it: enforced only
/// when the jail ran there and the kernel holds every limit asked, with all three controllers.
pub(super) fn cgroups_check(f: &Found<'_>) -> Check {
    let required = f.required(Protection::Cgroups);
    let Some((layout, e)) = f
        .enforcement
        .and_then(|e| e.cgroups.as_ref().map(|l| (l, e)))
    else {
        return check(
            "cgroups",
            false,
            required,
            Status::Unavailable,
            f.why_not(Protection::Cgroups),
        );
    };
    let at = match layout {
        Layout::V2 { base } => format!("cgroup v2, request cgroups in {}", base.display()),
        Layout::V1 { controllers } => format!(
            "cgroup v1 ({})",
            controllers
                .iter()
                .map(|(c, p)| format!("{c} at {}", p.display()))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    };
    let at = format!("{at}; controllers {}", list(&e.cgroup_controllers));
    let Some(rb) = &e.cgroup_probe else {
        return check(
            "cgroups",
            false,
            required,
            Status::Unavailable,
            format!("{at}; but the probe's jail got no cgroup"),
        );
    };
    let read = format!("the probe's own cgroup read back: {}", rb.describe());
    let mut wrong = rb.mismatches(&e.cgroup_limits);
    if !rb.ran {
        return check(
            "cgroups",
            false,
            required,
            Status::Unavailable,
            format!("{at}; {read}; but its jail did not run in it"),
        );
    }
    wrong.extend(
        ["memory", "pids", "cpu"]
            .into_iter()
            .filter(|c| !e.cgroup_controllers.iter().any(|x| x == c))
            .map(|c| format!("no {c} controller")),
    );
    let status = if wrong.is_empty() {
        Status::Enforced
    } else {
        Status::Partial
    };
    let detail = if wrong.is_empty() {
        format!("{at}; {read}")
    } else {
        format!("{at}; {read}; but {}", wrong.join(", "))
    };
    check("cgroups", true, required, status, detail)
}

/// The policy field an rlimit of the jail comes from (CORE is always 0).
fn rlimit_field(name: &str) -> Option<&'static str> {
    Some(match name {
        "NOFILE" => "spec.limits.openFiles",
        "FSIZE" => "spec.limits.fileSizeBytes",
        "DATA" => "spec.limits.dataBytes",
        "AS" => "spec.limits.addressSpaceBytes",
        "NPROC" => "spec.limits.pids",
        _ => return None,
    })
}

pub(super) fn rlimits_check(f: &Found<'_>) -> Check {
    let rl = f.report.map(|r| &r.rlimits);
    // RLIMIT_NPROC counts a UID's processes: a bound per request only when the UID is the
    // request's own (with a pids cgroup, the cgroup is the bound).
    let unique = f.report.is_some_and(|r| r.unique_uid);
    let pids_cgroup = f
        .enforcement
        .is_some_and(|e| e.cgroup_controllers.iter().any(|c| c == "pids"));
    check(
        "rlimits",
        rl.is_some(),
        true,
        match rl {
            None => Status::Unavailable,
            Some(_) if unique || pids_cgroup => Status::Enforced,
            Some(_) => Status::Partial,
        },
        match rl {
            Some(v) => {
                let mut d = v
                    .iter()
                    .filter(|(n, _)| unique || n != "NPROC")
                    .map(|(n, x)| {
                        let value = if *x == u64::MAX {
                            format!("{n}=unlimited")
                        } else {
                            format!("{n}={x}")
                        };
                        // The policy field each comes from, as an operator changes it.
                        match rlimit_field(n) {
                            Some(field) => format!("{value} ({field})"),
                            None => value,
                        }
                    })
                    .collect::<Vec<_>>()
                    .join(" ");
                if !unique {
                    d.push_str(if pids_cgroup {
                        "; NPROC not applied (the UID is shared): the pids cgroup bounds each request"
                    } else {
                        "; NPROC not applied (the UID is shared) and no pids cgroup: NO per-request process bound"
                    });
                }
                d
            }
            None => NO_PROBE.to_owned(),
        },
    )
}

/// One line per namespace: the ones the plan asks for (the policy's, less `net` under
/// `network: egress`), as the probe's jail entered them.
pub(super) fn namespace_checks(f: &Found<'_>) -> Vec<Check> {
    let ns = f.plan.namespaces();
    let wanted = [
        (Namespace::User, true),
        (Namespace::Mount, ns.mount),
        (Namespace::Pid, ns.pid),
        (Namespace::Net, ns.net),
        (Namespace::Ipc, ns.ipc),
        (Namespace::Uts, ns.uts),
        (Namespace::Cgroup, ns.cgroup),
    ];
    let ns_req = f.required(Protection::Namespaces);
    wanted
        .into_iter()
        .map(|(ns, want)| {
            let report = f.report.map(|r| &r.namespaces);
            let created = report.is_some_and(|r| r.has(ns));
            let failed = report
                .and_then(|r| r.failure_of(ns))
                .map(ToString::to_string);
            let notes: Vec<String> = report
                .map(|r| r.notes_of(ns).map(ToString::to_string).collect())
                .unwrap_or_default();
            let (status, detail) = if created && !notes.is_empty() {
                (
                    Status::Partial,
                    format!("{}; but {}", ns_detail(ns, f.report), notes.join("; ")),
                )
            } else if created {
                (Status::Enforced, ns_detail(ns, f.report))
            } else if !want {
                (
                    Status::Disabled,
                    if ns == Namespace::Net && f.plan.network() == NetworkMode::Egress {
                        "network.mode: egress shares the host's network".to_owned()
                    } else {
                        format!("spec.namespaces leaves out {ns}")
                    },
                )
            } else {
                (
                    Status::Unavailable,
                    failed.unwrap_or_else(|| "not created".to_owned()),
                )
            };
            check(
                &format!("namespace.{ns}"),
                created,
                ns_req && want,
                status,
                detail,
            )
        })
        .collect()
}

pub(super) fn disk_check(f: &Found<'_>) -> Check {
    let disk = f.report.and_then(|r| r.namespaces.disk_bytes);
    check(
        "diskLimit",
        disk.is_some(),
        false,
        yes(disk.is_some()),
        match disk {
            Some(b) => format!(
                "the request tree and /tmp live on a private tmpfs of {b} bytes (spec.limits.diskBytes)"
            ),
            None => {
                let why = f
                    .report
                    .and_then(|r| r.namespaces.notes_of(Namespace::Mount).next())
                    .map_or("no mount namespace".to_owned(), ToString::to_string);
                format!(
                    "{why}: the tree is bounded by RLIMIT_FSIZE per file and the archive limits only"
                )
            }
        },
    )
}

pub(super) fn read_only_root_check() -> Check {
    let (ro, detail) = root_read_only();
    check(
        "readOnlyRootFilesystem",
        ro,
        false,
        if ro {
            Status::Enforced
        } else {
            Status::Unavailable
        },
        detail,
    )
}

pub(super) fn work_dir_check(work_parent: &Path) -> Check {
    let detail = match std::fs::metadata(work_parent) {
        Ok(m) => format!(
            "{} (owner {}:{}, mode {:o}){}",
            work_parent.display(),
            m.uid(),
            m.gid(),
            m.mode() & 0o7777,
            if fs_type(work_parent).as_deref() == Some("tmpfs") {
                ", tmpfs"
            } else {
                ", not tmpfs (an emptyDir with medium: Memory is faster)"
            }
        ),
        Err(e) => format!("{}: {e}", work_parent.display()),
    };
    check("workDirectory", true, false, Status::Info, detail)
}

/// What a server running here has in force (its [`server::reload::InForce`] beside the work
/// directory), against the files doctor read now: a change a reload refused, or one not yet
/// reloaded, shows up here with the reason. Absent when no server runs here. `read_now`: the
/// SHA-256 of the default policy doctor read (`None`: the files do not parse, and the set in
/// force is all there is to show).
pub(super) fn in_force_check(work_parent: &Path, read_now: Option<&str>) -> Option<Check> {
    let f = match server::reload::InForce::read(work_parent)? {
        Ok(f) => f,
        Err(e) => return Some(check("configInForce", false, false, Status::Info, e)),
    };
    let short = |s: &str| s.get(..12).unwrap_or(s).to_owned();
    let policies: Vec<String> = f
        .policies
        .iter()
        .map(|p| format!("{}={}", p.name, short(&p.sha256)))
        .collect();
    let mut detail = format!(
        "the server here (pid {}) serves, since {}: policies {}; plugin.yaml {}",
        f.pid,
        f.since,
        list(&policies),
        short(&f.plugin_sha256)
    );
    let default_in_force = f.policies.first().map(|p| p.sha256.as_str());
    let differs = default_in_force != read_now;
    match read_now {
        Some(now) if differs => detail.push_str(&format!(
            "; the default policy read now ({}) is not the one in force",
            short(now)
        )),
        None => detail.push_str("; the policies read now do not parse (the error above)"),
        Some(_) => {}
    }
    match &f.last_refused {
        Some(r) => detail.push_str(&format!(
            "; the last reload, at {} ({}), was REFUSED: {}",
            r.time,
            r.trigger,
            r.reason.as_deref().unwrap_or("no reason recorded")
        )),
        None if differs => detail.push_str(
            "; no reload has read it yet (the next change, SIGHUP or the 30 s check does)",
        ),
        None => {}
    }
    let status = if differs || f.last_refused.is_some() {
        Status::Partial
    } else {
        Status::Info
    };
    Some(check("configInForce", true, false, status, detail))
}

pub(super) fn list(v: &[String]) -> String {
    if v.is_empty() {
        "none".into()
    } else {
        v.join(", ")
    }
}

/// The value of `key` in the probe's `/proc/self/status` lines (`Key: value`).
pub(super) fn status_value<'a>(status: &'a [String], key: &str) -> Option<&'a str> {
    status.iter().find_map(|l| {
        l.strip_prefix(key)
            .and_then(|r| r.strip_prefix(':'))
            .map(str::trim)
    })
}

pub(super) fn status_caps(status: &[String]) -> String {
    let caps: Vec<&str> = status
        .iter()
        .filter(|l| l.starts_with("Cap"))
        .map(String::as_str)
        .collect();
    format!("probe /proc status: {}", caps.join(", ").replace('\t', " "))
}

pub(super) fn ns_detail(ns: Namespace, report: Option<&Report>) -> String {
    match ns {
        Namespace::User => {
            "the request's UID/GID is mapped to itself; the jail holds no capability over the host"
                .into()
        }
        Namespace::Mount => {
            "private mounts (/ made private); the request tree and /tmp on the request's tmpfs"
                .into()
        }
        Namespace::Pid => format!(
            "commands see only their own processes{}",
            if report.is_some_and(|r| r.namespaces.private_proc) {
                "; private /proc"
            } else {
                ""
            }
        ),
        Namespace::Net => "empty network namespace: loopback only".into(),
        Namespace::Ipc => "private System V IPC and POSIX message queues".into(),
        Namespace::Uts => "private UTS namespace (hostname cmp-warden)".into(),
        Namespace::Cgroup => "commands see their own cgroup as the root".into(),
    }
}

/// Whether `/` is mounted read-only (the container's `readOnlyRootFilesystem`).
pub(super) fn root_read_only() -> (bool, String) {
    let text = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    // Field 5 is the mount point, field 6 the per-mount options; the last "/" mount wins.
    let root = text.lines().rev().find_map(|l| {
        let f: Vec<&str> = l.split(' ').collect();
        (f.get(4) == Some(&"/")).then(|| f.get(5).copied().unwrap_or("").to_owned())
    });
    match root {
        Some(opts) => {
            let ro = opts.split(',').any(|o| o == "ro");
            (
                ro,
                if ro {
                    "/ is mounted read-only".into()
                } else {
                    format!(
                        "/ is mounted writable ({opts}); set securityContext.readOnlyRootFilesystem: true"
                    )
                },
            )
        }
        None => (false, "no / in /proc/self/mountinfo".into()),
    }
}

/// The socket directory must not be writable by anyone but the server (a planted socket or
/// a replaced one would intercept the repo-server's requests).
pub(super) fn socket_dir_check(dir: &Path, euid: u32) -> Check {
    let (ok, detail) = socket_dir_state(dir, euid);
    check(
        "socketDirectory",
        ok,
        false,
        if ok {
            Status::Enforced
        } else {
            Status::Unavailable
        },
        detail,
    )
}

pub(super) fn socket_dir_state(dir: &Path, euid: u32) -> (bool, String) {
    match std::fs::metadata(dir) {
        Ok(m) => {
            let mode = m.mode() & 0o7777;
            let others_write = mode & 0o002 != 0 && mode & 0o1000 == 0;
            let owner_ok = m.uid() == euid || m.uid() == 0;
            (
                owner_ok && !others_write,
                format!(
                    "{} owner {}:{} mode {mode:o}{}{}",
                    dir.display(),
                    m.uid(),
                    m.gid(),
                    if owner_ok {
                        ""
                    } else {
                        "; NOT owned by the server or root"
                    },
                    if others_write {
                        "; WRITABLE BY OTHERS without the sticky bit"
                    } else {
                        ""
                    }
                ),
            )
        }
        Err(e) => (
            false,
            format!(
                "{}: {e} (serve creates the socket there; pass --socket-dir)",
                dir.display()
            ),
        ),
    }
}

pub(super) fn fs_type(p: &Path) -> Option<String> {
    let st = rustix::fs::statfs(p).ok()?;
    Some(
        match st.f_type as i64 {
            0x0102_1994 => "tmpfs",
            0xef53 => "ext4",
            0x9123_683e => "btrfs",
            0x5846_5342 => "xfs",
            0x794c_7630 => "overlayfs",
            _ => "other",
        }
        .to_owned(),
    )
}
