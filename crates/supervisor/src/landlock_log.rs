//! Landlock's own denial records (Landlock ABI 7, Linux 6.15+), read from the kernel's audit
//! log so that a failed command can be told *what* Landlock refused and which policy field
//! would allow it.
//!
//! The kernel writes two records per denial when audit is enabled: `LANDLOCK_ACCESS` (1423:
//! the domain, what was blocked and the object) and, the first time a domain shows up,
//! `LANDLOCK_DOMAIN` (1424: who created it, with its UID). Jails create their domain after the
//! switch to their leased UID, so the domain's creator UID names the request. We only read:
//! the read-only multicast group (`AUDIT_NLGRP_READLOG`) needs `CAP_AUDIT_READ` at bind time
//! and the host's network namespace, and whether audit is enabled is the host's decision
//! (never changed by the server; [`set_audit_enabled`] exists for tests and operators).
//!
//! Everything kept is bounded: domains, pending records and denials per UID, and only UIDs of
//! our own range are kept at all.

use std::collections::HashMap;
use std::ops::RangeInclusive;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use rustix::net::{self, AddressFamily, RecvFlags, SendFlags, SocketFlags, SocketType, netlink};

use vocab::record::LandlockDenial;

const AUDIT_GET: u16 = 1000;
const AUDIT_SET: u16 = 1001;
const AUDIT_LANDLOCK_ACCESS: u16 = 1423;
const AUDIT_LANDLOCK_DOMAIN: u16 = 1424;
const NLMSG_ERROR: u16 = 2;
const NLM_F_REQUEST: u16 = 1;
const NLM_F_ACK: u16 = 4;
/// `AUDIT_NLGRP_READLOG` (group 1) as a bind mask.
const READLOG_GROUPS: u32 = 1;
const AUDIT_STATUS_ENABLED: u32 = 1;

/// Denials kept per UID (a request is told about the first few; the rest add nothing).
const PER_UID: usize = 16;
/// Domains remembered (creator UID by domain id); forgotten wholesale past this.
const DOMAINS: usize = 4096;
/// Access records waiting for their domain record.
const PENDING: usize = 1024;

/// A subscription that is open but whose reader has not started (start-up opens it while the
/// process is single-threaded and still holds `CAP_AUDIT_READ`; the thread comes later).
#[derive(Debug)]
pub struct Subscription {
    fd: OwnedFd,
    uids: RangeInclusive<u32>,
}

/// Open the read-only audit multicast group. Fails without `CAP_AUDIT_READ`, outside the host's
/// network namespace, or on a kernel without audit.
pub fn subscribe(uids: RangeInclusive<u32>) -> std::io::Result<Subscription> {
    // The timeout wakes the reader now and then so that dropping the log ends its thread.
    let fd = audit_socket(Duration::from_secs(1))?;
    net::bind(&fd, &netlink::SocketAddrNetlink::new(0, READLOG_GROUPS))?;
    Ok(Subscription { fd, uids })
}

/// A `NETLINK_AUDIT` socket whose reads give up after `timeout`.
fn audit_socket(timeout: Duration) -> std::io::Result<OwnedFd> {
    let fd = net::socket_with(
        AddressFamily::NETLINK,
        SocketType::RAW,
        SocketFlags::CLOEXEC,
        Some(netlink::AUDIT),
    )?;
    net::sockopt::set_socket_timeout(&fd, net::sockopt::Timeout::Recv, Some(timeout))?;
    Ok(fd)
}

#[derive(Debug, Default)]
struct State {
    /// Creator UID by domain id.
    domains: HashMap<String, u32>,
    /// Access records whose domain record has not arrived yet.
    pending: HashMap<String, Vec<LandlockDenial>>,
    /// Denials by the UID whose jail created the domain.
    by_uid: HashMap<u32, Vec<LandlockDenial>>,
}

#[derive(Debug, Default)]
struct Shared {
    state: Mutex<State>,
    arrived: Condvar,
    stop: AtomicBool,
}

/// The running reader: one thread, bounded state.
#[derive(Debug)]
pub struct LandlockLog {
    shared: Arc<Shared>,
}

impl Subscription {
    /// Start the reader thread.
    pub fn start(self) -> std::io::Result<LandlockLog> {
        let shared = Arc::new(Shared::default());
        let s = shared.clone();
        std::thread::Builder::new()
            .name("landlock-log".into())
            .spawn(move || read_loop(self, &s))?;
        Ok(LandlockLog { shared })
    }
}

