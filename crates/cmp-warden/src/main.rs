//! `cmp-warden`: command-line entry point. Only argument parsing and dispatch live here.
#![forbid(unsafe_code)]
// The binary is where output to the terminal belongs.
#![allow(clippy::print_stdout, clippy::print_stderr)]

mod cmd;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// A confined, wire-compatible replacement for Argo CD's argocd-cmp-server.
#[derive(Debug, Parser)]
#[command(name = "cmp-warden", version, about)]
struct Cli {
    /// Log level (error, warn, info, debug, trace).
    #[arg(
        long = "loglevel",
        global = true,
        default_value = "warn",
        env = "CMP_WARDEN_LOGLEVEL"
    )]
    log_level: String,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Check or extract a tar.gz exactly as the server would.
    #[command(subcommand)]
    Archive(cmd::archive::ArchiveCmd),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let filter = tracing_subscriber::EnvFilter::try_new(&cli.log_level)
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
    match cli.command {
        Command::Archive(c) => cmd::archive::run(c),
    }
}
