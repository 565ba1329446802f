//! Egress: which destinations a request may reach (the allow list), why one is refused, and
//! what the proxy did with each connection.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use serde::{Deserialize, Serialize};

/// A host name pattern: an exact DNS name, or `*.suffix` (one or more labels before the
/// suffix; not the suffix itself). Lower-case, without a trailing dot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostPattern {
    wildcard: bool,
    name: String,
}

impl HostPattern {
    /// Parse `name` or `*.suffix`.
    pub fn parse(s: &str) -> Result<Self, Error> {
        let lower = s.trim_end_matches('.').to_ascii_lowercase();
        let (wildcard, name) = match lower.strip_prefix("*.") {
            Some(rest) => (true, rest.to_owned()),
            None => (false, lower),
        };
        if !dns_name(&name) {
            return Err(Error::Host(s.to_owned()));
        }
        Ok(Self { wildcard, name })
    }

    /// Whether `host` (already normalised by [`normalise_name`]) matches.
    pub fn matches(&self, host: &str) -> bool {
        if self.wildcard {
            host.len() > self.name.len() + 1
                && host.ends_with(&self.name)
                && host.as_bytes()[host.len() - self.name.len() - 1] == b'.'
        } else {
            host == self.name
        }
    }
}

impl Serialize for HostPattern {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl Serialize for Cidr {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl fmt::Display for HostPattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.wildcard {
            write!(f, "*.{}", self.name)
        } else {
            f.write_str(&self.name)
        }
    }
}

/// An address block, `ADDRESS/PREFIX`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cidr {
    addr: IpAddr,
    prefix: u8,
}

impl Cidr {
    /// Parse `10.0.0.0/8`, `fd00::/8`, or a bare address (a /32 or /128).
    pub fn parse(s: &str) -> Result<Self, Error> {
        let bad = || Error::Cidr(s.to_owned());
        let (a, p) = match s.split_once('/') {
            Some((a, p)) => (a, Some(p)),
            None => (s, None),
        };
        let addr: IpAddr = a.parse().map_err(|_| bad())?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let prefix = match p {
            Some(p) => p.parse::<u8>().ok().filter(|p| *p <= max).ok_or_else(bad)?,
            None => max,
        };
        Ok(Self { addr, prefix })
    }

    /// Whether `ip` lies in the block (an IPv4-mapped IPv6 address counts as its IPv4 form).
    pub fn contains(&self, ip: IpAddr) -> bool {
        match (self.addr, canonical(ip)) {
            (IpAddr::V4(net), IpAddr::V4(ip)) => {
                let mask = u32::MAX
                    .checked_shl(32 - u32::from(self.prefix))
                    .unwrap_or(0);
                u32::from(net) & mask == u32::from(ip) & mask
            }
            (IpAddr::V6(net), IpAddr::V6(ip)) => {
                let mask = u128::MAX
                    .checked_shl(128 - u32::from(self.prefix))
                    .unwrap_or(0);
                u128::from(net) & mask == u128::from(ip) & mask
            }
            _ => false,
        }
    }
}

impl Cidr {
    /// Whether the two blocks share an address.
    pub fn overlaps(&self, other: &Cidr) -> bool {
        let shorter = if self.prefix <= other.prefix {
            self
        } else {
            other
        };
        let longer = if self.prefix <= other.prefix {
            other
        } else {
            self
        };
        shorter.contains(longer.addr)
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix)
    }
}

/// What an entry names.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum Target {
    /// A host name (the proxy resolves it).
    Host(HostPattern),
    /// Addresses, reached by IP literal or by a name that resolves into the block.
    Cidr(Cidr),
}

/// One allow-list entry: a target and the ports it may be reached on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Rule {
    /// The host pattern or address block.
    pub target: Target,
    /// TCP ports (at least one).
    pub ports: Vec<u16>,
    /// The entry admits internal addresses: for a host entry, its names may resolve to any
    /// (loopback, link-local, private ranges, the pod's own), which are otherwise refused; for
    /// a cidr entry, the loopback, link-local and unspecified addresses and the pod's own in
    /// its block (the private ranges a block names it admits without this).
    pub internal: bool,
}

/// The allow list of one policy.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct AllowList {
    /// The entries, in policy order.
    pub rules: Vec<Rule>,
    /// Audit mode: every destination is allowed, and what the list would have decided is
    /// recorded (for `policy suggest`).
    pub audit: bool,
    /// Names resolved to these addresses instead of by DNS (like a pod's `hostAliases`):
    /// lower-case name, addresses. The addresses are still checked like resolved ones.
    pub hosts: Vec<(String, Vec<IpAddr>)>,
    /// Names are resolved through the pod's DNS search domains (`resolv.conf`'s `search` and
    /// `ndots`) instead of as absolute names.
    pub search_domains: bool,
}