impl Drop for LandlockLog {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
    }
}

fn lock(m: &Mutex<State>) -> std::sync::MutexGuard<'_, State> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl LandlockLog {
    /// Forget what is recorded for `uid` (a new request leased it).
    pub fn clear(&self, uid: u32) {
        lock(&self.shared.state).by_uid.remove(&uid);
    }

    /// What Landlock denied to `uid`'s jail, waiting at most `wait` for a first record (the
    /// kernel delivers them asynchronously, a few milliseconds after the denial).
    pub fn take(&self, uid: u32, wait: Duration) -> Vec<LandlockDenial> {
        self.take_when(uid, wait, |d| !d.is_empty())
    }

    /// What Landlock denied to `uid`'s jail, once those recorded so far satisfy `enough`, or
    /// at most `wait` from now (then whatever has arrived). The records come in the kernel's
    /// order but late: a tool's start-up probes may be here while the denial that failed it,
    /// just before it exited, is still on its way.
    pub fn take_when(
        &self,
        uid: u32,
        wait: Duration,
        enough: impl Fn(&[LandlockDenial]) -> bool,
    ) -> Vec<LandlockDenial> {
        let deadline = Instant::now() + wait;
        let mut st = lock(&self.shared.state);
        loop {
            let now = Instant::now();
            if now >= deadline || st.by_uid.get(&uid).is_some_and(|d| enough(d)) {
                return st.by_uid.remove(&uid).unwrap_or_default();
            }
            st = self
                .shared
                .arrived
                .wait_timeout(st, deadline - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }
}

fn read_loop(sub: Subscription, shared: &Shared) {
    let mut buf = vec![0u8; 16 * 1024];
    while !shared.stop.load(Ordering::SeqCst) {
        let n = match net::recv(&sub.fd, &mut buf[..], RecvFlags::empty()) {
            Ok((n, _)) => n,
            Err(rustix::io::Errno::AGAIN | rustix::io::Errno::INTR) => continue,
            // ENOBUFS: the kernel dropped records for us (a flood); keep reading.
            Err(rustix::io::Errno::NOBUFS) => continue,
            Err(e) => {
                tracing::warn!(error = %e, "landlock denial log: reading the audit socket failed; denials are no longer explained");
                return;
            }
        };
        for (ty, text) in messages(&buf[..n]) {
            match ty {
                AUDIT_LANDLOCK_ACCESS | AUDIT_LANDLOCK_DOMAIN => {
                    let mut st = lock(&shared.state);
                    if absorb(&mut st, ty, text, &sub.uids) {
                        shared.arrived.notify_all();
                    }
                }
                _ => {}
            }
        }
    }
}

/// The netlink messages in one datagram: (type, payload text).
fn messages(mut b: &[u8]) -> Vec<(u16, &str)> {
    let mut out = Vec::new();
    while b.len() >= 16 {
        let len = u32::from_ne_bytes([b[0], b[1], b[2], b[3]]) as usize;
        let ty = u16::from_ne_bytes([b[4], b[5]]);
        if len < 16 || len > b.len() {
            // Audit records' length is not always exact; the rest of the datagram is the text.
            let text = &b[16..];
            out.push((ty, trim_text(text)));
            break;
        }
        out.push((ty, trim_text(&b[16..len])));
        let next = (len + 3) & !3;
        b = b.get(next..).unwrap_or_default();
    }
    out
}

fn trim_text(b: &[u8]) -> &str {
    let end = b.iter().position(|&c| c == 0).unwrap_or(b.len());
    std::str::from_utf8(&b[..end]).unwrap_or_default()
}

/// Fold one record into the state; true when a UID gained denials.
fn absorb(st: &mut State, ty: u16, text: &str, uids: &RangeInclusive<u32>) -> bool {
    let fields = fields(text);
    let get = |k: &str| fields.iter().find(|(n, _)| *n == k).map(|(_, v)| v.clone());
    let Some(domain) = get("domain") else {
        return false;
    };
    if ty == AUDIT_LANDLOCK_DOMAIN {
        if get("status").as_deref() == Some("deallocated") {
            st.domains.remove(&domain);
            st.pending.remove(&domain);
            return false;
        }
        let Some(uid) = get("uid").and_then(|u| u.parse::<u32>().ok()) else {
            return false;
        };
        if st.domains.len() >= DOMAINS {
            st.domains.clear();
        }
        st.domains.insert(domain.clone(), uid);
        let waiting = st.pending.remove(&domain).unwrap_or_default();
        return !waiting.is_empty() && add(st, uid, waiting, uids);
    }
    let denial = denial(&fields);
    match st.domains.get(&domain).copied() {
        Some(uid) => add(st, uid, vec![denial], uids),
        None => {
            if st.pending.len() >= PENDING && !st.pending.contains_key(&domain) {
                st.pending.clear();
            }
            let p = st.pending.entry(domain).or_default();
            if p.len() < PER_UID {
                p.push(denial);
            }
            false
        }
    }
}

fn add(st: &mut State, uid: u32, ds: Vec<LandlockDenial>, uids: &RangeInclusive<u32>) -> bool {
    if !uids.contains(&uid) {
        return false;
    }
    let list = st.by_uid.entry(uid).or_default();
    for d in ds {
        if list.len() < PER_UID && !list.contains(&d) {
            list.push(d);
        }
    }
    true
}

/// The record's `key=value` fields; quoted values unquoted, hex-encoded untrusted strings
/// (paths with spaces or quotes) decoded.
fn fields(text: &str) -> Vec<(&str, String)> {
    // Skip `audit(<time>:<serial>): `.
    let mut s = match text.find("): ") {
        Some(i) if text.starts_with("audit(") => &text[i + 3..],
        _ => text,
    };
    let mut out = Vec::new();
    while let Some(eq) = s.find('=') {
        let key = s[..eq].trim();
        let rest = &s[eq + 1..];
        let (value, tail) = if let Some(q) = rest.strip_prefix('"') {
            match q.find('"') {
                Some(end) => (q[..end].to_owned(), &q[end + 1..]),
                None => (q.to_owned(), ""),
            }
        } else {
            let end = rest.find(' ').unwrap_or(rest.len());
            let raw = &rest[..end];
            let v = if matches!(key, "path" | "name" | "exe" | "comm" | "ocomm") {
                unhex(raw).unwrap_or_else(|| raw.to_owned())
            } else {
                raw.to_owned()
            };
            (v, &rest[end..])
        };
        out.push((key, value));
        s = tail.trim_start();
    }
    out
}

fn unhex(s: &str) -> Option<String> {
    if !s.len().is_multiple_of(2) || s.is_empty() || !s.bytes().all(|c| c.is_ascii_hexdigit()) {
        return None;
    }
    let bytes: Option<Vec<u8>> = (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).ok())
        .collect();
    bytes.map(|b| String::from_utf8_lossy(&b).into_owned())
}

