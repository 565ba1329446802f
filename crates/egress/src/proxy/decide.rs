//! Where a proxied connection goes: the destination a head names (and, for plain HTTP, the
//! `Host` it must match), the list's decision on it, the name resolved as an absolute name,
//! the checks on every address, and the connect, within the request's deadline.

use super::{Decision, Shared, bounded};
use crate::head::{Head, split_authority};
use std::net::{IpAddr, SocketAddr, ToSocketAddrs};
use std::time::Instant;
use tokio::net::TcpStream;
use vocab::egress::{Denial, Host, hosts_file_addresses, normalise_name};

/// Longest authority a destination may have (a 253-character name, brackets, a port).
pub(super) const MAX_AUTHORITY: usize = 263;

/// The destination of a head: `CONNECT host:port`, or an absolute `http://` URL (whose
/// origin-form path is returned for forwarding).
pub(super) fn destination(head: &Head) -> Result<(String, u16, Option<String>), Denial> {
    let too_long = || {
        Denial::BadRequest(format!(
            "a destination longer than {MAX_AUTHORITY} characters is not a host and port"
        ))
    };
    if head.method.eq_ignore_ascii_case("CONNECT") {
        if head.target.len() > MAX_AUTHORITY {
            return Err(too_long());
        }
        let (h, p) = split_authority(&head.target, None).map_err(Denial::BadRequest)?;
        return Ok((h, p, None));
    }
    let Some(rest) = head
        .target
        .strip_prefix("http://")
        .or_else(|| head.target.strip_prefix("HTTP://"))
    else {
        return Err(Denial::BadRequest(format!(
            "{} {}: only CONNECT and absolute http:// requests are proxied (https goes through CONNECT)",
            bounded(&head.method),
            bounded(&head.target)
        )));
    };
    let (authority, path) = match rest.find(['/', '?']) {
        Some(i) => (&rest[..i], rest[i..].to_owned()),
        None => (rest, "/".to_owned()),
    };
    if authority.len() > MAX_AUTHORITY {
        return Err(too_long());
    }
    if authority.contains('@') {
        return Err(Denial::BadRequest(
            "credentials in the proxy URL's authority are not forwarded".into(),
        ));
    }
    let (h, p) = split_authority(authority, Some(80)).map_err(Denial::BadRequest)?;
    let path = if path.starts_with('?') {
        format!("/{path}")
    } else {
        path
    };
    Ok((h, p, Some(path)))
}

/// A forwarded request's `Host` names the destination decided on (one header; the same host,
/// case and a trailing dot aside; the same port, if it names one) — or it is absent and the
/// forwarded head gets that destination.
pub(super) fn same_host(head: &Head, host: &str, port: u16) -> Result<(), Denial> {
    let mismatch = |given: &str| Denial::HostMismatch {
        given: bounded(given),
        destination: bounded(&format!("{host}:{port}")),
    };
    match head.count("host") {
        0 => return Ok(()),
        1 => {}
        _ => return Err(mismatch("several Host headers")),
    }
    let given = head.header("host").unwrap_or_default();
    // Without a port, the header names the host alone (clients omit the port they dial).
    let (h, p) = split_authority(given, Some(port)).map_err(|_| mismatch(given))?;
    let norm = |s: &str| s.trim_end_matches('.').to_ascii_lowercase();
    if p == port && norm(&h) == norm(host) {
        Ok(())
    } else {
        Err(mismatch(given))
    }
}

pub(super) type Refusal = (u16, Denial, Decision);

/// Decide `host:port` against the list, resolve it here, and connect to the first address the
/// list admits — all within the connect timeout and the request's deadline. Returns the
/// stream, the address, and in audit mode what the list would have refused.
pub(super) async fn connect(
    shared: &Shared,
    host: &str,
    port: u16,
) -> Result<(TcpStream, SocketAddr, Option<String>), Refusal> {
    let mut budget = shared.limits.connect_timeout;
    if let Some(d) = shared.deadline {
        budget = budget.min(d.saturating_duration_since(Instant::now()));
    }
    let bounded_by = budget;
    match tokio::time::timeout(budget, decide_and_connect(shared, host, port)).await {
        Ok(r) => r,
        Err(_) => Err((
            504,
            Denial::BadRequest(format!(
                "resolving and connecting to {}:{port} took longer than {} ms (the proxy's connect timeout, or the request's deadline)",
                bounded(host),
                bounded_by.as_millis()
            )),
            Decision::Allowed,
        )),
    }
}

