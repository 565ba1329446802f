//! OpenTelemetry traces over OTLP/gRPC, with nothing of Argo CD or the jail in it: the W3C
//! `traceparent` a caller sends ([`Parent`]), the sampling decision ([`Sampler`]), finished
//! spans ([`Span`]) and a bounded, batching exporter ([`Exporter`]) that never blocks the
//! request path and never grows without bound when the collector is slow or gone.
#![forbid(unsafe_code)]

mod context;
mod env;
mod export;
mod span;

pub use context::{Parent, Sampler, SpanId, TraceId};
pub use env::OtelEnv;
pub use export::{
    ExportTask, Exporter, ExporterConfig, ExporterStats, parse_attrs, parse_attrs_lenient,
    parse_headers, parse_headers_lenient,
};
pub use span::{Kind, Span, SpanStatus, Value};

/// The OTLP wire types (a subset, see `proto/otlp_trace.proto`): the client the exporter uses
/// and the server half a test collector uses.
#[allow(
    missing_docs,
    missing_debug_implementations,
    unused_qualifications,
    clippy::all
)]
pub mod wire {
    tonic::include_proto!("opentelemetry.proto.collector.trace.v1");
}

/// What can go wrong setting up export.
#[derive(Debug, thiserror::Error)]
pub enum OtlpError {
    /// The collector address is not usable.
    #[error("--otlp-address {address:?}: {reason}")]
    Address {
        /// As given.
        address: String,
        /// Why.
        reason: String,
    },
    /// `--otlp-headers` is not `key=value,…`.
    #[error("--otlp-headers: {0:?} is not key=value (a comma-separated list of them)")]
    Header(String),
    /// `--otlp-attrs` is not `key:value,…`.
    #[error("--otlp-attrs: {0:?} is not key:value (a comma-separated list of them)")]
    Attr(String),
    /// `--otlp-sample-ratio` outside 0..=1.
    #[error("--otlp-sample-ratio: {0} is not between 0 and 1")]
    Ratio(f64),
    /// TLS set-up for `--otlp-insecure=false`.
    #[error("--otlp-insecure=false: TLS to the collector: {0}")]
    Tls(String),
}
