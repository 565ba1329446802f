//! Log setup: JSON (Argo's cmp-server default) or text, to stderr.

use std::io::IsTerminal;

/// A level as Argo CD's logrus accepts it (`--loglevel`, `ARGOCD_CMP_SERVER_LOGLEVEL`), as
/// the `tracing` level it means. logrus' `fatal` and `panic` keep errors: a fatal start-up
/// error is never silenced by any level.
pub fn parse_level(s: &str) -> Result<&'static str, String> {
    Ok(match s.to_ascii_lowercase().as_str() {
        "trace" => "trace",
        "debug" => "debug",
        "info" => "info",
        "warn" | "warning" => "warn",
        "error" | "fatal" | "panic" => "error",
        _ => {
            return Err(format!(
                "not a valid logrus Level: {s:?} (trace, debug, info, warn, warning, error, fatal, panic)"
            ));
        }
    })
}

/// Install the global subscriber; `level` is one of [`parse_level`]'s results.
pub fn init(level: &str, json: bool) {
    let filter = tracing_subscriber::EnvFilter::try_new(level)
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        // Colour only for a person at a terminal, never into files and pipes.
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr);
    if json {
        builder
            .json()
            .flatten_event(true)
            .with_current_span(true)
            .with_span_list(false)
            .init();
    } else {
        builder.init();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn logrus_level_names_are_accepted_and_anything_else_is_refused() {
        for (given, level) in [
            ("trace", "trace"),
            ("DEBUG", "debug"),
            ("info", "info"),
            ("warn", "warn"),
            ("warning", "warn"),
            ("error", "error"),
            ("fatal", "error"),
            ("panic", "error"),
        ] {
            assert_eq!(parse_level(given), Ok(level), "{given}");
        }
        assert!(
            parse_level("verbose")
                .unwrap_err()
                .contains("not a valid logrus Level")
        );
    }
}
