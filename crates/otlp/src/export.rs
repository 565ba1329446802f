//! The exporter: requests hand it finished spans without waiting; one task batches them and
//! sends `TraceService/Export` calls. The queue is bounded (spans past it are dropped and
//! counted), each call has a timeout, and failures are logged at most once a minute, so a
//! slow or absent collector costs the server neither memory nor latency.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, watch};
use tonic::metadata::{MetadataKey, MetadataMap, MetadataValue};
use tonic::transport::{ClientTlsConfig, Endpoint};

use crate::context::{Parent, Sampler, TraceId};
use crate::span::{Span, Value, key_value};
use crate::wire;
use crate::wire::trace_service_client::TraceServiceClient;

/// Requests' span sets waiting for the exporter task.
const QUEUE: usize = 1024;
/// Spans per export call.
const MAX_BATCH: usize = 512;
/// How long spans wait for a fuller batch.
const FLUSH_EVERY: Duration = Duration::from_secs(1);
/// One export call's limit.
const EXPORT_TIMEOUT: Duration = Duration::from_secs(10);
/// Export failures are logged at most this often.
const WARN_EVERY: Duration = Duration::from_secs(60);

/// Where and how to export.
#[derive(Debug, Clone)]
pub struct ExporterConfig {
    /// `host:port` (as Argo CD's `--otlp-address`), or a URL with `http`/`https`.
    pub address: String,
    /// Plaintext to the collector (Argo CD's `--otlp-insecure`, default true).
    pub insecure: bool,
    /// gRPC metadata sent with every export (`--otlp-headers`).
    pub headers: Vec<(String, String)>,
    /// Resource attributes (service name, version, `--otlp-attrs`).
    pub resource: Vec<(String, Value)>,
    /// Instrumentation scope name and version.
    pub scope: (String, String),
    /// Share of new traces exported (`--otlp-sample-ratio`); callers' decisions are followed.
    pub sample_ratio: f64,
}

/// Counters (for logs and metrics).
#[derive(Debug, Default)]
pub struct ExporterStats {
    /// Spans the collector accepted.
    pub exported: AtomicU64,
    /// Spans dropped because the queue was full.
    pub dropped: AtomicU64,
    /// Spans lost to failed export calls.
    pub failed: AtomicU64,
}

/// The exporter (cheap to share; [`Exporter::submit`] never blocks).
#[derive(Debug)]
pub struct Exporter {
    tx: mpsc::Sender<Vec<Span>>,
    stop: watch::Sender<bool>,
    sampler: Sampler,
    stats: Arc<ExporterStats>,
    endpoint: String,
}

/// `key=value,key2=value2` (Argo CD's `--otlp-headers`, a string-to-string map).
pub fn parse_headers(s: &str) -> Result<Vec<(String, String)>, crate::OtlpError> {
    s.split(',')
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .map(header)
        .collect()
}

/// [`parse_headers`], keeping the valid pairs and returning the malformed ones apart (Argo CD
/// warns about those and goes on).
pub fn parse_headers_lenient(s: &str) -> (Vec<(String, String)>, Vec<String>) {
    split_lenient(s, header)
}

/// [`parse_attrs`], keeping the valid attributes and returning the malformed ones apart.
pub fn parse_attrs_lenient(s: &str) -> (Vec<(String, Value)>, Vec<String>) {
    split_lenient(s, attr)
}

fn split_lenient<T>(
    s: &str,
    one: impl Fn(&str) -> Result<T, crate::OtlpError>,
) -> (Vec<T>, Vec<String>) {
    let (mut good, mut bad) = (Vec::new(), Vec::new());
    for p in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        match one(p) {
            Ok(v) => good.push(v),
            Err(_) => bad.push(p.to_owned()),
        }
    }
    (good, bad)
}

