//! `cmp-warden policy check [FILE]`: validate a sandbox policy and print the effective policy.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Subcommand;
use policy::Policy;

/// Policy subcommands.
#[derive(Debug, Subcommand)]
pub enum PolicyCmd {
    /// Validate FILE (or the embedded default) and print the effective policy as JSON.
    Check {
        /// Policy file [default: the embedded policies/default.yaml].
        file: Option<PathBuf>,
    },
}

/// Exit 0 and the effective policy on stdout, or 1 and the reason on stderr.
pub fn run(cmd: PolicyCmd) -> ExitCode {
    let PolicyCmd::Check { file } = cmd;
    let parsed = match &file {
        None => Policy::default_policy(),
        Some(f) => Policy::load(f),
    };
    match parsed {
        Ok(p) => {
            // The profile must also compile for this architecture, as `serve` will do it.
            if let Err(e) = jail::seccomp::compile(&p.seccomp, p.seccomp_mode, p.network) {
                eprintln!("invalid: policy: spec.seccomp.profile: {e}");
                return ExitCode::from(1);
            }
            match serde_json::to_string_pretty(&p) {
                Ok(s) => println!("{s}"),
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