/// Why a destination is refused. Each message names the destination and the policy field that
/// would allow it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Denial {
    /// The request named neither a DNS name nor an IP address (e.g. `0x7f.1`, `2130706433`).
    NotAHostName(String),
    /// No entry names this host on this port.
    NoEntry { host: String, port: u16 },
    /// An IP literal no CIDR entry covers on this port.
    NoEntryForAddress { ip: IpAddr, port: u16 },
    /// The name resolves only to internal addresses and its entry does not say `internal`.
    Internal {
        host: String,
        port: u16,
        addresses: Vec<IpAddr>,
    },
    /// An IP literal that is loopback, link-local, unspecified or the pod's own: the cidr
    /// entry that covers it does not say `internal: true`.
    InternalAddress { ip: IpAddr, port: u16 },
    /// The name does not resolve (from the supervisor's side).
    Unresolvable {
        host: String,
        error: String,
        /// Whether the pod's search domains were tried.
        search_domains: bool,
    },
    /// A plain-HTTP request whose `Host` header names another destination than its URL.
    HostMismatch { given: String, destination: String },
    /// Not a proxy request this proxy serves.
    BadRequest(String),
    /// The request already holds the policy's number of concurrent connections.
    TooManyConnections(usize),
    /// The server's proxies already hold this many connections across requests.
    ServerFull(usize),
    /// A process other than the request's connected to its proxy (a listener on a loopback
    /// the pod shares): the socket's owner, if the kernel's tables still had it.
    Stranger {
        /// The UID owning the connecting socket.
        owner: Option<u32>,
        /// The request's UID.
        uid: u32,
    },
}

impl fmt::Display for Denial {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Denial::NotAHostName(h) => write!(
                f,
                "egress to {h:?} denied: not a DNS name or IP address (spec.network.allow)"
            ),
            Denial::NoEntry { host, port } => write!(
                f,
                "egress to {host}:{port} denied: no entry of spec.network.allow names this host and port"
            ),
            Denial::NoEntryForAddress { ip, port } => write!(
                f,
                "egress to {}:{port} denied: an IP address needs a cidr entry in spec.network.allow with this port",
                SocketAddrText(*ip)
            ),
            Denial::Internal {
                host,
                port,
                addresses,
            } => {
                let list: Vec<String> = addresses.iter().map(ToString::to_string).collect();
                write!(
                    f,
                    "egress to {host}:{port} denied: it resolves only to internal addresses ({}); set internal: true on its spec.network.allow entry (a cidr entry admits the private addresses it covers, never loopback, link-local or the pod's own)",
                    list.join(", ")
                )
            }
            Denial::InternalAddress { ip, port } => write!(
                f,
                "egress to {}:{port} denied: loopback, link-local (the cloud metadata address among them), unspecified and the pod's own addresses need an entry with internal: true (spec.network.allow[].internal); a cidr entry that only covers them does not admit them",
                SocketAddrText(*ip)
            ),
            Denial::Unresolvable {
                host,
                error,
                search_domains,
            } => {
                write!(
                    f,
                    "egress to {host} denied: the name does not resolve ({error})"
                )?;
                if !search_domains {
                    write!(
                        f,
                        "; it was resolved as an absolute name: write the full name (e.g. NAME.NAMESPACE.svc.cluster.local) or set spec.network.searchDomains: true"
                    )?;
                }
                Ok(())
            }
            Denial::HostMismatch { given, destination } => write!(
                f,
                "egress to {destination} denied: the request's Host header ({given}) names another destination; a plain-HTTP request through the proxy goes only to the host its URL names and spec.network.allow admits"
            ),
            Denial::BadRequest(why) => write!(f, "egress proxy: {why}"),
            Denial::TooManyConnections(n) => write!(
                f,
                "egress denied: the request already has {n} open connections (spec.network.maxConnections)"
            ),
            Denial::ServerFull(n) => write!(
                f,
                "egress denied: the server's egress proxies already hold {n} connections across all requests (a fixed bound of the supervisor); retry later"
            ),
            Denial::Stranger { owner, uid } => {
                let who = owner.map_or_else(
                    || "a socket the kernel no longer lists".to_owned(),
                    |o| format!("UID {o}"),
                );
                write!(
                    f,
                    "egress proxy: a connection from {who}, not the request's UID {uid}, refused (without a network namespace of the jail's own the proxy listens on the pod's loopback, and serves only the request's processes)"
                )
            }
        }
    }
}

struct SocketAddrText(IpAddr);

