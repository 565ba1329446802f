//! The OpenTelemetry SDKs' standard environment (`OTEL_*`), which collectors' documentation and
//! the OpenTelemetry Operator's injection assume. Read as defaults beneath the `--otlp-*`
//! flags (Argo CD's own), which win where both say something.

use crate::Value;

/// What the standard variables say; empty where they are unset.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct OtelEnv {
    /// `OTEL_SDK_DISABLED=true`: export nothing.
    pub disabled: bool,
    /// `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`, else `OTEL_EXPORTER_OTLP_ENDPOINT`, as `host:port`
    /// and whether it is plaintext (`http://`, or `OTEL_EXPORTER_OTLP[_TRACES]_INSECURE=true`).
    pub endpoint: Option<(String, bool)>,
    /// `OTEL_EXPORTER_OTLP_HEADERS`, then `OTEL_EXPORTER_OTLP_TRACES_HEADERS` (percent-decoded).
    pub headers: Vec<(String, String)>,
    /// `OTEL_RESOURCE_ATTRIBUTES` (percent-decoded string values).
    pub resource: Vec<(String, Value)>,
    /// `OTEL_SERVICE_NAME`.
    pub service_name: Option<String>,
    /// `OTEL_TRACES_SAMPLER` (`always_on`, `always_off`, `traceidratio` with
    /// `OTEL_TRACES_SAMPLER_ARG`, or their `parentbased_` forms): the share of new traces. A
    /// caller's decision is always followed, so the plain and `parentbased_` forms agree.
    pub sample_ratio: Option<f64>,
    /// Entries that were malformed and left out (`VARIABLE: entry`), to be warned about.
    pub ignored: Vec<String>,
}

impl OtelEnv {
    /// Read the variables through `get` (`std::env::var` in the binary).
    pub fn from_vars(get: impl Fn(&str) -> Option<String>) -> Self {
        let get = |k: &str| {
            get(k)
                .map(|v| v.trim().to_owned())
                .filter(|v| !v.is_empty())
        };
        let mut e = OtelEnv {
            disabled: get("OTEL_SDK_DISABLED").is_some_and(|v| v.eq_ignore_ascii_case("true")),
            service_name: get("OTEL_SERVICE_NAME"),
            ..OtelEnv::default()
        };
        let insecure_flag = [
            "OTEL_EXPORTER_OTLP_TRACES_INSECURE",
            "OTEL_EXPORTER_OTLP_INSECURE",
        ]
        .iter()
        .find_map(|k| get(k))
        .map(|v| v.eq_ignore_ascii_case("true"));
        for var in [
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
            "OTEL_EXPORTER_OTLP_ENDPOINT",
        ] {
            if let Some(url) = get(var) {
                match endpoint(&url) {
                    Some((address, plaintext)) => {
                        let insecure = plaintext.unwrap_or(false) || insecure_flag == Some(true);
                        e.endpoint = Some((address, insecure));
                    }
                    None => e.ignored.push(format!("{var}: {url}")),
                }
                break;
            }
        }
        for var in [
            "OTEL_EXPORTER_OTLP_HEADERS",
            "OTEL_EXPORTER_OTLP_TRACES_HEADERS",
        ] {
            for (k, v) in pairs(get(var).as_deref().unwrap_or(""), var, &mut e.ignored) {
                match crate::export::header(&format!("{k}={v}")) {
                    Ok(h) => e.headers.push(h),
                    Err(_) => e.ignored.push(format!("{var}: {k}")),
                }
            }
        }
        let attrs = get("OTEL_RESOURCE_ATTRIBUTES").unwrap_or_default();
        for (k, v) in pairs(&attrs, "OTEL_RESOURCE_ATTRIBUTES", &mut e.ignored) {
            e.resource.push((k, Value::Str(v)));
        }
        if let Some(s) = get("OTEL_TRACES_SAMPLER") {
            let s = s.to_ascii_lowercase();
            let ratio = match s.strip_prefix("parentbased_").unwrap_or(&s) {
                "always_on" => Some(1.0),
                "always_off" => Some(0.0),
                "traceidratio" => Some(
                    get("OTEL_TRACES_SAMPLER_ARG")
                        .and_then(|a| a.parse::<f64>().ok())
                        .filter(|r| (0.0..=1.0).contains(r))
                        .unwrap_or(1.0),
                ),
                _ => None,
            };
            match ratio {
                Some(r) => e.sample_ratio = Some(r),
                None => e.ignored.push(format!("OTEL_TRACES_SAMPLER: {s}")),
            }
        }
        e
    }
}

