//! `cmp-warden policy check [FILE]`: validate a sandbox policy and print the effective policy.
//! `cmp-warden policy suggest`: turn the audit events of an audit-mode run into a candidate
//! enforce-mode policy (and seccomp profile), with every change explained.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context;
use clap::Subcommand;
use policy::{NetworkMode, Policy, SeccompMode};
use serde_json::Value;

/// Policy subcommands.
#[derive(Debug, Subcommand)]
pub enum PolicyCmd {
    /// Validate FILE (or the embedded default) and print the effective policy as JSON; for a
    /// policy directory, every policy (the default first, each with the `select` it is for) as
    /// a JSON array, and which policy selects what on stderr.
    Check {
        /// Policy file or directory [default: the embedded policies/default.yaml].
        file: Option<PathBuf>,
    },
    /// From the audit events of runs under an audit-mode policy (serve or render with
    /// --audit-log), write a candidate enforce-mode policy and seccomp profile to --out.
    Suggest {
        /// Audit log (JSON lines; other log lines are skipped).
        #[arg(long)]
        audit_log: PathBuf,
        /// The policy the runs used [default: the embedded default].
        #[arg(long)]
        policy: Option<PathBuf>,
        /// Output directory (policy.yaml and seccomp/profile.json).
        #[arg(long)]
        out: PathBuf,
    },
}

/// Exit 0 and the effective policy on stdout, or 1 and the reason on stderr.
pub fn run(cmd: PolicyCmd) -> ExitCode {
    let file = match cmd {
        PolicyCmd::Check { file } => file,
        PolicyCmd::Suggest {
            audit_log,
            policy,
            out,
        } => {
            return match suggest(&audit_log, policy.as_deref(), &out) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("error: {e:#}");
                    ExitCode::from(1)
                }
            };
        }
    };
    let parsed = match &file {
        None => Policy::default_policy().map(policy::PolicySet::single),
        Some(f) => policy::PolicySet::load(f),
    };
    match parsed {
        Ok(set) => {
            let several = file.as_deref().is_some_and(Path::is_dir);
            for p in set.policies() {
                // The profile must also compile for this architecture, as `serve` will do it.
                if let Some(e) = seccomp_error(p) {
                    let which = if several {
                        format!(" {:?}", p.name)
                    } else {
                        String::new()
                    };
                    eprintln!("invalid: policy{which}: spec.seccomp.profile: {e}");
                    return ExitCode::from(1);
                }
                for w in p.warnings() {
                    eprintln!("warning: policy: {w}");
                }
                if p.select
                    .as_ref()
                    .is_some_and(policy::Select::without_project)
                {
                    eprintln!(
                        "warning: policy {:?}: spec.select names no project: an application's author chooses its name and destination namespace, so another project's application can match it (add spec.select.projects)",
                        p.name
                    );
                }
                if several {
                    match &p.select {
                        Some(s) => eprintln!("policy {:?} runs requests of {s}", p.name),
                        None => eprintln!(
                            "policy {:?} (the default) runs every request no other policy selects",
                            p.name
                        ),
                    }
                }
            }
            let json = if several {
                serde_json::to_string_pretty(set.policies())
            } else {
                serde_json::to_string_pretty(set.default_policy())
            };
            match json {
                Ok(s) => super::print_out(&format!("{s}\n")),
                Err(e) => {
                    eprintln!("error: {e}");
                    return ExitCode::from(1);
                }
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("invalid: {e}");
            ExitCode::from(1)
        }
    }
}

const MI: u64 = 1 << 20;

fn round_up(v: u64, unit: u64) -> u64 {
    v.div_ceil(unit).max(1) * unit
}

/// What the audit events show, across all requests.
#[derive(Debug, Default)]
struct Observed {
    requests: usize,
    denied: std::collections::BTreeMap<String, (u64, String)>,
    peak_memory: u64,
    duration_ms: u64,
    output: u64,
    limits_hit: Vec<(String, String)>,
    /// Destinations commands asked the egress proxy for: (host, port) → needed `internal`.
    egress: std::collections::BTreeMap<(String, u16), bool>,
    /// Server variables withheld from commands that failed (from the audit events'
    /// `withheldEnv`, or the server's start-up log line when the whole log is given).
    withheld: std::collections::BTreeSet<String>,
    /// Paths Landlock refused (the kernel's records, or the paths a failed command's error
    /// named outside every `spec.filesystem` rule): whether a write was refused, and in how
    /// many requests.
    files: std::collections::BTreeMap<String, (bool, u64)>,
}

