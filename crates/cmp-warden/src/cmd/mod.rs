//! One module per subcommand.

pub mod appset;
pub mod archive;
pub mod askpass;
pub mod client;
pub mod doctor;
pub mod flags;
pub mod net;
pub mod policy;
pub mod render;
pub mod serve;

/// `HOST:PORT` for a listener, where HOST may be an IPv6 address without brackets (as
/// Kubernetes' `$(POD_IP):9464` expands on an IPv6 pod): the last `:` then starts the port.
pub fn parse_listen_address(v: &str) -> Result<std::net::SocketAddr, String> {
    if let Ok(a) = v.parse() {
        return Ok(a);
    }
    let bad = || {
        format!(
            "{v:?} is not HOST:PORT with an IP address (e.g. 127.0.0.1:9464, [fd00::1]:9464 or fd00::1:9464)"
        )
    };
    let (host, port) = v.rsplit_once(':').ok_or_else(bad)?;
    let ip: std::net::IpAddr = host.parse().map_err(|_| bad())?;
    let port: u16 = port.parse().map_err(|_| bad())?;
    Ok(std::net::SocketAddr::new(ip, port))
}

/// `NAME=VALUE` → pair (value may be empty; a missing `=` is an error).
pub fn parse_env(s: &str) -> Result<(String, String), String> {
    s.split_once('=')
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .ok_or_else(|| format!("expected NAME=VALUE, got {s:?}"))
}

/// Write `text` to stdout. A reader that went away (`| head`) ends the output quietly, as it
/// does for any Unix tool, instead of a panic; another write error is said on stderr.
pub fn print_out(text: &str) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => {}
        Err(e) => eprintln!("error writing to stdout: {e}"),
    }
}

#[cfg(test)]
mod listen_address_tests {
    use super::parse_listen_address;

    #[test]
    fn listen_addresses_take_the_pod_ip_forms_kubernetes_expands() {
        for (given, want) in [
            ("127.0.0.1:9464", "127.0.0.1:9464"),
            ("[fd00::1]:9464", "[fd00::1]:9464"),
            ("fd00::1:9464", "[fd00::1]:9464"),
            ("10.244.1.7:9465", "10.244.1.7:9465"),
        ] {
            let a = parse_listen_address(given).expect(given);
            assert_eq!(a.to_string(), want);
        }
        for bad in [
            "0.0.0.0",
            "pod:9464",
            "$(POD_IP):9464",
            ":9464",
            "1.2.3.4:99999",
        ] {
            assert!(parse_listen_address(bad).is_err(), "{bad}");
        }
    }
}
