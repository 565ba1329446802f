//! `cmp-warden`: command-line entry point. Only argument parsing and dispatch live here.
#![forbid(unsafe_code)]
// The binary is where output to the terminal belongs.
#![allow(clippy::print_stdout, clippy::print_stderr)]

mod cmd;
mod logging;

use std::process::ExitCode;

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};

/// The version, the commit it was built from and that commit's date (build.rs).
pub const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (commit ",
    env!("CMP_WARDEN_COMMIT"),
    ", ",
    env!("CMP_WARDEN_COMMIT_DATE"),
    ")"
);

/// A confined, wire-compatible replacement for Argo CD's argocd-cmp-server.
#[derive(Debug, Parser)]
#[command(name = "cmp-warden", version = VERSION, about)]
struct Cli {
    /// Log level, as logrus names them: trace, debug, info, warn (warning), error, fatal, panic
    /// [default: info for serve, warn otherwise].
    #[arg(long = "loglevel", global = true, env = "ARGOCD_CMP_SERVER_LOGLEVEL")]
    log_level: Option<String>,
    /// Log format: json or text [default: json for serve, text otherwise].
    #[arg(long = "logformat", global = true, env = "ARGOCD_CMP_SERVER_LOGFORMAT")]
    log_format: Option<String>,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Serve the plugin on its unix socket (the argocd-cmp-server entrypoint; the default).
    Serve(Box<cmd::serve::ServeArgs>),
    /// Talk to a running server as the repo-server does (pack a directory, call an RPC).
    Client(cmd::client::ClientArgs),
    /// Run discovery, init and generate on a local directory and print the manifests.
    Render(cmd::render::RenderArgs),
    /// Check or extract a tar.gz exactly as the server would.
    #[command(subcommand)]
    Archive(cmd::archive::ArchiveCmd),
    /// Probe the sandbox as `serve` would and report, per protection, what is enforced here.
    Doctor(cmd::doctor::DoctorArgs),
    /// Validate a sandbox policy file.
    #[command(subcommand)]
    Policy(cmd::policy::PolicyCmd),
    /// The ApplicationSet plugin generator (HTTP), through the same sandbox.
    #[command(subcommand)]
    Appset(cmd::appset::AppsetCmd),
}

/// Invoked with no subcommand (as `argocd-cmp-server` is, possibly with flags such as
/// `--config-dir-path`), behave as `serve`.
fn with_default_subcommand(mut args: Vec<std::ffi::OsString>) -> Vec<std::ffi::OsString> {
    const SUBCOMMANDS: &[&str] = &[
        "serve", "client", "render", "archive", "policy", "doctor", "appset", "help",
    ];
    const TOP_LEVEL: &[&str] = &["-h", "--help", "-V", "--version"];
    let first = args.get(1).and_then(|a| a.to_str()).map(str::to_owned);
    let insert = match first.as_deref() {
        None => true,
        Some(a) if SUBCOMMANDS.contains(&a) || TOP_LEVEL.contains(&a) => false,
        Some(a) => a.starts_with('-'),
    };
    if insert {
        args.insert(1.min(args.len()), "serve".into());
    }
    args
}

/// Parse flags as Argo CD's cobra/pflag do: a repeated flag's last value wins (list flags
/// such as `--otlp-headers` collect every value), and an environment variable set to the empty
/// string counts as unset (Argo's `env.StringFromEnv`; Helm charts often render `value: ""`).
fn argo_like(cmd: clap::Command) -> clap::Command {
    cmd.args_override_self(true)
        .mut_args(|a| {
            let empty = a
                .get_env()
                .is_some_and(|name| std::env::var_os(name).is_some_and(|v| v.is_empty()));
            if empty {
                a.env(None::<&'static str>)
            } else {
                a
            }
        })
        .mut_subcommands(argo_like)
}

/// The jail factory (which forks every jail) and the reclaim helper are this binary re-executed by the supervisor with an
/// internal first argument and a cleared environment: dispatch them before anything else.
fn internal_entry() -> Option<ExitCode> {
    let args: Vec<String> = std::env::args().collect();
    let which = args.get(1)?.as_str();
    if which != supervisor::FACTORY_ARG
        && which != supervisor::RECLAIM_ARG
        && which != supervisor::KEEPER_ARG
    {
        return None;
    }
    let mut rest = &args[2..];
    let mut level = "warn".to_owned();
    let mut json = false;
    loop {
        match rest {
            [flag, v, tail @ ..] if flag == "--loglevel" => {
                level = v.clone();
                rest = tail;
            }
            [flag, tail @ ..] if flag == "--json" => {
                json = true;
                rest = tail;
            }
            _ => break,
        }
    }
    logging::init(&level, json);
    let code = match which {
        w if w == supervisor::FACTORY_ARG => supervisor::factory_main(),
        w if w == supervisor::KEEPER_ARG => supervisor::keeper_main(rest),
        _ => supervisor::reclaim_main(rest),
    };
    Some(ExitCode::from(u8::try_from(code).unwrap_or(1)))
}

fn main() -> ExitCode {
    if let Some(code) = internal_entry() {
        return code;
    }
    // Installed as `argocd` and run by git as its askpass helper (`provideGitCreds`).
    if cmd::askpass::invoked() {
        return cmd::askpass::run();
    }
    let matches = argo_like(Cli::command())
        .get_matches_from(with_default_subcommand(std::env::args_os().collect()));
    let cli = match Cli::from_arg_matches(&matches) {
        Ok(c) => c,
        Err(e) => e.exit(),
    };
    let Some(command) = cli.command else {
        eprintln!("no subcommand");
        return ExitCode::from(2);
    };
    let serving = matches!(command, Command::Serve(_) | Command::Appset(_));
    // doctor's report already says everything its probe logs would.
    let quiet = matches!(command, Command::Doctor(_));
    // Empty means the default, as logrus' level and Argo's format flags read it.
    let log_level = cli.log_level.as_deref().filter(|l| !l.is_empty());
    let level = match log_level.map(logging::parse_level) {
        Some(Ok(l)) => Some(l.to_owned()),
        // Argo's cmp-server exits 20 on start-up errors; so do we, saying why on stderr.
        Some(Err(e)) => {
            eprintln!("{e}");
            return ExitCode::from(20);
        }
        None => None,
    };
    let level = level.unwrap_or_else(|| {
        if serving {
            "info"
        } else if quiet {
            "error"
        } else {
            "warn"
        }
        .to_owned()
    });
    let format = cli.log_format.as_deref().map(str::to_ascii_lowercase);
    let json = match format.as_deref() {
        Some("json") => true,
        Some("text") => false,
        None | Some("") => serving,
        // Argo's cmp-server: `log.Fatalf("Unknown log format ...")`, exit 1.
        Some(_) => {
            eprintln!(
                "Unknown log format '{}' (json or text)",
                cli.log_format.as_deref().unwrap_or_default()
            );
            return ExitCode::from(1);
        }
    };
    logging::init(&level, json);
    let mut log_args = vec!["--loglevel".to_owned(), level.clone()];
    if json {
        log_args.push("--json".to_owned());
    }
    match command {
        Command::Serve(a) => cmd::serve::run(*a, log_args),
        Command::Client(a) => cmd::client::run(a),
        Command::Render(a) => cmd::render::run(a, log_args),
        Command::Doctor(a) => cmd::doctor::run(a, log_args),
        Command::Archive(c) => cmd::archive::run(c),
        Command::Policy(c) => cmd::policy::run(c),
        Command::Appset(c) => cmd::appset::run(c, log_args),
    }
}
