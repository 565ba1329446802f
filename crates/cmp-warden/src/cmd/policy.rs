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
        /// The policy the runs used: a file, or the policy directory `serve` ran with (its
        /// default is the base; the variables its other policies pass are never proposed for
        /// another) [default: the embedded default].
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
            for s in set.skipped() {
                eprintln!("skipped: {s} (policies are *.yaml or *.yml files)");
            }
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
                if set.policies().len() > 1 {
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
    /// Server variables withheld from a command that failed and that it named (its argv, or
    /// its error before the server's own note): name → the app whose request named it. The
    /// full withheld list of an event is not evidence: every failure carries it.
    withheld: std::collections::BTreeMap<String, String>,
    /// Paths Landlock refused, from the kernel's own records: whether a write was refused,
    /// and in how many requests.
    files: std::collections::BTreeMap<String, (bool, u64)>,
    /// Paths only a failed command's error named as refused (no kernel record): never
    /// proposed, a command's output being its own to write; listed for the reviewer.
    claimed_files: std::collections::BTreeSet<String>,
    /// Destinations the egress proxy refused: never proposed; listed for the reviewer.
    refused_destinations: std::collections::BTreeSet<String>,
}

/// Where the server's own note on withheld variables starts in an error (what precedes it is
/// the command's words).
const WITHHELD_NOTE: &str = " (server variables not passed to commands:";

/// Whether `text` names `var` as a word of its own (not inside a longer name).
fn names_var(text: &str, var: &str) -> bool {
    let word = |c: char| c.is_ascii_alphanumeric() || c == '_';
    text.match_indices(var).any(|(i, _)| {
        !text[..i].chars().next_back().is_some_and(word)
            && !text[i + var.len()..].chars().next().is_some_and(word)
    })
}