impl fmt::Display for SocketAddrText {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            IpAddr::V4(a) => write!(f, "{a}"),
            IpAddr::V6(a) => write!(f, "[{a}]"),
        }
    }
}

/// A destination as the client named it, after normalisation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Host {
    /// A DNS name (lower-case, no trailing dot).
    Name(String),
    /// An IP literal.
    Ip(IpAddr),
}

/// Normalise a client's host: an IP literal (IPv6 in brackets or bare), or a DNS name whose
/// last label starts with a letter. Anything else — the numeric and hex spellings resolvers
/// accept for addresses (`2130706433`, `0x7f.1`, `127.1`) — is refused rather than resolved.
pub fn normalise_name(host: &str) -> Result<Host, Denial> {
    let h = host.trim_end_matches('.').to_ascii_lowercase();
    let unbracketed = h
        .strip_prefix('[')
        .and_then(|r| r.strip_suffix(']'))
        .unwrap_or(&h);
    if let Ok(ip) = unbracketed.parse::<IpAddr>() {
        return Ok(Host::Ip(canonical(ip)));
    }
    if dns_name(&h) {
        Ok(Host::Name(h))
    } else {
        Err(Denial::NotAHostName(host.to_owned()))
    }
}

fn dns_name(name: &str) -> bool {
    let labels: Vec<&str> = name.split('.').collect();
    name.len() <= 253
        && labels.iter().all(|l| {
            !l.is_empty()
                && l.len() <= 63
                && !l.starts_with('-')
                && !l.ends_with('-')
                && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
        })
        && labels
            .last()
            .is_some_and(|l| l.as_bytes()[0].is_ascii_alphabetic())
}

impl AllowList {
    /// The policy's fixed addresses for `name`, if it lists the name.
    pub fn fixed_addresses(&self, name: &str) -> Option<&[IpAddr]> {
        self.hosts
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, a)| a.as_slice())
    }

    /// The entries that name `host` on `port` (step 2 of the proxy), or why there are none.
    pub fn entries_for(&self, host: &Host, port: u16) -> Result<Vec<&Rule>, Denial> {
        let found: Vec<&Rule> = self
            .rules
            .iter()
            .filter(|r| r.ports.contains(&port))
            .filter(|r| match (&r.target, host) {
                (Target::Host(p), Host::Name(n)) => p.matches(n),
                (Target::Cidr(c), Host::Ip(ip)) => c.contains(*ip),
                _ => false,
            })
            .collect();
        if !found.is_empty() {
            return Ok(found);
        }
        Err(match host {
            Host::Name(n) => Denial::NoEntry {
                host: n.clone(),
                port,
            },
            Host::Ip(ip) => Denial::NoEntryForAddress { ip: *ip, port },
        })
    }

    /// Whether an address may be used for a destination its `entries` matched (a name's
    /// resolved address, or an IP literal): an external address always; an internal one
    /// ([`is_internal`], with `own` for the pod's own addresses) when one of the entries says
    /// `internal: true`, or when a CIDR entry covers it on this port and it is merely private
    /// (a block that names private addresses admits them; loopback, link-local, unspecified
    /// and the pod's own need `internal: true` even there, so `0.0.0.0/0` never reaches the
    /// metadata address).
    pub fn address_allowed(&self, entries: &[&Rule], ip: IpAddr, port: u16, own: bool) -> bool {
        if !own && !is_internal(ip) {
            return true;
        }
        if entries.iter().any(|r| r.internal) {
            return true;
        }
        self.rules.iter().any(|r| {
            r.ports.contains(&port)
                && matches!(&r.target, Target::Cidr(c) if c.contains(ip))
                && (r.internal || (!own && !is_sensitive(ip)))
        })
    }

    /// Warnings for a reviewer: cidr entries that cover loopback, link-local or unspecified
    /// addresses without `internal: true` (those addresses stay refused).
    pub fn warnings(&self) -> Vec<String> {
        let mut out = Vec::new();
        if self.audit {
            out.push(AUDIT_WARNING.to_owned());
        }
        for (i, r) in self.rules.iter().enumerate() {
            let Target::Cidr(c) = &r.target else { continue };
            if r.internal {
                continue;
            }
            let covered: Vec<&str> = SENSITIVE_BLOCKS
                .iter()
                .filter(|(block, _)| c.overlaps(&Cidr::parse(block).expect("a fixed block")))
                .map(|(_, what)| *what)
                .collect();
            if !covered.is_empty() {
                out.push(format!(
                    "spec.network.allow[{i}]: cidr {c} covers {}; those addresses stay refused unless the entry says internal: true",
                    covered.join(", ")
                ));
            }
        }
        out
    }
}

