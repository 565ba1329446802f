//! Shared oracles for the fuzz targets.
//!
//! Archives: every input is extracted into a root nested in a sentinel directory. Whatever the
//! verdict: no panic, the sentinel holds only the root and nothing around it changed, and
//! `check` (which writes nothing) reaches the same verdict with the same reason. Accepted: the
//! tree passes the containment oracle (no special files, policy modes, every symlink resolves
//! beneath the root) and holds exactly what the archive says — every file's bytes, every
//! link's target, every directory — as an independent reader (the `tar` crate) sees it.
//! Refused: the root is empty.

use archive::{Limits, Options, Resolver};
use testkit::{Sentinel, check_contained};

/// Small limits so each run is fast; the logic under test is the same.
pub fn options() -> Options {
    Options {
        limits: Limits {
            compressed_bytes: 1 << 20,
            extracted_bytes: 16 << 20,
            file_bytes: 4 << 20,
            entries: 2000,
            ..Limits::default()
        },
        preserve_file_mode: true,
        ..Options::default()
    }
}

/// Run one tar.gz through the pipeline and the oracle.
pub fn run_tgz(tgz: &[u8]) {
    let s = Sentinel::new();
    let fd = archive::DirWriter::open_root(&s.root).expect("open root");
    let mut w = archive::DirWriter::new(fd, Resolver::Auto)
        .expect("read root")
        .expect("empty root");
    let extracted = archive::extract(tgz, &mut w, &options());
    let checked = archive::check(tgz, &options());
    match (&extracted, &checked) {
        (Ok(a), Ok(b)) => {
            assert_eq!(
                (a.entries, a.file_bytes, a.sha256_hex()),
                (b.entries, b.file_bytes, b.sha256_hex()),
                "check and extract disagree on what was accepted"
            );
            if let Err(e) = check_contained(&s.root) {
                panic!("accepted archive escaped: {e}");
            }
            same_content(tgz, &s.root);
        }
        (Err(a), Err(b)) => {
            assert_eq!(
                a.to_string(),
                b.to_string(),
                "check and extract refuse differently"
            );
            s.assert_root_empty();
        }
        (a, b) => panic!("check and extract disagree: extract {a:?}, check {b:?}"),
    }
    s.assert_outside_untouched();
}

/// The extracted tree holds what an independent reader finds in the archive.
fn same_content(tgz: &[u8], root: &std::path::Path) {
    use std::io::Read;
    let gz = flate2::read::GzDecoder::new(tgz);
    let mut ar = tar::Archive::new(gz);
    let entries = ar.entries().expect("an accepted archive is readable");
    let mut pax_paths = pax_paths(tgz).into_iter();
    for e in entries {
        let mut e = e.expect("an accepted archive's entries are readable");
        if e.header().entry_type() == tar::EntryType::XGlobalHeader {
            continue;
        }
        let path = match pax_paths.next().flatten() {
            Some(p) => {
                use std::os::unix::ffi::OsStringExt;
                std::path::PathBuf::from(std::ffi::OsString::from_vec(p))
            }
            None => e.path().expect("path").into_owned(),
        };
        let rel: std::path::PathBuf = path
            .components()
            .filter(|c| !matches!(c, std::path::Component::CurDir))
            .collect();
        let on_disk = root.join(&rel);
        match e.header().entry_type() {
            tar::EntryType::Regular => {
                let mut want = Vec::new();
                e.read_to_end(&mut want).expect("data");
                let got = std::fs::read(&on_disk)
                    .unwrap_or_else(|err| panic!("{}: not extracted: {err}", rel.display()));
                assert!(got == want, "{}: content differs", rel.display());
            }
            tar::EntryType::Directory if rel.as_os_str().is_empty() => {}
            tar::EntryType::Directory => {
                assert!(on_disk.is_dir(), "{}: directory missing", rel.display());
            }
            tar::EntryType::Symlink => {
                let want = e.link_name().expect("link").expect("target").into_owned();
                // Every target is read beneath the link's directory and written relative and
                // clean (Argo CD's rule): expect that rewrite, computed independently here.
                let want = rebased(&rel, &want);
                let got = std::fs::read_link(&on_disk)
                    .unwrap_or_else(|err| panic!("{}: link missing: {err}", rel.display()));
                assert_eq!(got, want, "{}: link target differs", rel.display());
            }
            // PAX records are metadata of the next entry.
            _ => {}
        }
    }
}

