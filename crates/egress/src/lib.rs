//! The per-request egress proxy.
//!
//! A jail with `network: allowList` has an empty network namespace; the only thing its commands
//! can reach is a TCP listener on the namespace's loopback, which the jail made and handed to the
//! supervisor. (Where the node gives no namespace, the listener is on the pod's loopback, the
//! jail's Landlock TCP rules allow connecting to its port alone, and the proxy serves only the
//! request's UID: [`Proxy::admit_only_uid`].) The supervisor serves it with [`Proxy`]: an HTTP proxy (`CONNECT host:port` for
//! TLS, absolute-form requests for plain HTTP) that
//! 1. parses one bounded request head per connection (`httparse`, one deadline for all of
//!    it),
//! 2. decides the destination against the [`AllowList`] (names by exact or `*.suffix` match,
//!    addresses only by CIDR entries, always with a port; a plain-HTTP request's `Host` must
//!    name that destination),
//! 3. resolves the name itself, as an absolute name, and connects to an address it checked
//!    (no second resolution; internal addresses, IP literals' too, only where an entry admits
//!    them), within the connect timeout and the request's deadline,
//! 4. relays bytes until either side closes or the request ends, and
//! 5. records each connection ([`Connection`]) for the request's audit event.
//!
//! Connections are tasks on one small runtime all requests share (at most [`MAX_THREADS`]
//! threads), capped per request (`maxConnections`) and across requests
//! ([`MAX_CONNECTIONS_TOTAL`]).
//!
//! A denial is answered with `403` whose reason phrase and body name the destination and the
//! policy field, so the tool's own error carries it. The proxy knows nothing of Argo CD, gRPC
//! or the jail.

#![forbid(unsafe_code)]

mod head;
mod peer;
mod proxy;

pub use proxy::{
    ASKPASS_HOST, BLOCKING_THREADS, Limits, MAX_CONNECTIONS_TOTAL, MAX_THREADS, Proxy, ProxyHandle,
};