/// What `audit: true` means, for `policy check` and the server's start-up log.
pub const AUDIT_WARNING: &str = "spec.network.audit: true lets every destination through (each connection is recorded, none refused): spec.network.allow is not enforced; a setting for learning what a plugin reaches (policy suggest), not for production (audit: false enforces the list)";

/// Blocks a cidr entry admits only with `internal: true`, as a reviewer reads them.
const SENSITIVE_BLOCKS: &[(&str, &str)] = &[
    ("127.0.0.0/8", "loopback (127.0.0.0/8)"),
    (
        "169.254.0.0/16",
        "link-local (169.254.0.0/16, the cloud metadata address 169.254.169.254 among them)",
    ),
    ("0.0.0.0/8", "unspecified (0.0.0.0/8)"),
    ("::1/128", "IPv6 loopback (::1)"),
    ("fe80::/10", "IPv6 link-local (fe80::/10)"),
    ("::/128", "the IPv6 unspecified address"),
];

/// The addresses a hosts file (`/etc/hosts`' format) lists for `name` (case-insensitive),
/// in file order.
pub fn hosts_file_addresses(text: &str, name: &str) -> Vec<IpAddr> {
    let mut out = Vec::new();
    for line in text.lines() {
        let line = line.split('#').next().unwrap_or_default();
        let mut fields = line.split_whitespace();
        let Some(ip) = fields.next().and_then(|a| a.parse::<IpAddr>().ok()) else {
            continue;
        };
        if fields.any(|n| n.trim_end_matches('.').eq_ignore_ascii_case(name)) && !out.contains(&ip)
        {
            out.push(ip);
        }
    }
    out
}

/// IPv4-mapped (`::ffff:a.b.c.d`) addresses as their IPv4 form.
fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6(v6),
        },
        v4 => v4,
    }
}

/// Addresses that are not the public internet: loopback, link-local (the cloud metadata
/// address 169.254.169.254 among them), private and shared ranges, unspecified, multicast,
/// reserved; in IPv6 also unique-local, the NAT64 local-use prefix, and every form that
/// embeds an IPv4 address (mapped, compatible, NAT64 well-known, 6to4, Teredo) judged by the
/// address it embeds.
pub fn is_internal(ip: IpAddr) -> bool {
    match canonical(ip) {
        IpAddr::V4(a) => internal_v4(a),
        IpAddr::V6(a) => internal_v6(a) || embedded_v4(a).iter().any(|v4| internal_v4(*v4)),
    }
}

/// The internal addresses no block admits by merely covering them: loopback, link-local,
/// unspecified ("this network"), in any IPv6 form that embeds them too.
fn is_sensitive(ip: IpAddr) -> bool {
    let v4 = |a: Ipv4Addr| a.is_loopback() || a.is_link_local() || a.octets()[0] == 0;
    match canonical(ip) {
        IpAddr::V4(a) => v4(a),
        IpAddr::V6(a) => {
            a.is_loopback()
                || a.is_unspecified()
                || (a.segments()[0] & 0xffc0) == 0xfe80
                || embedded_v4(a).iter().any(|e| v4(*e))
        }
    }
}

/// The IPv4 addresses an IPv6 address carries: IPv4-compatible (`::a.b.c.d`), NAT64's
/// well-known prefix (`64:ff9b::/96`), 6to4 (`2002:AABB:CCDD::/48`), Teredo (`2001::/32`:
/// the server's address and the client's, inverted). (Mapped ones are IPv4 already.)
fn embedded_v4(a: Ipv6Addr) -> Vec<Ipv4Addr> {
    let s = a.segments();
    let v4 = |h: u16, l: u16| Ipv4Addr::new((h >> 8) as u8, h as u8, (l >> 8) as u8, l as u8);
    let mut out = Vec::new();
    if s[..6] == [0, 0, 0, 0, 0, 0] {
        out.push(v4(s[6], s[7]));
    }
    if s[0] == 0x64 && s[1] == 0xff9b && s[2..6] == [0, 0, 0, 0] {
        out.push(v4(s[6], s[7]));
    }
    if s[0] == 0x2002 {
        out.push(v4(s[1], s[2]));
    }
    if s[0] == 0x2001 && s[1] == 0 {
        out.push(v4(s[2], s[3]));
        out.push(v4(!s[6], !s[7]));
    }
    out
}

fn internal_v4(a: Ipv4Addr) -> bool {
    let [b0, b1, b2, _] = a.octets();
    a.is_unspecified()
        || b0 == 0
        || a.is_loopback()
        || a.is_private()
        || a.is_link_local()
        || (b0 == 100 && (64..128).contains(&b1)) // shared address space (CGNAT)
        || (b0 == 192 && b1 == 0 && b2 == 0) // IETF protocol assignments
        || (b0 == 198 && (b1 == 18 || b1 == 19)) // benchmarking
        || b0 >= 224 // multicast, reserved, broadcast
}