/// Each member's path from the PAX header before it, if one names it, in member order. Read
/// record by record as Go's archive/tar (Argo CD's reader) does: the `tar` crate splits
/// records at newlines, so a path holding one falls back to the header's name there.
fn pax_paths(tgz: &[u8]) -> Vec<Option<Vec<u8>>> {
    use std::io::Read;
    let mut ar = tar::Archive::new(flate2::read::GzDecoder::new(tgz));
    let mut out = Vec::new();
    let mut pending = None;
    for e in ar.entries().expect("readable").raw(true) {
        let mut e = e.expect("an accepted archive's entries are readable");
        match e.header().entry_type() {
            tar::EntryType::XHeader => {
                let mut data = Vec::new();
                e.read_to_end(&mut data).expect("pax data");
                pending = pax_record(&data, b"path");
            }
            tar::EntryType::XGlobalHeader
            | tar::EntryType::GNULongName
            | tar::EntryType::GNULongLink => {}
            _ => out.push(pending.take()),
        }
    }
    out
}

/// The value of the last `key` record in PAX data (`LEN KEY=VALUE\n`, LEN counting the whole
/// record), as Go's archive/tar parses it.
fn pax_record(mut data: &[u8], key: &[u8]) -> Option<Vec<u8>> {
    let mut found = None;
    while !data.is_empty() {
        let sp = data.iter().position(|b| *b == b' ')?;
        let len: usize = std::str::from_utf8(&data[..sp]).ok()?.parse().ok()?;
        if len <= sp + 1 || len > data.len() || data[len - 1] != b'\n' {
            return found;
        }
        let record = &data[sp + 1..len - 1];
        let eq = record.iter().position(|b| *b == b'=')?;
        if &record[..eq] == key {
            found = Some(record[eq + 1..].to_vec());
        }
        data = &data[len..];
    }
    found
}

/// `Rel(Dir(link), Clean(Join(Dir(link), target)))`, by path
/// components (an accepted archive never climbs above the root here).
fn rebased(link: &std::path::Path, target: &std::path::Path) -> std::path::PathBuf {
    use std::path::{Component, PathBuf};
    let dir: Vec<_> = link
        .parent()
        .map(|p| p.components().collect())
        .unwrap_or_default();
    let mut resolved = dir.clone();
    for c in target.components() {
        match c {
            Component::ParentDir => {
                resolved.pop();
            }
            Component::Normal(_) => resolved.push(c),
            _ => {}
        }
    }
    let common = dir
        .iter()
        .zip(&resolved)
        .take_while(|(a, b)| a == b)
        .count();
    let mut out = PathBuf::new();
    for _ in common..dir.len() {
        out.push("..");
    }
    for c in &resolved[common..] {
        out.push(c);
    }
    if out.as_os_str().is_empty() {
        out.push(".");
    }
    out
}

