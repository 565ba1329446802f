//! One module per subcommand.

pub mod appset;
pub mod archive;
pub mod askpass;
pub mod client;
pub mod doctor;
pub mod flags;
pub mod net;
pub mod policy;
pub mod render;
pub mod serve;

/// `NAME=VALUE` → pair (value may be empty; a missing `=` is an error).
pub fn parse_env(s: &str) -> Result<(String, String), String> {
    s.split_once('=')
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .ok_or_else(|| format!("expected NAME=VALUE, got {s:?}"))
}