fn internal_v6(a: Ipv6Addr) -> bool {
    let s = a.segments();
    a.is_unspecified()
        || a.is_loopback()
        || (s[0] & 0xfe00) == 0xfc00 // unique local
        || (s[0] & 0xffc0) == 0xfe80 // link-local
        || (s[0] & 0xffc0) == 0xfec0 // site-local (deprecated)
        || (s[0] & 0xff00) == 0xff00 // multicast
        // NAT64's local-use prefix (64:ff9b:1::/48): a network's own translator
        || (s[0] == 0x64 && s[1] == 0xff9b && s[2] == 1)
        // IPv4-compatible (deprecated, ::a.b.c.d): never a public destination
        || (s[..6] == [0, 0, 0, 0, 0, 0])
}

/// Errors building an allow list.
#[derive(Debug)]
pub enum Error {
    /// A host pattern that is not a DNS name or `*.suffix`.
    Host(String),
    /// A CIDR that does not parse.
    Cidr(String),
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Host(s) => write!(
                f,
                "bad host pattern {s:?}: want a DNS name (letters, digits, '-', '.') or *.suffix"
            ),
            Error::Cidr(s) => write!(
                f,
                "bad CIDR {s:?}: want ADDRESS/PREFIX, e.g. 10.0.0.0/8 or fd00::/8"
            ),
        }
    }
}

impl std::error::Error for Error {}

/// What the proxy did with a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Decision {
    /// The allow list admits it.
    Allowed,
    /// Refused (the reason says why and which field would allow it).
    Denied,
    /// Audit mode: admitted although the list would refuse it (the reason says why).
    Audited,
}

impl Decision {
    /// The metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            Decision::Allowed => "allowed",
            Decision::Denied => "denied",
            Decision::Audited => "audited",
        }
    }
}