pub(crate) fn header(p: &str) -> Result<(String, String), crate::OtlpError> {
    let (k, v) = p
        .split_once('=')
        .ok_or_else(|| crate::OtlpError::Header(p.to_owned()))?;
    let k = k.trim().to_ascii_lowercase();
    // Valid gRPC metadata, checked once here rather than on every export.
    MetadataKey::<tonic::metadata::Ascii>::from_bytes(k.as_bytes())
        .map_err(|_| crate::OtlpError::Header(p.to_owned()))?;
    MetadataValue::<tonic::metadata::Ascii>::try_from(v.trim())
        .map_err(|_| crate::OtlpError::Header(p.to_owned()))?;
    Ok((k, v.trim().to_owned()))
}

/// `key:value,key2:value2` (Argo CD's `--otlp-attrs`); the value may itself contain `:`.
pub fn parse_attrs(s: &str) -> Result<Vec<(String, Value)>, crate::OtlpError> {
    s.split(',')
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .map(attr)
        .collect()
}

fn attr(p: &str) -> Result<(String, Value), crate::OtlpError> {
    match p.split_once(':') {
        Some((k, v)) if !k.trim().is_empty() => {
            Ok((k.trim().to_owned(), Value::Str(v.trim().to_owned())))
        }
        _ => Err(crate::OtlpError::Attr(p.to_owned())),
    }
}

fn endpoint(address: &str, insecure: bool) -> Result<Endpoint, crate::OtlpError> {
    let bad = |reason: String| crate::OtlpError::Address {
        address: address.to_owned(),
        reason,
    };
    let url = if address.contains("://") {
        address.to_owned()
    } else if insecure {
        format!("http://{address}")
    } else {
        format!("https://{address}")
    };
    let ep = Endpoint::from_shared(url.clone()).map_err(|e| bad(e.to_string()))?;
    if ep.uri().host().is_none() {
        return Err(bad("no host (expected host:port)".into()));
    }
    let ep = ep
        .connect_timeout(Duration::from_secs(5))
        .timeout(EXPORT_TIMEOUT);
    if url.starts_with("https://") {
        ep.tls_config(ClientTlsConfig::new().with_native_roots())
            .map_err(|e| crate::OtlpError::Tls(e.to_string()))
    } else if url.starts_with("http://") {
        Ok(ep)
    } else {
        Err(bad("the scheme must be http or https".into()))
    }
}

impl Exporter {
    /// Check the configuration and make the exporter and the task that sends its spans (run
    /// it inside a Tokio runtime: [`ExportTask::run`]). Nothing connects yet: a collector
    /// that is not up is tried at each export.
    pub fn new(cfg: ExporterConfig) -> Result<(Self, ExportTask), crate::OtlpError> {
        if !(0.0..=1.0).contains(&cfg.sample_ratio) || cfg.sample_ratio.is_nan() {
            return Err(crate::OtlpError::Ratio(cfg.sample_ratio));
        }
        let ep = endpoint(&cfg.address, cfg.insecure)?;
        let endpoint_text = ep.uri().to_string();
        let mut headers = MetadataMap::new();
        for (k, v) in &cfg.headers {
            let (Ok(k), Ok(v)) = (
                MetadataKey::from_bytes(k.as_bytes()),
                MetadataValue::try_from(v.as_str()),
            ) else {
                return Err(crate::OtlpError::Header(format!("{k}={v}")));
            };
            headers.insert(k, v);
        }
        let resource = wire::Resource {
            attributes: cfg.resource.iter().map(|(k, v)| key_value(k, v)).collect(),
        };
        let (tx, rx) = mpsc::channel(QUEUE);
        let (stop, stop_rx) = watch::channel(false);
        let stats = Arc::new(ExporterStats::default());
        let task = ExportTask {
            endpoint: ep,
            rx,
            stop: stop_rx,
            headers,
            resource,
            scope: wire::InstrumentationScope {
                name: cfg.scope.0.clone(),
                version: cfg.scope.1.clone(),
            },
            stats: stats.clone(),
            endpoint_text: endpoint_text.clone(),
        };
        Ok((
            Self {
                tx,
                stop,
                sampler: Sampler::new(cfg.sample_ratio),
                stats,
                endpoint: endpoint_text,
            },
            task,
        ))
    }