pub(super) async fn decide_and_connect(
    shared: &Shared,
    host: &str,
    port: u16,
) -> Result<(TcpStream, SocketAddr, Option<String>), Refusal> {
    let list = &shared.list;
    let host = normalise_name(host).map_err(|d| (403, d, Decision::Denied))?;
    let mut would_deny: Option<String> = None;
    let entries = match list.entries_for(&host, port) {
        Ok(e) => e,
        Err(d) if list.audit => {
            would_deny = Some(d.to_string());
            Vec::new()
        }
        Err(d) => return Err((403, d, Decision::Denied)),
    };
    let candidates: Vec<IpAddr> = match &host {
        Host::Ip(ip) => vec![*ip],
        Host::Name(n) => match list.fixed_addresses(n) {
            Some(fixed) => fixed.to_vec(),
            None => resolve(n.clone(), port, list.search_domains)
                .await
                .map_err(|error| {
                    (
                        403,
                        Denial::Unresolvable {
                            host: n.clone(),
                            error,
                            search_domains: list.search_domains,
                        },
                        Decision::Denied,
                    )
                })?,
        },
    };
    // Every address is checked, an IP literal's as a resolved one's: internal addresses
    // need an entry that admits them.
    let mut usable = Vec::new();
    for ip in &candidates {
        let own = own_address(*ip);
        if list.address_allowed(&entries, *ip, port, own) {
            usable.push(*ip);
        }
    }
    let usable = if usable.is_empty() && !candidates.is_empty() {
        let d = match &host {
            Host::Ip(ip) => Denial::InternalAddress { ip: *ip, port },
            Host::Name(n) => Denial::Internal {
                host: n.clone(),
                port,
                addresses: candidates.clone(),
            },
        };
        if !list.audit {
            return Err((403, d, Decision::Denied));
        }
        would_deny.get_or_insert(d.to_string());
        candidates
    } else {
        usable
    };
    let mut last = String::from("no address");
    for ip in usable {
        let addr = SocketAddr::new(ip, port);
        match TcpStream::connect(addr).await {
            Ok(s) => return Ok((s, addr, would_deny)),
            Err(e) => last = format!("{addr}: {e}"),
        }
    }
    let text = match &host {
        Host::Name(n) => n.clone(),
        Host::Ip(ip) => ip.to_string(),
    };
    Err((
        502,
        Denial::BadRequest(format!("connecting to {text}:{port} failed ({last})")),
        if would_deny.is_some() {
            Decision::Audited
        } else {
            Decision::Allowed
        },
    ))
}

/// The addresses of `name`: the node's hosts file, then DNS for the name as absolute (no
/// search-domain expansion), unless the policy asks for the pod's search domains. On a
/// blocking thread the caller abandons when its deadline passes.
pub(super) async fn resolve(
    name: String,
    port: u16,
    search_domains: bool,
) -> Result<Vec<IpAddr>, String> {
    let looked_up = tokio::task::spawn_blocking(move || {
        if search_domains {
            return lookup(&name, port);
        }
        let hosts = std::fs::read_to_string("/etc/hosts").unwrap_or_default();
        let fixed = hosts_file_addresses(&hosts, &name);
        if !fixed.is_empty() {
            return Ok(fixed);
        }
        // A trailing dot makes the name absolute for the system's resolver.
        lookup(&format!("{name}."), port)
    })
    .await;
    match looked_up {
        Ok(r) => r,
        Err(e) => Err(format!("lookup task: {e}")),
    }
}

pub(super) fn lookup(name: &str, port: u16) -> Result<Vec<IpAddr>, String> {
    let mut ips: Vec<IpAddr> = (name, port)
        .to_socket_addrs()
        .map_err(|e| e.to_string())?
        .map(|a| a.ip())
        .collect();
    ips.dedup();
    Ok(ips)
}

/// Whether `ip` is one of this node's (the pod's) own addresses: binding to it succeeds only
/// then.
pub(super) fn own_address(ip: IpAddr) -> bool {
    std::net::UdpSocket::bind(SocketAddr::new(ip, 0)).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head(method: &str, target: &str) -> Head {
        Head {
            method: method.into(),
            target: target.into(),
            headers: Vec::new(),
            rest: Vec::new(),
        }
    }

    fn too_long(r: Result<(String, u16, Option<String>), Denial>) -> bool {
        matches!(r, Err(Denial::BadRequest(m)) if m.contains("longer than 263"))
    }

    /// The node's own addresses are those it can bind to: loopback is, a documentation
    /// address (RFC 5737) is not.
    #[test]
    fn own_addresses_are_the_bindable_ones() {
        assert!(own_address("127.0.0.1".parse().unwrap()));
        assert!(!own_address("192.0.2.1".parse().unwrap()));
    }

    /// The length bound is the authority's, at its edge, for CONNECT and for an absolute URL
    /// (whose path does not count).
    #[test]
    fn a_destination_is_bounded_at_its_edge() {
        let at = |n: usize| format!("{}:443", "a".repeat(n - 4));
        assert_eq!(at(MAX_AUTHORITY).len(), MAX_AUTHORITY);
        assert!(!too_long(destination(&head("CONNECT", &at(MAX_AUTHORITY)))));
        assert!(too_long(destination(&head(
            "CONNECT",
            &at(MAX_AUTHORITY + 1)
        ))));
        let url = |n: usize| format!("http://{}/{}", at(n), "p".repeat(400));
        assert!(!too_long(destination(&head("GET", &url(MAX_AUTHORITY)))));
        assert!(too_long(destination(&head("GET", &url(MAX_AUTHORITY + 1)))));
        assert_eq!(
            destination(&head("GET", "http://example.com?q")).unwrap(),
            ("example.com".into(), 80, Some("/?q".into()))
        );
    }
}