/// A `PluginConfig` written back as plugin.yaml (a YAML flow mapping, every string
/// double-quoted with YAML escapes), for the round-trip oracle.
pub fn plugin_yaml(c: &plugin::PluginConfig) -> String {
    fn q(s: &str) -> String {
        let mut o = String::from("\"");
        for ch in s.chars() {
            match ch {
                '"' => o.push_str("\\\""),
                '\\' => o.push_str("\\\\"),
                ' '..='~' => o.push(ch),
                c if (c as u32) <= 0xffff => o.push_str(&format!("\\u{:04x}", c as u32)),
                c => o.push_str(&format!("\\U{:08x}", c as u32)),
            }
        }
        o.push('"');
        o
    }
    fn list(v: &[String]) -> String {
        format!(
            "[{}]",
            v.iter().map(|s| q(s)).collect::<Vec<_>>().join(", ")
        )
    }
    fn cmd(c: &plugin::config::Command) -> String {
        format!(
            "{{\"command\": {}, \"args\": {}}}",
            list(&c.command),
            list(&c.args)
        )
    }
    let s = &c.spec;
    let statics: Vec<String> = s
        .parameters
        .static_
        .iter()
        .map(|p| {
            let map: Vec<String> = p.map.iter().map(|(k, v)| format!("{}: {}", q(k), q(v))).collect();
            format!(
                "{{\"name\": {}, \"title\": {}, \"tooltip\": {}, \"required\": {}, \"itemType\": {}, \"collectionType\": {}, \"string\": {}, \"array\": {}, \"map\": {{{}}}}}",
                q(&p.name),
                q(&p.title),
                q(&p.tooltip),
                p.required,
                q(&p.item_type),
                q(&p.collection_type),
                q(&p.string),
                list(&p.array),
                map.join(", ")
            )
        })
        .collect();
    format!(
        "{{\"apiVersion\": {}, \"kind\": {}, \"metadata\": {{\"name\": {}}}, \"spec\": {{\"version\": {}, \"init\": {}, \"generate\": {}, \"discover\": {{\"fileName\": {}, \"find\": {{\"command\": {}, \"args\": {}, \"glob\": {}}}}}, \"parameters\": {{\"static\": [{}], \"dynamic\": {}}}, \"preserveFileMode\": {}, \"provideGitCreds\": {}}}}}",
        q(&c.api_version),
        q(&c.kind),
        q(&c.name),
        q(&s.version),
        cmd(&s.init),
        cmd(&s.generate),
        q(&s.discover.file_name),
        list(&s.discover.find.command.command),
        list(&s.discover.find.command.args),
        q(&s.discover.find.glob),
        statics.join(", "),
        cmd(&s.parameters.dynamic),
        s.preserve_file_mode,
        s.provide_git_creds
    )
}

/// gzip with the fastest level (the compressed form is not what is under test here).
pub fn gzip_fast(data: &[u8]) -> Vec<u8> {
    use std::io::Write;
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    e.write_all(data).expect("vec");
    e.finish().expect("vec")
}

/// A policy file, and a policy directory (the input split at NUL bytes into its files): any
/// text parses or is refused, never panics; a policy that parses is written back (as `policy
/// suggest` writes one) and reads back as the same policy; a directory that loads has a
/// default, and every identity selects one of its policies.
pub fn policy_text(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(p) = policy::Policy::parse(text, None) {
        let _ = p.warnings();
        let again = policy::emit::to_yaml(&p, "seccomp/default.json", &[]);
        let mut back = policy::Policy::parse(&again, None)
            .unwrap_or_else(|e| panic!("the written-back policy does not parse: {e}\n{again}"));
        // The digest is of the file's text, which differs by construction.
        back.sha256.clone_from(&p.sha256);
        assert_eq!(back, p, "round trip changed the policy\n{again}");
    }
    let files: Vec<(String, String)> = text
        .split('\0')
        .enumerate()
        .map(|(i, t)| (format!("p{i}.yaml"), t.to_owned()))
        .collect();
    if files.len() > 1
        && let Ok(set) = policy::PolicySet::from_texts("fuzz", &files, None)
    {
        assert!(!set.policies().is_empty(), "a set without policies");
        let _ = set.default_policy();
        for project in ["", "team-a", "a", "*"] {
            let id = policy::Identity {
                project: Some(project.to_owned()),
                ..policy::Identity::default()
            };
            assert!(
                set.select(&id) < set.policies().len(),
                "selected out of range"
            );
        }
    }
}

