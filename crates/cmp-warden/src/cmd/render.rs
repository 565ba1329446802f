//! `cmp-warden render`: discovery, init and generate on a local directory through the same code
//! path the server uses (pack → runner → split), for plugin authors without a cluster.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::Args;
use plugin::PluginConfig;
use supervisor::{CancelToken, RequestSpec};
use vocab::request::{Operation, Outcome};

/// `render` flags.
#[derive(Debug, Args)]
pub struct RenderArgs {
    /// Repository root.
    dir: PathBuf,
    /// Directory holding plugin.yaml.
    #[arg(long, default_value = "/home/argocd/cmp-server/config")]
    config_dir_path: PathBuf,
    /// App directory relative to DIR.
    #[arg(long, default_value = ".")]
    app_rel_path: String,
    /// Request environment entry (repeatable).
    #[arg(long = "env", value_parser = super::parse_env)]
    env: Vec<(String, String)>,
    /// Go filepath.Match globs of relative paths to leave out (repeatable).
    #[arg(long)]
    exclude: Vec<String>,
    /// Sandbox policy file [default: the embedded policies/default.yaml].
    #[arg(long, env = "CMP_WARDEN_POLICY")]
    policy: Option<PathBuf>,
    /// Append each request's audit event (as `serve` writes them) to this file; feed it to
    /// `cmp-warden policy suggest`.
    #[arg(long)]
    audit_log: Option<PathBuf>,
}

/// Print each manifest as one JSON line; exit 1 on failure.
pub fn run(a: RenderArgs, log_args: Vec<String>) -> ExitCode {
    match render(a, log_args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(1)
        }
    }
}

fn render(a: RenderArgs, log_args: Vec<String>) -> anyhow::Result<()> {
    let mut policy = super::flags::load_policy(a.policy.as_deref())?;
    if !supervisor::privileges_now().can_switch_uids()
        && policy.require.contains(&policy::Protection::UniqueUid)
    {
        // A plugin author's laptop: say so, and keep every other protection.
        eprintln!(
            "warning: not root: rendering WITHOUT a unique UID (Landlock, seccomp and no_new_privs still apply); the server refuses to start like this unless its policy allows it"
        );
        policy
            .require
            .retain(|p| *p != policy::Protection::UniqueUid);
    }
    let loaded = PluginConfig::read_dir(&a.config_dir_path)?;
    for k in &loaded.unknown_keys {
        eprintln!("warning: plugin.yaml: unknown key {k} ignored");
    }
    let config = loaded.config;
    let (buf, _) = super::client::pack(&a.dir, &a.exclude)?;
    let audit = match &a.audit_log {
        Some(p) => {
            Some(server::audit::AuditSink::file(p).with_context(|| p.display().to_string())?)
        }
        None => None,
    };
    let app = std::path::absolute(&a.dir)?
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let sha = {
        use sha2::Digest;
        hex::encode(sha2::Sha256::digest(&buf))
    };
    let work = std::env::temp_dir().join(format!("cmp-warden-render-{}", std::process::id()));
    let mut start = supervisor::StartOptions::new(work.clone(), supervisor::Owner::OneShot);
    start.log_args = log_args;
    start.overrides.command_timeout = super::flags::exec_timeout();
    start.lease_dir = super::flags::lease_dir(None);
    let (supervisor, _) = supervisor::Supervisor::start(&policy, start)?;
    let plan = supervisor.plan();
    let runner = supervisor.runner();
    let account = |s: &RequestSpec,
                   r: &Result<Outcome, vocab::request::RequestError>,
                   took: std::time::Duration| {
        let Some(sink) = &audit else { return };
        let status = r.as_ref().err().map(server::status::to_status);
        let event = server::audit::finished(
            s.op(),
            server::audit::Seen {
                request_id: s
                    .tree
                    .file_name()
                    .map(|n| n.to_string_lossy().into_owned())
                    .unwrap_or_default(),
                app: app.clone(),
                project: None,
                trace_id: None,
                app_rel_path: a.app_rel_path.clone(),
                env_names: a.env.iter().map(|(k, _)| k.clone()).collect(),
                archive: audit_event::ArchiveInfo {
                    sha256: Some(sha.clone()),
                    bytes: buf.len() as u64,
                    ..Default::default()
                },
                limit: None,
            },
            status.as_ref().map_or(Ok(()), Err),
            took,
            server::audit::policy_ref(&plan),
            supervisor::record::snapshot(&s.record),
        );
        sink.emit(&event);
    };
    let spec = |op: Operation| {
        plan.request(
            op,
            &config,
            // Unique per request: the name also names the request's cgroup.
            work.join(format!("{op:?}-{}", uuid::Uuid::new_v4())),
            &a.app_rel_path,
            &a.env,
            plan.deadline(None),
        )
    };
    let result = (|| -> anyhow::Result<()> {
        if config.spec.discover.is_defined() {
            let s = spec(Operation::Match);
            let t = std::time::Instant::now();
            let r = runner
                .execute(
                    &s,
                    Box::new(std::io::Cursor::new(buf.clone())),
                    &CancelToken::new(),
                )
                .map(|e| e.outcome);
            runner.reclaim(&s);
            account(&s, &r, t.elapsed());
            match r {
                Ok(Outcome::Match { supported, .. }) => {
                    eprintln!(
                        "discovery: {}",
                        if supported {
                            "matches"
                        } else {
                            "does NOT match (rendering anyway)"
                        }
                    )
                }
                Ok(_) => {}
                Err(e) => eprintln!("discovery: error: {e}"),
            }
        }
        let s = spec(Operation::Generate);
        let t = std::time::Instant::now();
        let out = runner
            .execute(
                &s,
                Box::new(std::io::Cursor::new(buf.clone())),
                &CancelToken::new(),
            )
            .map(|e| e.outcome);
        runner.reclaim(&s);
        account(&s, &out, t.elapsed());
        let out = out?;
        let Outcome::Manifests(m) = out else {
            anyhow::bail!("unexpected outcome")
        };
        // A reader that went away (`| head`) ends the output quietly.
        let mut text = String::new();
        for doc in m {
            text.push_str(&doc);
            text.push('\n');
        }
        super::print_out(&text);
        Ok(())
    })();
    // The spare jail prepared for a next request lives in `work` and the cgroup instance.
    supervisor.shutdown();
    result
}
