//! Log setup, shaped as Argo CD's components write their logs (logrus): JSON (the cmp-server's
//! default) or text, to stderr.
//!
//! The same environment as Argo's `util/log` applies: `ARGOCD_LOG_FORMAT_TIMESTAMP` (a Go time
//! layout; default RFC 3339, seconds), `FORCE_LOG_COLORS=1` (colour in text format even into a
//! pipe; otherwise only on a terminal) and `ARGOCD_LOG_FORMAT_ENABLE_FULL_TIMESTAMP=1` (coloured
//! text shows the time instead of the seconds since start). Times are UTC.

use std::io::IsTerminal;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use tracing_subscriber::fmt::format::Writer;
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

/// Go's `time.RFC3339`, logrus' default timestamp layout.
const RFC3339: &str = "2006-01-02T15:04:05Z07:00";

/// The libraries under the gRPC server log their internals (HTTP/2 frames, TLS records) at
/// debug; at `debug` they stay at `info`, as grpc-go's internals stay out of Argo CD's debug
/// logs. `trace` shows everything.
const QUIET_LIBRARIES: &str =
    "h2=info,hyper=info,hyper_util=info,tower=info,tonic=info,rustls=info";

/// Install the global subscriber; `level` is one of [`parse_level`]'s results.
pub fn init(level: &str, json: bool) {
    let directives = match level {
        "debug" => format!("debug,{QUIET_LIBRARIES}"),
        other => other.to_owned(),
    };
    let filter = tracing_subscriber::EnvFilter::try_new(directives)
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let env = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
    let format = Logrus {
        json,
        // Colour only for a person at a terminal, never into files and pipes, unless asked.
        color: !json
            && (std::io::stderr().is_terminal() || env("FORCE_LOG_COLORS").as_deref() == Some("1")),
        full_timestamp: env("ARGOCD_LOG_FORMAT_ENABLE_FULL_TIMESTAMP").as_deref() == Some("1"),
        layout: env("ARGOCD_LOG_FORMAT_TIMESTAMP").unwrap_or_else(|| RFC3339.to_owned()),
        started: Instant::now(),
    };
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .fmt_fields(tracing_subscriber::fmt::format::JsonFields::new())
        .event_format(format)
        .init();
}

/// One line per event as logrus writes it: `time`, `level` in logrus' lower-case names,
/// `msg`, then the fields of the request's spans and of the event (inner ones win) — a JSON
/// object with sorted keys (numbers and booleans as JSON values), or `key=value` text.
struct Logrus {
    json: bool,
    color: bool,
    full_timestamp: bool,
    layout: String,
    started: Instant,
}

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
        let msg = match map.remove("message") {
            Some(serde_json::Value::String(s)) => s,
            Some(other) => other.to_string(),
            None => String::new(),
        };
        let level = logrus_level(event.metadata().level());
        let time = go_time(&self.layout, SystemTime::now());
        if self.json {
            map.insert("time".into(), time.into());
            map.insert("level".into(), level.into());
            map.insert("msg".into(), msg.into());
            // Keys in sorted order (serde_json's map), as logrus' JSON formatter writes them.
            return writeln!(writer, "{}", serde_json::Value::Object(map));
        }
        if self.color {
            let code = match level {
                "trace" | "debug" => 37,
                "warning" => 33,
                "error" | "fatal" | "panic" => 31,
                _ => 36,
            };
            let upper: String = level.to_ascii_uppercase().chars().take(4).collect();
            let when = if self.full_timestamp {
                time
            } else {
                format!("{:04}", self.started.elapsed().as_secs())
            };
            write!(writer, "\x1b[{code}m{upper}\x1b[0m[{when}] {msg:<44}")?;
            for (k, v) in &map {
                write!(writer, " \x1b[{code}m{k}\x1b[0m={}", text_value(v))?;
            }
            return writeln!(writer);
        }
        write!(
            writer,
            "time={} level={level} msg={}",
            quoted(&time),
            quoted(&msg)
        )?;
        for (k, v) in &map {
            write!(writer, " {k}={}", text_value(v))?;
        }
        writeln!(writer)
    }
}