/// One access record as a denial with the policy field that allows it.
fn denial(fields: &[(&str, String)]) -> LandlockDenial {
    let get = |k: &str| {
        fields
            .iter()
            .find(|(n, _)| *n == k)
            .map(|(_, v)| v.as_str())
    };
    let blockers = get("blockers").unwrap_or("unknown").to_owned();
    let object = if let Some(p) = get("path") {
        p.to_owned()
    } else if let (Some(a), Some(p)) = (get("daddr"), get("dest")) {
        format!("{a}:{p}")
    } else if let Some(p) = get("lport").or(get("dest")) {
        format!("port {p}")
    } else if let (Some(pid), Some(comm)) = (get("opid"), get("ocomm")) {
        format!("process {pid} ({comm})")
    } else {
        String::new()
    };
    let allowed_by = allowed_by(&blockers);
    LandlockDenial {
        blockers,
        object: object.chars().take(256).collect(),
        allowed_by,
    }
}

/// The policy field that allows what `blockers` names, if any does.
fn allowed_by(blockers: &str) -> Option<String> {
    let first = blockers.split(',').next().unwrap_or_default();
    let field = match first {
        "fs.execute" | "fs.read_file" | "fs.read_dir" => {
            "spec.filesystem.readOnly (or readWrite) lists a directory above it"
        }
        b if b.starts_with("fs.") => "spec.filesystem.readWrite lists a directory above it",
        "net.connect_tcp" => {
            "spec.network: allowList with spec.network.allow reaches it through the egress proxy"
        }
        // Listening, signalling outside the jail, abstract sockets: no field allows these.
        _ => return None,
    };
    Some(field.to_owned())
}