fn observe(text: &str) -> Observed {
    let mut o = Observed::default();
    for line in text.lines() {
        let Ok(e) = serde_json::from_str::<Value>(line) else {
            continue;
        };
        if e["log"] != "audit" {
            continue;
        }
        // A withheld variable counts only where the failed command named it: in its argv
        // (plugin.yaml's), or in its own words before the server's note.
        let error = e["error"].as_str().unwrap_or_default();
        let own_words = error.split(WITHHELD_NOTE).next().unwrap_or_default();
        let argv: Vec<&str> = e["commands"]
            .as_array()
            .into_iter()
            .flatten()
            .flat_map(|c| c["argv"].as_array().into_iter().flatten())
            .filter_map(Value::as_str)
            .collect();
        for n in e["withheldEnv"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
        {
            if names_var(own_words, n) || argv.iter().any(|a| names_var(a, n)) {
                o.withheld
                    .entry(n.to_owned())
                    .or_insert_with(|| e["app"].as_str().unwrap_or_default().to_owned());
            }
        }
        for c in e["egress"].as_array().into_iter().flatten() {
            // Only what the proxy let through (allowed, or admitted in audit mode): a
            // destination it refused is not something the plugin reached.
            if !matches!(c["decision"].as_str(), Some("allowed" | "audited")) {
                if let Some(d) = c["destination"].as_str().filter(|d| !d.is_empty()) {
                    o.refused_destinations.insert(d.to_owned());
                }
                continue;
            }
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
            // The kernel's records name the access (`fs.read_file`); a path taken from the
            // command's own error does not.
            if !blockers.starts_with("fs.") {
                o.claimed_files.insert(path.to_owned());
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
            // What audit mode let through is what the plugin did; what enforce mode denied is
            // what a command tried, which may be an attack: never a grant.
            let calls = if d["action"] == "audited" {
                &mut o.denied
            } else {
                &mut o.enforced
            };
            let ent = calls
                .entry(name)
                .or_insert((0, d["comm"].as_str().unwrap_or("").to_owned()));
            ent.0 += d["count"].as_u64().unwrap_or(1);
        }
        o.peak_memory = o
            .peak_memory
            .max(e["peakMemoryBytes"].as_u64().unwrap_or(0));
        o.duration_ms = o.duration_ms.max(e["durationMs"].as_u64().unwrap_or(0));
        if e["outcome"] != "ok" {
            o.unfinished += 1;
        }
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

/// The base of a proposal: the policy the runs used, its text (whose comments the proposal
/// keeps), whether its profile is a file, and the set it came from (for the variables the
/// other policies pass).
struct Base {
    policy: Policy,
    input: String,
    profile: String,
    set: Option<policy::PolicySet>,
}

impl Base {
    fn load(path: Option<&Path>) -> anyhow::Result<Base> {
        let (policy, input, from_file, set) = match path {
            None => (
                Policy::default_policy()?,
                policy::DEFAULT_POLICY_YAML.to_owned(),
                false,
                None,
            ),
            Some(dir) if dir.is_dir() => {
                let set = policy::PolicySet::load(dir)?;
                let source = set.source(0).context("the policy directory's default")?;
                let input =
                    std::fs::read_to_string(source).with_context(|| format!("reading {source}"))?;
                (set.default_policy().clone(), input, true, Some(set))
            }
            Some(f) => (Policy::load(f)?, std::fs::read_to_string(f)?, true, None),
        };
        let profile = profile_text(&policy, from_file)?;
        Ok(Base {
            policy,
            input,
            profile,
            set,
        })
    }

    /// The policies of the set that do not run `project`'s requests: their variables are
    /// another tenant's, never proposed for these.
    fn others(&self, project: Option<&str>) -> Vec<Policy> {
        let Some(set) = &self.set else {
            return Vec::new();
        };
        let id = policy::Identity {
            project: project.map(str::to_owned),
            ..Default::default()
        };
        let mine = set.select(&id);
        set.policies()
            .iter()
            .enumerate()
            .filter(|(i, _)| *i != mine)
            .map(|(_, p)| p.clone())
            .collect()
    }
}

/// `policy suggest`: one proposal from every audit event; or, when the events come from
/// several Argo CD projects (their `project`), a policy directory for `serve --policy DIR` with
/// one selected policy per project, each from that project's events alone, and the default
/// from the requests without a project (the input policy unchanged when there are none).
/// Everything is written to a staging directory beside `out` and validated there first:
/// nothing reaches `out` unless the whole result passes `policy check`.
fn suggest(audit_log: &Path, base: Option<&Path>, out: &Path) -> anyhow::Result<()> {
    let text = std::fs::read_to_string(audit_log)
        .with_context(|| format!("reading {}", audit_log.display()))?;
    let base = Base::load(base)?;
    let from = audit_log.display().to_string();
    let projects = projects_in(&text);
    let staging = Staging::new(out)?;
    let mut written = Vec::new();
    let mut notes = Vec::new();
    if projects.len() < 2 {
        let s = propose(
            &text,
            &base.policy,
            &base.profile,
            &from,
            &base.others(None),
        )?;
        let Some(s) = s else {
            anyhow::bail!(
                "{from} holds no audit events (lines with \"log\":\"audit\"): run serve or render with --audit-log under an audit-mode policy first"
            );
        };
        written.push(s.write(&staging.dir, "policy.yaml", "profile.json", &base.input)?);
        let check =
            Policy::load(&written[0].0).context("the suggested policy does not validate")?;
        if let Some(e) = seccomp_error(&check) {
            anyhow::bail!("the suggested policy's seccomp profile does not compile: {e}");
        }
        notes = s.notes;
    } else {
        // Several projects: the default first, from the requests without one.
        let without: String = text
            .lines()
            .filter(|l| event_project(l).is_none())
            .map(|l| format!("{l}\n"))
            .collect();
        let mut default = match propose(
            &without,
            &base.policy,
            &base.profile,
            &from,
            &base.others(None),
        )? {
            Some(s) => s,
            None => unlearnt_default(&base, &from)?,
        };
        default.policy.name = base.policy.name.clone();
        written.push(default.write(&staging.dir, "default.yaml", "default.json", &base.input)?);
        for project in &projects {
            let mine: String = text
                .lines()
                .filter(|l| event_project(l).as_deref() == Some(project.as_str()))
                .map(|l| format!("{l}\n"))
                .collect();
            let others = base.others(Some(project));
            let Some(mut s) = propose(&mine, &base.policy, &base.profile, &from, &others)? else {
                continue;
            };
            // Named apart from the default (Argo CD's own project is called `default`).
            s.policy.name = format!("project-{project}");
            s.policy.select = Some(policy::Select {
                projects: vec![policy::Pattern::Exact(project.clone())],
                ..Default::default()
            });
            s.notes.insert(
                1,
                format!(
                    "Selected by project {project} (spec.select): only that project's requests in {from} shaped it; the node-wide fields are the default policy's."
                ),
            );
            let file = format!("project-{project}");
            written.push(s.write(
                &staging.dir,
                &format!("{file}.yaml"),
                &format!("{file}.json"),
                &base.input,
            )?);
        }
        // What we wrote must pass `policy check DIR`.
        let set = policy::PolicySet::load(&staging.dir)
            .context("the suggested policies do not validate")?;
        for p in set.policies() {
            if let Some(e) = seccomp_error(p) {
                anyhow::bail!(
                    "policy {:?}: its seccomp profile does not compile: {e}",
                    p.name
                );
            }
        }
        notes.push(format!(
            "requests of {} projects ({}): one policy each, selected by spec.select.projects; serve them with --policy {}",
            projects.len(),
            projects.iter().cloned().collect::<Vec<_>>().join(", "),
            out.display()
        ));
    }
    let published = staging.publish(&written)?;
    for n in &notes {
        eprintln!("{}", policy::emit::comment_text(n));
    }
    for (pol, prof) in published {
        eprintln!("wrote {} and {}", pol.display(), prof.display());
    }
    Ok(())
}

/// The default of a policy directory when every request named a project: the input without
/// what only a learning run may have (an audit-mode allow list, seccomp in audit mode).
fn unlearnt_default(base: &Base, from: &str) -> anyhow::Result<Suggested> {
    let mut p = base.policy.clone();
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
        profile: serde_json::from_str(&base.profile)?,
        notes,
    })
}

/// A directory beside `out` the proposal is written to and validated in; only then are its
/// files moved into `out`. Removed when dropped.
struct Staging {
    dir: PathBuf,
    out: PathBuf,
}

impl Staging {
    fn new(out: &Path) -> anyhow::Result<Staging> {
        let name = out
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| "suggested".into());
        let parent = out
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .unwrap_or(Path::new("."));
        std::fs::create_dir_all(parent)
            .with_context(|| format!("creating {}", parent.display()))?;
        let dir = parent.join(format!(".{name}.suggest-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        Ok(Staging {
            dir,
            out: out.to_owned(),
        })
    }

    /// Move the validated files into `out` (renames on one filesystem); their new paths.
    fn publish(&self, files: &[(PathBuf, PathBuf)]) -> anyhow::Result<Vec<(PathBuf, PathBuf)>> {
        std::fs::create_dir_all(self.out.join("seccomp"))
            .with_context(|| format!("creating {}", self.out.display()))?;
        let moved = |p: &Path| -> anyhow::Result<PathBuf> {
            let rel = p.strip_prefix(&self.dir).context("a staged file")?;
            let to = self.out.join(rel);
            std::fs::rename(p, &to).with_context(|| format!("writing {}", to.display()))?;
            Ok(to)
        };
        files
            .iter()
            .map(|(pol, prof)| Ok((moved(pol)?, moved(prof)?)))
            .collect()
    }
}

impl Drop for Staging {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The Argo CD projects the audit events in `text` name (only names a `spec.select` pattern
/// can hold).
fn projects_in(text: &str) -> std::collections::BTreeSet<String> {
    text.lines().filter_map(event_project).collect()
}

/// The project of an audit event line (`None` for other lines and events without one).
fn event_project(line: &str) -> Option<String> {
    let e: Value = serde_json::from_str(line).ok()?;
    if e["log"] != "audit" {
        return None;
    }
    let p = e["project"].as_str()?;
    policy::Pattern::try_from(p.to_owned())
        .ok()
        .filter(|p| matches!(p, policy::Pattern::Exact(_)))
        .map(|_| p.to_owned())
}

/// A proposal: the policy, its seccomp profile, and why each change was made.
struct Suggested {
    policy: Policy,
    profile: Value,
    notes: Vec<String>,
}

impl Suggested {
    /// Write `out/<file>` and `out/seccomp/<profile>`; returns both paths.
    fn write(
        &self,
        out: &Path,
        file: &str,
        profile: &str,
        input: &str,
    ) -> anyhow::Result<(PathBuf, PathBuf)> {
        std::fs::create_dir_all(out.join("seccomp"))?;
        let prof_path = out.join("seccomp").join(profile);
        std::fs::write(
            &prof_path,
            serde_json::to_string_pretty(&self.profile)? + "\n",
        )?;
        // The reviewer's own comments stay on the fields they explain.
        let yaml = policy::emit::keep_comments(
            input,
            &policy::emit::to_yaml(&self.policy, &format!("seccomp/{profile}"), &self.notes),
        );
        let pol_path = out.join(file);
        std::fs::write(&pol_path, &yaml)?;
        Ok((pol_path, prof_path))
    }
}

/// The proposal the audit events in `text` make of `base` (`None`: no audit event).
fn propose(
    text: &str,
    base: &Policy,
    base_profile: &str,
    from: &str,
    others: &[Policy],
) -> anyhow::Result<Option<Suggested>> {
    let mut p = base.clone();
    let o = observe(text);
    if o.requests == 0 {
        return Ok(None);
    }
    let mut notes = vec![format!(
        "Suggested by `cmp-warden policy suggest` from {} request(s) in {from}, based on policy {:?}.",
        o.requests, p.name
    )];
    notes.push("Review every line below before deploying; each change says why.".into());

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
) -> anyhow::Result<()> {
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
    for (name, app) in &o.withheld {
        if p.passes(name) || !policy::is_env_name(name) {
            continue;
        }
        if let Some(owner) = others.iter().find(|q| q.passes(name)) {
            notes.push(format!(
                "env.pass: NOT adding {name}, which a failed command of app {app:?} named: policy {:?} passes it, for its own requests only (another tenant's variable)",
                owner.name
            ));
            continue;
        }
        notes.push(format!(
            "env.pass: added {name} (withheld from a failed command of app {app:?}, which named it). REVIEW: it reaches every command of every request under this policy; remove it unless the plugin is configured by it."
        ));
        p.env_pass.push(name.clone());
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
    if !o.claimed_files.is_empty() {
        notes.push(format!(
            "filesystem: NOT added, as only a command's own error named them as refused (no kernel record of a refusal; a command writes what it likes): {}. Add one by hand if the plugin needs it.",
            o.claimed_files.iter().map(|f| format!("{f:?}")).collect::<Vec<_>>().join(", ")
        ));
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

/// Why `p`'s seccomp profile does not compile here (as `serve` would compile it).
fn seccomp_error(p: &Policy) -> Option<jail::supervisor::SeccompError> {
    jail::Plan::new(p, &jail::supervisor::Overrides::default(), Vec::new())
        .seccomp_error()
        .cloned()
}
