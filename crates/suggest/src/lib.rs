//! `cmp-warden policy suggest`'s reasoning: from the audit events of runs under a policy, a
//! proposed policy and seccomp profile, every change with its reason. Pure (no file is read
//! or written here): the binary loads the inputs, writes and validates the proposal.

#![forbid(unsafe_code)]

use std::path::PathBuf;
use vocab::egress;

use audit_event::AuditEvent;
use policy::{NetworkMode, Policy, SeccompMode};
use serde_json::Value;
use vocab::egress::Decision;
use vocab::record::SeccompAction;

/// Why a proposal could not be made.
#[derive(Debug, thiserror::Error)]
pub enum SuggestError {
    /// The input policy's seccomp profile is not JSON (or the proposal's cannot be written).
    #[error("seccomp profile: {0}")]
    Profile(#[from] serde_json::Error),
    /// A destination the plugin reached is no allow-list entry.
    #[error("network: {0}")]
    Destination(#[from] egress::Error),
}

const MI: u64 = 1 << 20;

fn round_up(v: u64, unit: u64) -> u64 {
    v.div_ceil(unit).max(1) * unit
}

/// What the audit events show, across all requests.
#[derive(Debug, Default)]
struct Observed {
    requests: usize,
    /// Calls the profile would have denied, let through in audit mode: name → (count, comm).
    denied: std::collections::BTreeMap<String, (u64, String)>,
    /// Calls the profile denied in enforce mode: never proposed (listed for the reviewer).
    enforced: std::collections::BTreeMap<String, (u64, String)>,
    peak_memory: u64,
    duration_ms: u64,
    output: u64,
    limits_hit: Vec<(String, String)>,
    /// Requests that did not finish `ok`: their figures (time, memory, output) stop where
    /// they failed, short of what a finished run needs.
    unfinished: usize,
    /// Destinations commands asked the egress proxy for: (host, port) → needed `internal`.
    egress: std::collections::BTreeMap<(String, u16), bool>,
    /// Server variables withheld from a command that failed and that its argv names (the
    /// operator's plugin.yaml): name → the app whose request it was. The full withheld list
    /// of an event is not evidence (every failure carries it), nor is what a command printed
    /// (a command chooses its words).
    withheld: std::collections::BTreeMap<String, String>,
    /// Withheld variables only a failed command's own words named: never proposed; listed
    /// for the reviewer.
    printed_only: std::collections::BTreeSet<String>,
    /// Paths in Landlock's records that no proposal may grant whoever asked (the server's own
    /// directories, every request's tree, shared memory, /proc): listed for the reviewer.
    never_files: std::collections::BTreeSet<String>,
    /// Paths Landlock refused, from the kernel's own records: whether a write was refused,
    /// and in how many requests.
    files: std::collections::BTreeMap<String, (bool, u64)>,
    /// Paths only a failed command's error named as refused (no kernel record): never
    /// proposed, a command's output being its own to write; listed for the reviewer.
    claimed_files: std::collections::BTreeSet<String>,
    /// Paths in a record that no policy can name (not absolute and normalised).
    unnamed_files: std::collections::BTreeSet<String>,
    /// Destinations the egress proxy refused: never proposed; listed for the reviewer.
    refused_destinations: std::collections::BTreeSet<String>,
    /// Lines marked as audit events that are no event of this schema (another version, a
    /// damaged line): not read, and said in the notes.
    unreadable: usize,
}

/// Paths no proposal grants, whatever a request's Landlock records say: beneath them lie the
/// work root (`…/_cmp_server`: every request's tree), Argo CD's sidecar directories (the
/// plugin's config, policies and socket: `/home/argocd/cmp-server`), the pod's shared memory,
/// /proc and /sys. A request tried them; no honest plugin needs them.
fn never_granted(path: &str) -> bool {
    const NEVER: &[&str] = &[
        "/proc",
        "/sys",
        "/dev/shm",
        "/run/shm",
        "/home/argocd/cmp-server",
        "/var/run/argocd",
        "/run/secrets",
        "/var/run/secrets",
    ];
    let p = std::path::Path::new(path);
    p == std::path::Path::new("/")
        || NEVER.iter().any(|n| p.starts_with(n))
        || p.components().any(|c| c.as_os_str() == WORK_ROOT_NAME)
        || p.components().any(|c| {
            matches!(
                c,
                std::path::Component::ParentDir | std::path::Component::CurDir
            )
        })
}

/// The work root's name under `ARGOCD_CMP_WORKDIR` (Argo CD's `_cmp_server`).
const WORK_ROOT_NAME: &str = "_cmp_server";

/// Where the server's own note on withheld variables starts in an error (what precedes it is
/// the command's words).
const WITHHELD_NOTE: &str = " (server variables not passed to commands:";

fn observe(text: &str, operator: &str) -> Observed {
    let mut o = Observed::default();
    for line in text.lines() {
        let Some(e) = AuditEvent::from_line(line) else {
            o.unreadable += usize::from(line.contains("\"log\":\"audit\""));
            continue;
        };
        // A withheld variable counts only where the operator names it: the failed commands'
        // argv (plugin.yaml's) or the policy the runs used; one only the command's own words
        // name is listed, not proposed: a hostile command prints whatever names it likes.
        let error = e.error.as_deref().unwrap_or_default();
        let own_words = error.split(WITHHELD_NOTE).next().unwrap_or_default();
        let argv: Vec<&str> = e
            .commands
            .iter()
            .flat_map(|c| c.argv.iter().map(String::as_str))
            .collect();
        for n in &e.withheld_env {
            if argv.iter().any(|a| policy::names_var(a, n)) || policy::names_var(operator, n) {
                o.withheld.entry(n.clone()).or_insert_with(|| e.app.clone());
            } else if policy::names_var(own_words, n) {
                o.printed_only.insert(n.clone());
            }
        }
        for c in &e.egress {
            // Only what the proxy let through (allowed, or admitted in audit mode): a
            // destination it refused is not something the plugin reached.
            if !matches!(c.decision, Decision::Allowed | Decision::Audited) {
                if !c.destination.is_empty() {
                    o.refused_destinations.insert(c.destination.clone());
                }
                continue;
            }
            let Some((host, port)) = c
                .destination
                .rsplit_once(':')
                .and_then(|(h, p)| Some((h.to_owned(), p.parse::<u16>().ok()?)))
            else {
                continue;
            };
            let internal = c
                .reason
                .as_deref()
                .is_some_and(|r| r.contains("resolves only to internal addresses"))
                || c.address.is_some_and(|a| egress::is_internal(a.ip()));
            *o.egress.entry((host, port)).or_default() |= internal;
        }
        o.requests += 1;
        for d in &e.landlock_denials {
            let (blockers, path) = (d.blockers.as_str(), d.object.as_str());
            // File accesses a policy field allows (not signals, sockets or ports).
            if !blockers.starts_with("fs") || d.allowed_by.is_none() || !path.starts_with('/') {
                continue;
            }
            // The kernel's records name the access (`fs.read_file`); a path taken from the
            // command's own error does not.
            if !blockers.starts_with("fs.") {
                o.claimed_files.insert(path.to_owned());
                continue;
            }
            // Whoever asked, these are never a need: the work root holds every request's
            // tree (and the spare jails', whose names are predictable), the server's config,
            // policy and socket directories are its own, /dev/shm is shared by every jail of
            // the pod, and /proc holds every process's state.
            if never_granted(path) {
                o.never_files.insert(path.to_owned());
                continue;
            }
            // A record no kernel writes (`//`, a relative part): not a path to propose.
            if !policy::policy::is_policy_path(path) {
                o.unnamed_files.insert(path.to_owned());
                continue;
            }
            // The kernel names the access; an error's path is proposed for reading.
            let write = blockers.split(',').any(|b| {
                b.starts_with("fs.") && !matches!(b, "fs.read_file" | "fs.read_dir" | "fs.execute")
            });
            let ent = o.files.entry(path.to_owned()).or_default();
            ent.0 |= write;
            ent.1 += 1;
        }
        for d in &e.seccomp_audit {
            // What audit mode let through is what the plugin did; what enforce mode denied is
            // what a command tried, which may be an attack: never a grant.
            let calls = if d.action == SeccompAction::Audited {
                &mut o.denied
            } else {
                &mut o.enforced
            };
            let ent = calls
                .entry(d.syscall.clone())
                .or_insert((0, d.comm.clone()));
            ent.0 += d.count;
        }
        o.peak_memory = o.peak_memory.max(e.peak_memory_bytes.unwrap_or(0));
        o.duration_ms = o.duration_ms.max(e.duration_ms);
        if e.outcome != "ok" {
            o.unfinished += 1;
        }
        for c in &e.commands {
            o.peak_memory = o.peak_memory.max(c.peak_rss_bytes.unwrap_or(0));
            o.output = o.output.max(c.stdout_bytes).max(c.stderr_bytes);
        }
        if let Some(l) = e.limit {
            o.limits_hit.push((l.as_str().to_owned(), e.app.clone()));
        }
    }
    o
}

/// The default of a policy directory when every request named a project: the input without
/// what only a learning run may have (an audit-mode allow list, seccomp in audit mode).
pub fn unlearnt_default(
    base: &Policy,
    base_profile: &str,
    from: &str,
) -> Result<Suggested, SuggestError> {
    let mut p = base.clone();
    let mut notes = vec![format!(
        "The default policy: every request in {from} named a project, so this runs only what no project's policy selects, and nothing was learnt for it."
    )];
    if p.network == NetworkMode::AllowList && p.egress.audit {
        p.network = NetworkMode::None;
        p.egress = egress::AllowList::default();
        notes.push("network: mode none (the input's allow list was in audit mode)".into());
    }
    if p.seccomp_mode == SeccompMode::Audit {
        p.seccomp_mode = SeccompMode::Enforce;
        notes.push("seccomp: mode enforce (the input's was audit)".into());
    }
    Ok(Suggested {
        policy: p,
        profile: serde_json::from_str(base_profile)?,
        notes,
    })
}

/// The Argo CD projects the audit events in `text` name (only names a `spec.select` pattern
/// can hold).
pub fn projects_in(text: &str) -> std::collections::BTreeSet<String> {
    text.lines().filter_map(event_project).collect()
}

/// The project of an audit event line (`None` for other lines and events without one).
pub fn event_project(line: &str) -> Option<String> {
    let p = AuditEvent::from_line(line)?.project?;
    policy::Pattern::try_from(p.clone())
        .ok()
        .filter(|p| matches!(p, policy::Pattern::Exact(_)))
        .map(|_| p)
}

/// A proposal: the policy, its seccomp profile, and why each change was made.
#[derive(Debug)]
pub struct Suggested {
    /// The proposed policy.
    pub policy: Policy,
    /// Its seccomp profile.
    pub profile: Value,
    /// Why each change was made, for the reviewer (and the policy's header comment).
    pub notes: Vec<String>,
}

impl Suggested {
    /// The policy file's text (naming its profile `seccomp/PROFILE`, keeping the comments of
    /// `input`, the policy the runs used) and the profile's.
    pub fn texts(&self, profile: &str, input: &str) -> Result<(String, String), SuggestError> {
        let profile_json = serde_json::to_string_pretty(&self.profile)? + "\n";
        // The reviewer's own comments stay on the fields they explain.
        let yaml = policy::emit::keep_comments(
            input,
            &policy::emit::to_yaml(&self.policy, &format!("seccomp/{profile}"), &self.notes),
        );
        Ok((yaml, profile_json))
    }
}

/// The proposal the audit events in `text` make of `base` (`None`: no audit event).
///
/// `base_text` is the base policy's file as the operator wrote it: a withheld variable it
/// names (in a field or a comment) counts as the operator's, as one plugin.yaml's commands
/// name does; one only a command printed never does.
pub fn propose(
    text: &str,
    base: &Policy,
    base_text: &str,
    base_profile: &str,
    from: &str,
    others: &[Policy],
) -> Result<Option<Suggested>, SuggestError> {
    let mut p = base.clone();
    let o = observe(text, base_text);
    if o.requests == 0 {
        return Ok(None);
    }
    let mut notes = vec![format!(
        "Suggested by `cmp-warden policy suggest` from {} request(s) in {from}, based on policy {:?}.",
        o.requests, p.name
    )];
    notes.push("Review every line below before deploying; each change says why.".into());
    if o.unreadable > 0 {
        notes.push(format!(
            "{} line(s) marked as audit events were not read: no {} event (another version, or a damaged line)",
            o.unreadable,
            audit_event::SCHEMA
        ));
    }

    // Seccomp: take out of the profile exactly the calls the plugin made.
    let mut profile: Value = serde_json::from_str(base_profile)?;
    if p.seccomp_mode == SeccompMode::Audit && o.denied.is_empty() {
        notes.push(
            "seccomp: no would-be denial was recorded; enforce mode keeps the profile unchanged"
                .into(),
        );
    }
    let mut denied = o.denied.clone();
    // Inet sockets refused under `network: none` lead to a learning run (an audit-mode allow
    // list), whichever mode refused them; every other enforced denial stays.
    if let Some(sockets) = o.enforced.get("socket") {
        denied
            .entry("socket".into())
            .or_insert_with(|| sockets.clone());
    }
    for (name, (n, comm)) in &o.enforced {
        if name != "socket" || p.network != NetworkMode::None {
            notes.push(format!(
                "seccomp: NOT allowing {name}, which the profile denied to {comm:?} {n} time(s) in enforce mode (a command's attempt is not a need): run the plugin under seccomp.mode audit to learn what it calls"
            ));
        }
    }
    suggest_network(&mut p, &o, &mut denied, &mut notes)?;
    suggest_env(&mut p, &o, others, &mut notes);
    suggest_files(&mut p, &o, &mut notes);
    allow_denied_calls(&mut profile, &denied, &mut notes);
    p.seccomp_mode = SeccompMode::Enforce;
    notes.push("seccomp: mode enforce".into());

    suggest_limits(&mut p, &o, &mut notes);
    p.name = format!("{}-suggested", p.name);
    Ok(Some(Suggested {
        policy: p,
        profile,
        notes,
    }))
}

/// `spec.network` from what the plugin did: inet sockets under `network: none` suggest
/// `allowList` in audit mode (taking `socket` out of `denied`); under `allowList`, the
/// destinations reached become the list.
fn suggest_network(
    p: &mut Policy,
    o: &Observed,
    denied: &mut std::collections::BTreeMap<String, (u64, String)>,
    notes: &mut Vec<String>,
) -> Result<(), SuggestError> {
    if !o.refused_destinations.is_empty() {
        notes.push(format!(
            "network: NOT added, as the egress proxy refused them: {}",
            o.refused_destinations
                .iter()
                .map(|d| format!("{d:?}"))
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    // A learning run (`allowList` with `audit: true`) that reached nothing: no network.
    if p.network == NetworkMode::AllowList && p.egress.audit && o.egress.is_empty() {
        p.network = NetworkMode::None;
        p.egress = egress::AllowList::default();
        notes.push(
            "network: mode none (the plugin made no connection through the audit-mode allow list)"
                .into(),
        );
        return Ok(());
    }
    // Sockets under `network: none`: what the plugin needs is a network mode, not a profile
    // without its socket rules (that would still fail, and would open netlink and the rest).
    if p.network == NetworkMode::None && denied.remove("socket").is_some() {
        p.network = NetworkMode::AllowList;
        p.egress = egress::AllowList {
            audit: true,
            ..Default::default()
        };
        p.egress_max_connections = 100;
        notes.push(
            "network: the plugin opened inet sockets under network: none. Suggested: mode allowList with audit: true, which admits and records every destination. Run the plugin once under this policy and run `policy suggest` again: it turns what the plugin reached into spec.network.allow. Do not deploy a policy with audit: true.".into(),
        );
    }
    if p.network == NetworkMode::AllowList && !o.egress.is_empty() {
        let mut by_target: std::collections::BTreeMap<(String, bool), Vec<u16>> =
            std::collections::BTreeMap::new();
        for ((host, port), internal) in &o.egress {
            by_target
                .entry((host.clone(), *internal))
                .or_default()
                .push(*port);
        }
        let mut rules = Vec::new();
        for ((host, internal), ports) in by_target {
            let bare = host.trim_start_matches('[').trim_end_matches(']');
            let target = match bare.parse::<std::net::IpAddr>() {
                Ok(ip) => egress::Target::Cidr(egress::Cidr::parse(&ip.to_string())?),
                Err(_) => match egress::HostPattern::parse(&host) {
                    Ok(h) => egress::Target::Host(h),
                    Err(_) => {
                        notes.push(format!("network: {host:?} is not a host name; left out"));
                        continue;
                    }
                },
            };
            let is_host = matches!(target, egress::Target::Host(_));
            notes.push(format!(
                "network.allow: {host:?} on {ports:?}{} (the egress proxy let the plugin through to it)",
                if internal && is_host {
                    ", internal: true because it resolved to an internal address"
                } else {
                    ""
                }
            ));
            rules.push(egress::Rule {
                target,
                ports,
                internal: internal && is_host,
            });
        }
        p.egress.rules = rules;
        p.egress.audit = false;
    }
    Ok(())
}

/// `spec.env.pass`: the variables a failing command did not get and named, each to be
/// reviewed; never one another policy of the directory passes (another tenant's secret).
fn suggest_env(p: &mut Policy, o: &Observed, others: &[Policy], notes: &mut Vec<String>) {
    let printed_only = o
        .printed_only
        .iter()
        .filter(|n| !o.withheld.contains_key(*n))
        .map(|n| (n, None));
    let by_argv = o.withheld.iter().map(|(n, app)| (n, Some(app)));
    let mut printed = Vec::new();
    for (name, app) in by_argv.chain(printed_only) {
        if p.passes(name) || !policy::is_env_name(name) {
            continue;
        }
        if let Some(owner) = others.iter().find(|q| q.passes(name)) {
            notes.push(format!(
                "env.pass: NOT adding {name}, which a failed command named: policy {:?} passes it, for its own requests only (another tenant's variable)",
                owner.name
            ));
            continue;
        }
        let Some(app) = app else {
            printed.push(format!("{name:?}"));
            continue;
        };
        notes.push(format!(
            "env.pass: added {name} (withheld from a failed command of app {app:?}; plugin.yaml's command or the base policy names it). REVIEW: it reaches every command of every request under this policy; remove it unless the plugin is configured by it."
        ));
        p.env_pass.push(name.clone());
    }
    if !printed.is_empty() {
        notes.push(format!(
            "env.pass: NOT adding {}, named only by a failed command's own output (a command prints whatever names it likes; neither plugin.yaml's commands nor the base policy name them). Add one by hand, or name it in the base policy (a comment will do) and run suggest again, if the plugin is configured by it.",
            printed.join(", ")
        ));
    }
}

/// `spec.filesystem`: each path Landlock refused, exactly (not a directory above it), in
/// `readWrite` when a write was refused and in `readOnly` otherwise; never one a rule already
/// covers for that access.
fn suggest_files(p: &mut Policy, o: &Observed, notes: &mut Vec<String>) {
    for (path, (write, requests)) in &o.files {
        let path = PathBuf::from(path);
        let covered = |rules: &[PathBuf]| rules.iter().any(|r| path.starts_with(r));
        if covered(&p.read_write) || (!write && covered(&p.read_only)) {
            continue;
        }
        let (rules, field) = if *write {
            (&mut p.read_write, "filesystem.readWrite")
        } else {
            (&mut p.read_only, "filesystem.readOnly")
        };
        notes.push(format!(
            "{field}: added {} (refused to commands in {requests} request(s)). REVIEW: every command of every request may then {} it; list a directory instead only if the plugin needs all of it.",
            path.display(),
            if *write { "write" } else { "read" }
        ));
        rules.push(path);
    }
    if !o.never_files.is_empty() {
        notes.push(format!(
            "filesystem: NOT added, as no policy grants them to a plugin (the server's own directories, every request's tree under the work root, the pod's shared memory, /proc, /sys): {}",
            o.never_files.iter().map(|f| format!("{f:?}")).collect::<Vec<_>>().join(", ")
        ));
    }
    if !o.unnamed_files.is_empty() {
        notes.push(format!(
            "filesystem: NOT added, as a policy names only absolute, normalised paths (the log's record is not the kernel's): {}",
            o.unnamed_files.iter().map(|f| format!("{f:?}")).collect::<Vec<_>>().join(", ")
        ));
    }
    if !o.claimed_files.is_empty() {
        notes.push(format!(
            "filesystem: NOT added, as only a command's own error named them as refused (no kernel record of a refusal; a command writes what it likes): {}. Add one by hand if the plugin needs it.",
            o.claimed_files.iter().map(|f| format!("{f:?}")).collect::<Vec<_>>().join(", ")
        ));
    }
}

/// Out of the seccomp profile: exactly the calls the plugin made that it denied, from rules
/// without argument conditions only. An audit record names the call, not the arguments it was
/// made with nor the rule they matched, so taking a call out of a conditional rule (the
/// socket families, the network modes' inet rules, Fast Open's `sendto`, `clone`'s namespace
/// flags) would widen every other condition that names it: such rules stay, and the notes say
/// so.
fn allow_denied_calls(
    profile: &mut Value,
    denied: &std::collections::BTreeMap<String, (u64, String)>,
    notes: &mut Vec<String>,
) {
    // Call → the reasons of the conditional rules that keep it.
    let mut kept_by: std::collections::BTreeMap<String, Vec<String>> = Default::default();
    if let Some(rules) = profile["rules"].as_array_mut() {
        for r in rules.iter_mut() {
            // The reason of this profile's own rule (a custom profile has its own).
            let reason = r["reason"]
                .as_str()
                .unwrap_or("(no reason given)")
                .to_owned();
            let conditional = r["args"].as_array().is_some_and(|a| !a.is_empty())
                || r.get("onlyWhen")
                    .is_some_and(|w| w.as_str().is_some_and(|w| w.starts_with("network")));
            if conditional {
                let kept: Vec<String> = r["syscalls"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(Value::as_str)
                    .filter(|c| denied.contains_key(*c))
                    .map(str::to_owned)
                    .collect();
                for name in kept {
                    kept_by.entry(name).or_default().push(reason.clone());
                }
                continue;
            }
            if let Some(calls) = r["syscalls"].as_array_mut() {
                calls.retain(|c| {
                    let name = c.as_str().unwrap_or("");
                    match denied.get(name) {
                        Some((n, comm)) => {
                            notes.push(format!(
                                "seccomp: {name} is ALLOWED: {comm:?} called it {n} time(s); the profile denied it because: {reason}"
                            ));
                            false
                        }
                        None => true,
                    }
                });
            }
        }
        rules.retain(|r| r["syscalls"].as_array().is_some_and(|c| !c.is_empty()));
    }
    for (name, reasons) in kept_by {
        let (n, comm) = &denied[&name];
        notes.push(format!(
            "seccomp: NOT allowing {name} in {} rule(s) with argument conditions ({comm:?} called it {n} time(s)): an audit record names the call, not the arguments it was made with, so no such rule is widened from it; narrow one by hand if the plugin needs it. The first: {}",
            reasons.len(),
            reasons[0]
        ));
    }
}

/// Limits: room above what was observed, never below it; and, when a request did not
/// finish, never below the input policy either (its figures stop where it failed: a 135 ms
/// failure once proposed wallSeconds 30 for a 35 s init).
fn suggest_limits(p: &mut Policy, o: &Observed, notes: &mut Vec<String>) {
    let keep = o.unfinished > 0;
    // `want`, or the input's value when it is larger and some request did not finish.
    let mut set = |field: &str, current: &mut u64, want: u64, why: String| {
        if keep && want < *current {
            notes.push(format!(
                "limits.{field}: {current} kept ({why} would lower it, but {} request(s) did not finish, so their figures are short of a finished run's)",
                o.unfinished
            ));
        } else {
            notes.push(format!("limits.{field}: {want} ({why})"));
            *current = want;
        }
    };
    if o.peak_memory > 0 {
        let want = round_up(o.peak_memory.saturating_mul(2), 64 * MI).max(256 * MI);
        set(
            "memoryBytes",
            &mut p.limits.memory_bytes,
            want,
            format!("observed peak {} bytes, x2", o.peak_memory),
        );
        p.limits.data_bytes = p.limits.data_bytes.max(p.limits.memory_bytes);
    }
    if o.duration_ms > 0 {
        let want = (o.duration_ms.saturating_mul(3).div_ceil(1000)).max(30);
        set(
            "wallSeconds",
            &mut p.limits.wall_seconds,
            want,
            format!("slowest request {} ms, x3", o.duration_ms),
        );
    }
    if o.output > 0 {
        let want = round_up(o.output.saturating_mul(4), MI);
        set(
            "outputBytes",
            &mut p.limits.output_bytes,
            want,
            format!("largest stdout/stderr {} bytes, x4", o.output),
        );
    }
    // A process's allocation refused under the per-process heap limit: the request's memory
    // was not the bound, dataBytes was (and the request must hold what one process may).
    if let Some((_, app)) = o.limits_hit.iter().find(|(l, _)| l == "heap") {
        let want = p.limits.data_bytes.saturating_mul(2);
        notes.push(format!(
            "limits.dataBytes: {want} (x2: an allocation of app {app:?} was refused under dataBytes {}, each process's heap limit; raising memoryBytes alone changes nothing)",
            p.limits.data_bytes
        ));
        p.limits.data_bytes = want;
        if p.limits.memory_bytes < want {
            notes.push(format!(
                "limits.memoryBytes: {want} (raised to dataBytes: the request must be able to hold what one of its processes may)"
            ));
            p.limits.memory_bytes = want;
        }
    }
    for (limit, app) in &o.limits_hit {
        notes.push(format!(
            "WARNING: request of app {app:?} ended on the {limit} limit: the values above come from runs that did not finish; {}",
            if limit == "heap" {
                "dataBytes is raised above; run again"
            } else {
                "raise it and run again"
            }
        ));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One audit event line under the default policy, with `extra` fields.
    fn event(extra: &str) -> String {
        format!(
            r#"{{"log":"audit","app":"a","outcome":"error","durationMs":5,"commands":[{{"phase":"generate","argv":["sh","-c","helm template . --set token=$PLAN_TOKEN"],"exitCode":1,"durationMs":1,"stdoutBytes":0,"stderrBytes":0}}]{extra}}}"#
        )
    }

    fn proposal(log: &str, mode: SeccompMode) -> Suggested {
        let mut base = Policy::default_policy().expect("default policy");
        base.seccomp_mode = mode;
        propose(
            log,
            &base,
            policy::DEFAULT_POLICY_YAML,
            policy::seccomp::DEFAULT_SECCOMP_JSON,
            "test",
            &[],
        )
        .expect("propose")
        .expect("a proposal")
    }

    /// The rules of a profile that name `call`, by reason.
    fn rules_naming(profile: &Value, call: &str) -> Vec<String> {
        profile["rules"]
            .as_array()
            .expect("rules")
            .iter()
            .filter(|r| {
                r["syscalls"]
                    .as_array()
                    .is_some_and(|c| c.iter().any(|c| c == call))
            })
            .map(|r| r["reason"].as_str().unwrap_or_default().to_owned())
            .collect()
    }

    /// An audit-mode run whose command resolved a name (glibc's resolver opens a UDP socket)
    /// and sent with MSG_FASTOPEN: the record names `socket` and `sendto`, not the arguments.
    /// Every rule with argument conditions that names them stays (the socket families, the
    /// network modes' inet rules, Fast Open), and the notes say why; an unconditional rule's
    /// call (`unshare`) is still allowed (mutant: the conditional check dropped -> the socket
    /// and Fast Open rules go).
    #[test]
    fn a_call_in_a_rule_with_argument_conditions_is_never_widened() {
        let before: Value =
            serde_json::from_str(policy::seccomp::DEFAULT_SECCOMP_JSON).expect("profile");
        let (sockets, sends) = (
            rules_naming(&before, "socket").len(),
            rules_naming(&before, "sendto").len(),
        );
        assert!(sockets >= 7 && sends >= 1, "fixture: {sockets} {sends}");
        let log = event(
            r#","seccompAudit":[{"syscall":"socket","action":"audited","count":1,"comm":"getent"},{"syscall":"sendto","action":"audited","count":1,"comm":"py"},{"syscall":"unshare","action":"audited","count":1,"comm":"unshare"}]"#,
        );
        // Under network: none the sockets suggest a learning run of the allow list; under
        // an allow list they are a call of the profile's conditional rules.
        let none = proposal(&log, SeccompMode::Audit);
        let mut allow_list = Policy::default_policy().expect("default policy");
        allow_list.seccomp_mode = SeccompMode::Audit;
        allow_list.network = NetworkMode::AllowList;
        let allow_list = propose(
            &log,
            &allow_list,
            policy::DEFAULT_POLICY_YAML,
            policy::seccomp::DEFAULT_SECCOMP_JSON,
            "test",
            &[],
        )
        .expect("propose")
        .expect("a proposal");
        for s in [&none, &allow_list] {
            assert_eq!(
                rules_naming(&s.profile, "socket").len(),
                sockets,
                "{:#}",
                s.profile
            );
            assert_eq!(rules_naming(&s.profile, "sendto").len(), sends);
            assert!(rules_naming(&s.profile, "unshare").is_empty());
            assert!(
                s.notes
                    .iter()
                    .any(|n| n.starts_with("seccomp: unshare is ALLOWED")),
                "{:?}",
                s.notes
            );
        }
        let not_allowing = |s: &Suggested, call: &str| {
            s.notes.iter().any(|n| {
                n.starts_with(&format!("seccomp: NOT allowing {call} in "))
                    && n.contains("argument conditions")
            })
        };
        assert!(not_allowing(&none, "sendto"), "{:?}", none.notes);
        assert!(
            not_allowing(&allow_list, "sendto"),
            "{:?}",
            allow_list.notes
        );
        assert!(
            not_allowing(&allow_list, "socket"),
            "{:?}",
            allow_list.notes
        );
    }

    /// Landlock's records of a hostile request: the work root (every request's tree), another
    /// request's tree, /dev/shm, the server's plugin.yaml and socket directory, /proc. None is
    /// proposed, the notes list them; an ordinary path of the same event is (mutant:
    /// `never_granted` always false -> the work root in readWrite).
    #[test]
    fn the_servers_paths_and_every_requests_tree_are_never_proposed() {
        let denials: Vec<String> = [
            ("fs.make_reg", "/tmp/_cmp_server"),
            ("fs.read_dir", "/tmp/_cmp_server/spare-7/repo"),
            ("fs.write_file", "/dev/shm/x"),
            ("fs.read_file", "/home/argocd/cmp-server/config/plugin.yaml"),
            ("fs.make_sock", "/home/argocd/cmp-server/plugins/x.sock"),
            ("fs.read_file", "/proc/1/environ"),
            ("fs.read_file", "/srv/charts/../../etc/shadow"),
            ("fs.read_file", "/srv/charts/index.yaml"),
        ]
        .iter()
        .map(|(b, o)| {
            format!(r#"{{"blockers":"{b}","object":"{o}","allowedBy":"spec.filesystem"}}"#)
        })
        .collect();
        let log = event(&format!(r#","landlockDenials":[{}]"#, denials.join(",")));
        let s = proposal(&log, SeccompMode::Enforce);
        let base = Policy::default_policy().expect("default policy");
        let granted: Vec<String> = s
            .policy
            .read_only
            .iter()
            .chain(&s.policy.read_write)
            .filter(|p| !base.read_only.contains(p) && !base.read_write.contains(p))
            .map(|p| p.display().to_string())
            .collect();
        assert_eq!(granted, ["/srv/charts/index.yaml"]);
        for never in ["_cmp_server", "/dev/shm", "cmp-server", "/proc", "shadow"] {
            assert!(
                !granted.iter().any(|g| g.contains(never)),
                "{never}: {granted:?}"
            );
        }
        let note = s
            .notes
            .iter()
            .find(|n| n.starts_with("filesystem: NOT added, as no policy grants them"))
            .expect("the note");
        assert!(
            note.contains("/tmp/_cmp_server") && note.contains("/proc/1/environ"),
            "{note}"
        );
    }

    /// A record naming a path no policy can (`//`, found by the suggest_log fuzz target) is
    /// listed for the reviewer, never proposed: the proposal still validates (mutant: the check
    /// removed -> "/op//secret" in readOnly, which the policy refuses).
    #[test]
    fn a_path_no_policy_can_name_is_never_proposed() {
        let log = event(
            r#","landlockDenials":[{"blockers":"fs.read_file","object":"/op//secret","allowedBy":"spec.filesystem.readOnly"},{"blockers":"fs.read_file","object":"/srv/charts/index.yaml","allowedBy":"spec.filesystem.readOnly"}]"#,
        );
        let s = proposal(&log, SeccompMode::Enforce);
        assert!(
            !s.policy
                .read_only
                .iter()
                .any(|p| p.display().to_string().contains("//")),
            "{:?}",
            s.policy.read_only
        );
        assert!(
            s.policy
                .read_only
                .contains(&PathBuf::from("/srv/charts/index.yaml"))
        );
        assert!(
            s.notes
                .iter()
                .any(|n| n.contains("absolute, normalised") && n.contains("/op//secret")),
            "{:?}",
            s.notes
        );
    }

    /// A withheld variable the operator's plugin.yaml names is proposed; one only the failed
    /// command's own words name is not (it is listed), nor one no one named (mutant: the old
    /// rule, named in the error -> AWS_SECRET_ACCESS_KEY proposed).
    #[test]
    fn env_pass_comes_from_plugin_yaml_never_from_what_a_command_printed() {
        let log = event(
            r#","error":"`sh -c ...` failed exit status 1: missing AWS_SECRET_ACCESS_KEY (server variables not passed to commands: AWS_SECRET_ACCESS_KEY; spec.env.pass allows them)","withheldEnv":["AWS_SECRET_ACCESS_KEY","PLAN_TOKEN","SIDECAR_DB_PASSWORD"]"#,
        );
        let s = proposal(&log, SeccompMode::Enforce);
        assert!(
            s.policy.env_pass.contains(&"PLAN_TOKEN".to_owned()),
            "{:?}",
            s.notes
        );
        for never in ["AWS_SECRET_ACCESS_KEY", "SIDECAR_DB_PASSWORD"] {
            assert!(!s.policy.env_pass.contains(&never.to_owned()), "{never}");
        }
        assert!(
            s.notes
                .iter()
                .any(|n| n
                    .starts_with("env.pass: NOT adding \"AWS_SECRET_ACCESS_KEY\", named only by")),
            "{:?}",
            s.notes
        );
    }

    /// A line marked as an audit event that is no event of this schema is not read, and the
    /// notes say so (mutant: the count dropped -> no note; a damaged event read as a request
    /// -> 2 requests).
    #[test]
    fn an_unreadable_event_is_not_read_and_the_notes_say_so() {
        let base = Policy::default_policy().expect("default policy");
        let log = [
            r#"{"log":"audit","app":"a","outcome":"ok","durationMs":5}"#,
            r#"{"log":"audit","app":"b","outcome":"error","durationMs":"a while"}"#,
            r#"{"level":"info","msg":"not an event"}"#,
        ]
        .join("\n");
        let s = propose(&log, &base, "", "{}", "test", &[])
            .expect("propose")
            .expect("a proposal");
        assert!(s.notes[0].contains("from 1 request(s)"), "{:?}", s.notes);
        assert!(
            s.notes.iter().any(|n| n.starts_with(
                "1 line(s) marked as audit events were not read: no cmp-warden.audit/v1 event"
            )),
            "{:?}",
            s.notes
        );
    }
}