/// `scheme://host:port[/path]` → (`host:port`, whether `http`); without a scheme, the text up
/// to a path, plaintext unknown.
fn endpoint(url: &str) -> Option<(String, Option<bool>)> {
    let (rest, plaintext) = match url.split_once("://") {
        Some(("http", r)) => (r, Some(true)),
        Some(("https", r)) => (r, Some(false)),
        Some(_) => return None,
        None => (url, None),
    };
    let host_port = rest.split('/').next().unwrap_or_default();
    (!host_port.is_empty()).then(|| (host_port.to_owned(), plaintext))
}

/// `k=v,k2=v2`, keys and values percent-decoded; malformed entries go to `ignored`.
fn pairs(s: &str, var: &str, ignored: &mut Vec<String>) -> Vec<(String, String)> {
    s.split(',')
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .filter_map(|p| {
            let kv = p
                .split_once('=')
                .and_then(|(k, v)| Some((decode(k.trim())?, decode(v.trim())?)))
                .filter(|(k, _)| !k.is_empty());
            if kv.is_none() {
                ignored.push(format!("{var}: {p}"));
            }
            kv
        })
        .collect()
}

/// Percent-decoding (`%2C` → `,`); `None` for a malformed escape or bytes that are not UTF-8.
fn decode(s: &str) -> Option<String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = s.get(i + 1..i + 3)?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(vars: &[(&str, &str)]) -> OtelEnv {
        OtelEnv::from_vars(|k| {
            vars.iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| (*v).to_owned())
        })
    }

    #[test]
    fn nothing_set_says_nothing() {
        assert_eq!(env(&[]), OtelEnv::default());
    }

    #[test]
    fn the_endpoint_the_traces_one_first_with_its_scheme_deciding_tls() {
        let e = env(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector.obs:4317")]);
        assert_eq!(e.endpoint, Some(("collector.obs:4317".into(), true)));
        let e = env(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://generic:4317"),
            (
                "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
                "https://traces:4317/v1/traces",
            ),
        ]);
        assert_eq!(e.endpoint, Some(("traces:4317".into(), false)));
        let e = env(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "collector:4317"),
            ("OTEL_EXPORTER_OTLP_INSECURE", "true"),
        ]);
        assert_eq!(e.endpoint, Some(("collector:4317".into(), true)));
        let e = env(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "unix:///run/otel.sock")]);
        assert_eq!(e.endpoint, None);
        assert_eq!(
            e.ignored,
            ["OTEL_EXPORTER_OTLP_ENDPOINT: unix:///run/otel.sock"]
        );
    }

    #[test]
    fn headers_attributes_service_name_and_sampler() {
        let e = env(&[
            (
                "OTEL_EXPORTER_OTLP_HEADERS",
                "X-Tenant=cd%20team, bad, api-key=k",
            ),
            ("OTEL_EXPORTER_OTLP_TRACES_HEADERS", "x-extra=1"),
            (
                "OTEL_RESOURCE_ATTRIBUTES",
                "deployment.environment=prod,k8s.pod.name=a%2Cb,=x",
            ),
            ("OTEL_SERVICE_NAME", "repo-server-cmp"),
            ("OTEL_TRACES_SAMPLER", "parentbased_traceidratio"),
            ("OTEL_TRACES_SAMPLER_ARG", "0.25"),
            ("OTEL_SDK_DISABLED", "false"),
        ]);
        assert_eq!(
            e.headers,
            [
                ("x-tenant".to_owned(), "cd team".to_owned()),
                ("api-key".into(), "k".into()),
                ("x-extra".into(), "1".into())
            ]
        );
        assert_eq!(
            e.resource,
            [
                (
                    "deployment.environment".to_owned(),
                    Value::Str("prod".into())
                ),
                ("k8s.pod.name".into(), Value::Str("a,b".into()))
            ]
        );
        assert_eq!(e.service_name.as_deref(), Some("repo-server-cmp"));
        assert_eq!(e.sample_ratio, Some(0.25));
        assert!(!e.disabled);
        assert_eq!(
            e.ignored,
            [
                "OTEL_EXPORTER_OTLP_HEADERS: bad",
                "OTEL_RESOURCE_ATTRIBUTES: =x"
            ]
        );
        assert_eq!(
            env(&[("OTEL_TRACES_SAMPLER", "always_off")]).sample_ratio,
            Some(0.0)
        );
        assert!(env(&[("OTEL_SDK_DISABLED", "TRUE")]).disabled);
    }
}