    /// Whether a request with this caller (and new trace ID) is exported.
    pub fn sampled(&self, parent: Option<&Parent>, trace_id: TraceId) -> bool {
        self.sampler.sampled(parent, trace_id)
    }

    /// Queue one request's spans; a full queue drops them (counted), never waits.
    pub fn submit(&self, spans: Vec<Span>) {
        let n = spans.len() as u64;
        if self.tx.try_send(spans).is_err() {
            self.stats.dropped.fetch_add(n, Ordering::Relaxed);
        }
    }

    /// Counters.
    pub fn stats(&self) -> &ExporterStats {
        &self.stats
    }

    /// The collector's URL (for logs).
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// Send what is queued, within `grace`, and stop (`task`: the spawned [`ExportTask::run`]).
    pub async fn shutdown(&self, task: tokio::task::JoinHandle<()>, grace: Duration) {
        let _ = self.stop.send(true);
        let _ = tokio::time::timeout(grace, task).await;
    }
}

/// The task that batches and sends spans.
#[derive(Debug)]
pub struct ExportTask {
    endpoint: Endpoint,
    rx: mpsc::Receiver<Vec<Span>>,
    stop: watch::Receiver<bool>,
    headers: MetadataMap,
    resource: wire::Resource,
    scope: wire::InstrumentationScope,
    stats: Arc<ExporterStats>,
    endpoint_text: String,
}

struct Sender {
    client: TraceServiceClient<tonic::transport::Channel>,
    headers: MetadataMap,
    resource: wire::Resource,
    scope: wire::InstrumentationScope,
    stats: Arc<ExporterStats>,
    endpoint: String,
    last_warning: Option<Instant>,
}

impl ExportTask {
    /// Batch and send until [`Exporter::shutdown`], then send what is left.
    pub async fn run(self) {
        let ExportTask {
            endpoint,
            mut rx,
            mut stop,
            headers,
            resource,
            scope,
            stats,
            endpoint_text,
        } = self;
        let mut sender = Sender {
            client: TraceServiceClient::new(endpoint.connect_lazy()),
            headers,
            resource,
            scope,
            stats,
            endpoint: endpoint_text,
            last_warning: None,
        };
        let mut buf: Vec<Span> = Vec::new();
        let mut tick = tokio::time::interval(FLUSH_EVERY);
        loop {
            tokio::select! {
                m = rx.recv() => match m {
                    Some(spans) => {
                        buf.extend(spans);
                        if buf.len() >= MAX_BATCH {
                            sender.send(&mut buf).await;
                        }
                    }
                    None => break,
                },
                _ = tick.tick() => {
                    if !buf.is_empty() {
                        sender.send(&mut buf).await;
                    }
                }
                _ = stop.changed() => break,
            }
        }
        while let Ok(spans) = rx.try_recv() {
            buf.extend(spans);
        }
        sender.send(&mut buf).await;
    }
}

