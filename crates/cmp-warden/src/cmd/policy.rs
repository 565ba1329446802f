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
        Some(f) => match std::fs::read_to_string(f) {
            Ok(text) => Policy::parse(&text, f.parent()),
            Err(e) => {
                eprintln!("error: cannot read {}: {e}", f.display());
                return ExitCode::from(1);
            }
        },
    };
    match parsed {
        Ok(p) => {
            if !p.seccomp_profile.exists() {
                eprintln!(
                    "warning: seccomp profile {} not found (seccomp enforcement is not implemented yet)",
                    p.seccomp_profile.display()
                );
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
