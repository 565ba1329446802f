//! The test collector: an OTLP/HTTP receiver built on the OpenTelemetry project's own
//! protobuf bindings (`tests/fixtures/otlp_collector.py`, `scripts/setup`).

use std::time::{Duration, Instant};

use serde_json::Value;

/// The test collector (the OpenTelemetry project's own OTLP bindings, `scripts/setup`): its
/// port, and the spans it has received so far.
pub struct Collector {
    child: std::process::Child,
    pub port: u16,
    pub spans: std::sync::Arc<std::sync::Mutex<Vec<Value>>>,
}

impl Collector {
    pub fn start() -> Self {
        use std::io::BufRead;
        let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/otlp_collector.py");
        let mut child = std::process::Command::new("/usr/bin/python3")
            .arg(script)
            .env("PYTHONPATH", "/opt/cmp-warden-tools/otlp-python")
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("start the OTLP collector (scripts/setup installs opentelemetry-proto)");
        let mut lines = std::io::BufReader::new(child.stdout.take().expect("stdout")).lines();
        let port = lines
            .next()
            .and_then(Result::ok)
            .and_then(|l| l.trim().parse().ok())
            .expect("the collector prints its port");
        let spans = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let sink = spans.clone();
        std::thread::spawn(move || {
            for l in lines.map_while(Result::ok) {
                let v: Value = serde_json::from_str(&l).expect("span line is JSON");
                sink.lock().expect("lock").push(v);
            }
        });
        Self { child, port, spans }
    }

    /// The spans of `trace_id` once its root span has arrived (export is batched: ≤ 1 s).
    pub fn trace(&self, trace_id: &str) -> Vec<Value> {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let of: Vec<Value> = self
                .spans
                .lock()
                .expect("lock")
                .iter()
                .filter(|s| s["traceId"] == trace_id)
                .cloned()
                .collect();
            if of.iter().any(|s| s["kind"] == 2) || Instant::now() > deadline {
                return of;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Collector {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