/// Paused time: the runtime jumps ahead whenever it idles, so a client that waits (and the
/// server's timeouts) cost no real time.
fn paused_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .expect("runtime")
}

/// The ApplicationSet generator's front door: any bytes as an HTTP/1.1 connection, through
/// the server's own connection handler and the generator service (a static source: nothing
/// runs). Never a panic, never a hang (10 minutes of the runtime's paused clock; libFuzzer's
/// `-timeout` for real time), never a 5xx; every response a JSON error or,
/// only for an authenticated POST to the one path, the parameters.
pub fn appset_connection(data: &[u8]) {
    use std::sync::{Arc, OnceLock};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    static RT: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    static SVC: OnceLock<Arc<server::appset::AppSetService>> = OnceLock::new();
    let rt = RT.get_or_init(paused_runtime);
    let svc = SVC.get_or_init(|| {
        let config = policy::generator::GeneratorConfig::parse(
            "apiVersion: cmp-warden.io/v1alpha1\nkind: AppSetGenerator\nmetadata: {name: fuzz}\nspec:\n  static: [{env: dev}]\n  limits: {bodyBytes: 4Ki, timeoutSeconds: 2, concurrency: 2}\n",
            std::path::Path::new("."),
        )
        .expect("generator config");
        let policy = policy::Policy::default_policy().expect("default policy");
        let plan = supervisor::Plan::new(&policy, &supervisor::Overrides::default(), std::iter::empty());
        Arc::new(server::appset::AppSetService::new(
            config,
            // (Were it asked, its error would be a 500, which the oracle below refuses.)
            Arc::new(server::appset::NoCommands),
            server::auth::BearerToken::new(b"fuzz-token", "fuzz").expect("token"),
            std::env::temp_dir().join("_cmp_appset_fuzz"),
            Arc::new(plan),
            server::audit::AuditSink::file(std::path::Path::new("/dev/null")).expect("sink"),
            Arc::new(server::metrics::Metrics::default()),
        ))
    });
    // A body the fuzzer changed keeps a matching Content-Length (else nearly every mutation
    // is a framing error and the handler behind it is never reached).
    let data = &fix_content_length(data);
    let out = rt.block_on(async {
        let (client, server_side) = tokio::io::duplex(1 << 16);
        let conn = tokio::spawn(server::appset::serve_connection(
            svc.clone(),
            server_side,
            None,
            None,
        ));
        let (mut rd, mut wr) = tokio::io::split(client);
        // As a client would: send, wait for the answers, then close (the server does not
        // answer a request whose connection was half-closed).
        let writer = async {
            let _ = wr.write_all(data).await;
            tokio::time::sleep(std::time::Duration::from_secs(60)).await;
            let _ = wr.shutdown().await;
        };
        let mut out = Vec::new();
        let reader = rd.read_to_end(&mut out);
        let done = tokio::time::timeout(std::time::Duration::from_secs(600), async {
            let ((), read) = tokio::join!(writer, reader);
            let _ = read;
            let _ = conn.await;
        })
        .await;
        assert!(
            done.is_ok(),
            "the connection hung: {:?}",
            String::from_utf8_lossy(data)
        );
        out
    });
    let text = String::from_utf8_lossy(&out);
    for (i, _) in text.match_indices("HTTP/1.1 ") {
        let code: u16 = text[i + 9..]
            .get(..3)
            .and_then(|c| c.parse().ok())
            .unwrap_or(0);
        assert!(
            code == 200 || (400..500).contains(&code) || code == 501 || code == 505,
            "status {code} for {:?}\n{text}",
            String::from_utf8_lossy(data)
        );
        if code == 200 {
            let req = String::from_utf8_lossy(data);
            assert!(
                req.contains(server::appset::PATH) && req.contains("fuzz-token"),
                "200 without the path and token: {req:?}"
            );
            assert!(
                text[i..].contains(r#"{"output":{"parameters":[{"env":"dev"}]}}"#),
                "200 without the static source's parameters: {text}"
            );
        }
    }
}

/// The first request's `Content-Length` set to the length of what follows its head.
fn fix_content_length(data: &[u8]) -> Vec<u8> {
    let Some(end) = data.windows(4).position(|w| w == b"\r\n\r\n") else {
        return data.to_vec();
    };
    let head = String::from_utf8_lossy(&data[..end]);
    let body_len = data.len() - end - 4;
    let mut out = Vec::with_capacity(data.len() + 8);
    for (i, line) in head.split("\r\n").enumerate() {
        if i > 0 {
            out.extend_from_slice(b"\r\n");
        }
        if line.to_ascii_lowercase().starts_with("content-length:") {
            out.extend_from_slice(format!("Content-Length: {body_len}").as_bytes());
        } else {
            out.extend_from_slice(line.as_bytes());
        }
    }
    out.extend_from_slice(&data[end..]);
    out
}

/// The magic checksum a seed's header carries: replaced by the SHA-256 of the body's chunks
/// before the call (else nearly every request fails its integrity check and what lies behind
/// it is never reached).
pub const CHUNKS_SHA256: &str = "sha256-of-the-chunks";

/// The CMP gRPC front door: `data[0]` picks the RPC, the rest is the request's HTTP/2 body as
/// a client would send it (gRPC length-prefixed frames of `AppStreamRequest`, or any bytes).
/// Through the real service, with a runner that only reads the archive: no panic; the call
/// ends (paused clock, within the service's own deadlines); the status is one a client's
/// fault earns (never Internal or Unimplemented; a stream the transport could not read is
/// Unknown, as Argo CD's `error receiving tgz file` is); `Ok` only for a header first and
/// chunks whose SHA-256 it names; every request the runner executed is reclaimed and none
/// stays active.
pub fn grpc_stream(data: &[u8]) {
    use proto::plugin::config_management_plugin_service_server::ConfigManagementPluginService;
    use std::sync::atomic::Ordering;
    use std::sync::{Arc, OnceLock};
    static RT: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    static SVC: OnceLock<(server::service::CmpService, Arc<Counting>)> = OnceLock::new();
    let Some((&rpc, body)) = data.split_first() else {
        return;
    };
    let rt = RT.get_or_init(paused_runtime);
    let (svc, runner) = SVC.get_or_init(|| {
        let loaded = plugin::PluginConfig::parse(
            "apiVersion: argoproj.io/v1alpha1\nkind: ConfigManagementPlugin\nmetadata: {name: fuzz}\nspec:\n  generate: {command: [cat]}\n  discover: {fileName: '*.yaml'}\n",
        )
        .expect("plugin.yaml");
        let set = policy::PolicySet::single(policy::Policy::default_policy().expect("policy"));
        let plans = supervisor::Plans::new(
            &set,
            &supervisor::Overrides::default(),
            std::iter::empty(),
        );
        let runner = Arc::new(Counting::default());
        let svc = server::service::CmpService::new(
            server::service::ServiceConfig {
                config: Arc::new(supervisor::Current::new(server::reload::ConfigSet {
                    plans: Arc::new(plans),
                    plugin: Arc::new(loaded.config),
                })),
                work_dir: std::env::temp_dir().join("_cmp_grpc_fuzz"),
                audit: server::audit::AuditSink::file(std::path::Path::new("/dev/null"))
                    .expect("sink"),
                metrics: Arc::new(server::metrics::Metrics::default()),
                tcp_token: None,
                admission: server::admission::AdmissionConfig::default(),
                tracer: None,
            },
            runner.clone(),
        );
        (svc, runner)
    });
    let (body, valid) = fix_checksums(body);
    let out = rt.block_on(async {
        let streaming = || {
            tonic::Streaming::new_request(
                <tonic_prost::ProstCodec<(), proto::plugin::AppStreamRequest> as tonic::codec::Codec>::decoder(
                    &mut tonic_prost::ProstCodec::default(),
                ),
                http_body_util::Full::new(bytes::Bytes::from(body.clone())),
                None,
                Some(4 << 20),
            )
        };
        let call = async {
            match rpc % 3 {
                0 => svc
                    .generate_manifest(tonic::Request::new(streaming()))
                    .await
                    .map(|_| ()),
                1 => svc
                    .match_repository(tonic::Request::new(streaming()))
                    .await
                    .map(|_| ()),
                _ => svc
                    .get_parameters_announcement(tonic::Request::new(streaming()))
                    .await
                    .map(|_| ()),
            }
        };
        let out = tokio::time::timeout(std::time::Duration::from_secs(3600), call).await;
        // The runner's own thread reclaims after answering: wait for it (real time passes
        // there, so the paused clock is left alone).
        for _ in 0..2000 {
            if runner.executed.load(Ordering::SeqCst) == runner.reclaimed.load(Ordering::SeqCst)
                && svc.active() == 0
            {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        out
    });
    let out = out.unwrap_or_else(|_| panic!("the call hung: {data:?}"));
    if let Err(status) = &out {
        assert!(
            !matches!(
                status.code(),
                tonic::Code::Internal | tonic::Code::Unimplemented
            ),
            "{status:?} for {data:?}"
        );
    }
    assert!(
        out.is_err() || valid,
        "answered Ok without a header first and chunks of its checksum: {data:?}"
    );
    assert_eq!(
        runner.executed.load(Ordering::SeqCst),
        runner.reclaimed.load(Ordering::SeqCst),
        "a request executed but not reclaimed"
    );
    assert_eq!(svc.active(), 0, "a request still active after its answer");
}

/// A runner that reads the whole archive and answers as a plugin would, counting what it
/// executed and reclaimed.
#[derive(Debug, Default)]
struct Counting {
    executed: std::sync::atomic::AtomicUsize,
    reclaimed: std::sync::atomic::AtomicUsize,
}

impl supervisor::Runner for Counting {
    fn execute(
        &self,
        spec: &supervisor::RequestSpec,
        mut input: Box<dyn std::io::Read + Send>,
        _cancel: &supervisor::CancelToken,
    ) -> Result<supervisor::Executed, vocab::request::RequestError> {
        self.executed
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let mut sink = Vec::new();
        std::io::Read::read_to_end(&mut input, &mut sink).map_err(|e| {
            vocab::request::RequestError::internal(format!("reading the archive: {e}"))
        })?;
        Ok(match spec.op() {
            vocab::request::Operation::Match => vocab::request::Outcome::Match {
                supported: true,
                discovery_enabled: true,
            },
            vocab::request::Operation::Parameters => {
                vocab::request::Outcome::Parameters(Vec::new())
            }
            _ => vocab::request::Outcome::Manifests(vec![r#"{"kind":"ConfigMap"}"#.to_owned()]),
        }
        .into())
    }
    fn reclaim(&self, _spec: &supervisor::RequestSpec) {
        self.reclaimed
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }
    fn describe(&self) -> &'static str {
        "fuzz: reads the archive, runs nothing"
    }
}

/// The body with each header's magic checksum ([`CHUNKS_SHA256`]) replaced by the SHA-256 of
/// the chunks (frames that do not decode are kept as they are); and whether it is a request
/// the service may answer `Ok`: well framed, a header first and only then, chunks whose
/// SHA-256 it names.
fn fix_checksums(body: &[u8]) -> (Vec<u8>, bool) {
    use prost::Message;
    use proto::plugin::app_stream_request::Request as R;
    use sha2::Digest;
    // The frames: (compressed flag, message bytes), and whatever trails them.
    let mut frames = Vec::new();
    let mut rest = body;
    while rest.len() >= 5 {
        let len = u32::from_be_bytes([rest[1], rest[2], rest[3], rest[4]]) as usize;
        if rest.len() - 5 < len {
            break;
        }
        frames.push((rest[0], &rest[5..5 + len]));
        rest = &rest[5 + len..];
    }
    let decoded: Vec<Option<proto::plugin::AppStreamRequest>> = frames
        .iter()
        .map(|(flag, m)| {
            (*flag == 0)
                .then(|| proto::plugin::AppStreamRequest::decode(*m).ok())
                .flatten()
        })
        .collect();
    let mut sha = sha2::Sha256::new();
    for m in decoded.iter().flatten() {
        if let Some(R::File(f)) = &m.request {
            sha.update(&f.chunk);
        }
    }
    let hex: String = sha.finalize().iter().map(|b| format!("{b:02x}")).collect();
    let mut out = Vec::with_capacity(body.len());
    for ((flag, raw), m) in frames.iter().zip(&decoded) {
        let fixed = match m {
            Some(proto::plugin::AppStreamRequest {
                request: Some(R::Metadata(h)),
            }) if h.checksum == CHUNKS_SHA256 => {
                let mut h = h.clone();
                h.checksum = hex.clone();
                Some(
                    proto::plugin::AppStreamRequest {
                        request: Some(R::Metadata(h)),
                    }
                    .encode_to_vec(),
                )
            }
            _ => None,
        };
        let msg = fixed.as_deref().unwrap_or(raw);
        out.push(*flag);
        out.extend_from_slice(&(msg.len() as u32).to_be_bytes());
        out.extend_from_slice(msg);
    }
    out.extend_from_slice(rest);
    let header_first = matches!(
        decoded.first(),
        Some(Some(proto::plugin::AppStreamRequest { request: Some(R::Metadata(h)) }))
            if h.checksum == CHUNKS_SHA256 || h.checksum == hex
    );
    // tonic ends a stream cleanly when it ends right after a frame's 5-byte prefix (the prefix
    // consumed, nothing left in its buffer: tonic 0.14 `decode.rs`), as if the frame were not
    // there; any other trailing bytes are an error.
    let ends_cleanly = rest.is_empty() || (rest.len() == 5 && rest[0] == 0);
    let valid = ends_cleanly
        && header_first
        && decoded.iter().skip(1).all(|m| {
            matches!(
                m,
                Some(proto::plugin::AppStreamRequest {
                    request: Some(R::File(_))
                })
            )
        });
    (out, valid)
}

/// `policy suggest`'s input: any audit log (lines of JSON or not) proposes, for the embedded
/// default policy, nothing or a policy that validates, whose profile is JSON; it never lowers
/// a limit when a request did not finish, and never proposes a variable another policy passes.
pub fn suggest_log(data: &[u8]) {
    use std::sync::OnceLock;
    static BASE: OnceLock<(policy::Policy, policy::Policy)> = OnceLock::new();
    let (base, other) = BASE.get_or_init(|| {
        let base = policy::Policy::default_policy().expect("default policy");
        let mut other = base.clone();
        other.name = "other-tenant".into();
        other.env_pass.push("OTHER_TENANTS_TOKEN".into());
        (base, other)
    });
    let text = String::from_utf8_lossy(data);
    let proposed = suggest::propose(
        &text,
        base,
        policy::DEFAULT_POLICY_YAML,
        policy::seccomp::DEFAULT_SECCOMP_JSON,
        "fuzz",
        std::slice::from_ref(other),
    );
    let Some(s) = proposed.unwrap_or_else(|e| panic!("no proposal for the default policy: {e}"))
    else {
        return;
    };
    let (yaml, profile) = s
        .texts("profile.json", policy::DEFAULT_POLICY_YAML)
        .expect("the proposal's texts");
    let dir = std::env::temp_dir().join(format!("_cmp_suggest_fuzz_{}", std::process::id()));
    std::fs::create_dir_all(dir.join("seccomp")).expect("mkdir");
    std::fs::write(dir.join("seccomp/profile.json"), &profile).expect("write profile");
    std::fs::write(dir.join("policy.yaml"), &yaml).expect("write policy");
    let back = policy::Policy::load(&dir.join("policy.yaml"))
        .unwrap_or_else(|e| panic!("the proposal does not validate: {e}\n{yaml}"));
    assert!(
        !back.passes("OTHER_TENANTS_TOKEN"),
        "another policy's variable proposed:\n{yaml}"
    );
    // Read as suggest reads them: a line the event type does not take is no request at all.
    let unfinished = text
        .lines()
        .filter_map(audit_event::AuditEvent::from_line)
        .any(|e| e.outcome != "ok");
    if unfinished {
        let (b, n) = (&base.limits, &back.limits);
        assert!(
            n.memory_bytes >= b.memory_bytes
                && n.wall_seconds >= b.wall_seconds
                && n.output_bytes >= b.output_bytes,
            "a limit lowered from a run that did not finish:\n{yaml}"
        );
    }
}

/// [`split_differential`]'s Argo CD side: one `argo-split` for the whole run.
fn argo_split() -> &'static std::sync::Mutex<testkit::argo_split::ArgoSplit> {
    use std::sync::{Mutex, OnceLock};
    static ARGO: OnceLock<Mutex<testkit::argo_split::ArgoSplit>> = OnceLock::new();
    ARGO.get_or_init(|| {
        let path = testkit::argo_split::ArgoSplit::path();
        Mutex::new(
            testkit::argo_split::ArgoSplit::start(&path).unwrap_or_else(|e| {
                panic!(
                    "{}: {e} (scripts/argo-build v3 --driver builds it)",
                    path.display()
                )
            }),
        )
    })
}

/// The `split_differential` target: `data[0]`'s parity picks the mode, the rest is the
/// command's output; Argo CD's answer and cmp-warden's must be the same.
pub fn split_differential(data: &[u8]) {
    use testkit::argo_split::{Answer, Mode};
    let Some((&first, input)) = data.split_first() else {
        return;
    };
    let mode = if first % 2 == 0 {
        Mode::Manifests
    } else {
        Mode::Params
    };
    plugin::gojson::reset_key_collisions();
    let ours = match mode {
        Mode::Manifests => match plugin::split_output(input) {
            Ok(m) => Answer::Manifests(m.into_iter().map(String::into_bytes).collect()),
            // cmp-warden's own bound (not Argo CD's): nothing to compare.
            Err(plugin::SplitError::TooLarge(_)) => return,
            Err(e) => Answer::Refused(e.argo_text().into_bytes()),
        },
        Mode::Params => match plugin::params::parse_dynamic_bytes(input) {
            Ok(p) => Answer::Params(plugin::params::as_go_json(&p)),
            Err(plugin::params::ParamsError::Unmarshal(e)) => Answer::Refused(e.into_bytes()),
            Err(e @ plugin::params::ParamsError::NilAnnouncement) => {
                Answer::Unsendable(format!("panic: {e}").into_bytes())
            }
        },
    };
    // Two keys of one map that become the same JSON key: Go keeps one at random.
    if plugin::gojson::key_collisions() > 0 {
        return;
    }
    let theirs = argo_split()
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .ask(mode, input)
        .as_sent();
    let show = |a: &Answer| match a {
        Answer::Manifests(m) => format!(
            "{:?}",
            m.iter()
                .map(|d| String::from_utf8_lossy(d))
                .collect::<Vec<_>>()
        ),
        Answer::Params(p) => p.to_string(),
        Answer::Refused(e) => format!("refused: {}", String::from_utf8_lossy(e)),
        Answer::Unsendable(e) => format!("unsendable: {}", String::from_utf8_lossy(e)),
    };
    assert!(
        theirs == ours,
        "{mode:?} {:?}\n  Argo CD:    {}\n  cmp-warden: {}",
        String::from_utf8_lossy(input),
        show(&theirs),
        show(&ours)
    );
}