/// One connection, as the request's audit event records it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Connection {
    /// `CONNECT`, or the method of a plain-HTTP request.
    pub method: String,
    /// The destination as the client named it (`host:port`), at most 270 characters.
    pub destination: String,
    /// The address connected to, when one was.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub address: Option<std::net::SocketAddr>,
    /// The decision.
    pub decision: Decision,
    /// Why it was denied (or would have been, in audit mode), or why connecting failed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Bytes from the command to the destination.
    pub bytes_up: u64,
    /// Bytes from the destination to the command.
    pub bytes_down: u64,
    /// From accept to close.
    pub duration_ms: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(t: &str, ports: &[u16], internal: bool) -> Rule {
        let target = if t.contains('/') || t.parse::<IpAddr>().is_ok() {
            Target::Cidr(Cidr::parse(t).expect("cidr"))
        } else {
            Target::Host(HostPattern::parse(t).expect("host"))
        };
        Rule {
            target,
            ports: ports.to_vec(),
            internal,
        }
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().expect("ip")
    }

    fn name(h: &str) -> Host {
        normalise_name(h).expect("host")
    }

    /// A block holds exactly its addresses, whatever host bits its address was written with;
    /// checked on public addresses, so no internal-address rule decides first.
    #[test]
    fn blocks_hold_exactly_their_addresses() {
        let c = Cidr::parse("203.0.113.77/24").expect("c");
        assert!(c.contains(ip("203.0.113.0")) && c.contains(ip("203.0.113.255")));
        assert!(!c.contains(ip("203.0.112.255")) && !c.contains(ip("203.0.114.0")));
        assert!(c.contains(ip("::ffff:203.0.113.9")));
        let one = Cidr::parse("198.51.100.7").expect("c");
        assert!(one.contains(ip("198.51.100.7")) && !one.contains(ip("198.51.100.6")));
        let v6 = Cidr::parse("2001:db8:aa::1/48").expect("c");
        assert!(v6.contains(ip("2001:db8:aa:ffff::9")));
        assert!(!v6.contains(ip("2001:db8:ab::1")) && !v6.contains(ip("203.0.113.1")));
        assert!(c.overlaps(&Cidr::parse("203.0.0.0/16").expect("c")));
        assert!(!c.overlaps(&Cidr::parse("203.0.114.0/24").expect("c")));
    }

    /// The IPv4 addresses IPv6 forms carry, octet for octet, and which addresses no block
    /// admits by covering them (loopback, link-local, "this network", embedded or not).
    #[test]
    fn embedded_addresses_and_the_sensitive_ones() {
        let v6 = |s: &str| s.parse::<Ipv6Addr>().expect("v6");
        let v4 = |s: &str| s.parse::<Ipv4Addr>().expect("v4");
        assert_eq!(embedded_v4(v6("64:ff9b::c633:6407")), [v4("198.51.100.7")]);
        assert_eq!(embedded_v4(v6("::c633:6407")), [v4("198.51.100.7")]);
        assert_eq!(embedded_v4(v6("2002:cb00:7107::1")), [v4("203.0.113.7")]);
        assert_eq!(
            embedded_v4(v6("2001:0:cb00:7107::39cc:9bf8")),
            [v4("203.0.113.7"), v4("198.51.100.7")]
        );
        assert!(embedded_v4(v6("2001:db8::1")).is_empty());
        for sensitive in [
            "127.0.0.1",
            "169.254.169.254",
            "0.1.2.3",
            "::1",
            "::",
            "fe80::1",
            "64:ff9b::7f00:1",
            "2002:7f00:1::",
        ] {
            assert!(is_sensitive(ip(sensitive)), "{sensitive}");
        }
        for not in ["10.0.0.1", "203.0.113.7", "2001:db8::1", "fc00::1"] {
            assert!(!is_sensitive(ip(not)), "{not}");
        }
        assert!(is_internal(ip("10.0.0.1")) && !is_internal(ip("203.0.113.7")));
        assert!(is_internal(ip("64:ff9b::a00:1")) && !is_internal(ip("64:ff9b::cb00:7107")));
    }

    /// Which addresses count as internal, each class at its edges.
    #[test]
    fn internal_addresses_each_class_at_its_edges() {
        for internal in [
            "0.0.0.0",
            "0.1.2.3",
            "127.0.0.1",
            "10.0.0.1",
            "172.16.0.1",
            "192.168.1.1",
            "169.254.1.1",
            "100.64.0.1",
            "100.127.255.255",
            "192.0.0.8",
            "198.18.0.1",
            "198.19.255.1",
            "224.0.0.1",
            "255.255.255.255",
            "::",
            "::1",
            "fc00::1",
            "fd12::1",
            "fe80::1",
            "febf::1",
            "fec0::1",
            "ff02::1",
            "64:ff9b:1::1",
            "::203.0.113.7",
            "::ffff:10.0.0.1",
        ] {
            assert!(is_internal(ip(internal)), "{internal}");
        }
        for public in [
            "1.0.0.1",
            "8.8.8.8",
            "100.63.255.255",
            "100.128.0.0",
            "172.32.0.1",
            "192.0.1.1",
            "192.1.0.1",
            "193.0.0.1",
            "198.17.0.1",
            "198.20.0.1",
            "223.255.255.255",
            "2001:db8::1",
            "fe00::1",
            "fb00::1",
            "64:ff9b:2::1",
            "2606:4700::1111",
        ] {
            assert!(!is_internal(ip(public)), "{public}");
        }
    }

    /// A wildcard needs a whole label before the suffix: not the suffix alone, not an empty
    /// label.
    #[test]
    fn a_wildcard_needs_a_whole_label() {
        let p = HostPattern::parse("*.example.com").expect("p");
        assert!(p.matches("a.example.com"));
        assert!(!p.matches(".example.com"));
        assert!(!p.matches("example.com"));
        assert!(!p.matches("aexample.com"));
    }

    #[test]
    fn a_listed_name_has_its_pinned_addresses_and_no_other_name_has_any() {
        let vault: Vec<IpAddr> = vec!["10.0.0.5".parse().unwrap(), "::1".parse().unwrap()];
        let charts: Vec<IpAddr> = vec!["10.0.0.6".parse().unwrap()];
        let list = AllowList {
            rules: Vec::new(),
            audit: false,
            hosts: vec![
                ("vault.example".to_owned(), vault.clone()),
                ("charts.example".to_owned(), charts.clone()),
            ],
            search_domains: false,
        };
        assert_eq!(
            list.fixed_addresses("vault.example"),
            Some(vault.as_slice())
        );
        assert_eq!(
            list.fixed_addresses("charts.example"),
            Some(charts.as_slice())
        );
        assert_eq!(list.fixed_addresses("evil.example"), None);
        assert_eq!(AllowList::default().fixed_addresses("vault.example"), None);
    }

    #[test]
    fn names_match_exactly_or_by_suffix_and_always_with_a_port() {
        let list = AllowList {
            rules: vec![
                rule("vault.example", &[8200], false),
                rule("*.charts.example", &[443], false),
            ],
            audit: false,
            hosts: Vec::new(),
            search_domains: false,
        };
        assert!(list.entries_for(&name("vault.example"), 8200).is_ok());
        assert!(list.entries_for(&name("VAULT.example."), 8200).is_ok());
        assert!(list.entries_for(&name("a.b.charts.example"), 443).is_ok());
        for (h, p) in [
            ("vault.example", 8201),
            ("evil-vault.example", 8200),
            ("vault.example.evil", 8200),
            ("charts.example", 443),
            ("xcharts.example", 443),
            ("a.charts.example", 80),
        ] {
            assert_eq!(
                list.entries_for(&name(h), p).map(|_| ()),
                Err(Denial::NoEntry {
                    host: h.trim_end_matches('.').to_ascii_lowercase(),
                    port: p
                }),
                "{h}:{p}"
            );
        }
    }

    #[test]
    fn ip_literals_need_a_cidr_entry_and_odd_spellings_are_not_names() {
        let list = AllowList {
            rules: vec![
                rule("localhost", &[8200], true),
                rule("10.1.0.0/16", &[443], false),
            ],
            audit: false,
            hosts: Vec::new(),
            search_domains: false,
        };
        // The address a listed name resolves to is not listed by that name.
        assert!(matches!(
            list.entries_for(&name("127.0.0.1"), 8200),
            Err(Denial::NoEntryForAddress { .. })
        ));
        assert!(list.entries_for(&name("10.1.2.3"), 443).is_ok());
        assert!(list.entries_for(&name("[::ffff:10.1.2.3]"), 443).is_ok());
        assert!(list.entries_for(&name("10.2.0.1"), 443).is_err());
        for odd in [
            "2130706433",
            "0x7f.1",
            "127.1",
            "0177.0.0.1",
            "a..b",
            "-a.b",
            "a_b.c",
            "",
        ] {
            assert!(
                matches!(normalise_name(odd), Err(Denial::NotAHostName(_))),
                "{odd}"
            );
        }
    }

    #[test]
    fn internal_addresses_need_an_entry_that_says_so() {
        let list = AllowList {
            rules: vec![
                rule("public.example", &[443], false),
                rule("local.example", &[80], true),
                rule("10.9.0.0/16", &[443], false),
            ],
            audit: false,
            hosts: Vec::new(),
            search_domains: false,
        };
        let public = list.entries_for(&name("public.example"), 443).expect("e");
        for ip in [
            "127.0.0.1",
            "169.254.169.254",
            "10.0.0.1",
            "172.16.0.1",
            "192.168.1.1",
            "100.64.0.1",
            "0.0.0.0",
            "::1",
            "fe80::1",
            "fd00::1",
            "::ffff:127.0.0.1",
            "64:ff9b::a9fe:a9fe",
            "224.0.0.1",
        ] {
            let ip: IpAddr = ip.parse().expect("ip");
            assert!(is_internal(ip), "{ip}");
            assert!(!list.address_allowed(&public, ip, 443, false), "{ip}");
        }
        let ext: IpAddr = "93.184.216.34".parse().expect("ip");
        assert!(list.address_allowed(&public, ext, 443, false));
        // The pod's own (public) address counts as internal.
        assert!(!list.address_allowed(&public, ext, 443, true));
        // A CIDR entry names an internal block explicitly (on its port).
        assert!(list.address_allowed(&public, "10.9.1.1".parse().expect("ip"), 443, false));
        assert!(!list.address_allowed(&public, "10.9.1.1".parse().expect("ip"), 80, false));
        let local = list.entries_for(&name("local.example"), 80).expect("e");
        assert!(list.address_allowed(&local, "127.0.0.1".parse().expect("ip"), 80, false));
    }

    #[test]
    fn every_ipv6_form_of_an_internal_ipv4_address_is_internal() {
        for ip in [
            "::ffff:169.254.169.254", // mapped
            "::a9fe:a9fe",            // compatible
            "64:ff9b::a9fe:a9fe",     // NAT64 well-known
            "64:ff9b::7f00:1",
            "64:ff9b:1::8.8.8.8",  // NAT64 local-use: a network's own translator
            "2002:a9fe:a9fe::1",   // 6to4 of 169.254.169.254
            "2002:7f00:1::",       // 6to4 of 127.0.0.1
            "2002:a00:1::1",       // 6to4 of 10.0.0.1
            "2001:0:a9fe:a9fe::1", // Teredo, server 169.254.169.254
            "2001:0:808:808::80ff:fffe", // Teredo, client 127.0.0.1 (inverted)
        ] {
            let ip: IpAddr = ip.parse().expect("ip");
            assert!(is_internal(ip), "{ip}");
        }
        for ip in [
            "64:ff9b::808:808",
            "2002:808:808::1",
            "2001:0:808:808::f7f7:f7f7",
            "2606:4700::1111",
        ] {
            let ip: IpAddr = ip.parse().expect("ip");
            assert!(!is_internal(ip), "{ip}");
        }
        // A cidr entry covering the public forms admits them; loopback and link-local stay
        // out, in whichever form.
        let list = AllowList {
            rules: vec![
                rule("::/0", &[443], false),
                rule("0.0.0.0/0", &[443], false),
            ],
            audit: false,
            hosts: Vec::new(),
            search_domains: false,
        };
        let entries = list.entries_for(&name("2002:808:808::1"), 443).expect("e");
        assert!(list.address_allowed(&entries, "2002:808:808::1".parse().expect("ip"), 443, false));
        for ip in [
            "2002:a9fe:a9fe::1",
            "64:ff9b::7f00:1",
            "::1",
            "fe80::1",
            "169.254.169.254",
        ] {
            let ip: IpAddr = ip.parse().expect("ip");
            let entries = list.entries_for(&Host::Ip(ip), 443).expect("e");
            assert!(!list.address_allowed(&entries, ip, 443, false), "{ip}");
        }
    }

    #[test]
    fn cidr_entries_admit_loopback_and_link_local_only_when_they_say_internal() {
        let list = AllowList {
            rules: vec![
                rule("0.0.0.0/0", &[443], false),
                rule("10.0.0.0/8", &[80], false),
                rule("127.0.0.0/8", &[8080], true),
            ],
            audit: false,
            hosts: Vec::new(),
            search_domains: false,
        };
        let at = |ip: &str, port: u16| {
            let ip: IpAddr = ip.parse().expect("ip");
            let entries = list.entries_for(&Host::Ip(ip), port).expect("entries");
            list.address_allowed(&entries, ip, port, false)
        };
        assert!(at("8.8.8.8", 443));
        // Private addresses a block names are admitted by it.
        assert!(at("10.1.2.3", 443) && at("10.1.2.3", 80));
        assert!(!at("127.0.0.1", 443));
        assert!(!at("169.254.169.254", 443));
        assert!(!at("0.0.0.0", 443));
        assert!(at("127.0.0.1", 8080));
        // The pod's own address needs internal: true even where merely covered.
        let ext: IpAddr = "93.184.216.34".parse().expect("ip");
        let entries = list.entries_for(&Host::Ip(ext), 443).expect("e");
        assert!(!list.address_allowed(&entries, ext, 443, true));
        // A reviewer is told.
        let w = list.warnings();
        assert_eq!(w.len(), 1, "{w:?}");
        assert!(
            w[0].starts_with("spec.network.allow[0]: cidr 0.0.0.0/0 covers loopback"),
            "{w:?}"
        );
        assert!(
            w[0].contains("169.254.169.254") && w[0].contains("internal: true"),
            "{w:?}"
        );
    }

    #[test]
    fn a_hosts_file_lists_names_case_insensitively() {
        let text = "127.0.0.1 localhost\n# 10.0.0.1 commented\n10.1.1.1 Vault.Example vault # x\n::1 localhost ip6-localhost\nbad line\n";
        assert_eq!(
            hosts_file_addresses(text, "localhost"),
            vec![
                "127.0.0.1".parse::<IpAddr>().expect("ip"),
                "::1".parse().expect("ip")
            ]
        );
        assert_eq!(hosts_file_addresses(text, "vault.example").len(), 1);
        assert!(hosts_file_addresses(text, "commented").is_empty());
    }

    #[test]
    fn patterns_and_blocks_refuse_what_they_cannot_mean() {
        for bad in ["*", "*.", "a.*.b", "http://x", "x:80", "1.2.3.4"] {
            assert!(HostPattern::parse(bad).is_err(), "{bad}");
        }
        for bad in ["10.0.0.0/33", "x/8", "::/129", "10.0.0.0/"] {
            assert!(Cidr::parse(bad).is_err(), "{bad}");
        }
        assert_eq!(
            Cidr::parse("10.0.0.0/8").expect("c").to_string(),
            "10.0.0.0/8"
        );
        assert!(
            Cidr::parse("0.0.0.0/0")
                .expect("c")
                .contains("8.8.8.8".parse().expect("ip"))
        );
    }

    /// The metric label of a decision is the name the audit event serialises it as.
    #[test]
    fn decision_labels_are_the_serialised_names() {
        for (d, name) in [
            (Decision::Allowed, "allowed"),
            (Decision::Denied, "denied"),
            (Decision::Audited, "audited"),
        ] {
            assert_eq!(d.as_str(), name);
            assert_eq!(
                serde_json::to_string(&d).expect("json"),
                format!("\"{name}\"")
            );
        }
    }
}
