//! W3C Trace Context (`traceparent`) and the parent-based, trace-ID-ratio sampler the Go SDK
//! applies by default.

use std::fmt;

/// A 16-byte trace ID (never all zero).
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct TraceId(pub [u8; 16]);

/// An 8-byte span ID (never all zero).
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct SpanId(pub [u8; 8]);

/// Random bytes, never all zero (an all-zero ID is invalid). The OS's generator, not a v4
/// UUID: a UUID fixes six bits, and the sampler reads the ID's low bits.
fn random_id<const N: usize>() -> [u8; N] {
    let mut b = [0u8; N];
    while b == [0u8; N] {
        if getrandom::fill(&mut b).is_err() {
            // No OS randomness: unique enough for tracing, never a security value.
            let t = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(1, |d| d.as_nanos())
                .to_le_bytes();
            for (i, x) in b.iter_mut().enumerate() {
                *x = t[i % t.len()] ^ (i as u8).wrapping_mul(31);
            }
        }
    }
    b
}

impl TraceId {
    /// A random trace ID.
    pub fn random() -> Self {
        Self(random_id())
    }
}

impl SpanId {
    /// A random span ID.
    pub fn random() -> Self {
        Self(random_id())
    }
}

fn hex(bytes: &[u8], f: &mut fmt::Formatter<'_>) -> fmt::Result {
    bytes.iter().try_for_each(|b| write!(f, "{b:02x}"))
}

impl fmt::Display for TraceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        hex(&self.0, f)
    }
}
impl fmt::Debug for TraceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        hex(&self.0, f)
    }
}
impl fmt::Display for SpanId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        hex(&self.0, f)
    }
}
impl fmt::Debug for SpanId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        hex(&self.0, f)
    }
}

/// The caller's span, from its `traceparent` header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Parent {
    /// The trace every span of the request joins.
    pub trace_id: TraceId,
    /// The caller's span: the parent of the request's root span.
    pub span_id: SpanId,
    /// The caller's sampled flag.
    pub sampled: bool,
}

fn unhex<const N: usize>(s: &str) -> Option<[u8; N]> {
    if s.len() != 2 * N || !s.bytes().all(|c| matches!(c, b'0'..=b'9' | b'a'..=b'f')) {
        return None;
    }
    let mut out = [0u8; N];
    for (i, o) in out.iter_mut().enumerate() {
        *o = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(out)
}

impl Parent {
    /// Parse `version-traceid-spanid-flags` as W3C Trace Context level 1 defines it: lower-case
    /// hex only, version `ff` and all-zero IDs invalid, version `00` exactly four fields; a
    /// later version may append fields, which are ignored. Invalid: `None` (a new trace starts).
    pub fn from_traceparent(v: &str) -> Option<Self> {
        let v = v.trim();
        let mut parts = v.split('-');
        let version = unhex::<1>(parts.next()?)?[0];
        let trace_id = unhex::<16>(parts.next()?)?;
        let span_id = unhex::<8>(parts.next()?)?;
        let flags = unhex::<1>(parts.next()?)?[0];
        if version == 0xff || (version == 0 && parts.next().is_some()) {
            return None;
        }
        if trace_id == [0; 16] || span_id == [0; 8] {
            return None;
        }
        Some(Self {
            trace_id: TraceId(trace_id),
            span_id: SpanId(span_id),
            sampled: flags & 1 == 1,
        })
    }

    /// The header value for a child span `span_id` of this trace.
    pub fn traceparent(trace_id: TraceId, span_id: SpanId, sampled: bool) -> String {
        format!("00-{trace_id}-{span_id}-{:02x}", u8::from(sampled))
    }
}

/// Parent-based sampling with a trace-ID ratio for new traces (the OpenTelemetry SDK's
/// `ParentBased(TraceIDRatioBased(ratio))`, which Argo CD's `--otlp-sample-ratio` configures):
/// a caller's decision is followed, so a trace is never half exported.
#[derive(Debug, Clone, Copy)]
pub struct Sampler {
    bound: u64,
}

impl Sampler {
    /// `ratio` in 0..=1 (checked by the exporter's configuration).
    pub fn new(ratio: f64) -> Self {
        // The upper bound over the trace ID's low 63 bits, as the Go SDK computes it.
        let bound = if ratio >= 1.0 {
            u64::MAX
        } else if ratio <= 0.0 {
            0
        } else {
            (ratio * (1u64 << 63) as f64) as u64
        };
        Self { bound }
    }

    /// Whether the request's spans are exported.
    pub fn sampled(&self, parent: Option<&Parent>, trace_id: TraceId) -> bool {
        if let Some(p) = parent {
            return p.sampled;
        }
        if self.bound == u64::MAX {
            return true;
        }
        let low = u64::from_be_bytes(trace_id.0[8..].try_into().unwrap_or([0; 8])) >> 1;
        low < self.bound
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn traceparent_as_w3c_defines_it() {
        let p = Parent::from_traceparent("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
            .expect("valid");
        assert_eq!(p.trace_id.to_string(), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(p.span_id.to_string(), "00f067aa0ba902b7");
        assert!(p.sampled);
        assert_eq!(
            Parent::traceparent(p.trace_id, p.span_id, true),
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
        );
        let unsampled =
            Parent::from_traceparent("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00");
        assert_eq!(unsampled.map(|p| p.sampled), Some(false));
        // A later version may add fields.
        assert!(
            Parent::from_traceparent(
                "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra"
            )
            .is_some()
        );
        for bad in [
            "",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-1",
        ] {
            assert_eq!(Parent::from_traceparent(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn the_sampler_follows_the_parent_and_otherwise_the_ratio() {
        let never = Sampler::new(0.0);
        let always = Sampler::new(1.0);
        let half = Sampler::new(0.5);
        let id = |b: u8| TraceId([b; 16]);
        let sampled = Parent {
            trace_id: id(1),
            span_id: SpanId([1; 8]),
            sampled: true,
        };
        let unsampled = Parent {
            sampled: false,
            ..sampled
        };
        assert!(never.sampled(Some(&sampled), id(1)));
        assert!(!always.sampled(Some(&unsampled), id(1)));
        assert!(always.sampled(None, id(0xff)));
        assert!(!never.sampled(None, id(0)));
        // The low 63 bits against half their range.
        assert!(half.sampled(None, id(0x10)));
        assert!(!half.sampled(None, id(0xf0)));
        let n = (0..2000)
            .filter(|_| half.sampled(None, TraceId::random()))
            .count();
        assert!((800..1200).contains(&n), "{n} of 2000 sampled at 0.5");
    }
}