/// A field's value in logrus' text format.
fn text_value(v: &serde_json::Value) -> String {
    match v {
        serde_json::Value::String(s) => quoted(s),
        other => quoted(&other.to_string()),
    }
}

/// logrus' text quoting: bare when every character is `[A-Za-z0-9-._/@^+]` (or empty), else a
/// Go-quoted string.
fn quoted(s: &str) -> String {
    let bare = s
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || "-._/@^+".contains(c));
    if bare {
        return s.to_owned();
    }
    // Go's %q and JSON agree for the text logs carry (escapes for quotes, `\`, controls).
    serde_json::Value::String(s.to_owned()).to_string()
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

/// `t` (UTC) in a Go time layout (`2006-01-02T15:04:05Z07:00` and the rest of Go's reference
/// time's elements: `Jan`/`January`, `Mon`/`Monday`, `1`/`01`, `2`/`02`/`_2`, `15`/`3`/`03`,
/// `4`/`04`, `5`/`05`, `PM`/`pm`, `MST`, `Z07:00`/`-0700` and their kin, `.000`/`.999`
/// fractions). Anything else is copied as written, as Go does.
pub fn go_time(layout: &str, t: SystemTime) -> String {
    const MONTHS: [&str; 12] = [
        "January",
        "February",
        "March",
        "April",
        "May",
        "June",
        "July",
        "August",
        "September",
        "October",
        "November",
        "December",
    ];
    const DAYS: [&str; 7] = [
        "Thursday",
        "Friday",
        "Saturday",
        "Sunday",
        "Monday",
        "Tuesday",
        "Wednesday",
    ];
    let d = t.duration_since(UNIX_EPOCH).unwrap_or_default();
    let secs = d.as_secs();
    let nanos = d.subsec_nanos();
    let days = secs / 86_400;
    let (y, m, day) = civil_from_days(days as i64);
    let (hh, mm, ss) = ((secs / 3600) % 24, (secs / 60) % 60, secs % 60);
    let weekday = DAYS[(days % 7) as usize];
    let month = MONTHS[(m - 1) as usize];
    let hour12 = match hh % 12 {
        0 => 12,
        h => h,
    };
    // Longest first where one element is a prefix of another.
    let tokens: &[&str] = &[
        "January",
        "Jan",
        "Monday",
        "Mon",
        "MST",
        "2006",
        "Z07:00:00",
        "Z070000",
        "Z07:00",
        "Z0700",
        "Z07",
        "-07:00:00",
        "-070000",
        "-07:00",
        "-0700",
        "-07",
        "_2",
        "01",
        "02",
        "03",
        "04",
        "05",
        "06",
        "15",
        "PM",
        "pm",
        "1",
        "2",
        "3",
        "4",
        "5",
    ];
    let mut out = String::new();
    let mut rest = layout;
    'outer: while !rest.is_empty() {
        // Fractional seconds: `.` or `,` then a run of 0s (fixed) or 9s (trailing zeros cut),
        // not followed by a digit.
        if let Some(sep) = rest.chars().next().filter(|c| *c == '.' || *c == ',') {
            let run: String = rest[1..]
                .chars()
                .take_while(|c| *c == '0' || *c == '9')
                .collect();
            let next = rest[1 + run.len()..].chars().next();
            let uniform = run.chars().all(|c| c == '0') || run.chars().all(|c| c == '9');
            if !run.is_empty() && uniform && !next.is_some_and(|c| c.is_ascii_digit()) {
                let digits = format!("{nanos:09}");
                let n = run.len().min(9);
                let mut frac = digits[..n].to_owned();
                if run.starts_with('9') {
                    frac = frac.trim_end_matches('0').to_owned();
                }
                if !frac.is_empty() {
                    out.push(sep);
                    out.push_str(&frac);
                }
                rest = &rest[1 + run.len()..];
                continue;
            }
        }
        for tok in tokens {
            if let Some(after) = rest.strip_prefix(tok) {
                match *tok {
                    "January" => out.push_str(month),
                    "Jan" => out.push_str(&month[..3]),
                    "Monday" => out.push_str(weekday),
                    "Mon" => out.push_str(&weekday[..3]),
                    "MST" => out.push_str("UTC"),
                    "2006" => out.push_str(&format!("{y:04}")),
                    "06" => out.push_str(&format!("{:02}", y.rem_euclid(100))),
                    t if t.starts_with('Z') => out.push('Z'),
                    "-07:00:00" => out.push_str("+00:00:00"),
                    "-070000" => out.push_str("+000000"),
                    "-07:00" => out.push_str("+00:00"),
                    "-0700" => out.push_str("+0000"),
                    "-07" => out.push_str("+00"),
                    "_2" => out.push_str(&format!("{day:>2}")),
                    "01" => out.push_str(&format!("{m:02}")),
                    "02" => out.push_str(&format!("{day:02}")),
                    "03" => out.push_str(&format!("{hour12:02}")),
                    "04" => out.push_str(&format!("{mm:02}")),
                    "05" => out.push_str(&format!("{ss:02}")),
                    "15" => out.push_str(&format!("{hh:02}")),
                    "PM" => out.push_str(if hh >= 12 { "PM" } else { "AM" }),
                    "pm" => out.push_str(if hh >= 12 { "pm" } else { "am" }),
                    "1" => out.push_str(&m.to_string()),
                    "2" => out.push_str(&day.to_string()),
                    "3" => out.push_str(&hour12.to_string()),
                    "4" => out.push_str(&mm.to_string()),
                    "5" => out.push_str(&ss.to_string()),
                    _ => out.push_str(tok),
                }
                rest = after;
                continue 'outer;
            }
        }
        let c = rest.chars().next().unwrap_or_default();
        out.push(c);
        rest = &rest[c.len_utf8()..];
    }
    out
}

