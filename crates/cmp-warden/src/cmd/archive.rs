//! `cmp-warden archive check|extract`: what the server would accept, for operators.

use std::fs::File;
use std::io::{self, Read};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, bail};
use archive::{Limits, Options, Summary};
use clap::{Args, Subcommand};

/// Archive subcommands.
#[derive(Debug, Subcommand)]
pub enum ArchiveCmd {
    /// Validate a tar.gz without writing anything: exit 0 and a summary if acceptable,
    /// exit 1 and the reason on stderr if not.
    Check {
        /// The archive, or `-` for standard input.
        #[arg(default_value = "-")]
        file: String,
        #[command(flatten)]
        opts: ArchiveOpts,
    },
    /// Extract a tar.gz into DIR (created if missing; must be empty), with the same verdicts.
    Extract {
        /// Destination directory.
        #[arg(long)]
        into: PathBuf,
        /// The archive, or `-` for standard input.
        #[arg(default_value = "-")]
        file: String,
        #[command(flatten)]
        opts: ArchiveOpts,
    },
}

/// Options shared by check and extract. Quantities accept `100Mi`-style suffixes.
#[derive(Debug, Args)]
pub struct ArchiveOpts {
    /// Keep the owner-execute bit (plugin.yaml `preserveFileMode`).
    #[arg(long)]
    preserve_file_mode: bool,
    /// Refuse unless the compressed bytes have this SHA-256 (lowercase hex).
    #[arg(long, value_name = "HEX")]
    sha256: Option<String>,
    /// Maximum compressed bytes [default: 100Mi].
    #[arg(long, value_name = "QTY")]
    max_compressed: Option<String>,
    /// Maximum decompressed tar bytes [default: 1Gi].
    #[arg(long, value_name = "QTY")]
    max_extracted: Option<String>,
    /// Maximum size of one file [default: 256Mi].
    #[arg(long, value_name = "QTY")]
    max_file: Option<String>,
    /// Maximum number of entries [default: 100000].
    #[arg(long, value_name = "QTY")]
    max_entries: Option<String>,
    /// Maximum number of symlinks [default: 10000].
    #[arg(long, value_name = "QTY")]
    max_symlinks: Option<String>,
    /// Maximum path depth in components [default: 64].
    #[arg(long, value_name = "N")]
    max_depth: Option<usize>,
    /// Maximum decompressed:compressed ratio [default: 250].
    #[arg(long, value_name = "N")]
    max_ratio: Option<u64>,
    /// Wall-clock limit in seconds [default: 120].
    #[arg(long, value_name = "SECS")]
    timeout: Option<u64>,
}

impl ArchiveOpts {
    fn to_options(&self) -> anyhow::Result<Options> {
        let q = |v: &Option<String>, default: u64| -> anyhow::Result<u64> {
            match v {
                Some(s) => Ok(policy::parse_quantity(s)?),
                None => Ok(default),
            }
        };
        let d = Limits::default();
        let limits = Limits {
            compressed_bytes: q(&self.max_compressed, d.compressed_bytes)?,
            extracted_bytes: q(&self.max_extracted, d.extracted_bytes)?,
            file_bytes: q(&self.max_file, d.file_bytes)?,
            entries: q(&self.max_entries, d.entries)?,
            symlinks: q(&self.max_symlinks, d.symlinks)?,
            path_depth: self.max_depth.unwrap_or(d.path_depth),
            max_ratio: self.max_ratio.unwrap_or(d.max_ratio),
            wall_clock: self.timeout.map_or(d.wall_clock, Duration::from_secs),
            ..d
        };
        let expected_sha256 = match &self.sha256 {
            None => None,
            Some(h) => {
                let v = hex::decode(h.trim()).context("--sha256 is not hex")?;
                let Ok(a) = <[u8; 32]>::try_from(v.as_slice()) else {
                    bail!("--sha256 must be 64 hex digits")
                };
                Some(a)
            }
        };
        Ok(Options {
            limits,
            preserve_file_mode: self.preserve_file_mode,
            expected_sha256,
            // `archive check` prints the digest.
            skip_digest: false,
        })
    }
}

fn open_input(file: &str) -> anyhow::Result<Box<dyn Read>> {
    if file == "-" {
        Ok(Box::new(io::stdin().lock()))
    } else {
        Ok(Box::new(
            File::open(file).with_context(|| format!("cannot open {file}"))?,
        ))
    }
}

fn print_summary(s: &Summary) {
    super::print_out(&format!(
        "ok entries={} files={} dirs={} symlinks={} bytes={} compressed={} sha256={}\n",
        s.entries,
        s.files,
        s.dirs,
        s.symlinks,
        s.file_bytes,
        s.compressed_bytes,
        s.sha256_hex()
    ));
}

/// Run an archive subcommand; exit 0 accepted, 1 refused or failed.
pub fn run(cmd: ArchiveCmd) -> ExitCode {
    match run_inner(cmd) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(1)
        }
    }
}

fn run_inner(cmd: ArchiveCmd) -> anyhow::Result<ExitCode> {
    let (result, _into) = match cmd {
        ArchiveCmd::Check { file, opts } => {
            let opts = opts.to_options()?;
            (archive::check(open_input(&file)?, &opts), None)
        }
        ArchiveCmd::Extract { into, file, opts } => {
            let opts = opts.to_options()?;
            std::fs::create_dir_all(&into)
                .with_context(|| format!("cannot create {}", into.display()))?;
            let input = open_input(&file)?;
            (archive::extract_to_dir(input, &into, &opts), Some(into))
        }
    };
    match result {
        Ok(summary) => {
            print_summary(&summary);
            Ok(ExitCode::SUCCESS)
        }
        Err(e) => {
            eprintln!("rejected ({}): {e}", e.class());
            Ok(ExitCode::from(1))
        }
    }
}