fn observe(text: &str) -> Observed {
    let mut o = Observed::default();
    for line in text.lines() {
        let Ok(e) = serde_json::from_str::<Value>(line) else {
            continue;
        };
        if let Some(w) = e["withheld"].as_str()
            // logrus' key (`msg`); `message` in logs of earlier versions.
            && e["msg"]
                .as_str()
                .or(e["message"].as_str())
                .is_some_and(|m| m.starts_with("server environment variables withheld"))
        {
            o.withheld.extend(w.split(", ").map(str::to_owned));
        }
        if e["log"] != "audit" {
            continue;
        }
        o.withheld.extend(
            e["withheldEnv"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|n| n.as_str().map(str::to_owned)),
        );
        for c in e["egress"].as_array().into_iter().flatten() {
            let Some((host, port)) = c["destination"]
                .as_str()
                .and_then(|d| d.rsplit_once(':'))
                .and_then(|(h, p)| Some((h.to_owned(), p.parse::<u16>().ok()?)))
            else {
                continue;
            };
            let internal = c["reason"]
                .as_str()
                .is_some_and(|r| r.contains("resolves only to internal addresses"))
                || c["address"]
                    .as_str()
                    .and_then(|a| a.parse::<std::net::SocketAddr>().ok())
                    .is_some_and(|a| egress::is_internal(a.ip()));
            *o.egress.entry((host, port)).or_default() |= internal;
        }
        o.requests += 1;
        for d in e["landlockDenials"].as_array().into_iter().flatten() {
            let (Some(blockers), Some(path)) = (d["blockers"].as_str(), d["object"].as_str())
            else {
                continue;
            };
            // File accesses a policy field allows (not signals, sockets or ports).
            if !blockers.starts_with("fs") || d["allowedBy"].is_null() || !path.starts_with('/') {
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
        for d in e["seccompAudit"].as_array().into_iter().flatten() {
            let name = d["syscall"].as_str().unwrap_or("?").to_owned();
            let ent = o
                .denied
                .entry(name)
                .or_insert((0, d["comm"].as_str().unwrap_or("").to_owned()));
            ent.0 += d["count"].as_u64().unwrap_or(1);
        }
        o.peak_memory = o
            .peak_memory
            .max(e["peakMemoryBytes"].as_u64().unwrap_or(0));
        o.duration_ms = o.duration_ms.max(e["durationMs"].as_u64().unwrap_or(0));
        for c in e["commands"].as_array().into_iter().flatten() {
            o.peak_memory = o.peak_memory.max(c["peakRssBytes"].as_u64().unwrap_or(0));
            o.output = o
                .output
                .max(c["stdoutBytes"].as_u64().unwrap_or(0))
                .max(c["stderrBytes"].as_u64().unwrap_or(0));
        }
        if let Some(l) = e["limit"].as_str() {
            o.limits_hit
                .push((l.to_owned(), e["app"].as_str().unwrap_or("").to_owned()));
        }
    }
    o
}

/// The profile text the policy points at (the embedded one for the embedded default).
fn profile_text(p: &Policy, from_file: bool) -> anyhow::Result<String> {
    if from_file {
        std::fs::read_to_string(&p.seccomp_profile)
            .with_context(|| format!("reading {}", p.seccomp_profile.display()))
    } else {
        Ok(policy::seccomp::DEFAULT_SECCOMP_JSON.to_owned())
    }
}

fn suggest(audit_log: &Path, base: Option<&Path>, out: &Path) -> anyhow::Result<()> {
    let mut p = match base {
        Some(f) => Policy::load(f)?,
        None => Policy::default_policy()?,
    };
    let text = std::fs::read_to_string(audit_log)
        .with_context(|| format!("reading {}", audit_log.display()))?;
    let o = observe(&text);
    if o.requests == 0 {
        anyhow::bail!(
            "{} holds no audit events (lines with \"log\":\"audit\"): run serve or render with --audit-log under an audit-mode policy first",
            audit_log.display()
        );
    }
    let mut notes = vec![format!(
        "Suggested by `cmp-warden policy suggest` from {} request(s) in {}, based on policy {:?}.",
        o.requests,
        audit_log.display(),
        p.name
    )];
    notes.push("Review every line below before deploying; each change says why.".into());

    // Seccomp: take out of the profile exactly the calls the plugin made.
    let mut profile: Value = serde_json::from_str(&profile_text(&p, base.is_some())?)?;
    if p.seccomp_mode == SeccompMode::Audit && o.denied.is_empty() {
        notes.push(
            "seccomp: no would-be denial was recorded; enforce mode keeps the profile unchanged"
                .into(),
        );
    }
    let mut denied = o.denied.clone();
    suggest_network(&mut p, &o, &mut denied, &mut notes)?;
    suggest_env(&mut p, &o, &mut notes);
    suggest_files(&mut p, &o, &mut notes);
    allow_denied_calls(&mut profile, &denied, &mut notes);
    p.seccomp_mode = SeccompMode::Enforce;
    notes.push("seccomp: mode enforce".into());

    suggest_limits(&mut p, &o, &mut notes);
    p.name = format!("{}-suggested", p.name);

    std::fs::create_dir_all(out.join("seccomp"))?;
    let prof_path = out.join("seccomp/profile.json");
    std::fs::write(&prof_path, serde_json::to_string_pretty(&profile)? + "\n")?;
    // The reviewer's own comments stay on the fields they explain.
    let input = match base {
        Some(f) => std::fs::read_to_string(f)?,
        None => policy::DEFAULT_POLICY_YAML.to_owned(),
    };
    let yaml = policy::emit::keep_comments(
        &input,
        &policy::emit::to_yaml(&p, "seccomp/profile.json", &notes),
    );
    let pol_path = out.join("policy.yaml");
    std::fs::write(&pol_path, &yaml)?;
    // What we wrote must pass `policy check`.
    let check = Policy::load(&pol_path).context("the suggested policy does not validate")?;
    if let Some(e) = seccomp_error(&check) {
        anyhow::bail!("the suggested policy's seccomp profile does not compile: {e}");
    }
    for n in &notes {
        eprintln!("{n}");
    }
    eprintln!("wrote {} and {}", pol_path.display(), prof_path.display());
    Ok(())
}

/// `spec.network` from what the plugin did: inet sockets under `network: none` suggest
/// `allowList` in audit mode (taking `socket` out of `denied`); under `allowList`, the
/// destinations reached become the list.
fn suggest_network(
    p: &mut Policy,
    o: &Observed,
    denied: &mut std::collections::BTreeMap<String, (u64, String)>,
    notes: &mut Vec<String>,
) -> anyhow::Result<()> {
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
                "network.allow: {host} on {ports:?}{} (the plugin connected to it)",
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

/// `spec.env.pass`: the variables a failing command did not get, each to be reviewed.
fn suggest_env(p: &mut Policy, o: &Observed, notes: &mut Vec<String>) {
    // Variables a failing command did not get: proposed as entries, each to be reviewed (every
    // entry reaches every command of every request, so a secret the plugin does not read
    // should be taken out again).
    let new_names: Vec<String> = o
        .withheld
        .iter()
        .filter(|n| !p.env_pass.contains(n) && policy::is_env_name(n))
        .cloned()
        .collect();
    if !new_names.is_empty() {
        notes.push(format!(
            "env.pass: added {} (the server withheld them from commands that failed). REVIEW: each reaches every command; remove those the plugin is not configured by, or use a NAME_* pattern.",
            new_names.join(", ")
        ));
        p.env_pass.extend(new_names);
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
}

/// Out of the seccomp profile: exactly the calls the plugin made that it denied.
fn allow_denied_calls(
    profile: &mut Value,
    denied: &std::collections::BTreeMap<String, (u64, String)>,
    notes: &mut Vec<String>,
) {
    if let Some(rules) = profile["rules"].as_array_mut() {
        for r in rules.iter_mut() {
            // The reason of this profile's own rule (a custom profile has its own).
            let reason = r["reason"]
                .as_str()
                .unwrap_or("(no reason given)")
                .to_owned();
            if let Some(calls) = r["syscalls"].as_array_mut() {
                calls.retain(|c| {
                    let name = c.as_str().unwrap_or("");
                    match denied.get(name) {
                        Some((n, comm)) => {
                            notes.push(format!(
                                "seccomp: {name} is ALLOWED: {comm} called it {n} time(s); the profile denied it because: {reason}"
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
}

/// Limits: room above what was observed, never below it.
fn suggest_limits(p: &mut Policy, o: &Observed, notes: &mut Vec<String>) {
    if o.peak_memory > 0 {
        let want = round_up(o.peak_memory.saturating_mul(2), 64 * MI).max(256 * MI);
        notes.push(format!(
            "limits.memoryBytes: {want} (observed peak {} bytes, x2)",
            o.peak_memory
        ));
        p.limits.memory_bytes = want;
        p.limits.data_bytes = p.limits.data_bytes.max(want);
    }
    if o.duration_ms > 0 {
        let want = (o.duration_ms.saturating_mul(3).div_ceil(1000)).max(30);
        notes.push(format!(
            "limits.wallSeconds: {want} (slowest request {} ms, x3)",
            o.duration_ms
        ));
        p.limits.wall_seconds = want;
    }
    if o.output > 0 {
        let want = round_up(o.output.saturating_mul(4), MI);
        notes.push(format!(
            "limits.outputBytes: {want} (largest stdout/stderr {} bytes, x4)",
            o.output
        ));
        p.limits.output_bytes = want;
    }
    for (limit, app) in &o.limits_hit {
        notes.push(format!(
            "WARNING: request of app {app:?} ended on the {limit} limit: the values above come from runs that did not finish; raise it and run again"
        ));
    }
}

/// Why `p`'s seccomp profile does not compile here (as `serve` would compile it).
fn seccomp_error(p: &Policy) -> Option<jail::supervisor::SeccompError> {
    jail::Plan::new(p, &jail::supervisor::Overrides::default(), Vec::new())
        .seccomp_error()
        .cloned()
}
