//! A request's OpenTelemetry trace. The root span joins the caller's trace from its
//! `traceparent` metadata (the W3C propagation Argo CD's gRPC clients use); its children are
//! built, once the request is finished, from what the service timed and the jail recorded —
//! in one place ([`RequestTrace::spans`]), so no span can disagree with the audit event.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use otlp::{Kind, Parent, Span, SpanId, SpanStatus, TraceId, Value};
use vocab::record::RunRecord;
use vocab::request::Operation;

/// The gRPC service every CMP span names (as the OpenTelemetry gRPC instrumentation does).
const SERVICE: &str = "plugin.ConfigManagementPluginService";

/// A traced request, from its first message on.
#[derive(Debug, Clone)]
pub struct RequestTrace {
    trace_id: TraceId,
    root: SpanId,
    parent: Option<SpanId>,
    start: SystemTime,
}

/// When the service saw the request's stages end.
#[derive(Debug, Clone, Copy, Default)]
pub struct Timings {
    /// The archive stream was received in full (or given up on).
    pub received: Option<SystemTime>,
    /// The runner's result arrived.
    pub answered: Option<SystemTime>,
}

/// How the request ended, as the client was told.
#[derive(Debug, Clone, Copy)]
pub struct Ending<'a> {
    /// gRPC status code.
    pub code: tonic::Code,
    /// The error message, if any.
    pub message: Option<&'a str>,
    /// When.
    pub at: SystemTime,
}

fn at(unix_nanos: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_nanos(unix_nanos)
}

/// The caller's trace ID from its `traceparent`, whether or not this server exports traces:
/// the audit event carries it, so that the event is found from the repo-server's trace.
pub fn caller_trace_id(traceparent: Option<&str>) -> Option<String> {
    traceparent
        .and_then(Parent::from_traceparent)
        .map(|p| p.trace_id.to_string())
}

impl RequestTrace {
    /// Start tracing a request, when an exporter is configured and the sampler (which follows
    /// the caller's decision) says so.
    pub fn begin(exporter: Option<&otlp::Exporter>, traceparent: Option<&str>) -> Option<Self> {
        let exporter = exporter?;
        let parent = traceparent.and_then(Parent::from_traceparent);
        let trace_id = parent.map_or_else(TraceId::random, |p| p.trace_id);
        exporter.sampled(parent.as_ref(), trace_id).then(|| Self {
            trace_id,
            root: SpanId::random(),
            parent: parent.map(|p| p.span_id),
            start: SystemTime::now(),
        })
    }

    /// The trace ID (the audit event carries it, to find the trace from the event).
    pub fn trace_id(&self) -> String {
        self.trace_id.to_string()
    }

    fn child(
        &self,
        name: &str,
        (start, end): (SystemTime, SystemTime),
        attributes: Vec<(&'static str, Value)>,
        status: SpanStatus,
    ) -> Span {
        Span {
            trace_id: self.trace_id,
            span_id: SpanId::random(),
            parent: Some(self.root),
            name: name.to_owned(),
            kind: Kind::Internal,
            start,
            end,
            attributes,
            status,
        }
    }

    /// The request's spans: the RPC (server kind, the caller's child), then receiving the
    /// stream, extracting it, each command with its phase, and the reply.
    pub fn spans(
        &self,
        op: Operation,
        app: &str,
        request_id: &str,
        timings: Timings,
        record: &RunRecord,
        end: Ending<'_>,
    ) -> Vec<Span> {
        let mut out = Vec::with_capacity(4 + record.commands.len());
        let failed = end.code != tonic::Code::Ok;
        out.push(Span {
            trace_id: self.trace_id,
            span_id: self.root,
            parent: self.parent,
            name: format!("{SERVICE}/{}", op.rpc_name()),
            kind: Kind::Server,
            start: self.start,
            end: end.at,
            attributes: vec![
                ("rpc.system", "grpc".into()),
                ("rpc.service", SERVICE.into()),
                ("rpc.method", op.rpc_name().into()),
                ("rpc.grpc.status_code", i64::from(end.code as i32).into()),
                ("argocd.app.name", app.into()),
                ("cmp.request_id", request_id.into()),
            ],
            status: if failed {
                SpanStatus::Error(end.message.unwrap_or_default().to_owned())
            } else {
                SpanStatus::Unset
            },
        });
        if let Some(received) = timings.received {
            out.push(self.child(
                "cmp.ReceiveRepoStream",
                (self.start, received),
                vec![],
                SpanStatus::Unset,
            ));
        }
        if let Some(a) = record.archive.as_ref().filter(|a| a.started_unix_nanos > 0) {
            let start = at(a.started_unix_nanos);
            let mut attrs = vec![
                (
                    "cmp.archive.entries",
                    i64::try_from(a.entries).unwrap_or(i64::MAX).into(),
                ),
                (
                    "cmp.archive.file_bytes",
                    i64::try_from(a.file_bytes).unwrap_or(i64::MAX).into(),
                ),
            ];
            // With the tree cache: `hit` (nothing extracted: a zero-length span), `filled`.
            if let Some(t) = record.tree_cache {
                attrs.push(("cmp.tree_cache", t.as_str().into()));
            }
            out.push(self.child(
                "cmp.Untgz",
                (start, start + Duration::from_micros(a.duration_us)),
                attrs,
                SpanStatus::Unset,
            ));
        }
        for c in record.commands.iter().filter(|c| c.started_unix_nanos > 0) {
            let start = at(c.started_unix_nanos);
            let mut attributes = vec![
                ("cmp.phase", Value::from(c.phase.as_str())),
                (
                    "process.executable.name",
                    c.argv.first().map_or("", String::as_str).into(),
                ),
            ];
            if let Some(code) = c.exit_code {
                attributes.push(("process.exit.code", i64::from(code).into()));
            }
            if let Some(sig) = &c.signal {
                attributes.push(("cmp.signal", sig.as_str().into()));
            }
            if let Some(limit) = c.ended_by {
                attributes.push(("cmp.ended_by", limit.as_str().into()));
            }
            let status = match (c.exit_code, &c.signal) {
                (Some(0), None) => SpanStatus::Unset,
                (Some(code), _) => SpanStatus::Error(format!("exit status {code}")),
                (None, Some(sig)) => SpanStatus::Error(format!("killed by {sig}")),
                (None, None) => SpanStatus::Error("did not finish".into()),
            };
            out.push(self.child(
                "plugin.runCommand",
                (start, start + Duration::from_millis(c.duration_ms)),
                attributes,
                status,
            ));
        }
        if let Some(answered) = timings.answered {
            out.push(self.child("cmp.reply", (answered, end.at), vec![], SpanStatus::Unset));
        }
        out
    }
}