/// (year, month 1–12, day 1–31) of a day count since 1970-01-01 (Howard Hinnant's algorithm).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
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
    use std::time::Duration;

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

    #[test]
    fn go_layouts_format_as_go_formats_them() {
        // 2026-11-25T00:45:07.123456789Z, a Wednesday.
        let t = UNIX_EPOCH + Duration::new(1_795_567_507, 123_456_789);
        assert_eq!(go_time(RFC3339, t), "2026-11-25T00:45:07Z");
        assert_eq!(
            go_time("2006-01-02T15:04:05.000Z07:00", t),
            "2026-11-25T00:45:07.123Z"
        );
        assert_eq!(
            go_time("2006-01-02 15:04:05.999999 -0700 MST", t),
            "2026-11-25 00:45:07.123456 +0000 UTC"
        );
        assert_eq!(
            go_time("Mon Jan _2 3:04:05 PM 06", t),
            "Wed Nov 25 12:45:07 AM 26"
        );
        assert_eq!(go_time("Monday, 2 January", t), "Wednesday, 25 November");
        // Leap day and century rules.
        let leap = UNIX_EPOCH + Duration::from_secs(951_782_400); // 2000-02-29
        assert_eq!(go_time("2006-01-02", leap), "2000-02-29");
    }

    #[test]
    fn text_values_are_quoted_as_logrus_quotes_them() {
        assert_eq!(quoted("guestbook"), "guestbook");
        assert_eq!(quoted("a/b-c_d.e@f"), "a/b-c_d.e@f");
        assert_eq!(quoted("request received"), "\"request received\"");
        assert_eq!(quoted("say \"hi\""), "\"say \\\"hi\\\"\"");
        assert_eq!(quoted(""), "");
    }
}
