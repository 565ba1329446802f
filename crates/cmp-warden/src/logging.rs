//! Log setup: JSON (Argo's cmp-server default) or text, to stderr.

use std::io::IsTerminal;

use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::time::{FormatTime, SystemTime};
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields, FormattedFields};
use tracing_subscriber::registry::LookupSpan;

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
            .fmt_fields(tracing_subscriber::fmt::format::JsonFields::new())
            .event_format(Logrus)
            .init();
    } else {
        builder.init();
    }
}

/// JSON lines shaped as logrus writes them (Argo CD's components, and the pipelines that read
/// their logs): `time`, `level` in logrus' lower-case names, `msg`, then the fields of the
/// request's spans and of the event, with numbers and booleans as JSON values.
struct Logrus;

impl<S, N> FormatEvent<S, N> for Logrus
where
    S: tracing::Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &tracing::Event<'_>,
    ) -> std::fmt::Result {
        let mut map = serde_json::Map::new();
        let mut time = String::new();
        SystemTime.format_time(&mut Writer::new(&mut time))?;
        map.insert("time".into(), time.into());
        map.insert(
            "level".into(),
            logrus_level(event.metadata().level()).into(),
        );
        // The request's fields (outermost span first; inner ones win).
        if let Some(scope) = ctx.event_scope() {
            for span in scope.from_root() {
                let ext = span.extensions();
                if let Some(f) = ext.get::<FormattedFields<N>>()
                    && let Ok(serde_json::Value::Object(fields)) =
                        serde_json::from_str::<serde_json::Value>(&f.fields)
                {
                    map.extend(fields);
                }
            }
        }
        event.record(&mut Fields(&mut map));
        // Keys in sorted order, as logrus' JSON formatter writes them.
        if let Some(msg) = map.remove("message") {
            map.insert("msg".into(), msg);
        }
        writeln!(writer, "{}", serde_json::Value::Object(map))
    }
}

/// logrus' level names.
fn logrus_level(l: &tracing::Level) -> &'static str {
    match *l {
        tracing::Level::TRACE => "trace",
        tracing::Level::DEBUG => "debug",
        tracing::Level::INFO => "info",
        tracing::Level::WARN => "warning",
        _ => "error",
    }
}

/// An event's fields as JSON values (numbers as numbers, text as text).
struct Fields<'a>(&'a mut serde_json::Map<String, serde_json::Value>);

impl tracing::field::Visit for Fields<'_> {
    fn record_str(&mut self, f: &tracing::field::Field, v: &str) {
        self.0.insert(f.name().into(), v.into());
    }
    fn record_i64(&mut self, f: &tracing::field::Field, v: i64) {
        self.0.insert(f.name().into(), v.into());
    }
    fn record_u64(&mut self, f: &tracing::field::Field, v: u64) {
        self.0.insert(f.name().into(), v.into());
    }
    fn record_f64(&mut self, f: &tracing::field::Field, v: f64) {
        self.0.insert(f.name().into(), v.into());
    }
    fn record_bool(&mut self, f: &tracing::field::Field, v: bool) {
        self.0.insert(f.name().into(), v.into());
    }
    fn record_error(&mut self, f: &tracing::field::Field, v: &(dyn std::error::Error + 'static)) {
        self.0.insert(f.name().into(), v.to_string().into());
    }
    fn record_debug(&mut self, f: &tracing::field::Field, v: &dyn std::fmt::Debug) {
        self.0.insert(f.name().into(), format!("{v:?}").into());
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