/// Whether audit is enabled on this host (`AUDIT_GET`; needs `CAP_AUDIT_CONTROL`).
pub fn audit_enabled() -> std::io::Result<bool> {
    let status = request(AUDIT_GET, &[])?;
    let enabled = status
        .get(4..8)
        .map(|b| u32::from_ne_bytes([b[0], b[1], b[2], b[3]]))
        .ok_or_else(|| std::io::Error::other("short AUDIT_GET reply"))?;
    Ok(enabled != 0)
}

/// Turn audit on or off for the whole host (`AUDIT_SET`; `CAP_AUDIT_CONTROL`). The server never
/// calls this: whether a host audits is its operator's decision.
pub fn set_audit_enabled(on: bool) -> std::io::Result<()> {
    // struct audit_status: mask, enabled, then nine more u32 we leave at zero (unmasked).
    let mut status = [0u8; 44];
    status[0..4].copy_from_slice(&AUDIT_STATUS_ENABLED.to_ne_bytes());
    status[4..8].copy_from_slice(&u32::from(on).to_ne_bytes());
    request(AUDIT_SET, &status).map(|_| ())
}

/// One unicast request to the audit subsystem; the reply's payload (empty for an ack).
fn request(ty: u16, payload: &[u8]) -> std::io::Result<Vec<u8>> {
    let fd = audit_socket(Duration::from_secs(2))?;
    let len = 16 + payload.len();
    let mut msg = Vec::with_capacity(len);
    msg.extend_from_slice(&(len as u32).to_ne_bytes());
    msg.extend_from_slice(&ty.to_ne_bytes());
    msg.extend_from_slice(&(NLM_F_REQUEST | NLM_F_ACK).to_ne_bytes());
    msg.extend_from_slice(&1u32.to_ne_bytes());
    msg.extend_from_slice(&0u32.to_ne_bytes());
    msg.extend_from_slice(payload);
    let kernel = netlink::SocketAddrNetlink::new(0, 0);
    net::sendto(fd.as_fd(), &msg, SendFlags::empty(), &kernel)?;
    let mut buf = vec![0u8; 8192];
    // The ack comes from the netlink layer at once; AUDIT_GET's status is sent afterwards by
    // the audit subsystem's own thread. An error arrives as the ack.
    for _ in 0..3 {
        let (n, _) = net::recv(&fd, &mut buf[..], RecvFlags::empty())?;
        let b = &buf[..n];
        if b.len() < 16 {
            continue;
        }
        if u16::from_ne_bytes([b[4], b[5]]) == NLMSG_ERROR {
            let code = b
                .get(16..20)
                .map(|c| i32::from_ne_bytes([c[0], c[1], c[2], c[3]]))
                .unwrap_or(0);
            if code != 0 {
                return Err(std::io::Error::from_raw_os_error(-code));
            }
            if ty != AUDIT_GET {
                return Ok(Vec::new());
            }
            continue;
        }
        return Ok(b[16..].to_vec());
    }
    Err(std::io::Error::other("no answer from the audit subsystem"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn st_with(records: &[(u16, &str)]) -> State {
        let mut st = State::default();
        for (ty, t) in records {
            absorb(&mut st, *ty, t, &(30000..=30099));
        }
        st
    }

    #[test]
    fn an_access_record_is_attributed_through_its_later_domain_record() {
        let st = st_with(&[
            (
                1423,
                r#"audit(1732459332.123:456): domain=1a2b3c4d5 blockers=fs.read_file path="/etc/shadow" dev="vda" ino=12"#,
            ),
            (
                1424,
                r#"audit(1732459332.123:456): domain=1a2b3c4d5 status=allocated mode=enforcing pid=77 uid=30007 exe="/bin/cat" comm="cat""#,
            ),
            (
                1423,
                "audit(1.2:3): domain=1a2b3c4d5 blockers=net.connect_tcp daddr=10.0.0.1 dest=443",
            ),
        ]);
        let d = &st.by_uid[&30007];
        assert_eq!(d.len(), 2);
        assert_eq!(d[0].blockers, "fs.read_file");
        assert_eq!(d[0].object, "/etc/shadow");
        assert!(d[0].allowed_by.as_deref().unwrap().contains("readOnly"));
        assert_eq!(d[1].object, "10.0.0.1:443");
        assert!(d[1].allowed_by.as_deref().unwrap().contains("allowList"));
    }

    /// A tool's start-up probe is recorded first; the denial its error names arrives later (the
    /// kernel's delivery lags under load). Waiting for the named one gets both; taking at the
    /// first record (mutant: `take_when` returns once any denial is there) would say only the
    /// probe, and the explanation would miss the cause.
    #[test]
    fn a_failed_command_waits_for_the_denial_its_error_names() {
        fn feed(shared: &Shared, ty: u16, text: &str) {
            let mut st = lock(&shared.state);
            if absorb(&mut st, ty, text, &(30000..=30099)) {
                shared.arrived.notify_all();
            }
        }
        let log = LandlockLog {
            shared: Arc::new(Shared::default()),
        };
        feed(
            &log.shared,
            1424,
            "audit(1.1:1): domain=77 status=allocated mode=enforcing pid=9 uid=30007 comm=\"helm\"",
        );
        feed(
            &log.shared,
            1423,
            "audit(1.1:2): domain=77 blockers=fs.read_file path=\"/sys/kernel/mm/transparent_hugepage/hpage_pmd_size\"",
        );
        let shared = log.shared.clone();
        // The kernel's lateness, not a stand-in for an event: the record is sent after it.
        let kernel = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(100));
            feed(
                &shared,
                1423,
                "audit(1.2:3): domain=77 blockers=fs.read_file path=\"/var/tmp/common.yaml\"",
            );
        });
        let message = "open /var/tmp/common.yaml: permission denied";
        let got = log.take_when(30007, Duration::from_secs(20), |ds| {
            ds.iter().any(|d| message.contains(d.object.as_str()))
        });
        kernel.join().expect("feeder");
        let objects: Vec<_> = got.iter().map(|d| d.object.as_str()).collect();
        assert_eq!(
            objects,
            [
                "/sys/kernel/mm/transparent_hugepage/hpage_pmd_size",
                "/var/tmp/common.yaml"
            ]
        );
        // Taken: the next request of the UID starts with nothing.
        assert!(log.take(30007, Duration::ZERO).is_empty());
    }

    #[test]
    fn other_uids_and_deallocated_domains_are_not_kept() {
        let st = st_with(&[
            (
                1423,
                "audit(1.2:3): domain=aa blockers=fs.write_file path=\"/x\"",
            ),
            (1424, "audit(1.2:3): domain=aa status=allocated uid=1000"),
            (
                1423,
                "audit(1.2:4): domain=bb blockers=fs.write_file path=\"/y\"",
            ),
            (1424, "audit(1.2:5): domain=bb status=deallocated denials=1"),
        ]);
        assert!(st.by_uid.is_empty());
        assert!(st.pending.is_empty());
        assert!(!st.domains.contains_key("bb"));
    }

    #[test]
    fn hex_encoded_paths_are_decoded_and_scopes_name_no_field() {
        // "/a b" hex-encoded, as audit writes an untrusted string with a space.
        let f = fields("audit(1.2:3): domain=aa blockers=fs.make_reg path=2F612062 dev=\"vda\"");
        let d = denial(&f);
        assert_eq!(d.object, "/a b");
        assert!(d.allowed_by.unwrap().contains("readWrite"));
        let s = denial(&fields(
            "audit(1.2:3): domain=aa blockers=scope.signal opid=1 ocomm=\"init\"",
        ));
        assert_eq!(s.object, "process 1 (init)");
        assert_eq!(s.allowed_by, None);
    }

    #[test]
    fn state_stays_bounded_under_a_flood_of_records() {
        let mut st = State::default();
        for i in 0..20_000u32 {
            absorb(
                &mut st,
                1423,
                &format!("audit(1.2:{i}): domain=d{i} blockers=fs.read_file path=\"/p{i}\""),
                &(30000..=30099),
            );
            absorb(
                &mut st,
                1424,
                &format!("audit(1.2:{i}): domain=e{i} status=allocated uid=30001"),
                &(30000..=30099),
            );
            absorb(
                &mut st,
                1423,
                &format!("audit(1.2:{i}): domain=e{i} blockers=fs.read_file path=\"/q{i}\""),
                &(30000..=30099),
            );
        }
        assert!(st.pending.len() <= PENDING);
        assert!(st.domains.len() <= DOMAINS);
        assert!(st.by_uid[&30001].len() <= PER_UID);
    }
}
