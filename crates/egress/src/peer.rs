//! Who owns the other end of an accepted loopback connection, from the kernel's socket tables
//! (`/proc/net/tcp`, `/proc/net/tcp6`): the client socket is the entry whose local address is
//! the connection's peer and whose remote address is the listener. Used when the listener is
//! on a loopback other processes share (a jail without a network namespace of its own), so
//! the proxy serves only the request's own UID.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

/// The UID owning the client socket of the connection `peer` → `listener`, if the tables
/// have it (a client that already closed has no entry).
pub fn owner(peer: SocketAddr, listener: SocketAddr) -> Option<u32> {
    ["/proc/net/tcp", "/proc/net/tcp6"]
        .iter()
        .filter_map(|f| std::fs::read_to_string(f).ok())
        .find_map(|table| owner_in(&table, peer, listener))
}

/// [`owner`] in one table's text.
pub(crate) fn owner_in(table: &str, peer: SocketAddr, listener: SocketAddr) -> Option<u32> {
    table.lines().skip(1).find_map(|line| {
        let f: Vec<&str> = line.split_whitespace().collect();
        // sl local rem st tx:rx tr:when retrnsmt uid …
        let (local, remote, uid) = (f.get(1)?, f.get(2)?, f.get(7)?);
        (same(parse(local)?, peer) && same(parse(remote)?, listener))
            .then(|| uid.parse().ok())
            .flatten()
    })
}

/// Equal, counting an IPv4-mapped IPv6 address as its IPv4 address.
fn same(a: SocketAddr, b: SocketAddr) -> bool {
    let v4 = |ip: IpAddr| match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    };
    a.port() == b.port() && v4(a.ip()) == v4(b.ip())
}

/// `0100007F:1F90` (IPv4) or 32 hex digits and a port (IPv6): the address as the kernel
/// prints it, each 32-bit word in host byte order.
fn parse(text: &str) -> Option<SocketAddr> {
    let (addr, port) = text.split_once(':')?;
    let port = u16::from_str_radix(port, 16).ok()?;
    let word = |i: usize| {
        // The kernel prints the word as it lies in memory, read as a native integer.
        let w = u32::from_str_radix(addr.get(i * 8..i * 8 + 8)?, 16).ok()?;
        Some(w.to_ne_bytes())
    };
    let ip = match addr.len() {
        8 => IpAddr::V4(Ipv4Addr::from(word(0)?)),
        32 => {
            let mut b = [0u8; 16];
            for i in 0..4 {
                b[i * 4..i * 4 + 4].copy_from_slice(&word(i)?);
            }
            IpAddr::V6(Ipv6Addr::from(b))
        }
        _ => return None,
    };
    Some(SocketAddr::new(ip, port))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A real loopback connection's client socket is found in the kernel's tables, owned by
    /// this process's UID; a connection that does not exist has no owner.
    #[test]
    fn the_owner_of_a_real_connection_and_of_none() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let c = std::net::TcpStream::connect(l.local_addr().unwrap()).expect("connect");
        let (_s, peer) = l.accept().expect("accept");
        assert_eq!(peer, c.local_addr().unwrap());
        let me = rustix::process::geteuid().as_raw();
        assert_eq!(owner(peer, l.local_addr().unwrap()), Some(me));
        // No connection runs from the listener's own address to itself.
        assert_eq!(
            owner(l.local_addr().unwrap(), l.local_addr().unwrap()),
            None
        );
    }

    const TCP: &str = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:9C41 0100007F:A1B2 01 00000000:00000000 00:00000000 00000000     0        0 1001 1 0000000000000000 20 4 30 10 -1
   1: 0100007F:A1B2 0100007F:9C41 01 00000000:00000000 00:00000000 00000000 20007        0 1002 1 0000000000000000 20 4 30 10 -1
";
    const TCP6: &str = "  sl  local_address                         remote_address                        st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0000000000000000FFFF00000100007F:B00B 0000000000000000FFFF00000100007F:9C41 01 00000000:00000000 00:00000000 00000000 20009        0 7 1 0000000000000000 20 4 30 10 -1
";

    #[test]
    fn the_client_sockets_owner_is_found_in_either_table() {
        let listener: SocketAddr = "127.0.0.1:40001".parse().expect("addr");
        // 0x9C41 = 40001, 0xA1B2 = 41394: the client's entry is local A1B2, remote 9C41.
        let peer: SocketAddr = "127.0.0.1:41394".parse().expect("addr");
        assert_eq!(owner_in(TCP, peer, listener), Some(20007));
        // Not the server side's entry (local 9C41), and nothing for an unknown peer.
        let stranger: SocketAddr = "127.0.0.1:1".parse().expect("addr");
        assert_eq!(owner_in(TCP, stranger, listener), None);
        // An IPv6 socket connected to the IPv4 listener shows as v4-mapped in tcp6.
        let mapped: SocketAddr = "127.0.0.1:45067".parse().expect("addr");
        assert_eq!(owner_in(TCP6, mapped, listener), Some(20009));
    }

    #[test]
    fn this_processs_own_connection_is_its_own() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let c = std::net::TcpStream::connect(l.local_addr().expect("addr")).expect("connect");
        let (_s, peer) = l.accept().expect("accept");
        assert_eq!(peer, c.local_addr().expect("addr"));
        assert_eq!(
            owner(peer, l.local_addr().expect("addr")),
            Some(rustix::process::getuid().as_raw())
        );
    }
}