impl Sender {
    async fn send(&mut self, buf: &mut Vec<Span>) {
        while !buf.is_empty() {
            let batch: Vec<Span> = buf.drain(..buf.len().min(MAX_BATCH)).collect();
            let n = batch.len() as u64;
            let body = wire::ExportTraceServiceRequest {
                resource_spans: vec![wire::ResourceSpans {
                    resource: Some(self.resource.clone()),
                    scope_spans: vec![wire::ScopeSpans {
                        scope: Some(self.scope.clone()),
                        spans: batch.iter().map(Span::to_wire).collect(),
                    }],
                    schema_url: String::new(),
                }],
            };
            let mut req = tonic::Request::new(body);
            *req.metadata_mut() = self.headers.clone();
            req.set_timeout(EXPORT_TIMEOUT);
            let out = tokio::time::timeout(EXPORT_TIMEOUT, self.client.export(req)).await;
            let failure = match out {
                Ok(Ok(resp)) => {
                    let rejected = resp
                        .get_ref()
                        .partial_success
                        .as_ref()
                        .map_or(0, |p| u64::try_from(p.rejected_spans).unwrap_or(0));
                    self.stats
                        .exported
                        .fetch_add(n.saturating_sub(rejected), Ordering::Relaxed);
                    (rejected > 0).then(|| format!("the collector rejected {rejected} spans"))
                }
                Ok(Err(status)) => Some(format!("{:?}: {}", status.code(), status.message())),
                Err(_) => Some(format!("no answer in {} s", EXPORT_TIMEOUT.as_secs())),
            };
            if let Some(why) = failure {
                self.stats.failed.fetch_add(n, Ordering::Relaxed);
                if self.last_warning.is_none_or(|t| t.elapsed() >= WARN_EVERY) {
                    self.last_warning = Some(Instant::now());
                    tracing::warn!(
                        endpoint = %self.endpoint,
                        spans = n,
                        error = %why,
                        lost_total = self.stats.failed.load(Ordering::Relaxed),
                        "OpenTelemetry export failed (spans dropped; logged at most once a minute)"
                    );
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_parse_as_argo_cd_reads_them() {
        assert_eq!(
            parse_headers("X-Team=cd, authorization=Bearer t").expect("ok"),
            vec![
                ("x-team".to_owned(), "cd".to_owned()),
                ("authorization".to_owned(), "Bearer t".to_owned())
            ]
        );
        assert!(parse_headers("").expect("empty").is_empty());
        let (good, bad) = parse_headers_lenient("a=1,novalue,b=2");
        assert_eq!(good.len(), 2);
        assert_eq!(bad, ["novalue"]);
        let (good, bad) = parse_attrs_lenient("env:prod,junk");
        assert_eq!((good.len(), bad), (1, vec!["junk".to_owned()]));
        assert!(matches!(
            parse_headers("novalue"),
            Err(crate::OtlpError::Header(_))
        ));
        assert_eq!(
            parse_attrs("env:prod,url:http://x:1").expect("ok"),
            vec![
                ("env".to_owned(), Value::from("prod")),
                ("url".to_owned(), Value::from("http://x:1"))
            ]
        );
        assert!(matches!(
            parse_attrs("bare"),
            Err(crate::OtlpError::Attr(_))
        ));
    }

    #[test]
    fn addresses_as_argo_cd_takes_them() {
        assert_eq!(
            endpoint("collector:4317", true)
                .expect("ok")
                .uri()
                .to_string(),
            "http://collector:4317/"
        );
        assert!(endpoint("collector:4317", false).is_ok());
        assert!(endpoint("ftp://collector:4317", true).is_err());
        assert!(endpoint("", true).is_err());
    }

    #[tokio::test]
    async fn a_full_queue_drops_and_counts_instead_of_waiting() {
        // Nothing listens on port 9 (discard); every export fails, slowly or at once.
        let (ex, task) = Exporter::new(ExporterConfig {
            address: "127.0.0.1:9".into(),
            insecure: true,
            headers: vec![],
            resource: vec![],
            scope: ("t".into(), "0".into()),
            sample_ratio: 1.0,
        })
        .expect("start");
        let span = || Span {
            trace_id: TraceId::random(),
            span_id: crate::SpanId::random(),
            parent: None,
            name: "x".into(),
            kind: crate::Kind::Internal,
            start: std::time::SystemTime::now(),
            end: std::time::SystemTime::now(),
            attributes: vec![],
            status: crate::SpanStatus::Unset,
        };
        // On this single-threaded runtime the exporter task cannot run until the test awaits:
        // a submit that waited for room would hang here.
        for _ in 0..(QUEUE * 3) {
            ex.submit(vec![span()]);
        }
        assert!(ex.stats().dropped.load(Ordering::Relaxed) >= QUEUE as u64);
        ex.shutdown(tokio::spawn(task.run()), Duration::from_secs(15))
            .await;
        assert_eq!(ex.stats().exported.load(Ordering::Relaxed), 0);
    }
}
