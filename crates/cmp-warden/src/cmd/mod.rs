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

/// Write `text` to stdout. A reader that went away (`| head`) ends the output quietly, as it
/// does for any Unix tool, instead of a panic; another write error is said on stderr.
pub fn print_out(text: &str) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => {}
        Err(e) => eprintln!("error writing to stdout: {e}"),
    }
}
