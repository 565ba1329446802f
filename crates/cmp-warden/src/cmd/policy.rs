//! `cmp-warden policy check [FILE]`: validate a sandbox policy and print the effective policy.
//! `cmp-warden policy suggest`: turn the audit events of an audit-mode run into a candidate
//! enforce-mode policy (and seccomp profile), with every change explained.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context;
use clap::Subcommand;
use policy::Policy;
use suggest::{Suggested, event_project, projects_in, propose, unlearnt_default};

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
            &base.input,
            &base.profile,
            &from,
            &base.others(None),
        )?;
        let Some(s) = s else {
            anyhow::bail!(
                "{from} holds no audit events (lines with \"log\":\"audit\"): run serve or render with --audit-log under an audit-mode policy first"
            );
        };
        written.push(write(
            &s,
            &staging.dir,
            "policy.yaml",
            "profile.json",
            &base.input,
        )?);
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
            &base.input,
            &base.profile,
            &from,
            &base.others(None),
        )? {
            Some(s) => s,
            None => unlearnt_default(&base.policy, &base.profile, &from)?,
        };
        default.policy.name = base.policy.name.clone();
        written.push(write(
            &default,
            &staging.dir,
            "default.yaml",
            "default.json",
            &base.input,
        )?);
        for project in &projects {
            let mine: String = text
                .lines()
                .filter(|l| event_project(l).as_deref() == Some(project.as_str()))
                .map(|l| format!("{l}\n"))
                .collect();
            let others = base.others(Some(project));
            let Some(mut s) = propose(
                &mine,
                &base.policy,
                &base.input,
                &base.profile,
                &from,
                &others,
            )?
            else {
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
            written.push(write(
                &s,
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

/// Write a proposal as `out/<file>` and `out/seccomp/<profile>`; returns both paths.
fn write(
    s: &Suggested,
    out: &Path,
    file: &str,
    profile: &str,
    input: &str,
) -> anyhow::Result<(PathBuf, PathBuf)> {
    let (yaml, profile_json) = s.texts(profile, input)?;
    std::fs::create_dir_all(out.join("seccomp"))?;
    let prof_path = out.join("seccomp").join(profile);
    std::fs::write(&prof_path, profile_json)?;
    let pol_path = out.join(file);
    std::fs::write(&pol_path, &yaml)?;
    Ok((pol_path, prof_path))
}

/// Why `p`'s seccomp profile does not compile here (as `serve` would compile it).
fn seccomp_error(p: &Policy) -> Option<seccomp::SeccompError> {
    supervisor::Plan::new(p, &supervisor::Overrides::default(), Vec::new())
        .seccomp_error()
        .cloned()
}
