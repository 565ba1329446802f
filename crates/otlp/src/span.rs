//! A finished span, and its OTLP form.

use std::time::{SystemTime, UNIX_EPOCH};

use crate::context::{SpanId, TraceId};
use crate::wire;

/// A span's kind (the two this server produces).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// The server side of an RPC (the request's root).
    Server,
    /// Work inside the request.
    Internal,
}

/// How a span ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SpanStatus {
    /// Not set (OpenTelemetry's default for work that did not fail).
    Unset,
    /// Failed, with the message.
    Error(String),
}

/// An attribute value.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    /// Text.
    Str(String),
    /// An integer.
    Int(i64),
    /// A flag.
    Bool(bool),
}

impl From<&str> for Value {
    fn from(s: &str) -> Self {
        Self::Str(s.to_owned())
    }
}
impl From<String> for Value {
    fn from(s: String) -> Self {
        Self::Str(s)
    }
}
impl From<i64> for Value {
    fn from(n: i64) -> Self {
        Self::Int(n)
    }
}
impl From<bool> for Value {
    fn from(b: bool) -> Self {
        Self::Bool(b)
    }
}

/// A finished span.
#[derive(Debug, Clone)]
pub struct Span {
    /// Its trace.
    pub trace_id: TraceId,
    /// Its ID.
    pub span_id: SpanId,
    /// Its parent (`None`: a root span).
    pub parent: Option<SpanId>,
    /// Its name.
    pub name: String,
    /// Its kind.
    pub kind: Kind,
    /// Start.
    pub start: SystemTime,
    /// End (never before the start).
    pub end: SystemTime,
    /// Attributes.
    pub attributes: Vec<(&'static str, Value)>,
    /// Outcome.
    pub status: SpanStatus,
}

fn nanos(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}

/// An OTLP attribute.
pub(crate) fn key_value(key: &str, v: &Value) -> wire::KeyValue {
    use wire::any_value::Value as V;
    wire::KeyValue {
        key: key.to_owned(),
        value: Some(wire::AnyValue {
            value: Some(match v {
                Value::Str(s) => V::StringValue(s.clone()),
                Value::Int(n) => V::IntValue(*n),
                Value::Bool(b) => V::BoolValue(*b),
            }),
        }),
    }
}

impl Span {
    /// The OTLP message.
    pub(crate) fn to_wire(&self) -> wire::Span {
        let start = nanos(self.start);
        wire::Span {
            trace_id: self.trace_id.0.to_vec(),
            span_id: self.span_id.0.to_vec(),
            trace_state: String::new(),
            parent_span_id: self.parent.map(|p| p.0.to_vec()).unwrap_or_default(),
            name: self.name.clone(),
            kind: match self.kind {
                Kind::Server => wire::span::SpanKind::Server,
                Kind::Internal => wire::span::SpanKind::Internal,
            } as i32,
            start_time_unix_nano: start,
            end_time_unix_nano: nanos(self.end).max(start),
            attributes: self
                .attributes
                .iter()
                .map(|(k, v)| key_value(k, v))
                .collect(),
            status: Some(match &self.status {
                SpanStatus::Unset => wire::Status::default(),
                SpanStatus::Error(m) => wire::Status {
                    message: m.clone(),
                    code: wire::status::StatusCode::Error as i32,
                },
            }),
            // Sampled (only sampled spans are exported), parent remote-ness unknown.
            flags: 1,
        }
    }
}
